package usage

import "github.com/prometheus/client_golang/prometheus"

const namespace = "volume_agent"

// The figures of every measured volume, labelled as the kubelet's volume
// stats are but by pod (namespace, pod, and the pod's name for the volume):
// emptyDirs have no claim. Only the node's own pods' volumes are exported.
var (
	volLabels     = []string{"namespace", "pod", "volume"}
	usedBytesDesc = prometheus.NewDesc(namespace+"_volume_used_bytes",
		"Bytes allocated in the pod's emptyDir (or hostPath) volume, as last measured.", volLabels, nil)
	inodesUsedDesc = prometheus.NewDesc(namespace+"_volume_inodes_used",
		"Inodes used in the pod's emptyDir (or hostPath) volume, as last measured.", volLabels, nil)
	limitBytesDesc = prometheus.NewDesc(namespace+"_volume_size_limit_bytes",
		"The emptyDir's sizeLimit in bytes (only emptyDirs that have one).", volLabels, nil)
	ageDesc = prometheus.NewDesc(namespace+"_volume_usage_age_seconds",
		"Seconds since the volume's usage was last measured.", volLabels, nil)
	overDesc = prometheus.NewDesc(namespace+"_pod_local_storage_over_limit",
		"1 for each limit a pod's local storage exceeds: reason EmptyDirOverLimit (volume set) or EphemeralStorageOverLimit.",
		[]string{"namespace", "pod", "volume", "reason"}, nil)
)

// Describe implements prometheus.Collector.
func (m *Measurer) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{usedBytesDesc, inodesUsedDesc, limitBytesDesc, ageDesc, overDesc} {
		ch <- d
	}
	for _, c := range []prometheus.Collector{m.entries, m.rounds, m.errors, m.measured} {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector; it reads stored results only,
// so a scrape never waits for a filesystem.
func (m *Measurer) Collect(ch chan<- prometheus.Metric) {
	now := m.opts.Clock.Now()
	pods := map[string][2]string{}
	for _, r := range m.Results() {
		pods[string(r.Pod.UID)] = [2]string{r.Pod.Namespace, r.Pod.Name}
		if !r.Measured() {
			continue
		}
		l := []string{r.Pod.Namespace, r.Pod.Name, r.Volume}
		ch <- prometheus.MustNewConstMetric(usedBytesDesc, prometheus.GaugeValue, float64(r.UsedBytes), l...)
		ch <- prometheus.MustNewConstMetric(inodesUsedDesc, prometheus.GaugeValue, float64(r.InodesUsed), l...)
		ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, now.Sub(r.At).Seconds(), l...)
		if r.Limit > 0 {
			ch <- prometheus.MustNewConstMetric(limitBytesDesc, prometheus.GaugeValue, float64(r.Limit), l...)
		}
	}
	for uid, os := range m.Over() {
		p := pods[string(uid)]
		for _, o := range os {
			ch <- prometheus.MustNewConstMetric(overDesc, prometheus.GaugeValue, 1, p[0], p[1], o.Volume, o.Reason)
		}
	}
	for _, c := range []prometheus.Collector{m.entries, m.rounds, m.errors, m.measured} {
		c.Collect(ch)
	}
}
