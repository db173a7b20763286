package operations

import (
	"context"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/status/events"
)

// Phase is the step of a reconcile pass a kind of operation belongs to. A
// plan lists its actions phase by phase, in the kubelet's order: a pod's
// old mount goes before anything is set up, and a device is released only
// after every pod let go of it.
type Phase uint8

const (
	// PhaseUnmount tears down the pods' mounts no pod wants any more.
	PhaseUnmount Phase = iota + 1
	// PhaseMount attaches, stages, sets up and grows what pods want.
	PhaseMount
	// PhaseTeardown releases the devices and attachments no pod uses.
	PhaseTeardown
)

// Kind is everything a kind of operation means, in the one place a new kind
// is added: the planner orders actions by its Phase and picks its block
// counterpart, the executor keys it per pod or per volume, the body
// re-checks its precondition and does the work, and the reporter names it
// and raises its failure event.
type Kind struct {
	// Op is the kind's name: the operation label of the metrics and the
	// logs, events and debug endpoint, so part of the agent's interface.
	Op    Op
	Phase Phase
	// PerPod is true for the kinds that work on one pod's use of a volume
	// (keyed by volume and pod), false for volume-wide ones (keyed by
	// volume, working for Target.Waiting).
	PerPod bool
	// Block is the kind that does this one's job for a raw block volume,
	// for the kinds of filesystem volumes only; empty when the kind serves
	// both.
	Block Op
	// BlockOnly is true for the raw block kinds (some kind's Block).
	BlockOnly bool
	// Needed is the kind's precondition, made of the predicates in package
	// cache: the planner plans an action of this kind from the same
	// predicates (reconciler's TestPlannedActionsAreNeeded checks that every
	// planned action passes it), and the body re-checks it when it runs
	// and returns ErrStale if it no longer holds. av is nil if the actual
	// state has nothing for the volume.
	Needed func(t *Target, av *cache.ActualVolume, desired Desired) bool
	// Body does the work: a method of the Operator.
	Body func(o *Operator, ctx context.Context, t *Target) error
	// FailureReason is the reason of the Warning event the pods concerned
	// get when the operation fails, named as the kubelet names it.
	FailureReason string
	// Unmounts is true for the kinds that call umount(2) (or release a
	// device the way unmounting does): a burst of them gains from spare Ps,
	// as each sleeps for an RCU grace period.
	Unmounts bool
}

// kinds is the table. Its order is that of Ops.
var kinds = [...]Kind{
	{Op: OpUnmountVolume, Phase: PhaseUnmount, PerPod: true, Block: OpUnmapVolume, Unmounts: true,
		Needed: unmountNeeded, Body: (*Operator).UnmountVolume, FailureReason: events.FailedUnmount},
	{Op: OpVerifyAttached, Phase: PhaseMount,
		Needed: func(t *Target, av *cache.ActualVolume, _ Desired) bool { return cache.AttachNeeded(t.Attributes, av) },
		Body:   (*Operator).VerifyAttached, FailureReason: events.FailedAttachVolume},
	{Op: OpMountDevice, Phase: PhaseMount, Block: OpMapDevice,
		Needed: deviceMountNeeded, Body: (*Operator).MountDevice, FailureReason: events.FailedMount},
	{Op: OpMountVolume, Phase: PhaseMount, PerPod: true, Block: OpMapVolume,
		Needed: podMountNeeded, Body: (*Operator).MountVolume, FailureReason: events.FailedMount},
	{Op: OpPrepareSubPaths, Phase: PhaseMount, PerPod: true,
		Needed: func(t *Target, av *cache.ActualVolume, desired Desired) bool {
			return desired.HasPodVolume(t.Volume, t.Pod.UID) && cache.SubPathsNeeded(t.SubPaths, podMount(av, t), t.ContentGeneration)
		},
		Body: (*Operator).PrepareSubPaths, FailureReason: events.FailedMount},
	{Op: OpExpandVolume, Phase: PhaseMount,
		Needed: func(t *Target, av *cache.ActualVolume, _ Desired) bool {
			return cache.ExpansionNeeded(t.DesiredSize, t.Attributes, av)
		},
		Body: (*Operator).ExpandVolume, FailureReason: events.VolumeResizeFailed},
	{Op: OpUnmountDevice, Phase: PhaseTeardown, Block: OpUnmapDevice, Unmounts: true,
		Needed: deviceUnmountNeeded, Body: (*Operator).UnmountDevice, FailureReason: events.FailedUnmountDevice},
	{Op: OpDetachVolume, Phase: PhaseTeardown,
		Needed: func(t *Target, av *cache.ActualVolume, desired Desired) bool {
			return cache.DetachNeeded(desired.HasVolume(t.Volume), av)
		},
		Body: (*Operator).DetachVolume, FailureReason: events.FailedDetachVolume},

	{Op: OpMapDevice, Phase: PhaseMount, BlockOnly: true,
		Needed: deviceMountNeeded, Body: (*Operator).MapDevice, FailureReason: events.FailedMapVolume},
	{Op: OpMapVolume, Phase: PhaseMount, PerPod: true, BlockOnly: true,
		Needed: podMountNeeded, Body: (*Operator).MapVolume, FailureReason: events.FailedMapVolume},
	{Op: OpUnmapVolume, Phase: PhaseUnmount, PerPod: true, BlockOnly: true, Unmounts: true,
		Needed: unmountNeeded, Body: (*Operator).UnmapVolume, FailureReason: events.FailedUnmapDevice},
	{Op: OpUnmapDevice, Phase: PhaseTeardown, BlockOnly: true, Unmounts: true,
		Needed: deviceUnmountNeeded, Body: (*Operator).UnmapDevice, FailureReason: events.FailedUnmapDevice},
}

