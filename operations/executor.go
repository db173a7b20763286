package operations

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/volume"
)

// Key identifies what an operation works on. Pod is empty for operations on
// the whole volume.
type Key struct {
	Volume volume.UniqueName
	Pod    types.UID
}

// Operation is one attempt at changing the node's state.
type Operation struct {
	// Name is the operation kind, used for backoff bookkeeping (a
	// different name resets the backoff) and metrics.
	Name Op
	// Target is what it works on; observers report from it (its Spec may
	// be nil).
	Target
	// Fn does the work. It must be idempotent and honour ctx.
	Fn func(ctx context.Context) error
	// body and operator do it instead for an operation of a kind
	// (Operator.Operation): a closure over them cost every operation an
	// allocation.
	body     func(*Operator, context.Context, *Target) error
	operator *Operator
}

// run does the operation's work.
func (op *Operation) run(ctx context.Context) error {
	if op.body != nil {
		return op.body(op.operator, ctx, &op.Target)
	}
	return op.Fn(ctx)
}

// ErrAlreadyExists is returned by Run when a conflicting operation is running.
var ErrAlreadyExists = errors.New("an operation on this volume is already running")

// BackoffError is returned by Run when the key failed recently.
type BackoffError struct {
	RetryAt time.Time
	LastErr error
}

func (e *BackoffError) Error() string {
	return fmt.Sprintf("in backoff until %s after: %v", e.RetryAt.Format(time.RFC3339Nano), e.LastErr)
}

// IsExpected reports whether err from Run is an expected condition (a
// conflicting operation is running, or the key is in backoff): these are not
// failures and must not be logged as such.
func IsExpected(err error) bool {
	var b *BackoffError
	return errors.Is(err, ErrAlreadyExists) || errors.As(err, &b)
}

// ErrStale is returned by an operation body that found its precondition no
// longer holds (the plan it came from is out of date). Nothing was done, no
// backoff applies, and the reconciler simply plans again.
var ErrStale = errors.New("operation skipped: state changed since it was planned")

// Observer learns about finished operations (metrics, logs, events).
type Observer interface {
	OperationFinished(key Key, op *Operation, took time.Duration, err error, retryIn time.Duration)
}

// ExecutorOptions configures an Executor. Zero values get defaults.
type ExecutorOptions struct {
	// MaxConcurrent bounds the operations running at once (default 64).
	MaxConcurrent int
	// Timeout bounds each operation (default 2m).
	Timeout time.Duration
	// InitialBackoff is the first delay after a failure (default 500ms);
	// it doubles up to MaxBackoff (default 2m2s).
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	Clock          clock.WithDelayedExecution
	Observer       Observer
	// OnStateChange is called after every operation finishes and when a
	// backoff expires: the moments a new plan or report may differ.
	OnStateChange func()
}

// Executor runs operations, at most one per (nested) key.
type Executor struct {
	opts ExecutorOptions

	mu       sync.Mutex
	byVolume map[volume.UniqueName]*volumeOps
	running  int
	// failed counts the entries kept for their backoff (not pending):
	// while there are none, Forget has nothing to look at.
	failed int
	idle   *sync.Cond
	// idleCh is closed while no operation runs (see Idle).
	idleCh chan struct{}
	// queue holds admitted operations waiting for a worker; workers is the
	// number of workers serving it. Workers are started on demand up to
	// MaxConcurrent and exit when the queue is empty, so thousands of
	// queued operations cost list entries, not goroutine stacks.
	queue   []*entry
	workers int
	// watching is true while the watch for the running operations is
	// armed (see wake), for watchAt; watchGen tells the armed watch from
	// one it replaced.
	watching bool
	watchAt  time.Time
	watchGen uint64

	// finished counts finished operations; recent lists those that
	// finished after the planner's last Mark, in the order they finished
	// (each volume's volumeOps.recent lists its own). A plan made from
	// snapshots taken before an operation finished does not know its
	// outcome: starting its key again from that plan would only find the
	// work done (ErrStale), as happened to a fifth of a mount storm's
	// operations when every pass took milliseconds. Kept in order, the
	// finished keys a mark forgets are a prefix: a pass costs what
	// finished since the last one, not a walk over every volume.
	finished uint64
	recent   []finishedKey
}

