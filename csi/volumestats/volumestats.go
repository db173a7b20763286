// Package volumestats reports how full the CSI volumes of persistent volume
// claims are, as the kubelet's kubelet_volume_stats_* gauges do: it asks each
// volume's driver (NodeGetVolumeStats) periodically and exposes the last
// answers per claim as Prometheus gauges.
//
// It owns the polling and the last results. A scrape only reads the stored
// results, so a slow or hung driver can never stall /metrics, and one driver
// can delay the others by at most one call timeout per round.
package volumestats

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/registry"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/volume"
)

// Defaults of Options.
const (
	DefaultPeriod      = time.Minute
	DefaultConcurrency = 4
	DefaultCallTimeout = 10 * time.Second
)

// Options configure a Collector. Registry and ASW are required.
type Options struct {
	Registry *registry.Registry
	// ASW returns the current actual state of world.
	ASW func() *cache.ActualSnapshot
	// Period is the time between rounds; each wait gets up to 10 % of
	// jitter, so that agents started together do not poll drivers in step.
	Period time.Duration
	// Concurrency bounds the NodeGetVolumeStats calls in flight.
	Concurrency int
	// CallTimeout bounds each call.
	CallTimeout time.Duration
	Log         *zap.Logger
}

// Stats is what a driver said about one claim's volume. The byte and inode
// figures are only meaningful when HasBytes and HasInodes say the driver
// reported them.
type Stats struct {
	Namespace, Claim string
	Driver           string
	Volume           volume.UniqueName
	HasBytes         bool
	CapacityBytes    int64
	AvailableBytes   int64
	UsedBytes        int64
	HasInodes        bool
	Inodes           int64
	InodesFree       int64
	InodesUsed       int64
	// At is when the driver answered.
	At time.Time
}

// Collector polls drivers for volume stats and is a prometheus.Collector of
// the results.
type Collector struct {
	opts Options
	log  *zap.Logger

	errors *prometheus.CounterVec

	roundMu sync.Mutex // one round at a time

	mu      sync.RWMutex
	results map[claimKey]*Stats
	failing map[claimKey]bool // to log a failing volume once, not every round
}

type claimKey struct{ namespace, name string }

const (
	namespace = "volume_agent"
	subsystem = "volume_stats"
)

var (
	labels             = []string{"namespace", "persistentvolumeclaim"}
	capacityBytesDesc  = desc("capacity_bytes", "Capacity in bytes of the volume, as its CSI driver reports it.")
	availableBytesDesc = desc("available_bytes", "Number of available bytes in the volume, as its CSI driver reports it.")
	usedBytesDesc      = desc("used_bytes", "Number of used bytes in the volume, as its CSI driver reports it.")
	inodesDesc         = desc("inodes", "Maximum number of inodes in the volume, as its CSI driver reports it.")
	inodesFreeDesc     = desc("inodes_free", "Number of free inodes in the volume, as its CSI driver reports it.")
	inodesUsedDesc     = desc("inodes_used", "Number of used inodes in the volume, as its CSI driver reports it.")
)

func desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, name), help, labels, nil)
}

// New returns a collector; it polls nothing until Run (or Refresh).
func New(opts Options) *Collector {
	if opts.Period <= 0 {
		opts.Period = DefaultPeriod
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	return &Collector{
		opts: opts,
		log:  opts.Log,
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "errors_total",
			Help: "NodeGetVolumeStats calls that failed or timed out, by CSI driver.",
		}, []string{"driver"}),
		results: map[claimKey]*Stats{},
		failing: map[claimKey]bool{},
	}
}

