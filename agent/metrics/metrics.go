// Package metrics owns the agent's Prometheus metrics under the
// volume_agent namespace: what happens (operations, passes, pods becoming
// ready, refreshes, token requests), observed as it happens, and the state
// (volumes, pods, pending operations, drivers, orphans, watches), read at
// scrape time from the parts that hold it.
package metrics

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/apivolume/budget"
	"github.com/volume-agent/volume-agent/populator"
	"github.com/volume-agent/volume-agent/reconciler"
	"github.com/volume-agent/volume-agent/reconciler/housekeeping"
	"github.com/volume-agent/volume-agent/refresh"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/source/objectwatch"
	"github.com/volume-agent/volume-agent/tokens"
	"github.com/volume-agent/volume-agent/volume"
)

const namespace = "volume_agent"

// buckets cover a fast tmpfs mount (well under a millisecond) up to a CSI
// call that ran into its timeout.
func buckets() []float64 {
	return []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
}

// Metrics holds the agent's Prometheus metrics. Counts of volumes, pods and
// pending operations are computed at scrape time from the caches, so an idle
// agent spends nothing keeping them up to date.
type Metrics struct {
	Registry *prometheus.Registry

	operationDuration *prometheus.HistogramVec
	reconcileDuration prometheus.Histogram
	populateDuration  prometheus.Histogram
	podReady          prometheus.Histogram
	podVolumeErrors   *prometheus.CounterVec
	actions           *prometheus.CounterVec
	reconstructed     prometheus.Counter
	refreshSeconds    *prometheus.HistogramVec
	tokenRequests     *prometheus.CounterVec
	overBudget        *prometheus.CounterVec

	mu    sync.Mutex
	ready readiness

	// opObservers caches operationDuration's histogram of each label set:
	// the vector's lookup hashes and checks the three labels on every
	// operation of a storm. The vector never deletes a series, so the
	// cached one is the one WithLabelValues returns. The map is never
	// changed once published (a new label set publishes a copy): reading
	// it writes nothing, where a read lock's count moved between the
	// cores of the workers on every operation.
	opMu        sync.Mutex // serialises publishing
	opObservers atomic.Pointer[map[opLabels]*opObserver]
	// opLast is the label set observed last, checked before the map: a
	// storm's operations are of one kind, plugin and result for long
	// runs, and its strings are those of the last operation (compared by
	// pointer and length), where the map hashed all three.
	opLast atomic.Pointer[opObserver]
}

type opLabels struct{ op, plugin, result string }

// opObserver is a label set's histogram.
type opObserver struct {
	labels opLabels
	o      prometheus.Observer
}

// New registers the metrics of what happens; RegisterState adds the
// counts read from the parts.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		operationDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "operation_duration_seconds",
			Help:    "Duration of volume operations by operation, plugin and result (success, uncertain, failure, stale, waiting).",
			Buckets: buckets(),
		}, []string{"operation", "plugin", "result"}),
		reconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "reconcile_duration_seconds",
			Help: "Duration of one reconciler pass (planning and dispatching).", Buckets: buckets(),
		}),
		populateDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "populate_duration_seconds",
			Help: "Duration of one populator pass (over the pods that changed, or over every pod).", Buckets: buckets(),
		}),
		podReady: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "pod_volumes_ready_seconds",
			Help:    "Time from a pod first being desired to all of its volumes being mounted.",
			Buckets: buckets(),
		}),
		podVolumeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "pod_volume_errors_total",
			Help: "Problems found resolving pods' volumes (missing claims, wrong modes, unsupported types...), by reason.",
		}, []string{"reason"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "planned_actions_total",
			Help: "Actions the reconciler planned, by operation (including ones not started because of a conflict or backoff).",
		}, []string{"operation"}),
		reconstructed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "reconstructed_pod_volumes_total",
			Help: "Pod volumes found on disk at start-up (then adopted if a pod wants them, torn down if not).",
		}),
		refreshSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "volume_refresh_seconds",
			Help:    "Time from a change of what a volume is built from (object, pod metadata, token due, republish due) to the volume's content catching up, by plugin.",
			Buckets: buckets(),
		}, []string{"plugin"}),
		tokenRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "token_requests_total",
			Help: "Service-account token requests (new tokens and refreshes), by result (success, failure).",
		}, []string{"result"}),
		overBudget: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "api_volume_over_budget_total",
			Help: "API-volume set ups refused because the content did not fit the pod's or the node's byte budget, by scope (pod, node).",
		}, []string{"scope"}),
	}
	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.operationDuration, m.reconcileDuration, m.populateDuration, m.podReady, m.podVolumeErrors, m.actions, m.reconstructed,
		m.refreshSeconds, m.tokenRequests, m.overBudget,
	)
	return m
}

