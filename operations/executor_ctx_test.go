package operations

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/volume"
)

// ctxOf hands an operation's context to the test.
func ctxOf(ch chan<- context.Context, body func(ctx context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error { ch <- ctx; return body(ctx) }
}

func afterFuncs(c *opContext) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.after)
}

type ctxView struct {
	err, cause error
	deadline   time.Time
	hasDL      bool
	done       bool
}

func view(ctx context.Context) ctxView {
	dl, ok := ctx.Deadline()
	v := ctxView{err: ctx.Err(), cause: context.Cause(ctx), deadline: dl, hasDL: ok}
	select {
	case <-ctx.Done():
		v.done = true
	default:
	}
	return v
}

// An opContext must look like the context.WithDeadline it replaces, to the
// operation and to every context derived from it, before and after its
// deadline: context.WithDeadline is the oracle.
func TestOpContextMatchesWithDeadline(t *testing.T) {
	type key struct{}
	tests := []struct {
		name string
		// derive makes the context the operation would use; viaAfterFunc
		// says it must register with the opContext (no goroutine).
		derive       func(context.Context) (context.Context, context.CancelFunc)
		viaAfterFunc bool
	}{
		{"itself", func(c context.Context) (context.Context, context.CancelFunc) { return c, func() {} }, false},
		{"WithCancel", context.WithCancel, true},
		{"WithTimeout longer than the deadline", func(c context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(c, time.Hour)
		}, true},
		{"WithCancelCause", func(c context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancelCause(c)
			return ctx, func() { cancel(nil) }
		}, true},
		// The context package finds no hook behind a value: it watches
		// with a goroutine, as it would for any parent of its own kind.
		{"WithValue then WithCancel", func(c context.Context) (context.Context, context.CancelFunc) {
			return context.WithCancel(context.WithValue(c, key{}, 1))
		}, false},
		{"WithoutCancel", func(c context.Context) (context.Context, context.CancelFunc) {
			return context.WithoutCancel(c), func() {}
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			deadline := time.Now().Add(20 * time.Millisecond)
			oracle, cancelOracle := context.WithDeadline(context.Background(), deadline)
			defer cancelOracle()
			oc := &opContext{deadline: deadline}
			defer oc.cancel(context.Canceled)
			want, cancelWant := tc.derive(oracle)
			defer cancelWant()
			got, cancelGot := tc.derive(oc)
			defer cancelGot()
			if w, g := view(want), view(got); w != g {
				t.Fatalf("before the deadline: got %+v, want %+v", g, w)
			}
			if n := afterFuncs(oc); (n == 1) != tc.viaAfterFunc {
				t.Fatalf("%d funcs registered with the opContext, want registration %v", n, tc.viaAfterFunc)
			}
			<-oracle.Done()
			oc.cancel(context.DeadlineExceeded)
			// A parent ends before its children do.
			for _, c := range []context.Context{want, got} {
				select {
				case <-c.Done(): // nil for WithoutCancel: never
				case <-time.After(100 * time.Millisecond):
				}
			}
			if w, g := view(want), view(got); w != g {
				t.Fatalf("after the deadline: got %+v, want %+v", g, w)
			}
			if n := afterFuncs(oc); n != 0 {
				t.Fatalf("%d funcs still registered once ended", n)
			}
		})
	}
}

// A derived context cancelled on its own unregisters; context.AfterFunc
// runs once the opContext ends, unless stopped.
func TestOpContextAfterFuncStop(t *testing.T) {
	oc := &opContext{deadline: time.Now().Add(time.Hour)}
	child, cancel := context.WithCancel(oc)
	if n := afterFuncs(oc); n != 1 {
		t.Fatalf("%d funcs registered, want the child's", n)
	}
	cancel()
	if n := afterFuncs(oc); n != 0 || !errors.Is(child.Err(), context.Canceled) {
		t.Fatalf("after the child's cancel: %d registered, child err %v", n, child.Err())
	}
	ran := make(chan struct{})
	context.AfterFunc(oc, func() { close(ran) })
	stop := context.AfterFunc(oc, func() { t.Error("a stopped AfterFunc ran") })
	if !stop() {
		t.Fatal("stop = false before the context ended")
	}
	oc.cancel(context.DeadlineExceeded)
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("AfterFunc did not run once the context ended")
	}
	if oc.cancel(context.Canceled); !errors.Is(oc.Err(), context.DeadlineExceeded) {
		t.Fatalf("a second cancel changed Err to %v", oc.Err())
	}
}

