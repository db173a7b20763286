package cache

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/changelog"
	"github.com/volume-agent/volume-agent/volume"
)

func changedNames(c Changes) []string {
	var out []string
	c.Each(func(n volume.UniqueName) { out = append(out, string(n)) })
	slices.Sort(out)
	return out
}

// TestDesiredTakeChanges: the DSW lists the volumes whose entries changed
// since the last take; the first take, and a change of whether a pod's
// mounts are protected, say All.
func TestDesiredTakeChanges(t *testing.T) {
	d, _ := newDSW()
	a, b := emptyDir("a", "v"), emptyDir("b", "v")
	d.SetPod(testPod("a"), []PodVolume{a}, nil, nil) // before the first take: not listed
	steps := []struct {
		name    string
		change  func()
		wantAll bool
		want    []string
	}{
		{"first take", func() {}, true, nil},
		{"nothing", func() {}, false, nil},
		{"pod added", func() { d.SetPod(testPod("b"), []PodVolume{b}, nil, nil) }, false, []string{string(b.Name)}},
		{"same pod again", func() { d.SetPod(testPod("b"), []PodVolume{b}, nil, nil) }, false, nil},
		{"pod deleted", func() { d.DeletePod("a") }, false, []string{string(a.Name)}},
		{"pod becomes protected", func() { d.SetPod(testPod("b"), []PodVolume{b}, nil, []string{"data"}) }, true, nil},
		{"protected pod deleted", func() { d.DeletePod("b") }, true, nil},
	}
	for _, s := range steps {
		s.change()
		c := d.TakeChanges()
		if got := changedNames(c); c.All != s.wantAll || !slices.Equal(got, s.want) {
			t.Fatalf("%s: All=%v %v, want All=%v %v", s.name, c.All, got, s.wantAll, s.want)
		}
	}
}

// TestActualTakeChanges: the ASW lists every volume an operation touched,
// across its shards, and collapses into All past its limit.
func TestActualTakeChanges(t *testing.T) {
	a, _ := newASW()
	if c := a.TakeChanges(); !c.All {
		t.Fatalf("first take: All=false, want true")
	}
	a.SetPodMount(perPodID, ActualPodMount{Pod: volume.PodRef{UID: "p1"}, State: Mounted})
	a.SetDeviceState(deviceID, DeviceGloballyMounted, "/dev/x", "/g")
	a.SetSubPaths(perPodID.Name, "p1", nil)
	c := a.TakeChanges()
	want := []string{string(deviceID.Name), string(perPodID.Name)}
	slices.Sort(want)
	if got := changedNames(c); c.All || !slices.Equal(got, want) {
		t.Fatalf("All=%v %v, want %v", c.All, got, want)
	}
	if !c.Has(deviceID.Name) || c.Has("other") {
		t.Fatalf("Has: %v %v, want true false", c.Has(deviceID.Name), c.Has("other"))
	}
	if c := a.TakeChanges(); c.All || len(changedNames(c)) != 0 {
		t.Fatalf("nothing changed: All=%v, %v", c.All, changedNames(c))
	}
	// Volumes that come and go (pod churn) leave no entries behind but
	// their names: past the limit the list becomes All.
	for i := range 32 * (changeLimit(0) + 2) {
		id := VolumeIdentity{Name: volume.UniqueName(fmt.Sprintf("p/v%d", i)), Plugin: "p"}
		a.SetPodMount(id, ActualPodMount{Pod: volume.PodRef{UID: "p1"}, State: Mounted})
		a.DeletePodMount(id.Name, "p1")
	}
	if c := a.TakeChanges(); !c.All {
		t.Fatalf("%d names listed, want All", len(changedNames(c)))
	}
}

// TestActualSnapshotFollowsChanges: a snapshot patched from the one before
// holds exactly what the shards hold, however the volumes changed, and
// leaves the snapshots taken before as they were.
func TestActualSnapshotFollowsChanges(t *testing.T) {
	a, _ := newASW()
	r := rand.New(rand.NewPCG(5, 6))
	truth := func() map[volume.UniqueName]*ActualVolume {
		m := map[volume.UniqueName]*ActualVolume{}
		for i := range a.shards {
			maps.Copy(m, a.shards[i].volumes)
		}
		return m
	}
	var old *ActualSnapshot
	var oldCopy map[volume.UniqueName]*ActualVolume
	for step := range 3000 {
		for range r.IntN(5) {
			n := r.IntN(200)
			id := VolumeIdentity{Name: volume.UniqueName(fmt.Sprintf("p/v%d", n)), Plugin: "p", Attributes: volume.Attributes{RequiresRemount: n%2 == 0}}
			uid := types.UID(fmt.Sprintf("u%d", r.IntN(3)))
			switch r.IntN(5) {
			case 4:
				a.SetSubPaths(id.Name, uid, nil)
			case 0, 1:
				a.SetPodMount(id, ActualPodMount{Pod: volume.PodRef{UID: uid}, State: Mounted})
			case 2:
				a.DeletePodMount(id.Name, uid)
			case 3:
				a.AddReconstructed([]*ActualVolume{{Name: id.Name, Plugin: "p", DeviceState: DeviceMountUncertain, DeviceReconstructed: true,
					Pods: PodSet[ActualPodMount]{}}})
			}
		}
		s := a.Snapshot()
		if want := truth(); !maps.Equal(maps.Collect(s.Volumes()), want) {
			t.Fatalf("step %d: snapshot (%d volumes) differs from the shards (%d)", step, s.VolumesLen(), len(want))
		}
		reconstructed := 0
		for _, v := range s.Volumes() {
			if v.hasReconstructed() {
				reconstructed++
			}
		}
		if s.reconstructed != reconstructed {
			t.Fatalf("step %d: snapshot counts %d reconstructed volumes, holds %d", step, s.reconstructed, reconstructed)
		}
		if old != nil && !maps.Equal(maps.Collect(old.Volumes()), oldCopy) {
			t.Fatalf("step %d: an earlier snapshot changed", step)
		}
		old, oldCopy = s, maps.Collect(s.Volumes())
	}
}

