package reconciler

import (
	"context"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
)

// OperatorHandler is the Handler of the agent: it turns actions into calls of
// the Operator's bodies and adopts through it.
type OperatorHandler struct {
	Operator *operations.Operator
}

// target is what the operation of an action is about.
func target(a *Action) *operations.Target {
	return &operations.Target{
		Volume: a.Volume, Plugin: a.Plugin, Attributes: a.Attributes,
		Spec: a.Spec, Pod: a.Pod, SpecName: a.SpecName, DesiredSize: a.DesiredSize, Waiting: a.Pods,
		SubPaths: a.SubPaths,
	}
}

// Operation implements Handler.
func (h *OperatorHandler) Operation(a *Action) *operations.Operation {
	t := target(a)
	var fn func(context.Context) error
	switch a.Op {
	case operations.OpMountDevice:
		fn = func(ctx context.Context) error { return h.Operator.MountDevice(ctx, t) }
	case operations.OpMountVolume:
		fn = func(ctx context.Context) error { return h.Operator.MountVolume(ctx, t) }
	case operations.OpPrepareSubPaths:
		fn = func(ctx context.Context) error { return h.Operator.PrepareSubPaths(ctx, t) }
	case operations.OpUnmountVolume:
		mountPath := a.MountPath
		fn = func(ctx context.Context) error { return h.Operator.UnmountVolume(ctx, t, mountPath) }
	case operations.OpUnmountDevice:
		fn = func(ctx context.Context) error { return h.Operator.UnmountDevice(ctx, t) }
	case operations.OpVerifyAttached:
		fn = func(ctx context.Context) error { return h.Operator.VerifyAttached(ctx, t) }
	case operations.OpDetachVolume:
		fn = func(ctx context.Context) error { return h.Operator.DetachVolume(ctx, t) }
	case operations.OpExpandVolume:
		fn = func(ctx context.Context) error { return h.Operator.ExpandVolume(ctx, t) }
	case operations.OpMapDevice:
		fn = func(ctx context.Context) error { return h.Operator.MapDevice(ctx, t) }
	case operations.OpMapVolume:
		fn = func(ctx context.Context) error { return h.Operator.MapVolume(ctx, t) }
	case operations.OpUnmapVolume:
		accessPoint := a.MountPath
		fn = func(ctx context.Context) error { return h.Operator.UnmapVolume(ctx, t, accessPoint) }
	case operations.OpUnmapDevice:
		fn = func(ctx context.Context) error { return h.Operator.UnmapDevice(ctx, t) }
	default:
		return nil
	}
	return &operations.Operation{Name: a.Op, Plugin: a.Plugin, Pod: a.Pod.PodRef, Waiting: a.Pods, Spec: a.Spec, Fn: fn}
}

// Adopt implements Handler through the Operator.
func (h *OperatorHandler) Adopt(a Adoption) {
	pods := make(map[types.UID]cache.ActualPodMount, len(a.Pods))
	for uid, p := range a.Pods {
		pods[uid] = cache.ActualPodMount{Pod: p.Pod, Spec: p.Spec}
	}
	h.Operator.AdoptVolume(cache.VolumeIdentity{Name: a.Volume, Plugin: a.Plugin, Attributes: a.Attributes, Spec: a.Spec}, a.Device, pods)
}
