package planner

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	clock "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// churn changes a real DSW and ASW at random, as the populator and
// operations do, over a small set of pods and volumes so that changes
// collide.
type churn struct {
	r     *rand.Rand
	dsw   *cache.DesiredStateOfWorld
	asw   *cache.ActualStateOfWorld
	attrs map[volume.UniqueName]volume.Attributes
	names []volume.UniqueName
	pods  []types.UID
}

func newChurn(seed uint64, nVols, nPods int) *churn {
	c := &churn{
		r:     rand.New(rand.NewPCG(seed, 7)),
		dsw:   cache.NewDesiredStateOfWorld(clock.NewFakeClock(time.Unix(1e9, 0))),
		asw:   cache.NewActualStateOfWorld(clock.NewFakeClock(time.Unix(1e9, 0))),
		attrs: map[volume.UniqueName]volume.Attributes{},
	}
	kinds := []volume.Attributes{perPodAttrs, remountAttrs, sharedDirAttrs, deviceAttrs, attachableAttrs, localBlockAttrs, csiBlockAttrs}
	for i := range nVols {
		name := volume.UniqueName(fmt.Sprintf("test/plugin/v%02d", i))
		c.names = append(c.names, name)
		c.attrs[name] = kinds[c.r.IntN(len(kinds))]
	}
	for i := range nPods {
		c.pods = append(c.pods, types.UID(fmt.Sprintf("p%02d", i)))
	}
	return c
}

func (c *churn) name() volume.UniqueName { return c.names[c.r.IntN(len(c.names))] }
func (c *churn) pod() types.UID          { return c.pods[c.r.IntN(len(c.pods))] }

func (c *churn) id(name volume.UniqueName) cache.VolumeIdentity {
	return cache.VolumeIdentity{Name: name, Plugin: testPlugin, Attributes: c.attrs[name], Spec: specFor(string(name))}
}

// desiredChange changes one pod in the DSW.
func (c *churn) desiredChange() {
	uid := c.pod()
	if c.r.IntN(4) == 0 {
		c.dsw.DeletePod(uid)
		return
	}
	var vols []cache.PodVolume
	for range c.r.IntN(3) {
		name := c.name()
		pv := cache.PodVolume{Name: name, Plugin: testPlugin, Attributes: c.attrs[name], OuterName: "o" + string(name[len(name)-2:]),
			Spec: specFor(string(name) + "@" + string(uid))}
		if c.r.IntN(4) == 0 {
			q := resource.MustParse(fmt.Sprintf("%dGi", c.r.IntN(3)+1))
			pv.DesiredSize = &q
		}
		if c.r.IntN(5) == 0 {
			pv.SubPaths = subPathsOf(fmt.Sprintf("s%d", c.r.IntN(2)))
		}
		vols = append(vols, pv)
	}
	var unresolved []string
	if c.r.IntN(6) == 0 {
		unresolved = []string{"data"}
	}
	c.dsw.SetPod(volume.PodInfo{PodRef: volume.PodRef{UID: uid, Namespace: "ns", Name: "pod-" + string(uid)}}, vols, nil, unresolved)
}

// actualChange records one operation's outcome (or a restart's findings)
// in the ASW.
func (c *churn) actualChange() {
	name, uid := c.name(), c.pod()
	switch c.r.IntN(11) {
	case 0, 1:
		state := cache.Mounted
		if c.r.IntN(3) == 0 {
			state = cache.MountUncertain
		}
		// A set up records the content generation it was planned
		// with: mostly the DSW's current one, sometimes an older one.
		var gen uint64
		if dv := c.dsw.Snapshot().Volume(name); dv != nil && dv.Pods.At(uid) != nil && c.r.IntN(3) > 0 {
			gen = dv.Pods.At(uid).ContentGeneration
		}
		c.asw.SetPodMount(c.id(name), cache.ActualPodMount{Pod: volume.PodRef{UID: uid}, SpecName: "s", MountPath: "/m/" + string(uid), State: state,
			ContentGeneration: gen})
	case 2, 3:
		c.asw.DeletePodMount(name, uid)
	case 4:
		states := []cache.DeviceMountState{cache.DeviceNotMounted, cache.DeviceMountUncertain, cache.DeviceGloballyMounted}
		c.asw.SetDeviceState(c.id(name), states[c.r.IntN(len(states))], "", "")
	case 5:
		states := []cache.AttachState{cache.NotAttached, cache.AttachUncertain, cache.Attached}
		c.asw.SetAttachState(c.id(name), states[c.r.IntN(len(states))], "", nil)
	case 6:
		c.asw.SetSubPaths(name, uid, subPathsOf(fmt.Sprintf("s%d", c.r.IntN(2))))
	case 7:
		// What the content is built from changed (package refresh).
		c.dsw.RefreshPodVolume(name, uid)
	case 8:
		q := resource.MustParse(fmt.Sprintf("%dGi", c.r.IntN(3)+1))
		c.asw.SetSize(name, &q)
	case 9:
		reason := ""
		if c.r.IntN(2) == 0 {
			reason = "in use"
		}
		c.asw.SetResizeBlocked(name, reason)
	case 10:
		v := &cache.ActualVolume{Name: name, Plugin: testPlugin, Attributes: c.attrs[name], DeviceState: cache.DeviceNotMounted,
			Pods: cache.PodSetOf(map[types.UID]*cache.ActualPodMount{uid: {Pod: volume.PodRef{UID: uid}, SpecName: "s", State: cache.MountUncertain, Reconstructed: true}})}
		if c.r.IntN(2) == 0 {
			v.DeviceState, v.DeviceReconstructed = cache.DeviceMountUncertain, true
		}
		c.asw.AddReconstructed([]*cache.ActualVolume{v})
	}
}