// Run polls every Period (with jitter) until ctx ends, starting at once.
func (c *Collector) Run(ctx context.Context) {
	for {
		c.Refresh(ctx)
		jitter := time.Duration(rand.Int64N(int64(c.opts.Period)/10 + 1))
		t := time.NewTimer(c.opts.Period + jitter)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{capacityBytesDesc, availableBytesDesc, usedBytesDesc, inodesDesc, inodesFreeDesc, inodesUsedDesc} {
		ch <- d
	}
	c.errors.Describe(ch)
}

// Collect implements prometheus.Collector. It reads the stored results only.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.Results() {
		gauge := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), s.Namespace, s.Claim)
		}
		if s.HasBytes {
			gauge(capacityBytesDesc, s.CapacityBytes)
			gauge(availableBytesDesc, s.AvailableBytes)
			gauge(usedBytesDesc, s.UsedBytes)
		}
		if s.HasInodes {
			gauge(inodesDesc, s.Inodes)
			gauge(inodesFreeDesc, s.InodesFree)
			gauge(inodesUsedDesc, s.InodesUsed)
		}
	}
	c.errors.Collect(ch)
}

// Results returns the stored results, sorted by namespace and claim.
func (c *Collector) Results() []Stats {
	c.mu.RLock()
	out := make([]Stats, 0, len(c.results))
	for _, s := range c.results {
		out = append(out, *s)
	}
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Claim < out[j].Claim
	})
	return out
}

// job is one NodeGetVolumeStats call to make.
type job struct {
	key     claimKey
	volume  volume.UniqueName
	driver  *registry.Driver
	handle  string
	path    string
	staging string
}

// Refresh runs one round: it asks the driver of every eligible volume for
// its stats and stores each answer as it arrives. Results of claims that
// are no longer eligible (volume gone, driver gone) are dropped at the start
// of the round.
func (c *Collector) Refresh(ctx context.Context) {
	c.roundMu.Lock()
	defer c.roundMu.Unlock()
	jobs := c.plan()
	wanted := make(map[claimKey]bool, len(jobs))
	for _, j := range jobs {
		wanted[j.key] = true
	}
	c.mu.Lock()
	for k := range c.results {
		if !wanted[k] {
			delete(c.results, k)
		}
	}
	for k := range c.failing {
		if !wanted[k] {
			delete(c.failing, k)
		}
	}
	c.mu.Unlock()
	c.run(ctx, jobs)
}