// volumeOps is a volume's bookkeeping: its entries, and its keys that
// finished after the planner's last Mark (oldest first). A volume with
// neither has none.
type volumeOps struct {
	entries []*entry
	recent  []finishedKey
	// The first entry and finished key fit in place: most volumes have
	// one key at a time, and a slice of their own cost an allocation each.
	entries1 [1]*entry
	recent1  [1]finishedKey
	// entry1 is the volume's first entry itself, used once (entry1Used):
	// a storm's volumes see one operation each while their bookkeeping
	// lasts, and an entry of its own cost each an allocation.
	entry1     entry
	entry1Used bool
}

func (v *volumeOps) empty() bool { return len(v.entries) == 0 && len(v.recent) == 0 }

// opsOf returns the volume's bookkeeping, made if it has none. e.mu must
// be held.
func (e *Executor) opsOf(name volume.UniqueName) *volumeOps {
	v := e.byVolume[name]
	if v == nil {
		v = &volumeOps{}
		v.entries, v.recent = v.entries1[:0], v.recent1[:0]
		e.byVolume[name] = v
	}
	return v
}

// entries returns the volume's entries. e.mu must be held.
func (e *Executor) entries(name volume.UniqueName) []*entry {
	if v := e.byVolume[name]; v != nil {
		return v.entries
	}
	return nil
}

// finishedKey is a key whose operation finished as the seq-th, and its
// volume's bookkeeping (which lists it, so is kept while it is listed): a
// pointer where a lookup by the volume's long name cost every finish.
type finishedKey struct {
	key Key
	seq uint64
	vol *volumeOps
}

// entry is a key's bookkeeping: a running operation, or the last failed one
// while its backoff lasts.
type entry struct {
	key Key
	// vol is the volume's bookkeeping, which holds the entry.
	vol     *volumeOps
	op      *Operation
	pending bool
	started time.Time
	// queued is true while a pending operation waits for a worker slot.
	queued bool
	// timedOut is true when the operation outlived its timeout and grace:
	// its worker slot is released (its worker is detached) but the key
	// stays pending until it returns.
	timedOut bool
	// ctx is the running operation's context until the watch passes it
	// its deadline or the operation finishes.
	ctx *opContext
	// ctx1 is the first operation's context, in place: most entries see
	// one operation (a success drops the entry), and one of its own cost
	// each an allocation. An entry kept for its backoff gives the next
	// one a new context (its deadline says it was used), so a context an
	// earlier operation leaked never comes back to life.
	ctx1 opContext

	lastErr     error
	lastErrTime time.Time
	delay       time.Duration
}

func (e *entry) retryAt() time.Time { return e.lastErrTime.Add(e.delay) }

// NewExecutor returns an Executor.
func NewExecutor(opts ExecutorOptions) *Executor {
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = 64
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Minute
	}
	if opts.InitialBackoff <= 0 {
		opts.InitialBackoff = 500 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 2*time.Minute + 2*time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.OnStateChange == nil {
		opts.OnStateChange = func() {}
	}
	e := &Executor{
		opts:     opts,
		byVolume: map[volume.UniqueName]*volumeOps{},
		idleCh:   make(chan struct{}),
	}
	close(e.idleCh)
	e.idle = sync.NewCond(&e.mu)
	return e
}

// matches reports whether an entry on the same volume conflicts with key.
func matches(a, b Key) bool { return a.Pod == "" || b.Pod == "" || a.Pod == b.Pod }

// admit decides whether an operation named name, writing content
// generation gen, may start on key now: not while a conflicting operation
// runs, nor while the key is in backoff after the same operation for the
// same generation failed (a newer generation is a new attempt; the delay
// still grows if it fails too). It returns the failed entry the operation
// carries on (its backoff grows on another failure), if any; when the
// operation may not start, that entry is the one in backoff, or nil when a
// conflicting operation runs. Run and Startable both decide through it.
// e.mu must be held.
func (e *Executor) admit(key Key, name Op, gen uint64, now time.Time) (reuse *entry, ok bool) {
	return admitIn(e.entries(key.Volume), key, name, gen, now)
}

