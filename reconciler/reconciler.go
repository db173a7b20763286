package reconciler

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler/planner"
	"github.com/volume-agent/volume-agent/volume"
)

// Action is what a pass planned: the planner's output, handed to the
// Observer (an alias, so observers need not import the planner).
type Action = planner.Action

// Handler performs actions and adoptions: *operations.Operator. The
// reconciler owns when; the handler owns how.
type Handler interface {
	// Operation returns the executor operation for an action's kind on its
	// target, or nil when the kind needs no operation.
	Operation(op operations.Op, t operations.Target) *operations.Operation
	// AdoptVolume confirms reconstructed state that pods want, without an
	// operation.
	AdoptVolume(id cache.VolumeIdentity, device bool, pods map[types.UID]cache.ActualPodMount)
}

var _ Handler = (*operations.Operator)(nil)

// Executor runs operations: *operations.Executor.
type Executor interface {
	// Mark returns the point in the sequence of finished operations that
	// snapshots taken after it reflect.
	Mark() uint64
	// Startable reports, for each candidate, whether Run would start it
	// now and no operation on its key finished after mark.
	Startable(cands []operations.Candidate, mark uint64) []bool
	// Run starts op on key, or says why not (operations.IsExpected tells
	// the refusals that are not failures).
	Run(key operations.Key, op *operations.Operation) error
	// Forget drops the failed entries of keys relevant says are gone.
	Forget(relevant func(operations.Key) bool) int
	// Idle returns a channel closed once no operation runs.
	Idle() <-chan struct{}
}

// Observer is told about every reconcile pass (metrics, pod readiness).
type Observer interface {
	Reconciled(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, actions []Action, took time.Duration)
}

// ChangeObserver is an Observer that follows what changed: the reconciler
// calls ReconciledChanged instead of Reconciled, so that it need not walk
// every pod of the snapshots on every pass.
type ChangeObserver interface {
	Observer
	ReconciledChanged(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, actions []Action, took time.Duration, chg Changed)
}

// Changed says in which volumes a pass's snapshots may differ from the
// last pass's: those each cache listed since (a change made between the
// lists and the snapshots is listed again next pass), or All. Full says
// the pass planned every volume again (resync, adoption). Entries of pods
// (DesiredSnapshot.Pods) are not listed.
type Changed struct {
	DSW, ASW cache.Changes
	Full     bool
}

// Options configures a Reconciler.
type Options struct {
	DSW      *cache.DesiredStateOfWorld
	ASW      *cache.ActualStateOfWorld
	Executor Executor
	Handler  Handler
	// SourcesReady gates destructive phases (see PlanOptions).
	SourcesReady func() bool
	// SourcesComplete additionally gates tearing down reconstructed state
	// (see PlanOptions.OrphanCleanupAllowed); nil means always complete.
	SourcesComplete func() bool
	// SetUpWithoutMount tells, for adoption, which volumes are set up
	// without a mount.
	SetUpWithoutMount func(plugin string, spec *volume.Spec) bool
	// ResyncPeriod is the longest time between two passes (default 1m).
	ResyncPeriod time.Duration
	// MinInterval spaces passes triggered in quick succession, so a burst
	// of finishing operations costs one pass, not one each (default 5ms).
	MinInterval time.Duration
	Clock       clock.WithTicker
	Observer    Observer
	Log         *zap.Logger

	// Wake, when set, asks for a pass whenever it is notified, like
	// Trigger: parts built before the reconciler (the executor, the
	// populator's observer) wake it through it.
	Wake *notify.Signal
}

// passSpacing is how many times the last pass's duration the reconciler
// waits before the next.
const passSpacing = 2

// maxBacklogWait bounds how long a pass waits for the executor's queue to
// drain (see backlogWait): a pod whose volumes are all set up is seen
// ready by a pass at most that much later.
const maxBacklogWait = 25 * time.Millisecond