// plan picks the volumes to ask about: CSI volumes with a Mounted pod that
// reached them through a claim, whose driver is registered and serves
// volume stats. One call per claim.
func (c *Collector) plan() []job {
	snap := c.opts.ASW()
	if snap == nil {
		return nil
	}
	names := make([]volume.UniqueName, 0, len(snap.Volumes))
	for n, v := range snap.Volumes {
		if v.Plugin == csiplugin.Name {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	seen := map[claimKey]bool{}
	var jobs []job
	for _, n := range names {
		v := snap.Volumes[n]
		m := mountedClaimPod(v)
		if m == nil {
			continue
		}
		src := m.Spec.PV.Spec.CSI
		key := claimKey{m.Spec.PVC.Namespace, m.Spec.PVC.Name}
		if seen[key] {
			continue
		}
		d, ok := c.opts.Registry.Get(src.Driver)
		if !ok || !d.VolumeStats {
			continue
		}
		seen[key] = true
		j := job{key: key, volume: n, driver: d, handle: src.VolumeHandle, path: m.MountPath}
		if d.StageUnstage {
			j.staging = v.DeviceMountPath
		}
		jobs = append(jobs, j)
	}
	return jobs
}

// mountedClaimPod returns a Mounted pod mount of v that reached a CSI PV
// through a claim, the same one every round (lowest pod UID).
func mountedClaimPod(v *cache.ActualVolume) *cache.ActualPodMount {
	var best *cache.ActualPodMount
	for _, m := range v.Pods {
		if m.State != cache.Mounted || m.Spec == nil || m.Spec.PVC == nil || m.Spec.PV == nil || m.Spec.PV.Spec.CSI == nil || m.MountPath == "" {
			continue
		}
		if best == nil || m.Pod.UID < best.Pod.UID {
			best = m
		}
	}
	return best
}

// queue holds one driver's jobs of a round.
type queue struct {
	name     string
	jobs     []job
	inflight int
	// timedOut: a call of this round timed out; the driver's remaining
	// calls are skipped so that it cannot hold the slots for another
	// timeout per call.
	timedOut bool
}

type outcome struct {
	job  job
	resp *csi.NodeGetVolumeStatsResponse
	err  error
	at   time.Time
}

// run makes the calls, at most Concurrency at once. Slots go to the driver
// with the fewest calls in flight, so a hung driver holds at most its share
// of them while the others carry on, and after its first timeout it gets
// none for the rest of the round.
func (c *Collector) run(ctx context.Context, jobs []job) {
	queues := map[string]*queue{}
	var order []*queue
	for _, j := range jobs {
		q := queues[j.driver.Name]
		if q == nil {
			q = &queue{name: j.driver.Name}
			queues[q.name] = q
			order = append(order, q)
		}
		q.jobs = append(q.jobs, j)
	}
	sort.Slice(order, func(i, k int) bool { return order[i].name < order[k].name })
	done := make(chan outcome)
	inflight := 0
	for {
		for inflight < c.opts.Concurrency && ctx.Err() == nil {
			var q *queue
			for _, o := range order {
				if len(o.jobs) > 0 && (q == nil || o.inflight < q.inflight) {
					q = o
				}
			}
			if q == nil {
				break
			}
			j := q.jobs[0]
			q.jobs = q.jobs[1:]
			q.inflight++
			inflight++
			go func() { done <- c.call(ctx, j) }()
		}
		if inflight == 0 {
			return
		}
		o := <-done
		inflight--
		q := queues[o.job.driver.Name]
		q.inflight--
		if ctx.Err() != nil && o.err != nil {
			continue // stopping: not the driver's fault
		}
		c.store(o)
		if o.err != nil && isTimeout(o.err) && !q.timedOut {
			q.timedOut = true
			if len(q.jobs) > 0 {
				c.log.Warn("CSI driver timed out on NodeGetVolumeStats; skipping its other volumes this round",
					zap.String("driver", q.name), zap.Int("skipped", len(q.jobs)))
				c.mu.Lock()
				for _, j := range q.jobs {
					delete(c.results, j.key)
				}
				c.mu.Unlock()
				q.jobs = nil
			}
		}
	}
}

func (c *Collector) call(ctx context.Context, j job) outcome {
	cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
	defer cancel()
	resp, err := j.driver.Client.Node.NodeGetVolumeStats(cctx, &csi.NodeGetVolumeStatsRequest{
		VolumeId: j.handle, VolumePath: j.path, StagingTargetPath: j.staging,
	})
	return outcome{job: j, resp: resp, err: err, at: time.Now()}
}

func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
}

// store records an outcome. A failed call drops the claim's earlier result:
// numbers the driver can no longer vouch for are worse than none.
func (c *Collector) store(o outcome) {
	j := o.job
	log := c.log.With(zap.String("driver", j.driver.Name), zap.String("volume", string(j.volume)),
		zap.String("pvc", j.key.namespace+"/"+j.key.name))
	c.mu.Lock()
	defer c.mu.Unlock()
	if o.err != nil {
		c.errors.WithLabelValues(j.driver.Name).Inc()
		delete(c.results, j.key)
		if !c.failing[j.key] {
			c.failing[j.key] = true
			log.Warn("NodeGetVolumeStats failed", zap.Error(o.err))
		} else {
			log.Debug("NodeGetVolumeStats failed again", zap.Error(o.err))
		}
		return
	}
	if c.failing[j.key] {
		delete(c.failing, j.key)
		log.Info("NodeGetVolumeStats works again")
	}
	s := &Stats{Namespace: j.key.namespace, Claim: j.key.name, Driver: j.driver.Name, Volume: j.volume, At: o.at}
	for _, u := range o.resp.GetUsage() {
		switch u.GetUnit() {
		case csi.VolumeUsage_BYTES:
			s.HasBytes = true
			s.CapacityBytes, s.AvailableBytes, s.UsedBytes = u.GetTotal(), u.GetAvailable(), u.GetUsed()
		case csi.VolumeUsage_INODES:
			s.HasInodes = true
			s.Inodes, s.InodesFree, s.InodesUsed = u.GetTotal(), u.GetAvailable(), u.GetUsed()
		}
	}
	c.results[j.key] = s
}
