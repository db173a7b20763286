package metrics

import (
	"fmt"
	"maps"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler"
	"github.com/volume-agent/volume-agent/volume"
)

// TestReadinessChangedAgreesWithAll drives random sequences of changes to
// real caches and checks, pass by pass, that following the changes
// (readiness.changed) finds the pods ready and observes them as walking
// every pod (readiness.all) does.
func TestReadinessChangedAgreesWithAll(t *testing.T) {
	const pods = 6
	spec := &volume.Spec{Volume: &v1.Volume{Name: "v"}}
	shared := volume.UniqueName("test/shared")
	uidOf := func(i int) types.UID { return types.UID(fmt.Sprintf("pod-%d", i)) }
	// Each pod may want its own two volumes and the shared one.
	volsOf := func(i int) []volume.UniqueName {
		return []volume.UniqueName{volume.UniqueName(fmt.Sprintf("test/%d-a", i)), volume.UniqueName(fmt.Sprintf("test/%d-b", i)), shared}
	}
	subPaths := [][]volume.SubPath{nil, {{Container: "c", Path: "x"}}}
	skipped := 0
	for seed := range int64(200) {
		rng := rand.New(rand.NewSource(seed))
		clk := clock.RealClock{}
		dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
		var inc, full readiness
		for pass := range 60 {
			for range rng.Intn(4) {
				i := rng.Intn(pods)
				uid := uidOf(i)
				ref := volume.PodRef{UID: uid, Namespace: "ns", Name: string(uid)}
				name := volsOf(i)[rng.Intn(3)]
				switch rng.Intn(7) {
				case 0, 1:
					var vols []cache.PodVolume
					for _, n := range volsOf(i) {
						if rng.Intn(3) > 0 {
							vols = append(vols, cache.PodVolume{Name: n, Plugin: "test", OuterName: string(n), Spec: spec,
								SubPaths: subPaths[rng.Intn(2)], Attributes: volume.Attributes{RequiresRemount: n == shared}})
						}
					}
					var errs []*volume.PodVolumeError
					if rng.Intn(8) == 0 {
						errs = []*volume.PodVolumeError{{Pod: ref, Volume: "bad", Reason: "Test"}}
					}
					var unresolved []string
					if rng.Intn(12) == 0 {
						unresolved = []string{"claim"}
					}
					dsw.SetPod(volume.PodInfo{PodRef: ref}, vols, errs, unresolved)
				case 2:
					dsw.DeletePod(uid)
				case 3, 4:
					state := cache.Mounted
					if rng.Intn(4) == 0 {
						state = cache.MountUncertain
					}
					asw.SetPodMount(cache.VolumeIdentity{Name: name, Plugin: "test", Spec: spec},
						cache.ActualPodMount{Pod: ref, SpecName: "v", State: state, SubPaths: subPaths[rng.Intn(2)]})
				case 5:
					asw.DeletePodMount(name, uid)
				case 6:
					dsw.RefreshPodVolume(name, uid)
				}
			}
			chg := reconciler.Changed{DSW: dsw.TakeChanges(), ASW: asw.TakeChanges(), Full: rng.Intn(20) == 0}
			ds, as := dsw.Snapshot(), asw.Snapshot()
			var gotObs, wantObs []types.UID
			inc.changed(ds, as, chg, func(p *cache.DesiredPod) { gotObs = append(gotObs, p.Pod.UID) })
			full.all(ds, as, func(p *cache.DesiredPod) { wantObs = append(wantObs, p.Pod.UID) })
			slices.Sort(gotObs)
			slices.Sort(wantObs)
			if !slices.Equal(gotObs, wantObs) || !maps.Equal(inc.ready, full.ready) {
				t.Fatalf("seed %d pass %d: changes observed %v, ready %v; every pod observed %v, ready %v",
					seed, pass, gotObs, inc.ready, wantObs, full.ready)
			}
		}
		skipped += inc.skipped
	}
	// Pods waiting on another volume than the one that changed must have
	// been left alone often, or the test proves little of that.
	if skipped < 1000 {
		t.Fatalf("only %d pods were not asked again because they wait on another volume", skipped)
	}
	t.Logf("%d pods not asked again", skipped)
}

