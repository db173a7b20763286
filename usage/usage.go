// Package usage measures the local storage the node's pods use and says
// which pods use more than their limits allow, as the kubelet's volume
// stats and eviction manager do on a node that has a kubelet.
//
// It owns the measuring rounds, their results (kept until the next
// measurement of the same volume), the pods over their limits and the
// events that tell them so. Every emptyDir a pod has mounted is measured,
// and hostPath volumes when asked: first from a cheap Source when one backs
// the volume (a project quota, a per-volume filesystem image), a Memory
// emptyDir by statfs of its own tmpfs, anything else by a walk on file
// descriptors (safefs.Usage) paced by one budget of entries per second for
// the whole node, each walk within a deadline. What to measure, in what
// order, and who is over a limit are pure functions (plan.go); the
// filesystem is touched only by Measure.
//
// Over a limit, a pod gets a Warning event (once per overage) and a warning
// in its explanation (explain.Limits): the agent reports, it does not evict
// and does not take the pod's readiness away.
package usage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/internal/safefs"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

// Defaults of Options.
const (
	DefaultPeriod           = time.Minute
	DefaultEntriesPerSecond = 20000
	DefaultWalkTimeout      = 2 * time.Minute
)

// Methods: how a result was obtained.
const (
	MethodSource = "source"
	MethodStatfs = "statfs"
	MethodWalk   = "walk"
)

// Options configure a Measurer. DSW and ASW are required.
type Options struct {
	DSW func() *cache.DesiredSnapshot
	ASW func() *cache.ActualSnapshot
	// Source answers cheaply for the volumes it backs; nil: NoSource.
	Source Source
	// Period is the time between the starts of two rounds (the kubelet's
	// --volume-stats-agg-period); each wait gets up to 10 % of jitter.
	Period time.Duration
	// EntriesPerSecond bounds the entries all walks look at together.
	EntriesPerSecond int
	// WalkTimeout bounds one walk; a walk cut short keeps the volume's
	// previous result.
	WalkTimeout time.Duration
	// HostPath: measure hostPath volumes too.
	HostPath bool
	// Events receives the over-limit warnings; nil: none.
	Events events.Recorder
	// OnChange is called when the pods over their limits change (a
	// reconciler pass then rewrites their condition, the page updates).
	OnChange func()
	Clock    clock.Clock
	Log      *zap.Logger
}

// Result is the last measurement of a volume.
type Result struct {
	Target
	UsedBytes, InodesUsed int64
	// Method is how it was measured (MethodSource, MethodStatfs,
	// MethodWalk); At when.
	Method string
	At     time.Time
	// Took is how long the measurement took.
	Took time.Duration
	// Err is why the last attempt failed; the figures are then those of
	// the last measurement that succeeded, if any (At zero: none).
	Err string
}

// Measured reports whether r holds figures.
func (r *Result) Measured() bool { return !r.At.IsZero() }

// Measurer runs the rounds and keeps the results.
type Measurer struct {
	opts   Options
	log    *zap.Logger
	budget *Budget

	roundMu sync.Mutex

	mu      sync.RWMutex
	results map[key]*Result
	over    map[types.UID][]Over
	// warned are the overages each pod got an event for, by reason and
	// volume, so a pod is told once per overage, not every round.
	warned map[types.UID]map[explain.Warning]bool
	// hung are walks that ran past their deadline and have not returned
	// (a hung filesystem): their volume is skipped until they do.
	hung map[string]bool

	entries  prometheus.Counter
	rounds   prometheus.Counter
	errors   *prometheus.CounterVec
	measured *prometheus.CounterVec
}

// New returns a Measurer; it measures nothing until Run (or Refresh).
func New(opts Options) *Measurer {
	if opts.Period <= 0 {
		opts.Period = DefaultPeriod
	}
	if opts.EntriesPerSecond <= 0 {
		opts.EntriesPerSecond = DefaultEntriesPerSecond
	}
	if opts.WalkTimeout <= 0 {
		opts.WalkTimeout = DefaultWalkTimeout
	}
	if opts.Source == nil {
		opts.Source = NoSource{}
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	return &Measurer{
		opts: opts, log: opts.Log, budget: NewBudget(opts.EntriesPerSecond, opts.Clock),
		results: map[key]*Result{}, over: map[types.UID][]Over{}, warned: map[types.UID]map[explain.Warning]bool{}, hung: map[string]bool{},
		entries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: "volume_usage", Name: "walk_entries_total",
			Help: "Directory entries the usage walks looked at (paced by --usage-entries-per-second)."}),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: "volume_usage", Name: "rounds_total",
			Help: "Rounds of volume usage measurement."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: "volume_usage", Name: "errors_total",
			Help: "Volume usage measurements that failed or were cut short by their deadline, by method."}, []string{"method"}),
		measured: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: "volume_usage", Name: "measurements_total",
			Help: "Volume usage measurements, by method (source, statfs, walk)."}, []string{"method"}),
	}
}

