package operations

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/volume"
)

// finished collects OperationFinished calls so tests can wait for them
// without sleeping.
type finished struct {
	ch chan result
}

type result struct {
	key     Key
	name    Op
	err     error
	retryIn time.Duration
}

func newFinished() *finished { return &finished{ch: make(chan result, 100)} }

func (f *finished) OperationFinished(key Key, op *Operation, _ time.Duration, err error, retryIn time.Duration) {
	f.ch <- result{key, op.Name, err, retryIn}
}

func (f *finished) wait(t *testing.T) result {
	t.Helper()
	select {
	case r := <-f.ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("operation did not finish within 10s")
		return result{}
	}
}

func newTestExecutor(t *testing.T, opts ExecutorOptions) (*Executor, *clocktesting.FakeClock, *finished) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	obs := newFinished()
	if opts.Clock == nil {
		opts.Clock = clk
	}
	opts.Observer = obs
	return NewExecutor(opts), clk, obs
}

func op(name Op, fn func(context.Context) error) *Operation {
	return &Operation{Name: name, Target: Target{Plugin: "test"}, Fn: fn}
}

func noop(context.Context) error { return nil }

var errBoom = errors.New("boom")

func failing(context.Context) error { return errBoom }

// blocking returns an operation body that runs until release is closed.
func blocking(release <-chan struct{}) func(context.Context) error {
	return func(context.Context) error { <-release; return nil }
}

func TestExecutorConflicts(t *testing.T) {
	const v1, v2 = volume.UniqueName("plugin/v1"), volume.UniqueName("plugin/v2")
	tests := []struct {
		name          string
		first, second Key
		wantConflict  bool
	}{
		{"volume then same volume", Key{v1, ""}, Key{v1, ""}, true},
		{"volume then volume+pod", Key{v1, ""}, Key{v1, "p1"}, true},
		{"volume+pod then volume", Key{v1, "p1"}, Key{v1, ""}, true},
		{"volume+pod then same volume+pod", Key{v1, "p1"}, Key{v1, "p1"}, true},
		{"volume+pod then volume+other pod", Key{v1, "p1"}, Key{v1, "p2"}, false},
		{"volume then other volume", Key{v1, ""}, Key{v2, ""}, false},
		{"volume+pod then other volume+same pod", Key{v1, "p1"}, Key{v2, "p1"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, _, obs := newTestExecutor(t, ExecutorOptions{})
			release := make(chan struct{})
			if err := e.Run(tc.first, op("first", blocking(release))); err != nil {
				t.Fatalf("first Run: %v", err)
			}
			// The second operation blocks too: started, it must still be
			// running when IsPending is asked below.
			err := e.Run(tc.second, op("second", blocking(release)))
			if tc.wantConflict {
				if !errors.Is(err, ErrAlreadyExists) || !IsExpected(err) {
					t.Fatalf("second Run = %v, want ErrAlreadyExists", err)
				}
			} else if err != nil {
				t.Fatalf("second Run = %v, want nil", err)
			}
			if !e.IsPending(tc.second) {
				t.Errorf("IsPending(%v) = false while the first operation runs", tc.second)
			}
			close(release)
			obs.wait(t)
			if !tc.wantConflict {
				obs.wait(t)
			}
			// Once the first finished, the second key is free again.
			if err := e.Run(tc.second, op("second", noop)); err != nil {
				t.Fatalf("Run after completion = %v, want nil", err)
			}
			obs.wait(t)
		})
	}
}