// BenchmarkReadinessPass is one pass in a storm: 1,000 pods of 4 volumes
// wanted, half of them ready, and one more pod's volumes mounted since the
// last pass. The passes' snapshots are made before the timer starts.
func BenchmarkReadinessPass(b *testing.B) {
	const pods, vols = 1000, 4
	clk := clock.RealClock{}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	spec := &volume.Spec{Volume: &v1.Volume{Name: "v"}}
	mount := func(i int) {
		ref := volume.PodRef{UID: types.UID(fmt.Sprintf("pod-%04d", i)), Namespace: "ns", Name: "p"}
		for j := range vols {
			asw.SetPodMount(cache.VolumeIdentity{Name: volume.UniqueName(fmt.Sprintf("test/%04d-%d", i, j)), Plugin: "test", Spec: spec},
				cache.ActualPodMount{Pod: ref, State: cache.Mounted})
		}
	}
	for i := range pods {
		ref := volume.PodRef{UID: types.UID(fmt.Sprintf("pod-%04d", i)), Namespace: "ns", Name: "p"}
		var pvs []cache.PodVolume
		for j := range vols {
			pvs = append(pvs, cache.PodVolume{Name: volume.UniqueName(fmt.Sprintf("test/%04d-%d", i, j)), Plugin: "test", OuterName: fmt.Sprint(j), Spec: spec})
		}
		dsw.SetPod(volume.PodInfo{PodRef: ref}, pvs, nil, nil)
		if i < pods/2 {
			mount(i)
		}
	}
	type pass struct {
		dsw *cache.DesiredSnapshot
		asw *cache.ActualSnapshot
		chg reconciler.Changed
	}
	dsw.TakeChanges()
	asw.TakeChanges()
	start := pass{dsw: dsw.Snapshot(), asw: asw.Snapshot()}
	var passes []pass
	for i := pods / 2; i < pods; i++ {
		mount(i)
		chg := reconciler.Changed{DSW: dsw.TakeChanges(), ASW: asw.TakeChanges()}
		passes = append(passes, pass{dsw.Snapshot(), asw.Snapshot(), chg})
	}
	for _, mode := range []string{"all", "changed"} {
		b.Run(mode, func(b *testing.B) {
			var r readiness
			observe := func(*cache.DesiredPod) {}
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				if n%len(passes) == 0 {
					b.StopTimer()
					if n > 0 && len(r.ready) != pods {
						b.Fatalf("%d pods ready after the passes, want %d", len(r.ready), pods)
					}
					r = readiness{}
					r.all(start.dsw, start.asw, observe)
					b.StartTimer()
				}
				p := passes[n%len(passes)]
				n++
				if mode == "all" {
					r.all(p.dsw, p.asw, observe)
				} else {
					r.changed(p.dsw, p.asw, p.chg, observe)
				}
			}
		})
	}
}

// The planned actions are counted by operation, however many operations a
// pass has (more than fit the list's room) and in whatever order.
func TestPlannedActionsCountedByOperation(t *testing.T) {
	tests := []struct {
		name string
		ops  []operations.Op
	}{
		{"none", nil},
		{"one operation", []operations.Op{"a", "a", "a"}},
		{"interleaved", []operations.Op{"a", "b", "a", "c", "b", "a"}},
		{"more than the room", []operations.Op{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "a", "j"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New()
			var actions []reconciler.Action
			want := map[operations.Op]float64{}
			for _, op := range tt.ops {
				actions = append(actions, reconciler.Action{Op: op})
				want[op]++
			}
			m.observePass(actions, time.Millisecond)
			m.observePass(actions, time.Millisecond)
			for op, n := range want {
				if got := testutil.ToFloat64(m.actions.WithLabelValues(string(op))); got != 2*n {
					t.Errorf("%s: counted %v, want %v", op, got, 2*n)
				}
			}
			if got := testutil.CollectAndCount(m.actions); got != len(want) {
				t.Errorf("%d series, want %d", got, len(want))
			}
		})
	}
}