// Run measures every Period (with jitter) until ctx ends, starting at once.
func (m *Measurer) Run(ctx context.Context) {
	for {
		start := m.opts.Clock.Now()
		m.Refresh(ctx)
		jitter := time.Duration(rand.Int64N(int64(m.opts.Period)/10 + 1))
		wait := m.opts.Period + jitter - m.opts.Clock.Since(start)
		t := m.opts.Clock.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// Refresh runs one round: it drops the results of volumes no longer
// mounted, measures the others in schedule order, and decides who is over
// a limit after each measurement.
func (m *Measurer) Refresh(ctx context.Context) {
	m.roundMu.Lock()
	defer m.roundMu.Unlock()
	m.rounds.Inc()
	dsw := m.opts.DSW()
	targets := Targets(dsw, m.opts.ASW(), m.opts.HostPath)
	wanted := make(map[key]bool, len(targets))
	for _, t := range targets {
		wanted[t.key()] = true
	}
	m.mu.Lock()
	for k := range m.results {
		if !wanted[k] {
			delete(m.results, k)
		}
	}
	last := make(map[key]time.Time, len(m.results))
	for k, r := range m.results {
		last[k] = r.At
	}
	m.mu.Unlock()
	limits := func(uid types.UID) *resource.Quantity {
		if p := dsw.Pod(uid); p != nil {
			return p.Pod.EphemeralStorageLimit
		}
		return nil
	}
	m.decide(targets, limits)
	// Deciding costs a look at every target: done at most once a second
	// during the round (a pod over its limit is known within a second of
	// its measurement) and at its end, not after every measurement.
	decided := m.opts.Clock.Now()
	for _, t := range schedule(targets, last) {
		if ctx.Err() != nil {
			return
		}
		m.store(t, m.measure(ctx, t))
		if m.opts.Clock.Since(decided) >= time.Second {
			m.decide(targets, limits)
			decided = m.opts.Clock.Now()
		}
	}
	m.decide(targets, limits)
}

// measured is one measurement's outcome.
type measured struct {
	bytes, inodes int64
	method        string
	entries       int64
	took          time.Duration
	err           error
}

// measure measures one target: a cheap source, statfs of a tmpfs, or a
// walk within WalkTimeout. A walk stuck in the filesystem past its
// deadline is left behind (one goroutine per hung volume) and the volume
// skipped until it returns.
func (m *Measurer) measure(ctx context.Context, t Target) measured {
	start := m.opts.Clock.Now()
	done := func(o measured) measured { o.took = m.opts.Clock.Since(start); return o }
	if t.Kind != HostPath {
		b, i, ok, err := m.opts.Source.Usage(t.Path)
		if ok || err != nil {
			return done(measured{bytes: b, inodes: i, method: MethodSource, err: err})
		}
	}
	if t.Kind == MemoryEmptyDir {
		b, i, err := tmpfsUsage(t.Path)
		return done(measured{bytes: b, inodes: i, method: MethodStatfs, err: err})
	}
	m.mu.Lock()
	if m.hung[t.Path] {
		m.mu.Unlock()
		return done(measured{method: MethodWalk, err: errHung})
	}
	m.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, m.opts.WalkTimeout)
	defer cancel()
	ch := make(chan measured, 1)
	go func() {
		du, err := safefs.Usage(wctx, t.Path, safefs.UsageOptions{Budget: m.budget})
		ch <- measured{bytes: du.Bytes, inodes: du.Inodes, entries: du.Entries, method: MethodWalk, err: err}
	}()
	// The walk checks its deadline between batches; a grace second beyond
	// it tells a walk stuck in one system call.
	grace := m.opts.Clock.NewTimer(m.opts.WalkTimeout + time.Second)
	defer grace.Stop()
	select {
	case o := <-ch:
		m.entries.Add(float64(o.entries))
		return done(o)
	case <-ctx.Done():
		return done(measured{method: MethodWalk, err: ctx.Err()})
	case <-grace.C():
		m.mu.Lock()
		m.hung[t.Path] = true
		m.mu.Unlock()
		go func() {
			o := <-ch
			m.entries.Add(float64(o.entries))
			m.mu.Lock()
			delete(m.hung, t.Path)
			m.mu.Unlock()
		}()
		return done(measured{method: MethodWalk, err: errHung})
	}
}

var errHung = errors.New("an earlier walk of this volume has not returned (the filesystem does not answer)")

// store records an outcome. A failed or cut-short measurement keeps the
// volume's last figures (a walk that could not finish says nothing new)
// and records why.
func (m *Measurer) store(t Target, o measured) {
	log := m.log.With(zap.String("pod", t.Pod.String()), zap.String("volume", t.Volume), zap.String("method", o.method))
	m.measured.WithLabelValues(o.method).Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.results[t.key()]
	if r == nil {
		r = &Result{}
		m.results[t.key()] = r
	}
	r.Target = t
	if o.err != nil {
		m.errors.WithLabelValues(o.method).Inc()
		if r.Err == "" {
			log.Warn("cannot measure volume usage", zap.String("path", t.Path), zap.Error(o.err))
		}
		r.Err = o.err.Error()
		return
	}
	if r.Err != "" {
		log.Info("volume usage can be measured again")
	}
	r.UsedBytes, r.InodesUsed, r.Method, r.At, r.Took, r.Err = o.bytes, o.inodes, o.method, m.opts.Clock.Now(), o.took, ""
}

// decide recomputes who is over a limit; new overages get an event, and a
// change calls OnChange.
func (m *Measurer) decide(targets []Target, limits func(types.UID) *resource.Quantity) {
	m.mu.Lock()
	over := overLimits(targets, m.results, limits)
	changed := !sameOver(over, m.over)
	m.over = over
	type warn struct {
		pod volume.PodRef
		o   Over
	}
	var warns []warn
	next := make(map[types.UID]map[explain.Warning]bool, len(over))
	for uid, os := range over {
		next[uid] = map[explain.Warning]bool{}
		for _, o := range os {
			id := explain.Warning{Volume: o.Volume, Reason: o.Reason}
			next[uid][id] = true
			if !m.warned[uid][id] {
				warns = append(warns, warn{podOf(targets, uid), o})
			}
		}
	}
	m.warned = next
	m.mu.Unlock()
	for _, w := range warns {
		m.log.Warn("pod over its local storage limit", zap.String("pod", w.pod.String()), zap.String("volume", w.o.Volume),
			zap.String("reason", w.o.Reason), zap.Int64("usedBytes", w.o.Used), zap.Int64("limitBytes", w.o.Limit))
		if m.opts.Events != nil {
			m.opts.Events.Event(events.PodObject(w.pod), events.Warning, w.o.Reason,
				fmt.Sprintf("%s Used: %s.%s", w.o.Message, quantity(w.o.Used), notEvicted))
		}
	}
	if changed && m.opts.OnChange != nil {
		m.opts.OnChange()
	}
}

// notEvicted ends the events' messages, which are otherwise the kubelet's
// eviction messages.
const notEvicted = " The pod is not evicted: no kubelet runs on this node."

func podOf(targets []Target, uid types.UID) volume.PodRef {
	for _, t := range targets {
		if t.Pod.UID == uid {
			return t.Pod
		}
	}
	return volume.PodRef{UID: uid}
}

func sameOver(a, b map[types.UID][]Over) bool {
	if len(a) != len(b) {
		return false
	}
	for uid, x := range a {
		if !slices.EqualFunc(x, b[uid], func(p, q Over) bool { return p.Warning == q.Warning }) {
			return false
		}
	}
	return true
}

// OverLimit implements explain.Limits.
func (m *Measurer) OverLimit(pod types.UID) []explain.Warning {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []explain.Warning
	for _, o := range m.over[pod] {
		out = append(out, o.Warning)
	}
	return out
}

// Over returns every pod over a limit, with the figures.
func (m *Measurer) Over() map[types.UID][]Over {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make(map[types.UID][]Over, len(m.over))
	for uid, o := range m.over {
		out[uid] = slices.Clone(o)
	}
	return out
}

// Results returns the stored results, sorted by pod and volume.
func (m *Measurer) Results() []Result {
	m.mu.RLock()
	out := make([]Result, 0, len(m.results))
	for _, r := range m.results {
		out = append(out, *r)
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(a, b Result) int { return compareTargets(a.Target, b.Target) })
	return out
}