// admitIn is admit over the volume's entries.
func admitIn(entries []*entry, key Key, name Op, gen uint64, now time.Time) (reuse *entry, ok bool) {
	for _, en := range entries {
		if !matches(en.key, key) {
			continue
		}
		if en.pending {
			return nil, false
		}
		// A failed entry: prefer the exact key, else the first match.
		if reuse == nil || (en.key == key && reuse.key != key) {
			reuse = en
		}
	}
	if reuse != nil && reuse.op.Name == name && reuse.op.ContentGeneration == gen && now.Before(reuse.retryAt()) {
		return reuse, false
	}
	return reuse, true
}

// Run starts op on key unless a conflicting operation is running
// (ErrAlreadyExists) or the key is in backoff for the same operation and
// generation (*BackoffError). It does not wait for the operation.
func (e *Executor) Run(key Key, op *Operation) error {
	now := e.opts.Clock.Now()
	e.mu.Lock()
	en, ok := e.admit(key, op.Name, op.ContentGeneration, now)
	if !ok {
		var err error = ErrAlreadyExists
		if en != nil {
			err = &BackoffError{RetryAt: en.retryAt(), LastErr: en.lastErr}
		}
		e.mu.Unlock()
		return err
	}
	if en != nil {
		if en.op.Name != op.Name {
			en.delay, en.lastErr, en.lastErrTime = 0, nil, time.Time{}
		}
		en.key = key
		e.failed--
	} else {
		v := e.opsOf(key.Volume)
		if v.entry1Used {
			en = &entry{key: key, vol: v}
		} else {
			v.entry1Used = true
			en = &v.entry1
			en.key, en.vol = key, v
		}
		v.entries = append(v.entries, en)
	}
	en.op, en.pending, en.queued, en.timedOut, en.started = op, true, true, false, now
	if e.running == 0 {
		e.idleCh = make(chan struct{})
	}
	e.running++
	e.queue = append(e.queue, en)
	startWorker := e.workers < e.opts.MaxConcurrent
	if startWorker {
		e.workers++
	}
	e.mu.Unlock()

	if startWorker {
		go e.worker()
	}
	return nil
}

// worker runs queued operations until the queue is empty.
func (e *Executor) worker() {
	for {
		e.mu.Lock()
		if len(e.queue) == 0 {
			e.workers--
			e.mu.Unlock()
			return
		}
		en := e.queue[0]
		e.queue[0] = nil
		e.queue = e.queue[1:]
		e.mu.Unlock()
		if detached := e.execute(en); detached {
			// Another worker took this one's place while the operation
			// was stuck; this goroutine is done.
			return
		}
	}
}

// execute runs one operation. It reports whether the worker was detached
// because the operation outlived its timeout.
func (e *Executor) execute(en *entry) (detached bool) {
	e.mu.Lock()
	ctx := &en.ctx1
	if !ctx.deadline.IsZero() {
		ctx = &opContext{}
	}
	en.queued = false
	start := e.opts.Clock.Now()
	en.started = start
	ctx.deadline = start.Add(e.opts.Timeout)
	en.ctx = ctx
	// The watch may be armed for another operation's grace, later than
	// this one's deadline when the timeout is shorter than the grace's
	// margin: arm it for the deadline then.
	arm := !e.watching || ctx.deadline.Before(e.watchAt)
	var gen uint64
	if arm {
		e.watching, e.watchAt = true, ctx.deadline
		e.watchGen++
		gen = e.watchGen
	}
	e.mu.Unlock()
	if arm {
		e.watch(ctx.deadline, gen)
	}

	err := runSafely(ctx, en.op)
	ctx.cancel(context.Canceled) // before the finish is reported
	return e.finish(en, start, err)
}

// grace is how long an operation may run before its worker stops counting:
// the timeout plus a grace period for a clean return.
func (e *Executor) grace() time.Duration { return e.opts.Timeout + e.opts.Timeout/10 + time.Second }

// watch arms the watch for the running operations to wake at at. One
// watch serves every running operation, for its deadline as for its grace,
// so an operation costs no timer of its own.
func (e *Executor) watch(at time.Time, gen uint64) {
	// A clock may call the func holding a lock its own methods take, so
	// the wake runs apart. A fake clock stepped past at between Now and
	// AfterFunc would arm it for later than at: wake now instead.
	t := e.opts.Clock.AfterFunc(at.Sub(e.opts.Clock.Now()), func() { go e.wake(gen) })
	if !e.opts.Clock.Now().Before(at) && t.Stop() {
		e.wake(gen)
	}
}