func (c *churn) change() {
	if c.r.IntN(3) == 0 {
		c.desiredChange()
	} else {
		c.actualChange()
	}
}

// TestIncrementalPlanMatchesPlan holds the incremental planner to Plan:
// after any sequence of changes to the caches, planning only what they
// report changed gives exactly what planning everything gives.
func TestIncrementalPlanMatchesPlan(t *testing.T) {
	optionSets := []Options{{}, {SourcesReady: true}, {SourcesReady: true, OrphanCleanupAllowed: true}}
	incremental, handedBack, patched := 0, 0, 0
	for seed := range uint64(40) {
		c := newChurn(seed, 12, 8)
		var p Incremental
		var got []Action
		opts := optionSets[2]
		for step := range 300 {
			for range c.r.IntN(4) + 1 {
				c.change()
			}
			if c.r.IntN(20) == 0 {
				opts = optionSets[c.r.IntN(len(optionSets))]
			}
			dchg, achg := c.dsw.TakeChanges(), c.asw.TakeChanges()
			dsw, asw := c.dsw.Snapshot(), c.asw.Snapshot()
			if p.valid && !dchg.All && !achg.All && opts == p.opts {
				incremental++
				if len(got) > 0 {
					handedBack++
				}
			}
			// Handed back the last result, as the reconciler does, so
			// that it may be patched.
			got = p.Plan(got, dsw, asw, opts, dchg, achg, false)
			want := Plan(dsw, asw, opts)
			if (len(got) > 0 || len(want) > 0) && !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d (%+v): incremental plan differs from Plan:\ngot  %v\nwant %v", seed, step, opts, summarize(got), summarize(want))
			}
		}
		patched += p.patched
	}
	// Most passes must have been incremental, or the test proves little;
	// each of them that was handed a last result patched it, however
	// much changed.
	t.Logf("%d passes patched", patched)
	if incremental < 40*300/2 || patched != handedBack || handedBack < incremental/2 {
		t.Fatalf("only %d of %d passes planned incrementally, %d patched", incremental, 40*300, patched)
	}
}

// TestIncrementalPlanCatchesUpWithConcurrentChanges: changes made while a
// pass takes its changes and snapshots are planned by the next pass at
// the latest, so once changes stop one pass gives Plan's result.
func TestIncrementalPlanCatchesUpWithConcurrentChanges(t *testing.T) {
	for seed := range uint64(20) {
		c := newChurn(seed, 12, 8)
		opts := Options{SourcesReady: true, OrphanCleanupAllowed: true}
		var p Incremental
		var wg sync.WaitGroup
		wg.Add(1)
		done := make(chan struct{})
		go func() {
			defer wg.Done()
			defer close(done)
			r := rand.New(rand.NewPCG(seed, 9))
			writer := &churn{r: r, dsw: c.dsw, asw: c.asw, attrs: c.attrs, names: c.names, pods: c.pods}
			for range 2000 {
				writer.change()
			}
		}()
		pass := func() ([]Action, *cache.DesiredSnapshot, *cache.ActualSnapshot) {
			dchg, achg := c.dsw.TakeChanges(), c.asw.TakeChanges()
			dsw, asw := c.dsw.Snapshot(), c.asw.Snapshot()
			return p.Plan(nil, dsw, asw, opts, dchg, achg, false), dsw, asw
		}
		passes := 0
	loop:
		for {
			select {
			case <-done:
				break loop
			default:
				pass()
				passes++
			}
		}
		wg.Wait()
		got, dsw, asw := pass()
		if want := Plan(dsw, asw, opts); !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d, after %d passes during changes: incremental plan differs from Plan:\ngot  %v\nwant %v", seed, passes, summarize(got), summarize(want))
		}
	}
}