var (
	_ operations.Observer = (*Metrics)(nil)
	_ populator.Observer  = (*Metrics)(nil)
	_ reconciler.Observer = (*Metrics)(nil)
	_ refresh.Observer    = (*Metrics)(nil)
	_ tokens.Observer     = (*Metrics)(nil)
	_ budget.Observer     = (*Metrics)(nil)
)

// State is what the gauges are read from at scrape time.
type State struct {
	DSW interface {
		Snapshot() *cache.DesiredSnapshot
	}
	ASW interface {
		Snapshot() *cache.ActualSnapshot
	}
	Operations Operations
	Source     source.ErrorReporter
	// SourcesReady: every source was read completely and the desired
	// state reflects it.
	SourcesReady func() bool
	Drivers      interface{ List() []registry.Driver }
	Orphans      interface {
		List() []housekeeping.OrphanStatus
	}
	// Watches are the per-object watches' counts (API objects; claims,
	// volumes and attachments), by resource; none in standalone mode.
	Watches []func() map[string]objectwatch.Stats
	// APIVolumeBytes is the API-volume content the budget counts (nil:
	// not reported).
	APIVolumeBytes func() int64
}

// Operations are the pending operations and their last errors (the
// executor).
type Operations interface {
	Status() []operations.OperationStatus
	explain.Failures
}

// RegisterState adds the gauges computed at scrape time from s: volumes,
// pods and pending operations, input errors, readiness, drivers, orphans
// and watches.
func (m *Metrics) RegisterState(s State) {
	m.Registry.MustRegister(&stateCollector{dsw: s.DSW, asw: s.ASW, exec: s.Operations, src: s.Source, sourcesReady: s.SourcesReady},
		driversCollector{s.Drivers},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "orphans",
			Help: "Things left on disk the agent cannot clean or account for (see /debug/orphans).",
		}, func() float64 { return float64(len(s.Orphans.List())) }))
	if len(s.Watches) > 0 {
		m.Registry.MustRegister(watchesCollector(s.Watches))
	}
	if s.APIVolumeBytes != nil {
		m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "api_volume_bytes",
			Help: "Bytes of API-volume content (configMap, secret, downwardAPI, projected) the agent has written and holds on the node, as the budget counts them.",
		}, func() float64 { return float64(s.APIVolumeBytes()) }))
	}
}

// Reconstructed counts the pod volumes found on disk at start-up.
func (m *Metrics) Reconstructed(podVolumes int) { m.reconstructed.Add(float64(podVolumes)) }

// Refreshed implements refresh.Observer.
func (m *Metrics) Refreshed(plugin string, took time.Duration) {
	m.refreshSeconds.WithLabelValues(plugin).Observe(took.Seconds())
}

// OverBudget implements budget.Observer.
func (m *Metrics) OverBudget(s budget.Scope) { m.overBudget.WithLabelValues(string(s)).Inc() }

// TokenRequested implements tokens.Observer.
func (m *Metrics) TokenRequested(err error) {
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.tokenRequests.WithLabelValues(result).Inc()
}

// OperationFinished implements operations.Observer.
func (m *Metrics) OperationFinished(_ operations.Key, op *operations.Operation, took time.Duration, err error, _ time.Duration) {
	m.operationObserver(opLabels{string(op.Name), op.Plugin, resultOf(err)}).Observe(took.Seconds())
}

func (m *Metrics) operationObserver(l opLabels) prometheus.Observer {
	if last := m.opLast.Load(); last != nil && last.labels == l {
		return last.o
	}
	if p := m.opObservers.Load(); p != nil {
		if o := (*p)[l]; o != nil {
			m.opLast.Store(o)
			return o.o
		}
	}
	o := &opObserver{labels: l, o: m.operationDuration.WithLabelValues(l.op, l.plugin, l.result)}
	m.opMu.Lock()
	defer m.opMu.Unlock()
	next := map[opLabels]*opObserver{l: o}
	if p := m.opObservers.Load(); p != nil {
		for k, v := range *p {
			next[k] = v
		}
	}
	m.opObservers.Store(&next)
	m.opLast.Store(o)
	return o.o
}

