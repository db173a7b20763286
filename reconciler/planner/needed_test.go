package planner

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// TestPlannedActionsAreNeeded: every action planned from a pair of snapshots
// passes, in the same snapshots, the check its operation makes when it starts
// (operations.Needed). Were one not to, the operation would end as stale and
// the next pass would plan it again, every few milliseconds, forever.
func TestPlannedActionsAreNeeded(t *testing.T) {
	planned := map[operations.Op]int{}
	check := func(ctx string, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, opts Options) {
		t.Helper()
		for _, a := range Plan(dsw, asw, opts) {
			planned[a.Op]++
			if perPod := a.Pod.UID != ""; perPod != operations.KindOf(a.Op).PerPod || (perPod && a.Waiting != nil) {
				t.Errorf("%s: planned %s for pod %q, waiting %v; the table says per pod: %v", ctx, a.Op, a.Pod.UID, a.Waiting, operations.KindOf(a.Op).PerPod)
			}
			if !operations.Needed(a.Op, &a.Target, asw.Volume(a.Volume), dsw) {
				t.Errorf("%s, %+v: planned %s, but its operation would find nothing to do and skip it as stale\n  actual: %s",
					ctx, opts, act{a.Op, a.Volume, a.Pod.UID, a.Reason}, describeActual(asw.Volume(a.Volume)))
			}
		}
	}
	allOpts := []Options{{}, {SourcesReady: true}, {SourcesReady: true, OrphanCleanupAllowed: true}}
	for _, tc := range planCases() {
		for _, opts := range allOpts {
			check(tc.name, desiredSnapshot(tc.dsw, tc.pods), actualSnapshot(tc.asw), opts)
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 500 {
		dsw, asw := randomWorld(r, 20, 10)
		enrichWorld(r, dsw, asw)
		for _, opts := range allOpts {
			check(fmt.Sprintf("world %d", i), dsw, asw, opts)
		}
	}
	for _, op := range operations.Ops {
		if planned[op] == 0 {
			t.Errorf("no fixture planned %s: the check does not cover it", op)
		}
	}
}

// enrichWorld adds to a random world what randomWorld leaves out: attachable
// volumes without a device mount, state found after a restart, expansion
// that waits for a pod or was refused.
func enrichWorld(r *rand.Rand, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot) {
	publishOnly := volume.Attributes{Identity: "pub", Attachable: true}
	// In a fixed order, so a seed gives one world.
	for _, name := range slices.Sorted(maps.Keys(maps.Collect(asw.Volumes()))) {
		av := asw.Volume(name)
		if r.IntN(6) == 0 {
			av.Attributes = publishOnly
			if dv := dsw.Volume(name); dv != nil {
				dv.Attributes = publishOnly
			}
		}
		if r.IntN(4) == 0 {
			// A raw block volume: the same world, with map operations.
			av.Attributes.Block = true
			if dv := dsw.Volume(name); dv != nil {
				dv.Attributes.Block = true
			}
		}
		if r.IntN(5) == 0 {
			av.DeviceReconstructed = true
		}
		if r.IntN(5) == 0 {
			av.ExpandAfterPublish = true
		}
		if r.IntN(8) == 0 {
			av.ResizeBlocked = "in use"
		}
		for _, uid := range slices.Sorted(av.Pods.UIDs()) {
			if r.IntN(4) == 0 {
				av.Pods.At(uid).Reconstructed = true
			}
			switch r.IntN(4) {
			case 0:
				prepared(string(uid), "a")(av)
			case 1:
				prepared(string(uid), "a")(av)
				outdated(string(uid))(av)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(maps.Collect(dsw.Volumes()))) {
		dv := dsw.Volume(name)
		for _, uid := range slices.Sorted(dv.Pods.UIDs()) {
			if r.IntN(3) == 0 {
				withSubPaths(dv, string(uid), "a")
			}
		}
	}
}

func describeActual(av *cache.ActualVolume) string {
	if av == nil {
		return "none"
	}
	s := fmt.Sprintf("attach=%q device=%q size=%v expandAfterPublish=%v resizeBlocked=%q", av.AttachState, av.DeviceState, av.Size, av.ExpandAfterPublish, av.ResizeBlocked)
	for uid, m := range av.Pods.All() {
		s += fmt.Sprintf(" pod %s: %s contentGeneration=%d reconstructed=%v", uid, m.State, m.ContentGeneration, m.Reconstructed)
	}
	return s
}

// TestRewriteCarriesGeneration: the set up planned for a mount whose
// content is older than the DSW's carries the DSW's generation to the
// operation (which records it as written) and to the executor (whose
// backoff holds back that generation only).
func TestRewriteCarriesGeneration(t *testing.T) {
	dv := dvol(vA, remountAttrs, "p1")
	dv.Pods.At("p1").ContentGeneration = 5
	av := avol(vA, remountAttrs, mounted("p1"))
	av.Pods.At("p1").ContentGeneration = 3
	actions := Plan(desiredSnapshot([]*cache.DesiredVolume{dv}, nil), actualSnapshot([]*cache.ActualVolume{av}), Options{SourcesReady: true})
	if len(actions) != 1 || actions[0].Op != operations.OpMountVolume || actions[0].ContentGeneration != 5 {
		t.Fatalf("plan %v: want one mount_volume for generation 5", summarize(actions))
	}
	if got := (&operations.Operator{}).Operation(actions[0].Op, actions[0].Target).ContentGeneration; got != 5 {
		t.Errorf("operation generation %d, want 5", got)
	}
	av.Pods.At("p1").ContentGeneration = 5
	if actions := Plan(desiredSnapshot([]*cache.DesiredVolume{dv}, nil), actualSnapshot([]*cache.ActualVolume{av}), Options{SourcesReady: true}); len(actions) != 0 {
		t.Errorf("content current, yet planned %v", summarize(actions))
	}
}
