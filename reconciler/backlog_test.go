package reconciler

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
)

func TestBacklogWait(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name     string
		queued   int
		finished uint64
		over     time.Duration
		want     time.Duration
	}{
		{"nothing queued", 0, 100, 10 * ms, 0},
		{"nothing finished: no rate", 1000, 0, 10 * ms, 0},
		{"no time passed", 1000, 10, 0, 0},
		{"half the queue in 2 ms", 100, 100, 4 * ms, 2 * ms},
		{"a queue as long as what finished", 50, 50, 10 * ms, 5 * ms},
		{"a storm's queue: capped", 3000, 100, 10 * ms, maxBacklogWait},
		{"a long quiet spell, a big queue: capped", 1 << 30, 1, 24 * time.Hour, maxBacklogWait},
		{"a long quiet spell, a queue shorter than what finished", 10, 1 << 40, 24 * time.Hour, 24 * time.Hour / (2 << 40) * 10},
		{"just under the cap", 24, 1, 2 * ms, 24 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := backlogWait(tc.queued, tc.finished, tc.over); got != tc.want {
				t.Errorf("backlogWait(%d, %d, %v) = %v, want %v", tc.queued, tc.finished, tc.over, got, tc.want)
			}
		})
	}
}

// backlogExecutor has a queue of queued operations and finishes step
// more at every pass (each asks Startable once).
type backlogExecutor struct {
	countingExecutor
	queued   atomic.Int64
	finished atomic.Uint64
	step     uint64
}

func (e *backlogExecutor) Queued() int  { return int(e.queued.Load()) }
func (e *backlogExecutor) Mark() uint64 { return e.finished.Load() }
func (e *backlogExecutor) Startable(cands []operations.Candidate, mark uint64) []bool {
	e.finished.Add(e.step)
	return e.countingExecutor.Startable(cands, mark)
}

// While operations queue in the executor, the next pass waits for half
// the queue to drain at the rate they finish, up to maxBacklogWait; with
// no queue, only MinInterval.
func TestReconcilerWaitsOutBacklog(t *testing.T) {
	clk := &afterRecordingClock{FakeClock: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), waits: make(chan time.Duration, 16)}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	exec := &backlogExecutor{step: 10}
	exec.queued.Store(3000)
	r := New(Options{DSW: dsw, ASW: asw, Executor: exec, Handler: &opHandler{}, Clock: clk, MinInterval: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitPasses(t, &exec.countingExecutor, 1, "first pass")

	nextWait := func(what string) time.Duration {
		t.Helper()
		r.Trigger()
		select {
		case d := <-clk.waits:
			return d
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no wait", what)
			return 0
		}
	}
	// The first pass has no rate yet: MinInterval.
	if d := nextWait("after the first pass"); d != 5*time.Millisecond {
		t.Fatalf("waited %v after the first pass, want MinInterval", d)
	}
	clk.Step(5 * time.Millisecond)
	waitPasses(t, &exec.countingExecutor, 2, "second pass")
	// 10 finished in 5 ms and 3000 wait: the cap.
	if d := nextWait("with a queue"); d != maxBacklogWait {
		t.Fatalf("waited %v with 3000 queued, want %v", d, maxBacklogWait)
	}
	if n := exec.passes.Load(); n != 2 {
		t.Fatalf("%d passes before the backlog wait ended, want 2", n)
	}
	exec.queued.Store(0)
	clk.Step(maxBacklogWait)
	waitPasses(t, &exec.countingExecutor, 3, "pass after the backlog wait")
	// The queue is gone: MinInterval again.
	if d := nextWait("without a queue"); d != 5*time.Millisecond {
		t.Fatalf("waited %v with nothing queued, want MinInterval", d)
	}
}