// Backlog is implemented by executors that queue operations
// (*operations.Executor): Queued is how many wait for a worker.
type Backlog interface{ Queued() int }

var _ Backlog = (*operations.Executor)(nil)

// backlogWait is how long the next pass may wait while queued operations
// wait for a worker: what it would start joins the tail of the queue, so
// planning before half the queue has drained starts nothing sooner, and
// in a storm every finishing operation asks for a pass that mostly
// re-plans what did not change (4,000 queued mounts each asked about at
// every pass). At the rate finished operations came (finished over the
// last interval), half the queue takes queued/rate/2; at most
// maxBacklogWait, and nothing when none finished (slow operations give no
// rate to trust).
func backlogWait(queued int, finished uint64, over time.Duration) time.Duration {
	if queued <= 0 || finished == 0 || over <= 0 {
		return 0
	}
	if over >= maxBacklogWait {
		// Fewer than queued/2 in maxBacklogWait: the cap decides
		// without a product that could overflow.
		if uint64(queued) >= 2*finished {
			return maxBacklogWait
		}
	}
	return min(time.Duration(int64(over)/int64(2*finished)*int64(queued)), maxBacklogWait)
}

// Reconciler runs Plan and dispatches its actions.
type Reconciler struct {
	opts    Options
	trigger *notify.Signal

	lastFullPlan time.Time
	planner      planner.Incremental
	planBuf      []Action
	candBuf      []operations.Candidate
}

// New returns a Reconciler.
func New(opts Options) *Reconciler {
	if opts.ResyncPeriod <= 0 {
		opts.ResyncPeriod = time.Minute
	}
	if opts.MinInterval <= 0 {
		opts.MinInterval = 5 * time.Millisecond
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.SourcesReady == nil {
		opts.SourcesReady = func() bool { return true }
	}
	if opts.Wake == nil {
		opts.Wake = notify.New()
	}
	return &Reconciler{opts: opts, trigger: opts.Wake}
}

// Trigger asks for a pass soon.
func (r *Reconciler) Trigger() { r.trigger.Notify() }

// Run reconciles until ctx ends. It does not wait for running operations.
func (r *Reconciler) Run(ctx context.Context) {
	resync := r.opts.Clock.NewTicker(r.opts.ResyncPeriod)
	defer resync.Stop()
	backlog, _ := r.opts.Executor.(Backlog)
	var lastEnd time.Time
	var lastFinished uint64
	for {
		start := r.opts.Clock.Now()
		r.ReconcileOnce()
		took := r.opts.Clock.Since(start)
		var busy time.Duration // see backlogWait
		if backlog != nil {
			finished := r.opts.Executor.Mark()
			if !lastEnd.IsZero() {
				busy = backlogWait(backlog.Queued(), finished-lastFinished, start.Add(took).Sub(lastEnd))
			}
			lastEnd, lastFinished = start.Add(took), finished
		}
		select {
		case <-ctx.Done():
			return
		case <-r.trigger.C():
		case <-r.opts.DSW.Changed():
		case <-resync.C():
		}
		// Let a burst of triggers settle into one pass: passes start at
		// least MinInterval apart. A trigger after a quiet spell starts
		// one at once (a single new pod waits for nothing); only the
		// ones that follow a pass closely wait out the rest.
		//
		// A pass plans every volume, and in a storm every finishing
		// operation asks for one: spacing passes by twice what the last
		// one took keeps planning under a third of a CPU (4,000 volumes
		// made it quadratic), at the cost of that much delay for
		// follow-up operations. The spacing leaves the CPU to running
		// operations; once none runs there is nothing to leave it to (a
		// pass slowed down by a busy CPU made the next wait 100 ms with
		// nothing running in between).
		end := start.Add(took)
		if spacing := max(passSpacing*took, busy) - r.opts.Clock.Since(end); spacing > r.opts.MinInterval-r.opts.Clock.Since(start) {
			select {
			case <-ctx.Done():
				return
			case <-r.opts.Clock.After(spacing):
			case <-r.opts.Executor.Idle():
				// Still MinInterval from the last pass's start.
			}
		}
		if wait := r.opts.MinInterval - r.opts.Clock.Since(start); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.opts.Clock.After(wait):
			}
		}
	}
}