// The preconditions two kinds share: a mount kind and its block counterpart.

func deviceMountNeeded(t *Target, av *cache.ActualVolume, _ Desired) bool {
	return !cache.AttachNeeded(t.Attributes, av) && cache.DeviceMountNeeded(t.Attributes, av)
}

func podMountNeeded(t *Target, av *cache.ActualVolume, _ Desired) bool {
	return cache.ReadyForPods(t.Attributes, av) && cache.PodMountNeeded(podMount(av, t), t.ContentGeneration)
}

func unmountNeeded(t *Target, av *cache.ActualVolume, desired Desired) bool {
	return cache.PodUnmountNeeded(desired.HasPodVolume(t.Volume, t.Pod.UID), podMount(av, t))
}

func deviceUnmountNeeded(t *Target, av *cache.ActualVolume, desired Desired) bool {
	return cache.DeviceUnmountNeeded(desired.HasVolume(t.Volume), av)
}

// byOp indexes kinds. It is built by init, not by its declaration: the
// bodies in the table look their own kind up through it, a cycle Go does
// not allow in initializers.
var byOp map[Op]*Kind

// Ops lists every kind of operation.
var Ops []Op

func init() {
	byOp = make(map[Op]*Kind, len(kinds))
	for i := range kinds {
		byOp[kinds[i].Op] = &kinds[i]
		Ops = append(Ops, kinds[i].Op)
	}
}

// KindOf returns what op means, or nil for a name that is no kind.
func KindOf(op Op) *Kind { return byOp[op] }

// Block reports whether op is one of the raw block operations.
func (op Op) Block() bool {
	k := byOp[op]
	return k != nil && k.BlockOnly
}

// ForMode returns the operation that does op's job for a volume of the
// given kind: the block counterpart of a mount operation for a raw block
// volume, op itself otherwise.
func ForMode(op Op, block bool) Op {
	if k := byOp[op]; block && k != nil && k.Block != "" {
		return k.Block
	}
	return op
}

// Operation returns the executor operation that runs op's body on t, or nil
// for a name that is no kind.
func (o *Operator) Operation(op Op, t Target) *Operation {
	k := byOp[op]
	if k == nil {
		return nil
	}
	switch op {
	case OpMountVolume:
		return withRoom[plugins.SetUpRequest](Operation{Name: op, Target: t, body: k.Body, operator: o})
	case OpUnmountVolume:
		return withRoom[plugins.TearDownRequest](Operation{Name: op, Target: t, body: k.Body, operator: o})
	}
	return &Operation{Name: op, Target: t, body: k.Body, operator: o}
}

// withRoom returns op allocated together with the room for the request
// (and logger) of type R its body hands its plugin (see withLog): the
// kinds of a storm's every volume cost one allocation less.
func withRoom[R any](op Operation) *Operation {
	w := &struct {
		op   Operation
		room logged[R]
	}{op: op}
	w.op.room = &w.room
	return &w.op
}
