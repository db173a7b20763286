package reconciler

import (
	"context"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
)

// OperatorHandler turns actions into calls of the Operator's bodies.
type OperatorHandler struct {
	Operator *operations.Operator
}

// Operation implements Handler.
func (h *OperatorHandler) Operation(a *Action) *operations.Operation {
	t := &operations.Target{
		Volume: a.Volume, Plugin: a.Plugin, Attributes: a.Attributes,
		Spec: a.Spec, Pod: a.Pod, SpecName: a.SpecName, DesiredSize: a.DesiredSize, Waiting: a.Pods,
	}
	var fn func(context.Context) error
	switch a.Op {
	case OpMountDevice:
		fn = func(ctx context.Context) error { return h.Operator.MountDevice(ctx, t) }
	case OpMountVolume:
		fn = func(ctx context.Context) error { return h.Operator.MountVolume(ctx, t) }
	case OpUnmountVolume:
		mountPath := a.MountPath
		fn = func(ctx context.Context) error { return h.Operator.UnmountVolume(ctx, t, mountPath) }
	case OpUnmountDevice:
		fn = func(ctx context.Context) error { return h.Operator.UnmountDevice(ctx, t) }
	case OpVerifyAttached:
		fn = func(ctx context.Context) error { return h.Operator.VerifyAttached(ctx, t) }
	case OpDetachVolume:
		fn = func(ctx context.Context) error { return h.Operator.DetachVolume(ctx, t) }
	case OpExpandVolume:
		fn = func(ctx context.Context) error { return h.Operator.ExpandVolume(ctx, t) }
	default:
		return nil
	}
	return &operations.Operation{Name: string(a.Op), Plugin: a.Plugin, Pod: a.Pod.PodRef, Waiting: a.Pods, Spec: a.Spec, Fn: fn}
}

// Adopt implements Adopter through the Operator.
func (h *OperatorHandler) Adopt(a Adoption) {
	pods := make(map[types.UID]cache.ActualPodMount, len(a.Pods))
	for uid, p := range a.Pods {
		pods[uid] = cache.ActualPodMount{Pod: p.Pod, Spec: p.Spec}
	}
	h.Operator.AdoptVolume(cache.VolumeIdentity{Name: a.Volume, Plugin: a.Plugin, Attributes: a.Attributes, Spec: a.Spec}, a.Device, pods)
}
