package agent

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

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
type memoryTrimmer struct {
	operations atomic.Int64
	trimming   atomic.Bool
	// free returns memory to the kernel (debug.FreeOSMemory; replaced in
	// tests).
	free func()
	// running is the trim in progress, which the agent waits for when it
	// stops.
	running sync.WaitGroup
}

// burst is how many operations make trimming worth its cost (a full GC).
const burst = 256

func (m *memoryTrimmer) operationFinished() { m.operations.Add(1) }

// Reconciled implements reconciler.Observer: a pass that planned nothing
// means the node is steady.
func (m *memoryTrimmer) Reconciled(_ *cache.DesiredSnapshot, _ *cache.ActualSnapshot, actions []reconciler.Action, _ time.Duration) {
	if len(actions) > 0 || m.operations.Load() < burst || !m.trimming.CompareAndSwap(false, true) {
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

// wait waits for a trim in progress. Call it once nothing calls Reconciled
// any more.
func (m *memoryTrimmer) wait() { m.running.Wait() }

// burstProcs gives the runtime spare Ps while a burst of teardown runs
// (see internal/procs): from a pass that plans burstActions unmounts or
// more until one plans nothing. Only for teardown: there the spare Ps
// halve the time (umount(2) sleeps for an RCU grace period), while setting
// up gained little from them and kept a MiB or two more of RSS for as long
// as the pods ran (the objects a burst allocates, spread over more Ps'
// caches). It comes before the trimmer, so the spans the spare Ps cached
// are free by the time the trimmer returns memory to the kernel.
type burstProcs struct{}

// burstActions is how many unmounts in one pass make a burst: a pod or
// two of a few volumes gain nothing from spare Ps.
const burstActions = 16

// Reconciled implements reconciler.Observer.
func (burstProcs) Reconciled(_ *cache.DesiredSnapshot, _ *cache.ActualSnapshot, actions []reconciler.Action, _ time.Duration) {
	if len(actions) == 0 {
		procs.Steady()
		return
	}
	unmounts := 0
	for i := range actions {
		switch actions[i].Op {
		case operations.OpUnmountVolume, operations.OpUnmapVolume, operations.OpUnmountDevice, operations.OpUnmapDevice:
			unmounts++
		}
	}
	if unmounts >= burstActions {
		procs.Burst()
	}
}
