package agent

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/procs"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler"
)

// memoryTrimmer returns the heap a burst of work left behind to the kernel
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
type memoryTrimmer struct {
	operations atomic.Int64
	trimming   atomic.Bool
	// free returns memory to the kernel (debug.FreeOSMemory; replaced in
	// tests).
	free func()
	// clock runs the settling timer (the real clock if nil).
	clock clock.WithDelayedExecution
	// running is the trim in progress, which the agent waits for when it
	// stops.
	running sync.WaitGroup

	mu       sync.Mutex
	settling clock.Timer // pending settling timer, if any
	stopped  bool
}

// burst is how many operations make trimming worth its cost (a full GC) at
// once.
const burst = 256

// settle is how long no operation must finish before the operations left
// since the last trim are trimmed, if there are settleMin or more: a few
// operations now and then on a steady node (a token or ConfigMap refresh)
// leave little, and a full GC for each would be idle CPU.
const (
	settle    = 2 * time.Second
	settleMin = 16
)

func (m *memoryTrimmer) operationFinished() { m.operations.Add(1) }

// Reconciled implements reconciler.Observer: a pass that planned nothing
// means the node is steady.
func (m *memoryTrimmer) Reconciled(_ *cache.DesiredSnapshot, _ *cache.ActualSnapshot, actions []reconciler.Action, _ time.Duration) {
	if len(actions) > 0 {
		return
	}
	switch ops := m.operations.Load(); {
	case ops >= burst:
		m.trim()
	case ops >= settleMin:
		m.settleThenTrim(ops)
	}
}

// trim returns memory to the kernel in the background, unless a trim is
// running already.
func (m *memoryTrimmer) trim() {
	if !m.trimming.CompareAndSwap(false, true) {
		return
	}
	m.operations.Store(0)
	m.running.Go(func() {
		defer m.trimming.Store(false)
		if m.free != nil {
			m.free()
		} else {
			debug.FreeOSMemory()
		}
	})
}

// settleThenTrim trims after the settling time if no operation finished
// meanwhile (ops is the count now), and waits again if some did: the last
// steady pass of a slow burst may come before its last operations finish
// in the background. Once a trim (either kind) has reset the count below
// settleMin, it stops.
func (m *memoryTrimmer) settleThenTrim(ops int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settling != nil || m.stopped {
		return
	}
	c := m.clock
	if c == nil {
		c = clock.RealClock{}
	}
	m.settling = c.AfterFunc(settle, func() {
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
		case now >= settleMin:
			// Armed again from a goroutine of its own: a clock may run
			// this function holding a lock that arming takes.
			m.running.Go(func() { m.settleThenTrim(now) })
		}
	})
}

// wait stops the settling timer and waits for a trim in progress. Call it
// once nothing calls Reconciled any more.
func (m *memoryTrimmer) wait() {
	m.mu.Lock()
	m.stopped = true
	if m.settling != nil {
		m.settling.Stop()
		m.settling = nil
	}
	m.mu.Unlock()
	m.running.Wait()
}

// burstProcs gives the runtime spare Ps while a burst of teardown runs
// (see internal/procs): from a pass that plans burstActions unmounts or
// more until one plans nothing. Only for teardown: there the spare Ps
// halve the time (umount(2) sleeps for an RCU grace period), while setting
// up gained little from them and kept a MiB or two more of RSS for as long
// as the pods ran (the objects a burst allocates, spread over more Ps'
// caches). It comes before the trimmer, so the spans the spare Ps cached
// are free by the time the trimmer returns memory to the kernel.
type burstProcs struct{ procs *procs.Tuning }

// burstActions is how many unmounts in one pass make a burst: a pod or
// two of a few volumes gain nothing from spare Ps.
const burstActions = 16

// Reconciled implements reconciler.Observer.
func (b burstProcs) Reconciled(_ *cache.DesiredSnapshot, _ *cache.ActualSnapshot, actions []reconciler.Action, _ time.Duration) {
	if len(actions) == 0 {
		b.procs.Steady()
		return
	}
	unmounts := 0
	for i := range actions {
		if k := operations.KindOf(actions[i].Op); k != nil && k.Unmounts {
			unmounts++
		}
	}
	if unmounts >= burstActions {
		b.procs.Burst()
	}
}
