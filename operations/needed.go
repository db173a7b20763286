package operations

import (
	"github.com/volume-agent/volume-agent/cache"
)

// Needed reports whether operation op on t still has something to do, with
// everything it depends on in place, given the volume's actual state (av, nil
// if the actual state has nothing for it) and the desired state. Every
// operation body checks it first and returns ErrStale when it does not hold.
// It is the kind's precondition (Kind.Needed), made of the predicates in
// package cache that the planner plans from, so an action planned from a pair
// of snapshots is Needed in them (the reconciler's tests check this on random
// worlds): were it not, the operation would be skipped as stale and planned
// again, forever.
//
// A mount operation is never Needed for a raw block volume, nor a map
// operation for any other: each kind of volume has its own.
func Needed(op Op, t *Target, av *cache.ActualVolume, desired Desired) bool {
	k := byOp[op]
	if k == nil || (k.BlockOnly && !t.Attributes.Block) || (k.Block != "" && t.Attributes.Block) {
		return false
	}
	return k.Needed(t, av, desired)
}

func podMount(av *cache.ActualVolume, t *Target) *cache.ActualPodMount {
	if av == nil {
		return nil
	}
	return av.Pods.At(t.Pod.UID)
}

// needed reads the volume's current actual state and reports whether op on
// t is Needed in it.
func (o *Operator) needed(op Op, t *Target) (*cache.ActualVolume, bool) {
	av, _ := o.ASW.Volume(t.Volume)
	return av, Needed(op, t, av, o.DSW)
}
