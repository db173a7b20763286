// Package burst owns how the Go runtime follows bursts of work: spare Ps
// while a burst of teardown runs (Procs), and the heap a burst left behind
// returned to the kernel once the node is steady again (Trimmer). Both
// learn of bursts from reconciler passes and finished operations.
package burst

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler"
)

// Trimmer returns the heap a burst of work left behind to the kernel
// once the node is steady again. A burst (reading hundreds of manifests,
// thousands of operations) grows the heap far beyond what an idle agent
// keeps; the Go runtime would hand it back only slowly, and an agent runs on
// every node.
//
// Work that comes a little at a time (pods arriving one by one) reaches the
// burst's count only now and then, with steady passes in between: what
// the operations since the last trim left is returned once no operation
// has finished for a settling time. Without that, 500 pods arriving over
// five seconds left 6 MiB more resident than the same pods all at once.
type Trimmer struct {
	opts       TrimmerOptions
	operations atomic.Int64
	trimming   atomic.Bool
	// running is the trim in progress, which the agent waits for when it
	// stops.
	running sync.WaitGroup

	mu       sync.Mutex
	settling clock.Timer // pending settling timer, if any
	stopped  bool
}

// TrimmerOptions tune a Trimmer; zero fields get the defaults.
type TrimmerOptions struct {
	// Burst is how many operations make trimming worth its cost (a full
	// GC) at once (default 256).
	Burst int64
	// Settle is how long no operation must finish before the operations
	// left since the last trim are trimmed, if there are SettleMin or
	// more (defaults 2s and 16): a few operations now and then on a
	// steady node (a token or ConfigMap refresh) leave little, and a full
	// GC for each would be idle CPU.
	Settle    time.Duration
	SettleMin int64
	// Free returns memory to the kernel (default debug.FreeOSMemory).
	Free func()
	// Clock runs the settling timer (default the real clock).
	Clock clock.WithDelayedExecution
}

// NewTrimmer is a Trimmer; call Wait once it is no longer told of passes.
func NewTrimmer(o TrimmerOptions) *Trimmer {
	if o.Burst <= 0 {
		o.Burst = 256
	}
	if o.Settle <= 0 {
		o.Settle = 2 * time.Second
	}
	if o.SettleMin <= 0 {
		o.SettleMin = 16
	}
	if o.Free == nil {
		o.Free = debug.FreeOSMemory
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Trimmer{opts: o}
}

var (
	_ operations.Observer = (*Trimmer)(nil)
	_ reconciler.Observer = (*Trimmer)(nil)
)

// OperationFinished implements operations.Observer: every operation
// counts towards a burst.
func (m *Trimmer) OperationFinished(operations.Key, *operations.Operation, time.Duration, error, time.Duration) {
	m.operations.Add(1)
}

// Reconciled implements reconciler.Observer: a pass that planned nothing
// means the node is steady.
func (m *Trimmer) Reconciled(_ *cache.DesiredSnapshot, _ *cache.ActualSnapshot, actions []reconciler.Action, _ time.Duration) {
	if len(actions) > 0 {
		return
	}
	switch ops := m.operations.Load(); {
	case ops >= m.opts.Burst:
		m.trim()
	case ops >= m.opts.SettleMin:
		m.settleThenTrim(ops)
	}
}

// trim returns memory to the kernel in the background, unless a trim is
// running already.
func (m *Trimmer) trim() {
	if !m.trimming.CompareAndSwap(false, true) {
		return
	}
	m.operations.Store(0)
	m.running.Go(func() {
		defer m.trimming.Store(false)
		m.opts.Free()
	})
}

// settleThenTrim trims after the settling time if no operation finished
// meanwhile (ops is the count now), and waits again if some did: the last
// steady pass of a slow burst may come before its last operations finish
// in the background. Once a trim (either kind) has reset the count below
// SettleMin, it stops.
func (m *Trimmer) settleThenTrim(ops int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settling != nil || m.stopped {
		return
	}
	m.settling = m.opts.Clock.AfterFunc(m.opts.Settle, func() {
		// Under the lock, so that wait either stops this or waits for
		// the trim it starts.
		m.mu.Lock()
		defer m.mu.Unlock()
		m.settling = nil
		if m.stopped {
			return
		}
		switch now := m.operations.Load(); {
		case now == ops:
			m.trim()
		case now >= m.opts.SettleMin:
			// Armed again from a goroutine of its own: a clock may run
			// this function holding a lock that arming takes.
			m.running.Go(func() { m.settleThenTrim(now) })
		}
	})
}

// Wait stops the settling timer and waits for a trim in progress. Call it
// once nothing calls Reconciled any more.
func (m *Trimmer) Wait() {
	m.mu.Lock()
	m.stopped = true
	if m.settling != nil {
		m.settling.Stop()
		m.settling = nil
	}
	m.mu.Unlock()
	m.running.Wait()
}
