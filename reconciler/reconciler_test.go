package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/volume"
)

// fakeExecutor refuses the keys in busy and records what it was asked to
// run.
type fakeExecutor struct {
	busy map[operations.Key]bool
	ran  []string
}

func (e *fakeExecutor) Mark() uint64 { return 0 }

func (e *fakeExecutor) Startable(cands []operations.Candidate, _ uint64) []bool {
	out := make([]bool, len(cands))
	for i, c := range cands {
		out[i] = !e.busy[c.Key]
	}
	return out
}

func (e *fakeExecutor) Forget(func(operations.Key) bool) int { return 0 }

func (e *fakeExecutor) Idle() <-chan struct{} { return nil }

func (e *fakeExecutor) Run(key operations.Key, op *operations.Operation) error {
	e.ran = append(e.ran, string(op.Name)+" "+string(key.Volume)+" "+string(key.Pod))
	return nil
}

// opHandler builds an operation for every action and records which.
type opHandler struct{ built []string }

func (h *opHandler) Operation(op operations.Op, t operations.Target) *operations.Operation {
	h.built = append(h.built, rcActs([]Action{{Op: op, Target: t}})[0])
	return &operations.Operation{Name: op, Target: t, Fn: func(context.Context) error { return nil }}
}

func (h *opHandler) AdoptVolume(cache.VolumeIdentity, bool, map[types.UID]cache.ActualPodMount) {}

// A pass plans, asks the executor which actions can start, and builds and
// runs exactly those, each on its own key.
func TestReconcilerRunsOnlyStartableActions(t *testing.T) {
	clk := clock.RealClock{}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	var names []volume.UniqueName
	for _, uid := range []types.UID{"p1", "p2", "p3"} {
		name := volume.PodScopedName(emptydir.Name, uid, "scratch")
		names = append(names, name)
		dsw.SetPod(volume.PodInfo{PodRef: rcRef(uid)}, []cache.PodVolume{
			{Name: name, Plugin: emptydir.Name, OuterName: "scratch", Spec: emptyDirSpec("scratch", v1.StorageMediumDefault)},
		}, nil, nil)
	}
	exec := &fakeExecutor{busy: map[operations.Key]bool{{Volume: names[1], Pod: "p2"}: true}}
	h := &opHandler{}
	r := New(Options{DSW: dsw, ASW: asw, Executor: exec, Handler: h, Clock: clk})

	if actions := r.ReconcileOnce(); len(actions) != 3 {
		t.Fatalf("planned %q, want three mounts", rcActs(actions))
	}
	want := []string{
		"mount_volume " + string(names[0]) + " p1",
		"mount_volume " + string(names[2]) + " p3",
	}
	if !slices.Equal(h.built, want) {
		t.Errorf("built operations for %q, want %q (not for the busy key)", h.built, want)
	}
	if !slices.Equal(exec.ran, want) {
		t.Errorf("ran %q, want %q", exec.ran, want)
	}
}

// failingHandler builds operations that always fail.
type failingHandler struct{}

func (failingHandler) Operation(op operations.Op, t operations.Target) *operations.Operation {
	return &operations.Operation{Name: op, Target: t,
		Fn: func(context.Context) error { return errors.New("device busy") }}
}

func (failingHandler) AdoptVolume(cache.VolumeIdentity, bool, map[types.UID]cache.ActualPodMount) {}

// Pods come and go while their volumes fail to mount: the executor's
// entries (what /debug/operations lists and the pending-operations metric
// counts) are those of pods still there, not one per pod that ever was.
func TestExecutorForgetsKeysOfGonePods(t *testing.T) {
	clk := clock.RealClock{}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	exec := operations.NewExecutor(operations.ExecutorOptions{MaxConcurrent: 4})
	r := New(Options{DSW: dsw, ASW: asw, Executor: exec, Handler: failingHandler{}, Clock: clk})
	const churn = 50
	most := 0
	for i := range churn {
		uid := types.UID(fmt.Sprintf("pod-%d", i))
		name := volume.PodScopedName(emptydir.Name, uid, "scratch")
		dsw.SetPod(volume.PodInfo{PodRef: rcRef(uid)}, []cache.PodVolume{
			{Name: name, Plugin: emptydir.Name, OuterName: "scratch", Spec: emptyDirSpec("scratch", v1.StorageMediumDefault)},
		}, nil, nil)
		r.ReconcileOnce()
		if err := exec.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if exec.LastError(operations.Key{Volume: name, Pod: uid}) == nil {
			t.Fatalf("pod %s: its mount did not fail", uid)
		}
		dsw.DeletePod(uid)
		r.ReconcileOnce()
		most = max(most, len(exec.Status()))
	}
	if most > 1 {
		t.Errorf("the executor held up to %d entries with at most one pod on the node (%d pods came and went)", most, churn)
	}
	if st := exec.Status(); len(st) != 0 {
		t.Errorf("entries of gone pods remain: %+v", st)
	}
}

// slowPassExecutor makes every pass look slow (it steps the fake clock
// while the pass asks it what may start) and counts the passes.
type slowPassExecutor struct {
	fakeExecutor
	clk    *clocktesting.FakeClock
	passes atomic.Int32
	idle   chan struct{}
}

func (e *slowPassExecutor) Startable(cands []operations.Candidate, mark uint64) []bool {
	e.clk.Step(time.Second)
	e.passes.Add(1)
	return make([]bool, len(cands))
}

func (e *slowPassExecutor) Idle() <-chan struct{} { return e.idle }

