package localpv

import (
	"github.com/prometheus/client_golang/prometheus"
)

const metricPrefix = "volume_agent_local_volume"

// buckets run from a quick in-process cleanup to a full-device zeroing.
var buckets = []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600}

type metrics struct {
	passDuration    prometheus.Histogram
	created         *prometheus.CounterVec
	deleted         *prometheus.CounterVec
	discoveryErrors *prometheus.CounterVec
	cleanups        *prometheus.CounterVec
	cleanupDuration *prometheus.HistogramVec
	configReloads   *prometheus.CounterVec
	identityChecks  *prometheus.CounterVec
	state           *stateCollector
}

func newMetrics(p *Provisioner) *metrics {
	return &metrics{
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: metricPrefix + "_discovery_duration_seconds",
			Help: "Duration of one local volume discovery pass (all classes).", Buckets: buckets,
		}),
		created: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricPrefix + "_created_total",
			Help: "Local PersistentVolumes created, by storage class and volume mode.",
		}, []string{"class", "mode"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricPrefix + "_deleted_total",
			Help: "Local PersistentVolumes deleted after their disk was cleaned (each is created again), by class and mode.",
		}, []string{"class", "mode"}),
		discoveryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricPrefix + "_discovery_errors_total",
			Help: "Local volume discovery errors, by class and kind (class: the class creates no PV; create, delete: API requests that failed).",
		}, []string{"class", "kind"}),
		cleanups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricPrefix + "_cleanups_total",
			Help: "Finished cleanups of released local volumes, by class, mode, method and result (success, failure).",
		}, []string{"class", "mode", "method", "result"}),
		cleanupDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: metricPrefix + "_cleanup_duration_seconds",
			Help: "Duration of cleanups of released local volumes, by class, mode, method and result.", Buckets: buckets,
		}, []string{"class", "mode", "method", "result"}),
		configReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricPrefix + "_config_reloads_total",
			Help: "Reads of a changed local volumes configuration, by result (success; partial: some classes rejected; failure: the file rejected, the previous configuration kept).",
		}, []string{"result"}),
		identityChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricPrefix + "_identity_checks_total",
			Help: "Checks before a cleanup that the disk at a PV's path is the one the PV was made from, by class and result (match; mismatch: the cleanup was refused; unrecorded: the PV records no identity, cleaned with the other checks only).",
		}, []string{"class", "result"}),
		state: &stateCollector{p: p},
	}
}

// Collectors returns the provisioner's Prometheus collectors, to register
// with the agent's registry.
func (p *Provisioner) Collectors() []prometheus.Collector {
	m := p.metrics
	return []prometheus.Collector{m.passDuration, m.created, m.deleted, m.discoveryErrors, m.cleanups, m.cleanupDuration, m.configReloads, m.identityChecks, m.state}
}

// stateCollector computes gauges at scrape time from the last pass.
type stateCollector struct{ p *Provisioner }

var (
	volumesDesc = prometheus.NewDesc(metricPrefix+"s",
		"Discovered entries and local PVs of this node by class and state (available, bound, released, cleaning, cleanupFailed, missing, skipped, pending, failed). state=\"missing\" counts PVs whose disk is gone.",
		[]string{"class", "state"}, nil)
	capacityDesc = prometheus.NewDesc(metricPrefix+"_capacity_bytes",
		"Capacity of this node's local PVs by class and volume mode.", []string{"class", "mode"}, nil)
	cleanupStateDesc = prometheus.NewDesc(metricPrefix+"_cleanup_states",
		"Cleanups the provisioner tracks, by state (pending, running, succeeded, failed).", []string{"state"}, nil)
	configErrorsDesc = prometheus.NewDesc(metricPrefix+"_config_errors",
		"Errors in the last read of the local volumes configuration (0 when it is entirely valid).", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- volumesDesc
	ch <- capacityDesc
	ch <- cleanupStateDesc
	ch <- configErrorsDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	doc := c.p.Status()
	type key struct{ a, b string }
	counts := map[key]int{}
	capacity := map[key]int64{}
	for _, v := range doc.Volumes {
		counts[key{v.Class, string(v.State)}]++
		if v.UID != "" && v.PV != "" && v.capacityBytes > 0 {
			capacity[key{v.Class, string(v.VolumeMode)}] += v.capacityBytes
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(volumesDesc, prometheus.GaugeValue, float64(n), k.a, k.b)
	}
	for k, n := range capacity {
		ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(n), k.a, k.b)
	}
	states := map[CleanupState]int{CleanupPending: 0, CleanupRunning: 0, CleanupSucceeded: 0, CleanupFailed: 0}
	for _, cl := range doc.Cleanups {
		states[cl.State]++
	}
	for s, n := range states {
		ch <- prometheus.MustNewConstMetric(cleanupStateDesc, prometheus.GaugeValue, float64(n), string(s))
	}
	ch <- prometheus.MustNewConstMetric(configErrorsDesc, prometheus.GaugeValue, float64(len(doc.Config.Errors)))
}