// An operation waiting on its context gets DeadlineExceeded when the clock
// reaches start+Timeout, not a nanosecond before, and Deadline says when.
func TestExecutorContextDeadline(t *testing.T) {
	const timeout = time.Minute
	e, clk, obs := newTestExecutor(t, ExecutorOptions{Timeout: timeout})
	start := clk.Now()
	ctxs := make(chan context.Context, 1)
	if err := e.Run(Key{Volume: "plugin/v"}, op(OpMountDevice, ctxOf(ctxs, func(ctx context.Context) error {
		<-ctx.Done()
		return context.Cause(ctx)
	}))); err != nil {
		t.Fatal(err)
	}
	ctx := <-ctxs
	if dl, ok := ctx.Deadline(); !ok || !dl.Equal(start.Add(timeout)) {
		t.Fatalf("Deadline() = %v, %v; want %v", dl, ok, start.Add(timeout))
	}
	waitUntil(t, clk.HasWaiters)
	clk.Step(timeout - time.Nanosecond)
	if err := ctx.Err(); err != nil {
		t.Fatalf("a nanosecond before the deadline: Err() = %v", err)
	}
	clk.Step(time.Nanosecond)
	if r := obs.wait(t); !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("operation finished with %v, want DeadlineExceeded", r.err)
	}
}

// A shorter timeout derived from the operation's context fires on its own
// (the fake clock never moves here), leaving the operation's context be.
func TestExecutorContextShorterChildTimeout(t *testing.T) {
	// The child's deadline is real time: the fake clock starts now so the
	// operation's deadline is not already before it.
	e, _, obs := newTestExecutor(t, ExecutorOptions{Timeout: time.Minute, Clock: clocktesting.NewFakeClock(time.Now())})
	if err := e.Run(Key{Volume: "plugin/v"}, op(OpMountDevice, func(ctx context.Context) error {
		child, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		<-child.Done()
		if ctx.Err() != nil {
			return fmt.Errorf("the operation's context ended too: %w", ctx.Err())
		}
		return child.Err()
	})); err != nil {
		t.Fatal(err)
	}
	if r := obs.wait(t); !errors.Is(r.err, context.DeadlineExceeded) || r.err != context.DeadlineExceeded {
		t.Fatalf("operation finished with %v, want the child's DeadlineExceeded", r.err)
	}
}

// An operation that ignores its context gets DeadlineExceeded at its
// deadline all the same, and its worker is detached at its grace as before.
func TestExecutorContextIgnoredThenDetached(t *testing.T) {
	const timeout = time.Hour
	grace := timeout + timeout/10 + time.Second
	e, clk, obs := newTestExecutor(t, ExecutorOptions{MaxConcurrent: 1, Timeout: timeout})
	release := make(chan struct{})
	ctxs := make(chan context.Context, 1)
	if err := e.Run(Key{Volume: "plugin/stuck"}, op(OpMountDevice, ctxOf(ctxs, func(ctx context.Context) error {
		<-release
		return ctx.Err()
	}))); err != nil {
		t.Fatal(err)
	}
	ctx := <-ctxs
	states := func() []string { return statusLines(e.Status()) }
	waitUntil(t, clk.HasWaiters)
	clk.Step(timeout)
	waitUntil(t, func() bool { return ctx.Err() != nil })
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("at the deadline: Err() = %v", ctx.Err())
	}
	waitUntil(t, clk.HasWaiters) // the watch goes on for the grace
	clk.Step(grace - timeout - time.Nanosecond)
	if got := states(); !slices.Equal(got, []string{"plugin/stuck mount_device running"}) {
		t.Fatalf("a nanosecond before the grace ends: %q", got)
	}
	clk.Step(time.Nanosecond)
	waitUntil(t, func() bool { return e.workerCount() == 0 })
	if got := states(); !slices.Equal(got, []string{"plugin/stuck mount_device timedOut"}) {
		t.Fatalf("at the grace: %q", got)
	}
	close(release)
	if r := obs.wait(t); !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("operation finished with %v", r.err)
	}
}