// ReconcileOnce plans from fresh snapshots and starts what can start. The
// actions it returns are valid until the next pass, which reuses them.
func (r *Reconciler) ReconcileOnce() []Action {
	start := r.opts.Clock.Now()
	ready := r.opts.SourcesReady()
	mark := r.opts.Executor.Mark()
	// The changes first, then the snapshots: a change made in between is
	// in the snapshots and planned again next pass.
	dchg, achg := r.opts.DSW.TakeChanges(), r.opts.ASW.TakeChanges()
	asw := r.opts.ASW.Snapshot()
	dsw := r.opts.DSW.Snapshot()
	// Every volume is planned again while state found after a restart is
	// being adopted, and once per resync period: planning only what
	// changed must never be the only way a volume gets planned.
	full := r.opts.Clock.Since(r.lastFullPlan) >= r.opts.ResyncPeriod
	if ready && asw.HasReconstructed() {
		full = true
		adoptions := planner.Adoptions(dsw, asw, r.opts.SetUpWithoutMount)
		for _, a := range adoptions {
			r.opts.Handler.AdoptVolume(a.ID, a.Device, a.Pods)
		}
		if len(adoptions) > 0 {
			asw = r.opts.ASW.Snapshot()
		}
	}
	if full {
		r.lastFullPlan = start
	}
	complete := ready && (r.opts.SourcesComplete == nil || r.opts.SourcesComplete())
	actions := r.planner.Plan(r.planBuf, dsw, asw, planner.Options{SourcesReady: ready, OrphanCleanupAllowed: complete}, dchg, achg, full)
	cands := r.candBuf[:0]
	for i := range actions {
		cands = append(cands, operations.Candidate{Key: actions[i].Key(), Name: actions[i].Op, Generation: actions[i].ContentGeneration})
	}
	// Keep the slices for the next pass while there is work; drop them
	// once a pass plans nothing, so an idle agent holds no stale actions.
	r.planBuf, r.candBuf = nil, nil
	if len(actions) > 0 {
		r.planBuf, r.candBuf = actions, cands
	}
	started := 0
	for i, ok := range r.opts.Executor.Startable(cands, mark) {
		if ok {
			r.dispatch(&actions[i])
			started++
		}
	}
	// Failed keys of pods and volumes that are gone will never be retried:
	// their backoff entries go, or they would pile up under pod churn.
	r.opts.Executor.Forget(func(k operations.Key) bool { return planner.Relevant(dsw, asw, k) })
	if r.opts.Log != nil && started > 0 {
		r.opts.Log.Debug("reconciled", zap.Int("actions", len(actions)), zap.Int("started", started),
			zap.Bool("sourcesReady", ready), zap.Duration("took", r.opts.Clock.Since(start)))
	}
	if o, ok := r.opts.Observer.(ChangeObserver); ok {
		o.ReconciledChanged(dsw, asw, actions, r.opts.Clock.Since(start), Changed{DSW: dchg, ASW: achg, Full: full})
	} else if r.opts.Observer != nil {
		r.opts.Observer.Reconciled(dsw, asw, actions, r.opts.Clock.Since(start))
	}
	return actions
}

func (r *Reconciler) dispatch(a *Action) {
	op := r.opts.Handler.Operation(a.Op, a.Target)
	if op == nil {
		return
	}
	err := r.opts.Executor.Run(a.Key(), op)
	if err != nil && !operations.IsExpected(err) && r.opts.Log != nil {
		r.opts.Log.Error("starting operation", zap.String("operation", string(a.Op)),
			zap.String("volume", string(a.Volume)), zap.Error(fmt.Errorf("%s: %w", a.Reason, err)))
	}
}