func TestExecutorBackoff(t *testing.T) {
	key := Key{"plugin/v", "pod"}
	e, clk, obs := newTestExecutor(t, ExecutorOptions{InitialBackoff: 500 * time.Millisecond, MaxBackoff: 2 * time.Second})

	wantDelays := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second}
	for i, want := range wantDelays {
		if err := e.Run(key, op("mount", failing)); err != nil {
			t.Fatalf("attempt %d: Run = %v", i, err)
		}
		r := obs.wait(t)
		if !errors.Is(r.err, errBoom) || r.retryIn != want {
			t.Fatalf("attempt %d: finished with (%v, retry in %v), want (boom, %v)", i, r.err, r.retryIn, want)
		}
		var b *BackoffError
		if err := e.Run(key, op("mount", failing)); !errors.As(err, &b) || !IsExpected(err) {
			t.Fatalf("attempt %d: Run during backoff = %v, want *BackoffError", i, err)
		}
		if !errors.Is(b.LastErr, errBoom) {
			t.Errorf("BackoffError.LastErr = %v", b.LastErr)
		}
		clk.Step(want - time.Millisecond)
		if err := e.Run(key, op("mount", failing)); !errors.As(err, &b) {
			t.Fatalf("attempt %d: Run 1ms before retry = %v, want *BackoffError", i, err)
		}
		clk.Step(time.Millisecond)
	}

	// Success resets the backoff: the next failure waits the initial delay.
	if err := e.Run(key, op("mount", noop)); err != nil {
		t.Fatal(err)
	}
	obs.wait(t)
	if err := e.Run(key, op("mount", failing)); err != nil {
		t.Fatal(err)
	}
	if r := obs.wait(t); r.retryIn != 500*time.Millisecond {
		t.Fatalf("after success, retry in %v, want 500ms", r.retryIn)
	}
}

func TestExecutorBackoffResetByOtherOperation(t *testing.T) {
	key := Key{"plugin/v", "pod"}
	e, _, obs := newTestExecutor(t, ExecutorOptions{})
	if err := e.Run(key, op("mount_volume", failing)); err != nil {
		t.Fatal(err)
	}
	obs.wait(t)
	if err := e.Run(key, op("mount_volume", noop)); !IsExpected(err) {
		t.Fatalf("same operation during backoff = %v, want backoff", err)
	}
	// A different operation on the key is not held back by mount's backoff.
	if err := e.Run(key, op("unmount_volume", failing)); err != nil {
		t.Fatalf("different operation during backoff = %v, want nil", err)
	}
	if r := obs.wait(t); r.retryIn != 500*time.Millisecond {
		t.Fatalf("backoff of the new operation = %v, want a fresh 500ms", r.retryIn)
	}
}

func TestExecutorResetBackoff(t *testing.T) {
	key := Key{"plugin/v", ""}
	e, _, obs := newTestExecutor(t, ExecutorOptions{})
	if err := e.Run(key, op("mount_device", failing)); err != nil {
		t.Fatal(err)
	}
	obs.wait(t)
	if err := e.Run(key, op("mount_device", noop)); !IsExpected(err) {
		t.Fatalf("Run during backoff = %v", err)
	}
	e.ResetBackoff(key.Volume)
	if err := e.Run(key, op("mount_device", noop)); err != nil {
		t.Fatalf("Run after ResetBackoff = %v", err)
	}
	obs.wait(t)
}

// TestExecutorBackoffPerGeneration: a failed set up's backoff holds back
// retries of the same content generation only; a newer one (its sources
// changed again) starts at once, and Startable agrees with Run.
func TestExecutorBackoffPerGeneration(t *testing.T) {
	key := Key{"plugin/v", "p1"}
	e, _, obs := newTestExecutor(t, ExecutorOptions{})
	withGen := func(fn func(context.Context) error, gen uint64) *Operation {
		o := op("mount_volume", fn)
		o.ContentGeneration = gen
		return o
	}
	if err := e.Run(key, withGen(failing, 3)); err != nil {
		t.Fatal(err)
	}
	obs.wait(t)
	for _, tc := range []struct {
		gen  uint64
		want bool
	}{{3, false}, {4, true}} {
		got := e.Startable([]Candidate{{Key: key, Name: "mount_volume", Generation: tc.gen}}, e.Mark())[0]
		if got != tc.want {
			t.Errorf("generation %d: Startable = %v, want %v", tc.gen, got, tc.want)
		}
	}
	if err := e.Run(key, withGen(noop, 3)); !IsExpected(err) {
		t.Fatalf("retry of the failed generation during backoff = %v, want a backoff error", err)
	}
	if err := e.Run(key, withGen(failing, 4)); err != nil {
		t.Fatalf("a newer generation during backoff = %v, want started", err)
	}
	if r := obs.wait(t); r.retryIn != time.Second {
		t.Errorf("backoff after the newer generation failed too = %v, want the delay doubled to 1s", r.retryIn)
	}
}