// TestShrunk: a map is copied into a smaller table once it holds under a
// quarter of the most it held, and not before.
func TestShrunk(t *testing.T) {
	m := map[int]int{}
	peak := 0
	for i := range 1000 {
		m[i] = i
	}
	if shrunk(m, &peak); peak != 1000 {
		t.Fatalf("peak %d, want 1000", peak)
	}
	for i := range 740 {
		delete(m, i)
	}
	if c := shrunk(m, &peak); reflect.ValueOf(c).UnsafePointer() != reflect.ValueOf(m).UnsafePointer() {
		t.Fatalf("copied at 260 of 1000 entries")
	}
	for i := range 12 {
		delete(m, 900+i)
	}
	c := shrunk(m, &peak)
	if reflect.ValueOf(c).UnsafePointer() == reflect.ValueOf(m).UnsafePointer() || !maps.Equal(c, m) || peak != 248 {
		t.Fatalf("at 248 of 1000 entries: copied=%v equal=%v peak=%d", reflect.ValueOf(c).UnsafePointer() != reflect.ValueOf(m).UnsafePointer(), maps.Equal(c, m), peak)
	}
}

// TestTouchedChangesOracle: the ASW's change list (touched, with repeats,
// deduplicated at take time as TakeChanges does) against the set a
// changelog.Log keeps, which it replaced: over random marks and takes, both
// say All on the first take, list the same names when neither is All,
// and the list is All whenever the set is; the list may be All sooner only
// when it holds more than the limit (repeats count there).
func TestTouchedChangesOracle(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		limit := 1 + r.IntN(12)
		var list touched[volume.UniqueName]
		list.all = true
		var set changelog.Log[volume.UniqueName]
		marks := 0 // since the last take, after consecutive repeats
		var last volume.UniqueName
		for step := range 300 {
			if r.IntN(8) == 0 {
				lall, names := list.take()
				got := slices.Clone(names)
				slices.Sort(got)
				got = slices.Compact(got)
				sall, keys := set.Take()
				want := slices.Sorted(maps.Keys(keys))
				switch {
				case sall && !lall:
					t.Fatalf("seed %d step %d: set All, list %v", seed, step, got)
				case lall && !sall && marks <= limit:
					t.Fatalf("seed %d step %d: list All after %d marks (limit %d), set %v", seed, step, marks, limit, want)
				case !lall && !slices.Equal(got, want):
					t.Fatalf("seed %d step %d: list %v, set %v", seed, step, got, want)
				}
				marks, last = 0, ""
				continue
			}
			name := volume.UniqueName(fmt.Sprintf("v%d", r.IntN(2*limit)))
			if name != last {
				marks++
			}
			last = name
			list.mark(name, limit)
			set.Mark(name, limit)
		}
	}
}

// TestUnionOracle: Union walks two sorted lists side by side; the simple
// version is Each of one, then Each of the other with what the first has
// left out, sorted. Both must give the same names in the same order.
func TestUnionOracle(t *testing.T) {
	random := func(r *rand.Rand) Changes {
		if r.IntN(10) == 0 {
			return Changes{All: true}
		}
		var names []volume.UniqueName
		for range r.IntN(10) {
			names = append(names, volume.UniqueName(fmt.Sprintf("v%d", r.IntN(12))))
		}
		return Changes{names: sortedOnce(names)}
	}
	for seed := range uint64(500) {
		r := rand.New(rand.NewPCG(seed, 2))
		a, b := random(r), random(r)
		var want []volume.UniqueName
		if !a.All && !b.All {
			a.Each(func(n volume.UniqueName) { want = append(want, n) })
			b.Each(func(n volume.UniqueName) {
				if !a.Has(n) {
					want = append(want, n)
				}
			})
			slices.Sort(want)
		}
		var got []volume.UniqueName
		Union(a, b, func(n volume.UniqueName) { got = append(got, n) })
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d: Union(%v, %v) = %v, want %v", seed, a, b, got, want)
		}
	}
}
