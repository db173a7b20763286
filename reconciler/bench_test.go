package reconciler

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/volume"
)

// BenchmarkPassWhileBusy measures a pass in the middle of a storm: 4,000
// volumes wanted, none mounted yet, every operation still running, and one
// of them changed since the last pass.
func BenchmarkPassWhileBusy(b *testing.B) {
	clk := clock.RealClock{}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	exec := &fakeExecutor{busy: map[operations.Key]bool{}}
	setPod := func(i int) {
		uid := types.UID(fmt.Sprintf("pod-%04d", i))
		name := volume.PodScopedName(emptydir.Name, uid, "scratch")
		dsw.SetPod(volume.PodInfo{PodRef: rcRef(uid)}, []cache.PodVolume{
			{Name: name, Plugin: emptydir.Name, OuterName: "scratch", Spec: emptyDirSpec("scratch", v1.StorageMediumDefault)},
		}, nil, nil)
		exec.busy[operations.Key{Volume: name, Pod: uid}] = true
	}
	for i := range 4000 {
		setPod(i)
	}
	r := New(Options{DSW: dsw, ASW: asw, Executor: exec, Handler: &opHandler{}, Clock: clk})
	r.ReconcileOnce()
	b.ReportAllocs()
	for b.Loop() {
		dsw.DeletePod("pod-0000")
		setPod(0)
		if n := len(r.ReconcileOnce()); n != 4000 {
			b.Fatalf("%d actions, want 4000", n)
		}
	}
}

// BenchmarkStorm mirrors the 1000 pods x 4 emptyDirs storm as far as the
// caches and the reconciler see it: pods arrive in batches of 50 (as the
// populator hands them in), every pass's mounts finish before the next
// pass and are recorded in the ASW; then the pods leave in batches and
// their unmounts are recorded the same way. One op is the whole storm.
func BenchmarkStorm(b *testing.B) { benchmarkStorm(b, 0) }

// BenchmarkStormLimited is BenchmarkStorm with at most 64 operations
// started per pass, as an executor with 64 workers does: the planned
// actions pile up, and each pass changes a few of many.
func BenchmarkStormLimited(b *testing.B) { benchmarkStorm(b, 64) }

// benchmarkStorm runs the storm; a limit > 0 starts at most that many
// operations per pass.
func benchmarkStorm(b *testing.B, limit int) {
	const pods, vols, batch = 1000, 4, 50
	clk := clock.RealClock{}
	type pod struct {
		info volume.PodInfo
		vols []cache.PodVolume
	}
	all := make([]pod, pods)
	for i := range all {
		uid := types.UID(fmt.Sprintf("pod-%04d", i))
		all[i].info = volume.PodInfo{PodRef: rcRef(uid)}
		for j := range vols {
			outer := fmt.Sprintf("v%d", j)
			all[i].vols = append(all[i].vols, cache.PodVolume{Name: volume.PodScopedName(emptydir.Name, uid, outer), Plugin: emptydir.Name,
				OuterName: outer, Spec: emptyDirSpec(outer, v1.StorageMediumMemory)})
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
		h := &stormHandler{}
		r := New(Options{DSW: dsw, ASW: asw, Executor: stormExecutor{limit}, Handler: h, Clock: clk})
		finish := func() {
			for _, t := range h.started {
				id := cache.VolumeIdentity{Name: t.Volume, Plugin: t.Plugin, Attributes: t.Attributes, Spec: t.Spec}
				switch t.op {
				case operations.OpMountVolume:
					asw.SetPodMount(id, cache.ActualPodMount{Pod: t.Pod.PodRef, SpecName: t.SpecName, MountPath: "/x", State: cache.Mounted,
						ContentGeneration: t.ContentGeneration, Spec: t.Spec})
				case operations.OpUnmountVolume:
					asw.DeletePodMount(t.Volume, t.Pod.UID)
				}
			}
			h.started = h.started[:0]
		}
		r.ReconcileOnce()
		for i := 0; i < pods; i += batch {
			dsw.Batch(func() {
				for _, p := range all[i : i+batch] {
					dsw.SetPodWithContainers(p.info, p.vols, nil, nil, nil)
				}
			})
			r.ReconcileOnce()
			finish()
		}
		for r.ReconcileOnce(); len(h.started) > 0; r.ReconcileOnce() {
			finish()
		}
		for i := 0; i < pods; i += batch {
			dsw.Batch(func() {
				for _, p := range all[i : i+batch] {
					dsw.DeletePod(p.info.UID)
				}
			})
			r.ReconcileOnce()
			finish()
		}
		for r.ReconcileOnce(); len(h.started) > 0; r.ReconcileOnce() {
			finish()
		}
		if n := len(r.ReconcileOnce()); n != 0 {
			b.Fatalf("%d actions left after the storm", n)
		}
		if n := asw.Snapshot().VolumesLen(); n != 0 {
			b.Fatalf("%d volumes left in the ASW", n)
		}
	}
}

// stormExecutor starts every action at once, or the first limit if
// limit > 0.
type stormExecutor struct{ limit int }

func (stormExecutor) Mark() uint64 { return 0 }
func (e stormExecutor) Startable(cands []operations.Candidate, _ uint64) []bool {
	out := make([]bool, len(cands))
	for i := range out {
		out[i] = e.limit <= 0 || i < e.limit
	}
	return out
}
func (stormExecutor) Run(operations.Key, *operations.Operation) error { return nil }
func (stormExecutor) Forget(func(operations.Key) bool) int            { return 0 }
func (stormExecutor) Idle() <-chan struct{}                           { return nil }

// stormHandler records the targets of the operations it builds, for the
// benchmark to finish them.
type stormHandler struct {
	started []stormOp
}

type stormOp struct {
	op operations.Op
	operations.Target
}

var stormOperation = &operations.Operation{}

func (h *stormHandler) Operation(op operations.Op, t operations.Target) *operations.Operation {
	h.started = append(h.started, stormOp{op, t})
	return stormOperation
}

func (h *stormHandler) AdoptVolume(cache.VolumeIdentity, bool, map[types.UID]cache.ActualPodMount) {}