func TestExecutorPanicIsFailure(t *testing.T) {
	key := Key{"plugin/v", ""}
	e, _, obs := newTestExecutor(t, ExecutorOptions{})
	if err := e.Run(key, op("mount_device", func(context.Context) error { panic("oops") })); err != nil {
		t.Fatal(err)
	}
	if r := obs.wait(t); r.err == nil || r.retryIn == 0 {
		t.Fatalf("panicking operation finished with (%v, %v), want an error and backoff", r.err, r.retryIn)
	}
	if err := e.Run(key, op("mount_device", noop)); !IsExpected(err) {
		t.Fatalf("Run after panic = %v, want backoff", err)
	}
}

func TestExecutorStaleIsNotAFailure(t *testing.T) {
	key := Key{"plugin/v", ""}
	var changes atomic.Int32
	e, _, obs := newTestExecutor(t, ExecutorOptions{OnStateChange: func() { changes.Add(1) }})
	if err := e.Run(key, op("unmount_device", func(context.Context) error { return ErrStale })); err != nil {
		t.Fatal(err)
	}
	if r := obs.wait(t); r.retryIn != 0 {
		t.Fatalf("stale operation put the key in backoff for %v", r.retryIn)
	}
	if err := e.Run(key, op("unmount_device", noop)); err != nil {
		t.Fatalf("Run after stale = %v, want nil", err)
	}
	obs.wait(t)
	if changes.Load() < 1 {
		t.Error("OnStateChange was not called")
	}
}

func TestExecutorPendingFirst(t *testing.T) {
	// Failed entries for pod1 and pod2 and a running one for pod3: a
	// volume-wide operation must see the running one, not reuse a failed one.
	const v = volume.UniqueName("plugin/v")
	e, _, obs := newTestExecutor(t, ExecutorOptions{})
	for _, p := range []string{"pod1", "pod2"} {
		if err := e.Run(Key{v, types.UID(p)}, op("unmount_volume", failing)); err != nil {
			t.Fatal(err)
		}
		obs.wait(t)
	}
	release := make(chan struct{})
	if err := e.Run(Key{v, "pod3"}, op("unmount_volume", blocking(release))); err != nil {
		t.Fatal(err)
	}
	if err := e.Run(Key{v, ""}, op("mount_device", noop)); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("volume-wide Run = %v, want ErrAlreadyExists", err)
	}
	close(release)
	obs.wait(t)
}

// TestExecutorExactMatchReused: a key's own failed entry decides its
// backoff even when an entry of the whole volume comes first, and success
// removes that entry and no other.
func TestExecutorExactMatchReused(t *testing.T) {
	const v = volume.UniqueName("plugin/v")
	e, clk, obs := newTestExecutor(t, ExecutorOptions{})
	for _, p := range []types.UID{"pod1", "pod2", "pod3"} {
		if err := e.Run(Key{v, p}, podOp(OpUnmountVolume, p, failing)); err != nil {
			t.Fatal(err)
		}
		obs.wait(t)
	}
	// A different operation on the whole volume carries on the first
	// failed entry (pod1's), which now comes first for every key.
	if err := e.Run(Key{v, ""}, op(OpMountDevice, failing)); err != nil {
		t.Fatalf("volume-wide Run = %v", err)
	}
	obs.wait(t)
	if got, want := statusLines(e.Status()), []string{
		"plugin/v mount_device backoff",
		"plugin/v/pod2 unmount_volume backoff",
		"plugin/v/pod3 unmount_volume backoff",
	}; !slices.Equal(got, want) {
		t.Fatalf("status = %q, want %q", got, want)
	}
	// pod2's own entry (unmount_volume, in backoff) decides, not the
	// volume's (another operation) that comes first.
	var b *BackoffError
	if err := e.Run(Key{v, "pod2"}, podOp(OpUnmountVolume, "pod2", noop)); !errors.As(err, &b) {
		t.Fatalf("pod2 retry during its backoff = %v, want *BackoffError", err)
	}
	clk.Step(time.Second)
	if err := e.Run(Key{v, "pod2"}, podOp(OpUnmountVolume, "pod2", noop)); err != nil {
		t.Fatalf("pod2 retry = %v", err)
	}
	if r := obs.wait(t); r.err != nil || r.key != (Key{v, "pod2"}) {
		t.Fatalf("finished %v with %v, want pod2's retry to succeed", r.key, r.err)
	}
	if got, want := statusLines(e.Status()), []string{
		"plugin/v mount_device backoff",
		"plugin/v/pod3 unmount_volume backoff",
	}; !slices.Equal(got, want) {
		t.Errorf("after pod2's success, status = %q, want %q", got, want)
	}
	if err := e.LastError(Key{v, ""}); !errors.Is(err, errBoom) {
		t.Errorf("the volume's failure was lost: LastError = %v", err)
	}
}

