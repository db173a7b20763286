package burst

import (
	"runtime"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/internal/procs"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler"
)

// finished tells m an operation finished.
func finished(m *Trimmer) { m.OperationFinished(operations.Key{}, nil, 0, nil, 0) }

func TestMemoryTrimmer(t *testing.T) {
	// free waits for a release per call, so a trim, once started, holds
	// m.trimming until the test lets it finish: right after a pass,
	// m.trimming says whether that pass started one, with no race against
	// the trimming goroutine.
	freed := make(chan struct{}, 10)
	release := make(chan struct{})
	defer close(release)
	m := NewTrimmer(TrimmerOptions{Free: func() { freed <- struct{}{}; <-release }})
	busy := []reconciler.Action{{Op: operations.OpMountVolume}}

	for range m.opts.Burst - 1 {
		finished(m)
	}
	m.Reconciled(nil, nil, nil, 0)
	finished(m)
	m.Reconciled(nil, nil, busy, 0)
	if m.trimming.Load() {
		t.Fatal("trimmed after a small burst or while work was planned")
	}
	m.Reconciled(nil, nil, nil, 0)
	if !m.trimming.Load() {
		t.Fatal("not trimmed once steady after a burst")
	}
	select {
	case <-freed:
	case <-time.After(10 * time.Second):
		t.Fatal("the trim did not free memory")
	}
	release <- struct{}{}
	// The count starts again: a steady pass after the trim trims nothing.
	m.Wait()
	m.Reconciled(nil, nil, nil, 0)
	if m.trimming.Load() {
		t.Fatal("trimmed twice for one burst")
	}
}

// A pass that plans a burst of unmounts adds the spare Ps; one that plans
// nothing takes them back; a few unmounts, or mounts however many, change
// nothing.
func TestBurstProcs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "")
	b := NewProcs(procs.New(), 0)
	t.Cleanup(b.tuning.Steady)
	base := runtime.GOMAXPROCS(0)
	actions := func(n int, op operations.Op) []reconciler.Action {
		out := make([]reconciler.Action, n)
		for i := range out {
			out[i].Op = op
		}
		return out
	}
	for _, step := range []struct {
		name    string
		actions []reconciler.Action
		want    int
	}{
		{"a few unmounts", actions(b.unmounts-1, operations.OpUnmountVolume), base},
		{"many mounts", actions(10*b.unmounts, operations.OpMountVolume), base},
		{"many unmounts", actions(b.unmounts, operations.OpUnmountVolume), base + procs.Spare},
		{"one mount", actions(1, operations.OpMountVolume), base + procs.Spare},
		{"nothing", nil, base},
		{"many unmaps", actions(b.unmounts, operations.OpUnmapVolume), base + procs.Spare},
		{"nothing again", nil, base},
	} {
		b.Reconciled(nil, nil, step.actions, 0)
		if got := runtime.GOMAXPROCS(0); got != step.want {
			t.Fatalf("after a pass of %s: GOMAXPROCS %d, want %d", step.name, got, step.want)
		}
	}
}

// Some operations, then a steady node: their memory is returned once no
// operation has finished for the settling time, not before, and not if
// more finish meanwhile (the trimmer then waits again by itself); a
// handful of operations arm nothing.
func TestMemoryTrimmerSettles(t *testing.T) {
	freed := make(chan struct{}, 10)
	clk := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	m := NewTrimmer(TrimmerOptions{Free: func() { freed <- struct{}{} }, Clock: clk})
	trimmed := func() bool {
		m.running.Wait()
		select {
		case <-freed:
			return true
		default:
			return false
		}
	}
	waitForTimer := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("no settling timer armed")
			}
			time.Sleep(time.Millisecond) // polling the fake clock's waiters
		}
	}

	// Fewer than SettleMin operations: nothing, not even a timer.
	for range m.opts.SettleMin - 1 {
		finished(m)
	}
	m.Reconciled(nil, nil, nil, 0)
	if clk.HasWaiters() {
		t.Fatalf("settling timer armed after %d operations", m.opts.SettleMin-1)
	}
	finished(m)
	m.Reconciled(nil, nil, nil, 0)
	if trimmed() {
		t.Fatal("trimmed at once after a few operations")
	}
	waitForTimer()
	// More work finishes before the node settled, and no steady pass
	// follows (the last pass of a slow burst came before it): the
	// trimmer waits again by itself.
	// (The fake clock runs a timer's function within Step; what it starts
	// runs in m.running, which trimmed waits for.)
	finished(m)
	clk.Step(m.opts.Settle)
	if trimmed() {
		t.Fatal("trimmed although an operation finished while settling")
	}
	waitForTimer()
	clk.Step(m.opts.Settle - time.Millisecond)
	if trimmed() {
		t.Fatal("trimmed before the settling time")
	}
	clk.Step(time.Millisecond)
	if !trimmed() {
		t.Fatal("not trimmed once settled")
	}
	// Nothing since: a steady pass arms nothing.
	m.Reconciled(nil, nil, nil, 0)
	if clk.HasWaiters() {
		t.Fatal("settling timer armed with no operation since the trim")
	}

	// Stopping drops a pending timer.
	for range m.opts.SettleMin {
		finished(m)
	}
	m.Reconciled(nil, nil, nil, 0)
	waitForTimer()
	m.Wait()
	clk.Step(m.opts.Settle)
	if trimmed() || clk.HasWaiters() {
		t.Fatal("trimmed after the agent stopped")
	}
}