// Operations started a second apart each end at their own deadline, in
// turn: the one watch wakes for each.
func TestExecutorContextEachAtItsDeadline(t *testing.T) {
	const n, timeout = 8, time.Minute
	e, clk, obs := newTestExecutor(t, ExecutorOptions{Timeout: timeout})
	ctxs := make([]context.Context, n)
	for i := range n {
		ch := make(chan context.Context, 1)
		key := Key{Volume: volume.UniqueName(fmt.Sprintf("plugin/v%d", i))}
		if err := e.Run(key, op(OpMountDevice, ctxOf(ch, func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		}))); err != nil {
			t.Fatal(err)
		}
		ctxs[i] = <-ch
		if i < n-1 {
			clk.Step(time.Second)
		}
	}
	// The clock is at the last one's start: the first is due in
	// timeout-(n-1)s, then one a second.
	for i := range n {
		waitUntil(t, clk.HasWaiters)
		if i == 0 {
			clk.Step(timeout - (n-1)*time.Second)
		} else {
			clk.Step(time.Second)
		}
		r := obs.wait(t)
		if want := volume.UniqueName(fmt.Sprintf("plugin/v%d", i)); r.key.Volume != want || !errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("step %d: %v finished with %v, want %s with DeadlineExceeded", i, r.key, r.err, want)
		}
		for j := i + 1; j < n; j++ {
			if err := ctxs[j].Err(); err != nil {
				t.Fatalf("step %d: operation %d ended early: %v", i, j, err)
			}
		}
	}
}

// Finished operations leave nothing behind: their contexts end (with
// everything derived from them), the executor keeps none, and the watch
// stops once nothing runs.
func TestExecutorContextReleased(t *testing.T) {
	const n = 200
	e, clk, obs := newTestExecutor(t, ExecutorOptions{Timeout: time.Minute})
	ctxs := make(chan context.Context, n)
	children := make(chan context.Context, n)
	for i := range n {
		key := Key{Volume: volume.UniqueName(fmt.Sprintf("plugin/v%d", i))}
		if err := e.Run(key, op(OpMountDevice, ctxOf(ctxs, func(ctx context.Context) error {
			// Not cancelled by the operation: its end must end it.
			child, cancel := context.WithCancel(ctx)
			children <- child
			t.Cleanup(cancel)
			return nil
		}))); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		obs.wait(t)
	}
	for range n {
		oc := (<-ctxs).(*opContext)
		if !errors.Is(oc.Err(), context.Canceled) || afterFuncs(oc) != 0 {
			t.Fatalf("a finished operation's context: Err() = %v, %d funcs registered", oc.Err(), afterFuncs(oc))
		}
		if child := <-children; !errors.Is(child.Err(), context.Canceled) {
			t.Fatalf("a context derived from a finished operation's: Err() = %v", child.Err())
		}
	}
	e.Startable(nil, e.Mark()) // forgets the finished keys
	e.mu.Lock()
	left := len(e.byVolume)
	e.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d volumes kept after every operation finished", left)
	}
	waitUntil(t, clk.HasWaiters)
	clk.Step(time.Minute)
	waitUntil(t, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return !e.watching && !clk.HasWaiters()
	})
}

// With a timeout shorter than the grace's margin, the watch may be armed
// for a stuck operation's grace when another starts: it is armed again for
// the new operation's earlier deadline, which ends on time.
func TestExecutorContextDeadlineBeforeArmedGrace(t *testing.T) {
	const timeout = 100 * time.Millisecond // grace: 1.11 s
	e, clk, obs := newTestExecutor(t, ExecutorOptions{Timeout: timeout})
	release := make(chan struct{})
	defer close(release)
	stuck := make(chan context.Context, 1)
	if err := e.Run(Key{Volume: "plugin/stuck"}, op(OpMountDevice, ctxOf(stuck, func(ctx context.Context) error {
		<-release
		return ctx.Err()
	}))); err != nil {
		t.Fatal(err)
	}
	stuckCtx := <-stuck
	waitUntil(t, clk.HasWaiters)
	clk.Step(timeout)
	waitUntil(t, func() bool { return stuckCtx.Err() != nil })
	waitUntil(t, clk.HasWaiters) // now armed for the stuck one's grace
	clk.Step(timeout)
	later := make(chan context.Context, 1)
	if err := e.Run(Key{Volume: "plugin/later"}, op(OpMountDevice, ctxOf(later, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	}))); err != nil {
		t.Fatal(err)
	}
	laterCtx := <-later
	clk.Step(timeout - time.Nanosecond)
	if err := laterCtx.Err(); err != nil {
		t.Fatalf("a nanosecond before its deadline: Err() = %v", err)
	}
	clk.Step(time.Nanosecond)
	if r := obs.wait(t); r.key.Volume != "plugin/later" || !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("%v finished with %v, want plugin/later with DeadlineExceeded at its deadline", r.key, r.err)
	}
}