// podOp is an operation for one pod (Status shows its pod).
func podOp(name Op, pod types.UID, fn func(context.Context) error) *Operation {
	o := op(name, fn)
	o.Pod.UID = pod
	return o
}

// statusLines summarises Status as "volume[/pod] operation state".
func statusLines(st []OperationStatus) []string {
	var out []string
	for _, s := range st {
		key := string(s.Volume)
		if s.Pod != nil {
			key += "/" + string(s.Pod.UID)
		}
		out = append(out, key+" "+s.Operation+" "+s.State)
	}
	return out
}

func TestExecutorBoundedConcurrency(t *testing.T) {
	const limit, total = 2, 6
	e, _, obs := newTestExecutor(t, ExecutorOptions{MaxConcurrent: limit})
	var running, peak atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, total)
	for i := 0; i < total; i++ {
		key := Key{volume.UniqueName("plugin/v" + string(rune('a'+i))), ""}
		err := e.Run(key, op("mount_device", func(context.Context) error {
			n := running.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			started <- struct{}{}
			<-release
			running.Add(-1)
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := e.workerCount(); n != limit {
		t.Errorf("%d workers for %d operations, want the limit %d", n, total, limit)
	}
	for i := 0; i < limit; i++ {
		<-started
	}
	queued := 0
	for _, s := range e.Status() {
		if s.State == "queued" {
			queued++
		}
	}
	if queued != total-limit {
		t.Errorf("%d operations queued, want %d", queued, total-limit)
	}
	close(release)
	for i := 0; i < total; i++ {
		obs.wait(t)
	}
	if p := peak.Load(); p > limit {
		t.Fatalf("%d operations ran at once, limit %d", p, limit)
	}
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestExecutorTimeout(t *testing.T) {
	key := Key{"plugin/v", "pod"}
	obs := newFinished()
	e := NewExecutor(ExecutorOptions{Timeout: 50 * time.Millisecond, Observer: obs})
	if err := e.Run(key, op("mount_volume", func(ctx context.Context) error {
		<-ctx.Done()
		return volume.Uncertain(ctx.Err())
	})); err != nil {
		t.Fatal(err)
	}
	r := obs.wait(t)
	if !errors.Is(r.err, context.DeadlineExceeded) || !volume.IsUncertain(r.err) {
		t.Fatalf("operation finished with %v, want an uncertain deadline error", r.err)
	}
}

func TestExecutorStatusAndWait(t *testing.T) {
	e, _, obs := newTestExecutor(t, ExecutorOptions{})
	release := make(chan struct{})
	pod := volume.PodRef{UID: "pod", Namespace: "ns", Name: "p"}
	if err := e.Run(Key{"plugin/a", "pod"}, &Operation{Name: "mount_volume", Target: Target{Plugin: "test", Pod: volume.PodInfo{PodRef: pod}}, Fn: blocking(release)}); err != nil {
		t.Fatal(err)
	}
	if err := e.Run(Key{"plugin/b", ""}, op("mount_device", failing)); err != nil {
		t.Fatal(err)
	}
	obs.wait(t)
	waitUntil(t, func() bool {
		st := e.Status()
		return len(st) == 2 && st[0].State == "running"
	})
	st := e.Status()
	if st[0].Volume != "plugin/a" || st[0].Pod == nil || *st[0].Pod != pod {
		t.Errorf("status[0] = %+v", st[0])
	}
	if st[1].State != "backoff" || st[1].LastError != "boom" || st[1].RetryAt == nil || st[1].Waiting {
		t.Errorf("status[1] = %+v", st[1])
	}
	// A normal wait says so.
	if err := e.Run(Key{"plugin/c", ""}, op("verify_attached", func(context.Context) error {
		return fmt.Errorf("attach: %w", volume.Waitingf("waiting for the controller"))
	})); err != nil {
		t.Fatal(err)
	}
	obs.wait(t)
	if st := e.Status(); len(st) != 3 || st[2].Volume != "plugin/c" || !st[2].Waiting || st[2].LastError != "attach: waiting for the controller" {
		t.Errorf("status = %+v, want plugin/c waiting", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := e.Wait(ctx); err == nil {
		t.Fatal("Wait returned nil while an operation runs")
	}
	close(release)
	obs.wait(t)
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// workerCount is how many workers serve the queue.
func (e *Executor) workerCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.workers
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestExecutorStuckOperationDoesNotStarveOthers(t *testing.T) {
	// One worker, an operation that ignores its context and never returns
	// on its own: after its timeout and grace period another worker must
	// serve the queue, while the stuck key stays pending.
	e, clk, obs := newTestExecutor(t, ExecutorOptions{MaxConcurrent: 1, Timeout: time.Hour})
	release := make(chan struct{})
	started := make(chan struct{})
	stuck := Key{"plugin/stuck", ""}
	if err := e.Run(stuck, op("mount_device", func(context.Context) error { close(started); <-release; return nil })); err != nil {
		t.Fatal(err)
	}
	<-started
	other := Key{"plugin/other", ""}
	if err := e.Run(other, op("mount_device", noop)); err != nil {
		t.Fatal(err)
	}
	// The only worker is busy: the operation waits in the queue, and no
	// other worker was started for it (Run decides that before it returns,
	// so this needs no waiting).
	if n := e.workerCount(); n != 1 {
		t.Fatalf("%d workers with MaxConcurrent 1", n)
	}
	if got := statusLines(e.Status()); !slices.Equal(got, []string{"plugin/other mount_device queued", "plugin/stuck mount_device running"}) {
		t.Fatalf("status = %q, want other queued behind stuck", got)
	}
	waitUntil(t, func() bool { return clk.HasWaiters() })
	clk.Step(2 * time.Hour)
	if r := obs.wait(t); r.key != other {
		t.Fatalf("finished %v, want %v", r.key, other)
	}
	if !e.IsPending(stuck) {
		t.Fatal("the stuck operation's key was released while it still runs")
	}
	st := e.Status()
	if len(st) != 1 || st[0].State != "timedOut" {
		t.Fatalf("status = %+v, want the stuck operation timedOut", st)
	}
	close(release)
	if r := obs.wait(t); r.key != stuck {
		t.Fatalf("finished %v, want %v", r.key, stuck)
	}
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Forget drops failed entries whose keys are not relevant any more, keeps
// the relevant ones (their backoff still holds) and never touches a
// running operation.
func TestExecutorForget(t *testing.T) {
	e, _, obs := newTestExecutor(t, ExecutorOptions{})
	gone, kept := Key{"plugin/v1", "gone-pod"}, Key{"plugin/v1", "kept-pod"}
	runningKey := Key{"plugin/v2", "gone-too"}
	for _, k := range []Key{gone, kept} {
		if err := e.Run(k, op(OpMountVolume, failing)); err != nil {
			t.Fatal(err)
		}
		obs.wait(t)
	}
	release := make(chan struct{})
	if err := e.Run(runningKey, op(OpMountVolume, blocking(release))); err != nil {
		t.Fatal(err)
	}
	relevant := func(k Key) bool { return k == kept }
	if n := e.Forget(relevant); n != 1 {
		t.Errorf("Forget dropped %d entries, want 1", n)
	}
	if st := e.Status(); len(st) != 2 {
		t.Errorf("entries %+v, want the relevant key's and the running one", st)
	}
	if e.LastError(kept) == nil {
		t.Error("the relevant key lost its backoff")
	}
	if e.LastError(gone) != nil {
		t.Error("the gone key is still in backoff")
	}
	if !e.IsPending(runningKey) {
		t.Error("the running operation was forgotten")
	}
	close(release)
	obs.wait(t)
}

func TestExecutorIdle(t *testing.T) {
	e, _, obs := newTestExecutor(t, ExecutorOptions{})
	isClosed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	if !isClosed(e.Idle()) {
		t.Fatal("Idle not closed before any operation")
	}
	release := make(chan struct{})
	if err := e.Run(Key{"plugin/a", ""}, op("mount_device", blocking(release))); err != nil {
		t.Fatal(err)
	}
	idle := e.Idle()
	if isClosed(idle) {
		t.Fatal("Idle closed while an operation runs")
	}
	// A second operation finishing first does not make the executor idle.
	if err := e.Run(Key{"plugin/b", ""}, op("mount_device", noop)); err != nil {
		t.Fatal(err)
	}
	obs.wait(t)
	if isClosed(idle) || isClosed(e.Idle()) {
		t.Fatal("Idle closed while an operation still runs")
	}
	close(release)
	obs.wait(t)
	select {
	case <-idle:
	case <-time.After(10 * time.Second):
		t.Fatal("Idle not closed once the last operation finished")
	}
	if !isClosed(e.Idle()) {
		t.Fatal("Idle not closed after all finished")
	}
}

// One watch serves every running operation: each stuck one is detached
// once it has had its own grace (timeout + 10% + 1s), not before, however
// late after the first it started.
func TestExecutorWatchDetachesEachStuckOperationInTurn(t *testing.T) {
	e, clk, _ := newTestExecutor(t, ExecutorOptions{MaxConcurrent: 2, Timeout: time.Hour})
	grace := time.Hour + 6*time.Minute + time.Second
	release := make(chan struct{})
	defer close(release)
	run := func(name volume.UniqueName) {
		t.Helper()
		started := make(chan struct{})
		if err := e.Run(Key{Volume: name}, op(OpMountDevice, func(context.Context) error { close(started); <-release; return nil })); err != nil {
			t.Fatal(err)
		}
		<-started
	}
	run("plugin/first")
	waitUntil(t, clk.HasWaiters)
	clk.Step(30 * time.Minute)
	run("plugin/second") // starts 30 minutes after the first
	states := func() []string { return statusLines(e.Status()) }

	clk.Step(grace - 30*time.Minute - time.Second)
	if got := states(); !slices.Equal(got, []string{"plugin/first mount_device running", "plugin/second mount_device running"}) {
		t.Fatalf("a second before the first one's grace ends: %q", got)
	}
	clk.Step(time.Second)
	waitUntil(t, func() bool { return e.workerCount() == 1 })
	if got := states(); !slices.Equal(got, []string{"plugin/first mount_device timedOut", "plugin/second mount_device running"}) {
		t.Fatalf("at the first one's grace: %q", got)
	}
	waitUntil(t, clk.HasWaiters) // the watch goes on for the second
	clk.Step(30*time.Minute - time.Second)
	if got := states(); got[1] != "plugin/second mount_device running" {
		t.Fatalf("a second before the second one's grace ends: %q", got)
	}
	clk.Step(time.Second)
	waitUntil(t, func() bool { return e.workerCount() == 0 })
	if got := states(); got[1] != "plugin/second mount_device timedOut" {
		t.Fatalf("at the second one's grace: %q", got)
	}
}