// wake cancels the contexts of the running operations whose deadline
// passed (DeadlineExceeded), and detaches the workers of those that are
// still running after their grace: an operation stuck in a syscall cannot
// be cancelled, so another worker serves the queue and one wedged volume
// cannot starve the others. Its key stays pending until it returns. The
// watch goes on, for the next deadline or grace, while operations run.
func (e *Executor) wake(gen uint64) {
	now := e.opts.Clock.Now()
	grace := e.grace()
	var expired []*opContext
	start := 0
	var next time.Time
	later := func(at time.Time) {
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	e.mu.Lock()
	if gen != e.watchGen {
		// An earlier watch replaced this one.
		e.mu.Unlock()
		return
	}
	for _, v := range e.byVolume {
		for _, en := range v.entries {
			if !en.pending || en.queued || en.timedOut {
				continue
			}
			if en.ctx != nil {
				if en.ctx.deadline.After(now) {
					later(en.ctx.deadline)
					continue
				}
				expired = append(expired, en.ctx)
				en.ctx = nil
			}
			if at := en.started.Add(grace); at.After(now) {
				later(at)
				continue
			}
			en.timedOut = true
			if len(e.queue) > start {
				start++ // takes over this worker's place in the count
			} else {
				e.workers--
			}
		}
	}
	e.watching = !next.IsZero()
	if e.watching {
		e.watchAt = next
		e.watchGen++
		gen = e.watchGen
	}
	e.mu.Unlock()
	for _, c := range expired {
		c.cancel(context.DeadlineExceeded)
	}
	for range start {
		go e.worker()
	}
	if !next.IsZero() {
		e.watch(next, gen)
	}
}

// opContext is a running operation's context. It reports the operation's
// deadline and ends with DeadlineExceeded when the executor's watch finds
// the deadline passed, or Canceled when the operation returns:
// context.WithTimeout cost every operation a runtime timer and three
// allocations. Contexts derived from it register through AfterFunc, the
// context package's hook for parents of its own kind, so they cost no
// goroutine and take its Err when it ends (it hides no cancelCtx behind
// Value, whose Canceled they would take instead). One derived behind a
// context.WithValue is watched by a goroutine of the context package's:
// no operation here derives one that way.
type opContext struct {
	deadline time.Time

	mu   sync.Mutex
	done chan struct{} // made by the first Done
	err  error
	// after holds the funcs registered by AfterFunc not yet run or stopped.
	after map[*func()]struct{}
}

// closedDone is the Done of an opContext ended before anyone asked.
var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *opContext) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *opContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		if c.err != nil {
			return closedDone
		}
		c.done = make(chan struct{})
	}
	return c.done
}

func (c *opContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *opContext) Value(any) any { return nil }

func (c *opContext) String() string { return "operations.opContext" }

// AfterFunc calls f once c ends, or at once if it has; stop undoes it
// unless f was called.
func (c *opContext) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		f()
		return func() bool { return false }
	}
	if c.after == nil {
		c.after = map[*func()]struct{}{}
	}
	key := &f
	c.after[key] = struct{}{}
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.after[key]
		delete(c.after, key)
		return ok
	}
}

// cancel ends c with err unless it has ended.
func (c *opContext) cancel(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	after := c.after
	c.after = nil
	c.mu.Unlock()
	for f := range after {
		(*f)()
	}
}

// runSafely turns a panicking operation into an error.
func runSafely(ctx context.Context, op *Operation) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("operation panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return op.run(ctx)
}

