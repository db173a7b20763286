package operations

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

// ClaimStatus records node expansion on a claim's status, the way the
// kubelet does since Kubernetes 1.34: allocatedResourceStatuses[storage]
// NodeResizeInProgress while working, NodeResizeFailed after a failure, and
// on success the new capacity with the status entry and the resize
// conditions removed.
type ClaimStatus interface {
	ResizeInProgress(ctx context.Context, pvc *v1.PersistentVolumeClaim) error
	ResizeFinished(ctx context.Context, pvc *v1.PersistentVolumeClaim, size resource.Quantity) error
	ResizeFailed(ctx context.Context, pvc *v1.PersistentVolumeClaim, cause error) error
}

// ExpandVolume grows a volume's filesystem on the node to the desired size
// (online while pods use it, offline after staging and before any pod
// does), then reports the new size on the claim.
func (o *Operator) ExpandVolume(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpExpandVolume, t)
	if !needed {
		return ErrStale
	}
	p, err := o.plugin(t.Plugin)
	if err != nil {
		return err
	}
	pvc := t.Spec.PVC
	log := o.logger(t, OpExpandVolume)
	ex, ok := p.(plugins.Expander)
	if !ok {
		log.Info("plugin cannot grow filesystems on the node; expansion counts as done")
		return o.expansionDone(ctx, t, t.DesiredSize)
	}
	if pvc != nil && o.Claims != nil {
		if err := o.Claims.ResizeInProgress(ctx, pvc); err != nil {
			log.Warn("could not mark the claim's node expansion in progress", zap.Error(err))
		}
	}
	req := &plugins.ExpandRequest{
		VolumeName: t.Volume, Spec: t.Spec, DevicePath: av.DevicePath, DeviceMountPath: av.DeviceMountPath,
		VolumePath: firstMountPath(av), OldSize: av.Size, NewSize: *t.DesiredSize, Log: log,
	}
	_, err = ex.Expand(ctx, req)
	switch {
	case err == nil:
		return o.expansionDone(ctx, t, t.DesiredSize)
	case errors.Is(err, plugins.ErrExpansionNotSupported):
		log.Info("nothing to grow on the node; expansion counts as done", zap.Error(err))
		return o.expansionDone(ctx, t, t.DesiredSize)
	case errors.Is(err, plugins.ErrNotPublished):
		// This volume can only grow once a pod has it: publish first.
		o.ASW.SetExpandAfterPublish(t.Volume)
		return ErrStale
	case errors.Is(err, plugins.ErrVolumeInUse):
		o.ASW.SetResizeBlocked(t.Volume, err.Error())
	}
	o.expansionFailed(ctx, t, err)
	return fmt.Errorf("growing the filesystem to %s: %w", volume.SizeString(t.DesiredSize), err)
}

// firstMountPath is one pod's mount of the volume (sorted, so the choice is
// stable), for drivers that need a published path.
func firstMountPath(av *cache.ActualVolume) string {
	var paths []string
	for _, m := range av.Pods.All() {
		if m.State == cache.Mounted {
			paths = append(paths, m.MountPath)
		}
	}
	sort.Strings(paths)
	if len(paths) == 0 {
		return ""
	}
	return paths[0]
}

// expansionDone records the new size on the claim and then in the ASW. The
// size is recorded only once the claim says so: if the claim update fails,
// the error makes the (idempotent) expansion and the report run again.
// size is the DSW's, shared with its snapshots: it is formatted with
// volume.SizeString, never with its own String, which writes into it.
func (o *Operator) expansionDone(ctx context.Context, t *Target, size *resource.Quantity) error {
	if pvc := t.Spec.PVC; pvc != nil && o.Claims != nil {
		if err := o.Claims.ResizeFinished(ctx, pvc, *size); err != nil {
			return fmt.Errorf("the filesystem was grown to %s, but recording it on the claim failed: %w", volume.SizeString(size), err)
		}
	}
	o.ASW.SetSize(t.Volume, size)
	what := "filesystem of volume"
	if t.Attributes.Block {
		what = "raw block volume" // no filesystem: the device itself grew
	}
	o.event(t, events.Normal, events.FileSystemResizeSuccessful, fmt.Sprintf("%s %s grown to %s on node", what, t.Spec.Name, volume.SizeString(size)))
	return nil
}

func (o *Operator) expansionFailed(ctx context.Context, t *Target, cause error) {
	pvc := t.Spec.PVC
	if pvc != nil && o.Claims != nil {
		if err := o.Claims.ResizeFailed(ctx, pvc, cause); err != nil {
			o.logger(t, OpExpandVolume).Warn("could not record the failure on the claim", zap.Error(err))
		}
	}
	if pvc != nil && o.Events != nil {
		o.Events.Event(events.Object{Kind: "PersistentVolumeClaim", Namespace: pvc.Namespace, Name: pvc.Name, UID: string(pvc.UID)},
			events.Warning, events.VolumeResizeFailed, fmt.Sprintf("growing the filesystem of volume %s to %s failed: %v", t.Spec.Name, volume.SizeString(t.DesiredSize), cause))
	}
}

// event reports on the claim and on the pods using the volume.
func (o *Operator) event(t *Target, typ, reason, msg string) {
	if o.Events == nil {
		return
	}
	if pvc := t.Spec.PVC; pvc != nil {
		o.Events.Event(events.Object{Kind: "PersistentVolumeClaim", Namespace: pvc.Namespace, Name: pvc.Name, UID: string(pvc.UID)}, typ, reason, msg)
	}
	for _, p := range t.Waiting {
		o.Events.Event(events.PodObject(p), typ, reason, msg)
	}
}