func resultOf(err error) string {
	switch {
	case err == nil:
		return "success"
	case errors.Is(err, operations.ErrStale):
		return "stale"
	case volume.IsUncertain(err):
		return "uncertain"
	case volume.IsWaiting(err):
		return "waiting"
	}
	return "failure"
}

// Populated implements populator.Observer.
func (m *Metrics) Populated(took time.Duration, _ int) { m.populateDuration.Observe(took.Seconds()) }

// PodVolumeError implements populator.Observer.
func (m *Metrics) PodVolumeError(err *volume.PodVolumeError) {
	m.podVolumeErrors.WithLabelValues(err.Reason).Inc()
}

// Reconciled implements reconciler.Observer: it times the pass and records,
// for every pod whose volumes all became mounted, how long that took. It
// looks at every pod; the reconciler calls ReconciledChanged, which looks
// at what changed and must agree with it.
func (m *Metrics) Reconciled(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, actions []reconciler.Action, took time.Duration) {
	m.observePass(actions, took)
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ready.all(dsw, asw, m.observeReady(now))
}

// ReconciledChanged implements reconciler.ChangeObserver: Reconciled, with
// the pods' readiness looked at again only where the pass's snapshots may
// differ from the last one's. Looking at every pod not yet ready on every
// pass was a third of a storm's passes.
func (m *Metrics) ReconciledChanged(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, actions []reconciler.Action, took time.Duration, chg reconciler.Changed) {
	m.observePass(actions, took)
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ready.changed(dsw, asw, chg, m.observeReady(now))
}

func (m *Metrics) observePass(actions []reconciler.Action, took time.Duration) {
	m.reconcileDuration.Observe(took.Seconds())
	// Counted in a short list, not a map: a pass in a storm plans
	// thousands of actions of a few operations, and hashing each action's
	// operation cost as much as the pods' readiness.
	type opCount struct {
		op operations.Op
		n  int
	}
	var room [8]opCount
	counts := room[:0]
	for i := range actions {
		op := actions[i].Op
		j := len(counts) - 1
		for j >= 0 && counts[j].op != op {
			j--
		}
		if j < 0 {
			counts = append(counts, opCount{op, 1})
		} else {
			counts[j].n++
		}
	}
	for _, c := range counts {
		m.actions.WithLabelValues(string(c.op)).Add(float64(c.n))
	}
}

func (m *Metrics) observeReady(now time.Time) func(*cache.DesiredPod) {
	return func(p *cache.DesiredPod) { m.podReady.Observe(now.Sub(p.Since).Seconds()) }
}

var _ reconciler.ChangeObserver = (*Metrics)(nil)

// readiness remembers which pods of the desired state had all their
// volumes ready (explain.PodReady) at some pass since they appeared, so
// that each is observed once.
type readiness struct {
	ready map[types.UID]bool
	// blocked holds, for each pod looked at and found not ready, the
	// volume that stopped it (explain.PodReadyBlocker): while neither
	// that volume's actual entry nor the pod's entry changes, the pod is
	// not ready, and changed does not ask again. In a storm a pod's
	// volumes are mounted one after the other, and each mount that was
	// not the one the pod waited on asked about all its volumes again.
	blocked map[types.UID]volume.UniqueName
	// skipped counts the pods not asked again thanks to blocked (tests).
	skipped int
	// last is the desired snapshot of the last pass.
	last *cache.DesiredSnapshot
	// todo holds the pods a pass looks at (kept for the next).
	todo map[types.UID]*cache.DesiredPod
}

// all looks at every pod: the simple version, which changed must agree
// with.
func (r *readiness) all(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, observe func(*cache.DesiredPod)) {
	if r.ready == nil {
		r.ready = map[types.UID]bool{}
	}
	clear(r.blocked) // every pod not ready is found blocked again
	for uid, p := range dsw.Pods() {
		r.check(uid, p, dsw, asw, observe)
	}
	for uid := range r.ready {
		if dsw.Pod(uid) == nil {
			delete(r.ready, uid)
		}
	}
	r.last = dsw
}

