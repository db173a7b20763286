package housekeeping

import (
	"context"
	"time"

	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/reconciler/planner"
	"github.com/volume-agent/volume-agent/volume"
)

// LoopOptions configures a Loop.
type LoopOptions struct {
	DSW   *cache.DesiredStateOfWorld
	ASW   *cache.ActualStateOfWorld
	Paths volume.Paths
	// IsMountPoint tells what CleanPodDirs must never remove.
	IsMountPoint func(string) (bool, error)
	// SourcesComplete says whether every source was read completely and
	// none of their inputs is unreadable: until then a pod directory may
	// belong to a pod that simply was not read.
	SourcesComplete func() bool
	// Idle returns a channel closed once no operation runs (the
	// executor's Idle): a pass that started operations is followed by no
	// cleanup until they finish.
	Idle func() <-chan struct{}
	// Orphans receives what CleanPodDirs cannot remove.
	Orphans *Orphans
	// Period is the least time between two cleanups (default 1m).
	Period time.Duration
	Clock  clock.Clock
}

// Loop removes what is left of gone pods (CleanPodDirs) in its own
// goroutine, at most once per Period, after a reconciler pass (it is a
// reconciler Observer) once the agent is idle: the sources are complete,
// nothing found after a restart is still unmatched and no operation runs.
type Loop struct {
	opts LoopOptions
	wake *notify.Signal
	last time.Time
}

// NewLoop returns a Loop; Run runs it.
func NewLoop(opts LoopOptions) *Loop {
	if opts.Period <= 0 {
		opts.Period = time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Loop{opts: opts, wake: notify.New()}
}

// Reconciled implements reconciler.Observer: every pass wakes the loop,
// which never holds the pass up.
func (l *Loop) Reconciled(*cache.DesiredSnapshot, *cache.ActualSnapshot, []planner.Action, time.Duration) {
	l.wake.Notify()
}

// Run cleans after passes until ctx ends.
func (l *Loop) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake.C():
		}
		l.Once()
	}
}

// Once cleans if the period since the last cleanup is over and the agent
// is idle, and reports whether it did.
func (l *Loop) Once() bool {
	if !l.last.IsZero() && l.opts.Clock.Since(l.last) < l.opts.Period {
		return false
	}
	if !l.opts.SourcesComplete() {
		return false
	}
	select {
	case <-l.opts.Idle():
	default:
		return false
	}
	// The ASW first, then the DSW, as a reconciler pass takes them: a pod
	// whose volume is being set up is in the DSW before its directories
	// appear, and leaves the ASW only after its mounts are gone, so it is
	// in one snapshot or the other.
	asw := l.opts.ASW.Snapshot()
	if asw.HasReconstructed() {
		return false
	}
	dsw := l.opts.DSW.Snapshot()
	l.last = l.opts.Clock.Now()
	l.opts.Orphans.Set("housekeeping", CleanPodDirs(l.opts.Paths, dsw, asw, l.opts.IsMountPoint))
	return true
}
