package planner

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// sortActions must order exactly as a stable sort by phase, volume, pod and
// operation does. A plan never holds two actions with the same phase,
// volume and pod (TestPlanInvariants), so the test data has none either.
func TestSortActionsMatchesStableSort(t *testing.T) {
	ops := []operations.Op{operations.OpUnmountVolume, operations.OpMountVolume, operations.OpUnmountDevice, operations.OpMountDevice, operations.OpUnmapVolume}
	rnd := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 2, 3, 10, 100, 1000} {
		actions := make([]Action, 0, n)
		seen := map[[3]string]bool{}
		for i := 0; len(actions) < n; i++ {
			a := Action{
				Op: ops[rnd.IntN(len(ops))],
				Target: operations.Target{
					Volume: volume.UniqueName(fmt.Sprintf("v%d", rnd.IntN(n/3+1))),
					Pod:    volume.PodInfo{PodRef: volume.PodRef{UID: types.UID(fmt.Sprintf("p%d", rnd.IntN(3)))}},
				},
				Reason: fmt.Sprint(i),
			}
			key := [3]string{fmt.Sprint(phase(a.Op)), string(a.Volume), string(a.Pod.UID)}
			if seen[key] {
				continue
			}
			seen[key] = true
			actions = append(actions, a)
		}
		want := append([]Action(nil), actions...)
		sort.SliceStable(want, func(i, j int) bool {
			a, b := &want[i], &want[j]
			if pa, pb := phase(a.Op), phase(b.Op); pa != pb {
				return pa < pb
			}
			if a.Volume != b.Volume {
				return a.Volume < b.Volume
			}
			if a.Pod.UID != b.Pod.UID {
				return a.Pod.UID < b.Pod.UID
			}
			return a.Op < b.Op
		})
		if got := sortActions(actions); len(got) != len(want) || (n > 0 && !reflect.DeepEqual(got, want)) {
			t.Errorf("%d actions: sortActions differs from a stable sort", n)
		}
	}
}

// TestGallop: gallop finds the first action at which a monotone predicate
// holds, and gallopBack counts the actions at the end for which it holds,
// for every length and answer, as a linear scan does, in about twice the
// log of the answer calls.
func TestGallop(t *testing.T) {
	for _, tc := range []struct {
		name string
		find func([]Action, func(*Action) bool) int
		// want is the answer for n actions of which the first holding is k.
		want func(n, k int) int
	}{
		{"gallop", gallop, func(_, k int) int { return k }},
		{"gallopBack", gallopBack, func(n, k int) int { return n - k }},
	} {
		for n := range 70 {
			s := make([]Action, n)
			for k := range n + 1 {
				for i := range s {
					s[i].Reason = "before"
					if i >= k {
						s[i].Reason = "after"
					}
				}
				calls := 0
				got := tc.find(s, func(a *Action) bool { calls++; return a.Reason == "after" })
				want := tc.want(n, k)
				if got != want {
					t.Fatalf("%s: len %d, first at %d: says %d, want %d", tc.name, n, k, got, want)
				}
				if limit := 2*bits.Len(uint(want+1)) + 2; calls > limit {
					t.Fatalf("%s: len %d, first at %d: %d calls, want at most %d", tc.name, n, k, calls, limit)
				}
			}
		}
	}
}