// changed is all, given the volumes in which the snapshots may differ
// from the last pass's (the desired ones' list is not needed, so a storm
// of pods too big to list does not make it look at every pod). A pod's
// readiness follows its own entry and its volumes' entries in both
// snapshots: a pod not yet ready is looked at again when its entry
// changed (cache.DesiredSnapshot.EachPodChanged, when the desired state
// changed at all) or one of its actual volumes did.
func (r *readiness) changed(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, chg reconciler.Changed, observe func(*cache.DesiredPod)) {
	if chg.Full || chg.ASW.All || r.last == nil {
		r.all(dsw, asw, observe)
		return
	}
	// A pod is looked at once per pass, however many of its volumes
	// changed.
	if r.todo == nil {
		r.todo = map[types.UID]*cache.DesiredPod{}
	}
	if dsw != r.last {
		dsw.EachPodChanged(r.last, func(uid types.UID, p *cache.DesiredPod) {
			switch {
			case p == nil:
				delete(r.ready, uid)
				delete(r.blocked, uid)
			case !r.ready[uid]:
				r.todo[uid] = p
			}
		})
		r.last = dsw
	}
	volumeChanged := func(name volume.UniqueName) {
		if dv := dsw.Volume(name); dv != nil {
			for uid := range dv.Pods.All() {
				if b, ok := r.blocked[uid]; ok && b != name {
					r.skipped++ // still waits on another volume
					continue
				}
				if p := dsw.Pod(uid); p != nil && !r.ready[uid] {
					r.todo[uid] = p
				}
			}
		}
	}
	// The desired volumes that changed need no look of their own: what a
	// pod's readiness reads of them changes only with the pod's entry.
	chg.ASW.Each(volumeChanged)
	for uid, p := range r.todo {
		r.check(uid, p, dsw, asw, observe)
	}
	if len(r.todo) > 256 {
		r.todo = nil // a map keeps its buckets: a storm's are not held
	} else {
		clear(r.todo)
	}
	if len(r.blocked) == 0 {
		r.blocked = nil
	}
}

func (r *readiness) check(uid types.UID, p *cache.DesiredPod, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, observe func(*cache.DesiredPod)) {
	if r.ready[uid] {
		return
	}
	blocker, ready := explain.PodReadyBlocker(p, dsw, asw)
	if !ready {
		if r.blocked == nil {
			r.blocked = map[types.UID]volume.UniqueName{}
		}
		r.blocked[uid] = blocker
		return
	}
	delete(r.blocked, uid)
	r.ready[uid] = true
	observe(p)
}

// stateCollector reports gauges computed from the caches at scrape time.
type stateCollector struct {
	dsw          interface{ Snapshot() *cache.DesiredSnapshot }
	asw          interface{ Snapshot() *cache.ActualSnapshot }
	exec         Operations
	src          source.ErrorReporter
	sourcesReady func() bool
}