// A pass that took long spaces the next one by twice as much, to leave the
// CPU to running operations; with none running there is nothing to wait
// for, and the next pass comes after MinInterval.
func TestReconcilerPassNotSpacedWhenExecutorIdle(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	idle := make(chan struct{})
	close(idle)
	exec := &slowPassExecutor{clk: clk, idle: idle}
	r := New(Options{DSW: dsw, ASW: asw, Executor: exec, Handler: &opHandler{}, Clock: clk, MinInterval: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(10 * time.Second)
	for exec.passes.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no first pass")
		}
		time.Sleep(100 * time.Microsecond)
	}
	r.Trigger()
	// The last pass took 1 s, so without the executor's idleness the next
	// one would wait 2 s of clock time.
	stepped := time.Duration(0)
	for exec.passes.Load() < 2 {
		if stepped >= time.Second || time.Now().After(deadline) {
			t.Fatalf("no second pass after %v of clock time with the executor idle", stepped)
		}
		time.Sleep(100 * time.Microsecond)
		clk.Step(time.Millisecond)
		stepped += time.Millisecond
	}
}

// countingExecutor counts passes (each asks Startable once) and starts
// nothing.
type countingExecutor struct {
	fakeExecutor
	passes atomic.Int32
}

func (e *countingExecutor) Startable(cands []operations.Candidate, _ uint64) []bool {
	e.passes.Add(1)
	return make([]bool, len(cands))
}

// afterRecordingClock is a fake clock that reports every After it is asked
// for, so a test knows when the reconciler waits and for how long.
type afterRecordingClock struct {
	*clocktesting.FakeClock
	waits chan time.Duration
}

func (c *afterRecordingClock) After(d time.Duration) <-chan time.Time {
	ch := c.FakeClock.After(d)
	c.waits <- d
	return ch
}

func waitPasses(t *testing.T, e *countingExecutor, n int32, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.passes.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d passes, want %d", what, e.passes.Load(), n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// Passes start at least MinInterval apart, but a trigger after a quiet
// spell starts one without waiting: a pod created on an idle node is
// planned at once.
func TestReconcilerMinIntervalFromLastPass(t *testing.T) {
	clk := &afterRecordingClock{FakeClock: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), waits: make(chan time.Duration, 16)}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	exec := &countingExecutor{}
	r := New(Options{DSW: dsw, ASW: asw, Executor: exec, Handler: &opHandler{}, Clock: clk, MinInterval: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitPasses(t, exec, 1, "first pass")

	// Right after a pass: the next waits out MinInterval on the clock.
	r.Trigger()
	select {
	case d := <-clk.waits:
		if d != 5*time.Millisecond {
			t.Fatalf("waited %v after a pass that took no time, want 5ms", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a trigger right after a pass did not wait MinInterval")
	}
	if n := exec.passes.Load(); n != 1 {
		t.Fatalf("%d passes before MinInterval passed, want 1", n)
	}
	clk.Step(5 * time.Millisecond)
	waitPasses(t, exec, 2, "pass after MinInterval")

	// After a quiet spell longer than MinInterval: at once, no wait.
	clk.Step(time.Second)
	r.Trigger()
	waitPasses(t, exec, 3, "pass after a quiet spell, with the clock standing still")
	select {
	case d := <-clk.waits:
		t.Fatalf("waited %v after a quiet spell", d)
	default:
	}
}

// changeRecorder is a ChangeObserver that keeps what it was told.
type changeRecorder struct {
	plain int
	chg   []Changed
}

func (c *changeRecorder) Reconciled(*cache.DesiredSnapshot, *cache.ActualSnapshot, []Action, time.Duration) {
	c.plain++
}

func (c *changeRecorder) ReconciledChanged(_ *cache.DesiredSnapshot, _ *cache.ActualSnapshot, _ []Action, _ time.Duration, chg Changed) {
	c.chg = append(c.chg, chg)
}

// A ChangeObserver is told, with each pass, the volumes the caches listed
// as changed since the last pass, or All (both on the first pass).
func TestReconcilerTellsChangeObserverWhatChanged(t *testing.T) {
	clk := clock.RealClock{}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	name := volume.PodScopedName(emptydir.Name, "p1", "scratch")
	spec := emptyDirSpec("scratch", v1.StorageMediumDefault)
	obs := &changeRecorder{}
	r := New(Options{DSW: dsw, ASW: asw, Executor: &fakeExecutor{}, Handler: &opHandler{}, Clock: clk, Observer: obs})
	steps := []struct {
		name          string
		change        func()
		all, inD, inA bool
	}{
		{"first pass", func() {}, true, false, false},
		{"nothing changed", func() {}, false, false, false},
		{"pod wants the volume", func() {
			dsw.SetPod(volume.PodInfo{PodRef: rcRef("p1")}, []cache.PodVolume{{Name: name, Plugin: emptydir.Name, OuterName: "scratch", Spec: spec}}, nil, nil)
		}, false, true, false},
		{"volume mounted", func() {
			asw.SetPodMount(cache.VolumeIdentity{Name: name, Plugin: emptydir.Name, Spec: spec}, cache.ActualPodMount{Pod: rcRef("p1"), State: cache.Mounted})
		}, false, false, true},
	}
	for i, s := range steps {
		s.change()
		r.ReconcileOnce()
		if len(obs.chg) != i+1 || obs.plain != 0 {
			t.Fatalf("%s: told of %d passes with changes and %d without, want %d and 0", s.name, len(obs.chg), obs.plain, i+1)
		}
		c := obs.chg[i]
		all := c.DSW.All && c.ASW.All
		if all != s.all || (!all && (c.DSW.Has(name) != s.inD || c.ASW.Has(name) != s.inA)) {
			t.Errorf("%s: told All %v, desired %v, actual %v; want %v, %v, %v", s.name, all, c.DSW.Has(name), c.ASW.Has(name), s.all, s.inD, s.inA)
		}
	}
}