// finish records how an operation ended. It reports whether its worker was
// detached meanwhile, read before the entry can be reused by the next Run.
func (e *Executor) finish(en *entry, start time.Time, err error) (detached bool) {
	now := e.opts.Clock.Now()
	stale := errors.Is(err, ErrStale)
	var retryIn time.Duration

	e.mu.Lock()
	detached = en.timedOut
	en.pending, en.ctx = false, nil
	e.finished++
	v := en.vol
	f := finishedKey{key: en.key, seq: e.finished, vol: v}
	e.recent = append(e.recent, f)
	v.recent = append(v.recent, f)
	if err == nil || stale {
		e.remove(v, en)
	} else {
		e.failed++
		if en.delay == 0 {
			en.delay = e.opts.InitialBackoff
		} else {
			en.delay = min(2*en.delay, e.opts.MaxBackoff)
		}
		en.lastErr, en.lastErrTime = err, now
		retryIn = en.delay
	}
	e.running--
	if e.running == 0 {
		e.idle.Broadcast()
		close(e.idleCh)
	}
	op, key := en.op, en.key
	e.mu.Unlock()

	if e.opts.Observer != nil {
		e.opts.Observer.OperationFinished(key, op, now.Sub(start), err, retryIn)
	}
	if retryIn > 0 {
		e.opts.Clock.AfterFunc(retryIn, e.opts.OnStateChange)
	}
	// Every outcome can change what is reported (a failure is shown in pod
	// conditions), and a pass costs nothing when the key is in backoff.
	e.opts.OnStateChange()
	return detached
}

// remove drops the entry from its volume's bookkeeping v.
func (e *Executor) remove(v *volumeOps, en *entry) {
	for i, x := range v.entries {
		if x == en {
			last := len(v.entries) - 1
			copy(v.entries[i:], v.entries[i+1:])
			v.entries[last] = nil
			v.entries = v.entries[:last]
			break
		}
	}
	if v.empty() {
		delete(e.byVolume, en.key.Volume)
	}
}

// Candidate is an operation the caller would like to start.
type Candidate struct {
	Key        Key
	Name       Op
	Generation uint64
}

// Mark returns a point in the sequence of finished operations. A planner
// calls it before it takes the snapshots it plans from, and passes it to
// Startable.
func (e *Executor) Mark() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.finished
}

// Startable reports, for each candidate, whether Run would start it now (no
// conflicting operation running, not in backoff) and whether the plan can
// know its key's state: a candidate whose key (or a conflicting one)
// finished an operation after mark, the caller's Mark before its
// snapshots, is not startable yet; the finish wakes the next pass, which
// sees the outcome. It takes the lock once for the whole list, so a
// reconciler pass over thousands of volumes that are mostly busy does not
// contend with the operations finishing meanwhile, nor build operations
// only to have them refused.
//
// What finished up to mark is forgotten: one planner, passing marks that
// never go back, may call it.
func (e *Executor) Startable(cands []Candidate, mark uint64) []bool {
	now := e.opts.Clock.Now()
	out := make([]bool, len(cands))
	e.mu.Lock()
	defer e.mu.Unlock()
	e.forgetFinished(mark)
	for i, c := range cands {
		v := e.byVolume[c.Key.Volume]
		if v == nil {
			out[i] = true // nothing runs, failed or finished on it
			continue
		}
		_, out[i] = admitIn(v.entries, c.Key, c.Name, c.Generation, now)
		if out[i] {
			for _, f := range v.recent {
				if matches(f.key, c.Key) {
					out[i] = false
					break
				}
			}
		}
	}
	return out
}

// forgetFinished drops the finished keys up to mark: the oldest ones, in
// e.recent as in each volume's list. e.mu must be held.
func (e *Executor) forgetFinished(mark uint64) {
	n := 0
	for _, f := range e.recent {
		if f.seq > mark {
			break
		}
		n++
		// f is the volume's oldest; shifted out, not sliced off, so the
		// list keeps its room.
		v := f.vol
		last := len(v.recent) - 1
		copy(v.recent, v.recent[1:])
		v.recent[last] = finishedKey{}
		v.recent = v.recent[:last]
		if v.empty() {
			delete(e.byVolume, f.key.Volume)
		}
	}
	if n > 0 {
		kept := copy(e.recent, e.recent[n:])
		clear(e.recent[kept:])
		e.recent = e.recent[:kept]
	}
}

// IsPending reports whether an operation conflicting with key is running.
func (e *Executor) IsPending(key Key) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, en := range e.entries(key.Volume) {
		if en.pending && matches(en.key, key) {
			return true
		}
	}
	return false
}

// ResetBackoff lets every failed key of the volume be retried at once: used
// when something the failure depended on changed (a driver registered, a
// claim got bound).
func (e *Executor) ResetBackoff(name volume.UniqueName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, en := range e.entries(name) {
		if !en.pending {
			en.lastErrTime = time.Time{}
		}
	}
}