var (
	volumesDesc = prometheus.NewDesc(namespace+"_volumes",
		"Pod volumes by world (desired, actual), plugin and state (desired; mounted, uncertain).",
		[]string{"world", "plugin", "state"}, nil)
	deviceMountsDesc = prometheus.NewDesc(namespace+"_device_mounts",
		"Device (global, staging) mounts by plugin and state (GloballyMounted, Uncertain).",
		[]string{"plugin", "state"}, nil)
	pendingDesc = prometheus.NewDesc(namespace+"_pending_operations",
		"Entries of the pending-operations map by operation and state (queued, running, timedOut, backoff).",
		[]string{"operation", "state"}, nil)
	podsWithErrorsDesc = prometheus.NewDesc(namespace+"_pods_with_volume_errors",
		"Pods with a volume that needs a change to the pod or to what it refers to (explain.NeedsChange).", nil, nil)
	podsDesc = prometheus.NewDesc(namespace+"_pods",
		"Pods by where their volumes stand, as the pods' VolumesReady condition, the page and the runtime API say it: ready, waiting, failing or needsChange.", []string{"status"}, nil)
	inputErrorsDesc = prometheus.NewDesc(namespace+"_source_input_errors",
		"Inputs (manifest files, objects) that are currently unusable.", nil, nil)
	sourcesReadyDesc = prometheus.NewDesc(namespace+"_sources_ready",
		"1 once every source was read completely and the desired state reflects it.", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{volumesDesc, deviceMountsDesc, pendingDesc, podsWithErrorsDesc, podsDesc, inputErrorsDesc, sourcesReadyDesc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ a, b, c string }
	counts := map[key]int{}
	dsw, asw := c.dsw.Snapshot(), c.asw.Snapshot()
	for _, v := range dsw.Volumes() {
		counts[key{"desired", v.Plugin, "desired"}] += v.Pods.Len()
	}
	devices := map[key]int{}
	for _, v := range asw.Volumes() {
		for _, m := range v.Pods.All() {
			state := "mounted"
			if m.State == cache.MountUncertain {
				state = "uncertain"
			}
			counts[key{"actual", v.Plugin, state}]++
		}
		if v.DeviceState.MayBeMounted() {
			devices[key{v.Plugin, string(v.DeviceState), ""}]++
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(volumesDesc, prometheus.GaugeValue, float64(n), k.a, k.b, k.c)
	}
	for k, n := range devices {
		ch <- prometheus.MustNewConstMetric(deviceMountsDesc, prometheus.GaugeValue, float64(n), k.a, k.b)
	}
	pending := map[key]int{}
	for _, s := range c.exec.Status() {
		pending[key{s.Operation, s.State, ""}]++
	}
	for k, n := range pending {
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(n), k.a, k.b)
	}
	pods := map[explain.Status]int{explain.Ready: 0, explain.Waiting: 0, explain.Failing: 0, explain.NeedsChange: 0}
	for _, p := range dsw.Pods() {
		pods[explain.Explain(p, dsw, asw, c.exec).Status]++
	}
	for st, n := range pods {
		ch <- prometheus.MustNewConstMetric(podsDesc, prometheus.GaugeValue, float64(n), string(st))
	}
	ch <- prometheus.MustNewConstMetric(podsWithErrorsDesc, prometheus.GaugeValue, float64(pods[explain.NeedsChange]))
	ch <- prometheus.MustNewConstMetric(inputErrorsDesc, prometheus.GaugeValue, float64(len(c.src.InputErrors())))
	ready := 0.0
	if c.sourcesReady() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(sourcesReadyDesc, prometheus.GaugeValue, ready)
}

// driversCollector reports the registered drivers.
type driversCollector struct {
	drivers interface{ List() []registry.Driver }
}

var driversDesc = prometheus.NewDesc(namespace+"_csi_drivers",
	"Registered CSI drivers (1 per driver), by driver, source (registration, static) and whether it stages volumes.",
	[]string{"driver", "source", "stage_unstage"}, nil)

func (c driversCollector) Describe(ch chan<- *prometheus.Desc) { ch <- driversDesc }

func (c driversCollector) Collect(ch chan<- prometheus.Metric) {
	for _, d := range c.drivers.List() {
		ch <- prometheus.MustNewConstMetric(driversDesc, prometheus.GaugeValue, 1, d.Name, d.Source, fmt.Sprint(d.StageUnstage))
	}
}

// watchesCollector reports the per-object watches (API objects; claims,
// volumes and attachments) at scrape time.
type watchesCollector []func() map[string]objectwatch.Stats

var watchedDesc = prometheus.NewDesc(namespace+"_watched_objects",
	"Objects the agent watches one by one for the pods on its node, by resource and state (watching; listing: first list not in yet; immutable: read once, no watch).",
	[]string{"resource", "state"}, nil)

func (c watchesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- watchedDesc }

func (c watchesCollector) Collect(ch chan<- prometheus.Metric) {
	for _, stats := range c {
		for res, s := range stats() {
			ch <- prometheus.MustNewConstMetric(watchedDesc, prometheus.GaugeValue, float64(s.Watching-s.Listing), res, "watching")
			ch <- prometheus.MustNewConstMetric(watchedDesc, prometheus.GaugeValue, float64(s.Listing), res, "listing")
			ch <- prometheus.MustNewConstMetric(watchedDesc, prometheus.GaugeValue, float64(s.Keys-s.Watching), res, "immutable")
		}
	}
}
