package burst

import (
	"time"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/procs"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler"
)

// Procs gives the runtime spare Ps while a burst of teardown runs
// (see internal/procs): from a pass that plans burstActions unmounts or
// more until one plans nothing. Only for teardown: there the spare Ps
// halve the time (umount(2) sleeps for an RCU grace period), while setting
// up gained little from them and kept a MiB or two more of RSS for as long
// as the pods ran (the objects a burst allocates, spread over more Ps'
// caches). It comes before the trimmer, so the spans the spare Ps cached
// are free by the time the trimmer returns memory to the kernel.
type Procs struct {
	tuning   *procs.Tuning
	unmounts int
}

// NewProcs tunes t (nil: leaves the runtime alone). unmounts is how many
// unmounts in one pass make a burst (0: 16): a pod or two of a few
// volumes gain nothing from spare Ps.
func NewProcs(t *procs.Tuning, unmounts int) Procs {
	if unmounts <= 0 {
		unmounts = 16
	}
	return Procs{tuning: t, unmounts: unmounts}
}

var _ reconciler.Observer = Procs{}

// Reconciled implements reconciler.Observer.
func (b Procs) Reconciled(_ *cache.DesiredSnapshot, _ *cache.ActualSnapshot, actions []reconciler.Action, _ time.Duration) {
	if len(actions) == 0 {
		b.tuning.Steady()
		return
	}
	unmounts := 0
	for i := range actions {
		if k := operations.KindOf(actions[i].Op); k != nil && k.Unmounts {
			unmounts++
		}
	}
	if unmounts >= b.unmounts {
		b.tuning.Burst()
	}
}
