package operations

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// The bodies of the raw block operations. They record state in the ASW
// exactly as the mount operations do (a device state for the volume, a pod
// "mount" whose MountPath is the access point), so that the planner's
// predicates, reconstruction and adoption need no second vocabulary; only the
// plugin calls differ, and map_volume pins the device.

func (o *Operator) blockMapper(t *Target) (plugins.BlockMapper, error) {
	p, err := o.plugin(t.Plugin)
	if err != nil {
		return nil, err
	}
	bm, ok := p.(plugins.BlockMapper)
	if !ok {
		return nil, fmt.Errorf("volume plugin %s does not support raw block volumes", t.Plugin)
	}
	return bm, nil
}

// MapDevice prepares a raw block volume's device once per node (CSI:
// NodeStageVolume with the block capability). Nothing is formatted or
// mounted.
func (o *Operator) MapDevice(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpMapDevice, t)
	if !needed {
		return ErrStale
	}
	bm, err := o.blockMapper(t)
	if err != nil {
		return err
	}
	req := o.deviceRequest(t, av, OpMapDevice)
	err = bm.MapDevice(ctx, req)
	o.recordDevice(t, av, req, err)
	return err
}

// MapVolume gives one pod the block device at its access point and pins the
// device there. A pin that cannot be made leaves the mapping uncertain: it
// is retried while the pod wants the volume and undone when it does not.
func (o *Operator) MapVolume(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpMapVolume, t)
	if !needed {
		return ErrStale
	}
	bm, err := o.blockMapper(t)
	if err != nil {
		return err
	}
	req := &plugins.SetUpRequest{
		VolumeName: t.Volume, Spec: t.Spec, Pod: t.Pod,
		Dir: o.Paths.PodDevicePath(t.Pod.UID, t.Plugin, t.SpecName),
		Log: o.logger(t, OpMapVolume),
	}
	if t.Attributes.DeviceMountable {
		req.DeviceMountPath = av.DeviceMountPath
	}
	if av != nil {
		req.DevicePath, req.PublishContext = av.DevicePath, av.PublishContext
	}
	prev := podMount(av, t)
	mount := cache.ActualPodMount{Pod: t.Pod.PodRef, SpecName: t.SpecName, MountPath: req.Dir, Spec: t.Spec}
	if _, err := mountutil.EnsureDir(filepath.Dir(req.Dir), 0o750); err != nil {
		return err
	}
	err = bm.MapPodDevice(ctx, req)
	if err == nil {
		if err = o.pin(req.Dir); err != nil {
			err = volume.Uncertain(err)
		}
	}
	switch {
	case err == nil:
		mount.State, mount.ContentGeneration = cache.Mounted, t.ContentGeneration
		o.ASW.SetPodMount(t.identity(), mount)
		if o.Refresh != nil {
			// A CSI driver with requiresRepublish is published again.
			o.Refresh.MountDone(t.Volume, t.Pod.UID, t.ContentGeneration, req.RefreshAt)
		}
	case volume.IsUncertain(err):
		mount.State = cache.MountUncertain
		o.ASW.SetPodMount(t.identity(), mount)
	case prev != nil && prev.State == cache.MountUncertain && !prev.Reconstructed:
		o.ASW.DeletePodMount(t.Volume, t.Pod.UID)
		mountutil.RemoveEmptyDirs(filepath.Dir(req.Dir), o.Paths.PodsDir())
	case prev == nil:
		// Nothing is mapped: leave no directory behind for a pod that may
		// go away before it is retried.
		mountutil.RemoveEmptyDirs(filepath.Dir(req.Dir), o.Paths.PodsDir())
	}
	return err
}

func (o *Operator) pin(path string) error {
	if o.Pins == nil {
		return fmt.Errorf("cannot pin the block device at %s: the agent has no pinner", path)
	}
	return o.Pins.Pin(path)
}

// UnmapVolume releases the pin of one pod's access point (t.MountPath), then
// has the plugin remove the access point, then removes the pod's directories
// left empty.
func (o *Operator) UnmapVolume(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpUnmapVolume, t)
	if !needed {
		return ErrStale
	}
	bm, err := o.blockMapper(t)
	if err != nil {
		return err
	}
	prev, accessPoint := podMount(av, t), t.MountPath
	fail := func(err error) error {
		if prev.State != cache.MountUncertain {
			m := *prev
			m.State = cache.MountUncertain
			o.ASW.SetPodMount(t.identity(), m)
		}
		return err
	}
	// The pin holds the access point's mount busy: release it first.
	if o.Pins == nil {
		return fail(fmt.Errorf("cannot release the pin of %s: the agent has no pinner", accessPoint))
	}
	if err := o.Pins.Unpin(accessPoint); err != nil {
		return fail(err)
	}
	req := &plugins.TearDownRequest{
		VolumeName: t.Volume, Spec: prev.Spec, Pod: t.Pod.PodRef, Dir: accessPoint,
		DeviceMountPath: av.DeviceMountPath, Log: o.logger(t, OpUnmapVolume),
	}
	if err := bm.UnmapPodDevice(ctx, req); err != nil {
		return fail(err)
	}
	o.ASW.DeletePodMount(t.Volume, t.Pod.UID)
	o.removePodDirs(t, volume.PodVolumeDirs{
		Dir: accessPoint, Plugin: filepath.Dir(accessPoint), Pod: o.Paths.PodDir(t.Pod.UID), Pods: o.Paths.PodsDir(),
	})
	return nil
}

// UnmapDevice undoes MapDevice once no pod has the device mapped.
func (o *Operator) UnmapDevice(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpUnmapDevice, t)
	if !needed {
		return ErrStale
	}
	bm, err := o.blockMapper(t)
	if err != nil {
		return err
	}
	return o.releaseDevice(ctx, t, av, OpUnmapDevice, bm.UnmapDevice)
}