// TestPlannerHoldsNothingWhenIdle: once nothing is left to do, the planner
// keeps no memo nor free slices (a storm's thousands of entries would stay otherwise).
func TestPlannerHoldsNothingWhenIdle(t *testing.T) {
	dsw, asw := benchWorld(100, false)
	opts := Options{SourcesReady: true}
	var p Incremental
	if got := p.Plan(nil, dsw, asw, opts, cache.Changes{All: true}, cache.Changes{}, false); len(got) != 100 || len(p.memo) != 100 {
		t.Fatalf("%d actions, %d memo entries; want 100 each", len(got), len(p.memo))
	}
	dsw, asw = benchWorld(100, true)
	if got := p.Plan(nil, dsw, asw, opts, cache.Changes{All: true}, cache.Changes{}, false); len(got) != 0 || p.memo != nil || p.free != nil || p.changed != nil || p.add != nil {
		t.Fatalf("%d actions, memo %v, %d free slices; want none and no memo", len(got), p.memo, len(p.free))
	}
}

// BenchmarkPassOnePodArrives is one reconciler pass's planning on a node
// with 10,000 mounted volumes when one more pod (one volume) arrives or
// goes, snapshots included: planning everything against planning what
// changed.
func BenchmarkPassOnePodArrives(b *testing.B) {
	for _, full := range []bool{true, false} {
		name := "incremental"
		if full {
			name = "full"
		}
		b.Run(name, func(b *testing.B) {
			clk := clock.NewFakeClock(time.Unix(1e9, 0))
			dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
			podVolume := func(uid string) (volume.PodInfo, cache.PodVolume, cache.VolumeIdentity) {
				name := volume.PodScopedName("kubernetes.io/empty-dir", types.UID(uid), "scratch")
				spec := &volume.Spec{Name: "scratch"}
				return podInfo(uid), cache.PodVolume{Name: name, Plugin: "kubernetes.io/empty-dir", OuterName: "scratch", Spec: spec},
					cache.VolumeIdentity{Name: name, Plugin: "kubernetes.io/empty-dir", Spec: spec}
			}
			for i := range 10000 {
				pod, pv, id := podVolume(fmt.Sprintf("pod-%05d", i))
				dsw.SetPod(pod, []cache.PodVolume{pv}, nil, nil)
				asw.SetPodMount(id, cache.ActualPodMount{Pod: pod.PodRef, SpecName: "scratch", State: cache.Mounted})
			}
			opts := Options{SourcesReady: true, OrphanCleanupAllowed: true}
			var p Incremental
			var buf []Action
			pass := func() int {
				dchg, achg := dsw.TakeChanges(), asw.TakeChanges()
				buf = p.Plan(buf, dsw.Snapshot(), asw.Snapshot(), opts, dchg, achg, full)
				return len(buf)
			}
			pass()
			newPod, pv, _ := podVolume("pod-new")
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 {
					dsw.SetPod(newPod, []cache.PodVolume{pv}, nil, nil)
				} else {
					dsw.DeletePod(newPod.UID)
				}
				if n := pass(); n != 1-i%2 {
					b.Fatalf("%d actions, want %d", n, 1-i%2)
				}
			}
		})
	}
}

// TestPlanVolumeMatchesEveryPhase holds planVolume, which skips walking a
// volume's mounts for unmounts when planMounts found them all wanted, to
// the plain sequence of the three phases, over random states.
func TestPlanVolumeMatchesEveryPhase(t *testing.T) {
	optionSets := []Options{{}, {SourcesReady: true}, {SourcesReady: true, OrphanCleanupAllowed: true}}
	skipped, unmounted := 0, 0
	for seed := range uint64(20) {
		c := newChurn(seed, 12, 8)
		for range 300 {
			for range c.r.IntN(4) + 1 {
				c.change()
			}
			dsw, asw := c.dsw.Snapshot(), c.asw.Snapshot()
			for _, opts := range optionSets {
				for _, name := range c.names {
					dv, av := dsw.Volume(name), asw.Volume(name)
					var want []Action
					if opts.SourcesReady && av != nil {
						want = planUnmounts(dsw, dv, av, opts.OrphanCleanupAllowed, want)
					}
					wantedMounts := -1
					if dv != nil {
						want, wantedMounts = planMounts(dv, av, opts.SourcesReady, want)
					}
					if opts.SourcesReady && av != nil {
						if wantedMounts == av.Pods.Len() && av.Pods.Len() > 0 {
							skipped++
						}
						want = planDeviceTeardown(dv != nil, av, opts.OrphanCleanupAllowed, want)
					}
					got := sortActions(planVolume(nil, dsw, dv, av, opts))
					want = sortActions(want)
					for _, a := range want {
						if dv != nil && phase(a.Op) == operations.PhaseUnmount {
							unmounted++
						}
					}
					if (len(got) > 0 || len(want) > 0) && !reflect.DeepEqual(got, want) {
						t.Fatalf("seed %d %s (%+v): planVolume differs:\ngot  %v\nwant %v", seed, name, opts, summarize(got), summarize(want))
					}
				}
			}
		}
	}
	// Both the skip and unmounts of wanted volumes must have come up.
	if skipped < 100 || unmounted < 100 {
		t.Fatalf("skipped %d walks, %d unmounts of wanted volumes: the test proves little", skipped, unmounted)
	}
}