// ResetBackoffWhere lets every failed operation for which match is true be
// retried at once, e.g. all CSI operations when a driver registers.
func (e *Executor) ResetBackoffWhere(match func(op *Operation) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, v := range e.byVolume {
		for _, en := range v.entries {
			if !en.pending && match(en.op) {
				en.lastErrTime = time.Time{}
			}
		}
	}
}

// Forget drops the failed entries (backoff) of keys that are no longer
// relevant: a pod that left, a volume no pod wants and nothing has mounted.
// A failed key is otherwise dropped only by a later success on it, which
// never comes for a pod that is gone, so under pod churn the entries (and
// /debug/operations and the metrics counting them) would grow without
// bound. Running operations are kept whatever relevant says. It returns
// how many entries it dropped.
func (e *Executor) Forget(relevant func(Key) bool) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed == 0 {
		return 0 // only running operations: the common case, in a storm
	}
	dropped := 0
	for name, v := range e.byVolume {
		entries := v.entries
		kept := entries[:0]
		for _, en := range entries {
			if !en.pending && !relevant(en.key) {
				dropped++
				continue
			}
			kept = append(kept, en)
		}
		if len(kept) == len(entries) {
			continue
		}
		clear(entries[len(kept):])
		v.entries = kept
		if v.empty() {
			delete(e.byVolume, name)
		}
	}
	e.failed -= dropped
	return dropped
}

// Queued reports how many admitted operations wait for a worker.
func (e *Executor) Queued() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.queue)
}

// Idle returns a channel that is closed once no operation runs: at once if
// none runs now.
func (e *Executor) Idle() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.idleCh
}

// Wait blocks until no operation runs or ctx ends.
func (e *Executor) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		e.mu.Lock()
		for e.running > 0 && ctx.Err() == nil {
			e.idle.Wait()
		}
		e.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		e.mu.Lock()
		e.idle.Broadcast()
		e.mu.Unlock()
		return ctx.Err()
	}
}

// OperationStatus describes one entry of the pending-operations map.
type OperationStatus struct {
	Volume    volume.UniqueName `json:"volume"`
	Pod       *volume.PodRef    `json:"pod,omitempty"`
	Operation string            `json:"operation"`
	Plugin    string            `json:"plugin"`
	// State is "queued" (waiting for a worker), "running", "timedOut"
	// (outlived its timeout, key still held) or "backoff".
	State     string     `json:"state"`
	Since     time.Time  `json:"since"`
	LastError string     `json:"lastError,omitempty"`
	RetryAt   *time.Time `json:"retryAt,omitempty"`
	// Waiting: the last error is a normal wait (volume.IsWaiting), not a
	// failure.
	Waiting bool `json:"waiting,omitempty"`
}

// Status lists the pending-operations map, sorted by volume and pod.
func (e *Executor) Status() []OperationStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []OperationStatus
	for _, v := range e.byVolume {
		for _, en := range v.entries {
			s := OperationStatus{Volume: en.key.Volume, Operation: string(en.op.Name), Plugin: en.op.Plugin, Since: en.started}
			if en.key.Pod != "" {
				pod := en.op.Pod.PodRef
				s.Pod = &pod
			}
			switch {
			case en.pending && en.queued:
				s.State = "queued"
			case en.pending && en.timedOut:
				s.State = "timedOut"
			case en.pending:
				s.State = "running"
			default:
				s.State = "backoff"
				s.Since = en.lastErrTime
				t := en.retryAt()
				s.RetryAt = &t
			}
			if en.lastErr != nil {
				s.LastError = en.lastErr.Error()
				s.Waiting = volume.IsWaiting(en.lastErr)
			}
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Volume != out[j].Volume {
			return out[i].Volume < out[j].Volume
		}
		return podUID(out[i].Pod) < podUID(out[j].Pod)
	})
	return out
}

func podUID(p *volume.PodRef) types.UID {
	if p == nil {
		return ""
	}
	return p.UID
}

// LastError returns the last error of the key's entry, if it is in backoff.
func (e *Executor) LastError(key Key) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, en := range e.entries(key.Volume) {
		if en.key == key && !en.pending {
			return en.lastErr
		}
	}
	return nil
}
