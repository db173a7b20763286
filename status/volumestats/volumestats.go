// Package volumestats reports how full the node's claim-backed volumes are,
// and how healthy their drivers say they are, under the kubelet's names
// (kubelet_volume_stats_*), so that the standard alerts and dashboards work
// on a node without a kubelet. CSI volumes are read through their driver's
// NodeGetVolumeStats (with the volume condition of drivers that report
// one), local volumes by statfs of their mount (Block: the device's size),
// every Period.
//
// It owns the polling, the last results and the volumes' health: an
// abnormal condition sets kubelet_volume_stats_health_status_abnormal and
// puts a Warning event on the pods using the volume. A scrape only reads
// the stored results, so a slow driver or a hung disk can never stall
// /metrics; a round waits for each at most one timeout, and a hung
// filesystem holds at most one goroutine per path (see fsCalls).
package volumestats

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

// Defaults of Options.
const (
	DefaultPeriod       = time.Minute
	DefaultConcurrency  = 4
	DefaultCallTimeout  = 10 * time.Second
	DefaultMaxHungCalls = 4
)

// Options configure a Collector. ASW is required.
type Options struct {
	// Registry has the CSI drivers; nil: no CSI volume is read.
	Registry *registry.Registry
	// ASW returns the current actual state of world.
	ASW func() *cache.ActualSnapshot
	// DSW, if set, names the pods' volumes in events as the pods do
	// (pod.spec.volumes[].name) instead of by the persistent volume.
	DSW func() *cache.DesiredSnapshot
	// Events receives the Warning events of abnormal volumes; nil: none.
	Events events.Recorder
	// Period is the time between rounds (the kubelet's
	// --volume-stats-agg-period); each wait gets up to 10 % of jitter, so
	// that agents started together do not poll drivers in step.
	Period time.Duration
	// Concurrency bounds the reads in flight.
	Concurrency int
	// CallTimeout bounds each NodeGetVolumeStats call and how long a
	// round waits for a filesystem.
	CallTimeout time.Duration
	// MaxHungCalls: no filesystem call starts while this many have run
	// past CallTimeout without returning.
	MaxHungCalls int
	// FS looks at local volumes; default HostFS.
	FS  FS
	Log *zap.Logger
}

// Stats is what was read about one claim's volume.
type Stats struct {
	Namespace, Claim string
	Volume           volume.UniqueName
	Plugin           string
	// Driver is the CSI driver, for CSI volumes.
	Driver string
	Usage
	// Health is the driver's word on the volume's condition; nil unless
	// the driver has VOLUME_CONDITION.
	Health *Health
	// At is when the answer came.
	At time.Time
}

// Collector reads volume stats and is a prometheus.Collector of the
// results.
type Collector struct {
	opts Options
	log  *zap.Logger
	fs   *fsCalls

	errors *prometheus.CounterVec

	roundMu sync.Mutex // one round at a time

	mu      sync.RWMutex
	results map[claimKey]*Stats
	failing map[claimKey]bool // to log a failing volume once, not every round
	// abnormal holds, per claim, the message of the abnormal condition
	// each pod was warned about; a claim is absent while healthy.
	abnormal map[claimKey]map[types.UID]string
}

const namespace = "volume_agent"

// The kubelet's descriptions, stability prefix included, as its /metrics
// shows them (pkg/kubelet/metrics/collectors/volume_stats.go).
var (
	labels             = []string{"namespace", "persistentvolumeclaim"}
	capacityBytesDesc  = kubeletDesc("capacity_bytes", "Capacity in bytes of the volume")
	availableBytesDesc = kubeletDesc("available_bytes", "Number of available bytes in the volume")
	usedBytesDesc      = kubeletDesc("used_bytes", "Number of used bytes in the volume")
	inodesDesc         = kubeletDesc("inodes", "Maximum number of inodes in the volume")
	inodesFreeDesc     = kubeletDesc("inodes_free", "Number of free inodes in the volume")
	inodesUsedDesc     = kubeletDesc("inodes_used", "Number of used inodes in the volume")
	healthAbnormalDesc = kubeletDesc("health_status_abnormal",
		"Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy")
	hungCallsDesc = prometheus.NewDesc(namespace+"_volume_stats_hung_calls",
		"Filesystem calls of volume stats (statfs, block device size) that ran past their timeout and have not returned: hung disks.", nil, nil)
)

func kubeletDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("kubelet_volume_stats_"+name, "[ALPHA] "+help, labels, nil)
}

// New returns a collector; it reads nothing until Run (or Refresh).
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
	if opts.MaxHungCalls <= 0 {
		opts.MaxHungCalls = DefaultMaxHungCalls
	}
	if opts.FS == nil {
		opts.FS = HostFS{}
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	return &Collector{
		opts: opts,
		log:  opts.Log,
		fs:   newFSCalls(opts.MaxHungCalls),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "volume_stats", Name: "errors_total",
			Help: "Volume stats that could not be read, by CSI driver (the plugin, kubernetes.io/local-volume, for local volumes): failed or timed-out calls, and calls not made because an earlier one on the same path hangs.",
		}, []string{"driver"}),
		results:  map[claimKey]*Stats{},
		failing:  map[claimKey]bool{},
		abnormal: map[claimKey]map[types.UID]string{},
	}
}

// Run reads every Period (with jitter) until ctx ends, starting at once.
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
	for _, d := range []*prometheus.Desc{capacityBytesDesc, availableBytesDesc, usedBytesDesc, inodesDesc, inodesFreeDesc, inodesUsedDesc, healthAbnormalDesc, hungCallsDesc} {
		ch <- d
	}
	c.errors.Describe(ch)
}

// Collect implements prometheus.Collector. It reads the stored results
// only: every figure of every claim (0 for what its source does not
// report, as the kubelet exports them), and the health of claims whose
// driver reports it.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.Results() {
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, s.Namespace, s.Claim)
		}
		gauge(capacityBytesDesc, float64(s.CapacityBytes))
		gauge(availableBytesDesc, float64(s.AvailableBytes))
		gauge(usedBytesDesc, float64(s.UsedBytes))
		gauge(inodesDesc, float64(s.Inodes))
		gauge(inodesFreeDesc, float64(s.InodesFree))
		gauge(inodesUsedDesc, float64(s.InodesUsed))
		if s.Health != nil {
			v := 0.0
			if s.Health.Abnormal {
				v = 1
			}
			gauge(healthAbnormalDesc, v)
		}
	}
	ch <- prometheus.MustNewConstMetric(hungCallsDesc, prometheus.GaugeValue, float64(c.fs.hungCalls()))
	c.errors.Collect(ch)
}

// Results returns the stored results, sorted by namespace and claim.
func (c *Collector) Results() []Stats {
	c.mu.RLock()
	out := make([]Stats, 0, len(c.results))
	for _, s := range c.results {
		cp := *s
		if s.Health != nil {
			h := *s.Health
			cp.Health = &h
		}
		out = append(out, cp)
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

// Refresh runs one round: it reads the stats of every volume plan picks
// and stores each answer as it arrives. What is kept of claims that are no
// longer picked (volume gone, driver gone) is dropped at the start of the
// round.
func (c *Collector) Refresh(ctx context.Context) {
	c.roundMu.Lock()
	defer c.roundMu.Unlock()
	var drivers func(string) (*registry.Driver, bool)
	if c.opts.Registry != nil {
		drivers = c.opts.Registry.Get
	}
	jobs := plan(c.opts.ASW(), drivers)
	wanted := make(map[claimKey]bool, len(jobs))
	for _, j := range jobs {
		wanted[j.key] = true
	}
	c.mu.Lock()
	for k := range c.failing {
		if !wanted[k] {
			delete(c.failing, k)
		}
	}
	for k := range c.results {
		if !wanted[k] {
			delete(c.results, k)
		}
	}
	for k := range c.abnormal {
		if !wanted[k] {
			delete(c.abnormal, k)
		}
	}
	c.mu.Unlock()
	c.run(ctx, jobs)
}

// queue holds the jobs of a round that share a source that can hang as a
// whole: one CSI driver. Each local volume has a queue of its own.
type queue struct {
	name     string
	csi      bool
	jobs     []job
	inflight int
	// timedOut: a call to this driver timed out this round; its
	// remaining calls are skipped so that it cannot hold the slots for
	// another timeout per call.
	timedOut bool
}

type outcome struct {
	job    job
	usage  Usage
	health *Health
	err    error
	at     time.Time
}

// run reads, at most Concurrency at once. Slots go to the queue with the
// fewest reads in flight, so a hung driver or disk holds at most its share
// of them while the others carry on, and a driver gets none for the rest
// of the round after its first timeout.
func (c *Collector) run(ctx context.Context, jobs []job) {
	queues := map[string]*queue{}
	var order []*queue
	for _, j := range jobs {
		name := "fs\x00" + j.path
		if j.driver != nil {
			name = "csi\x00" + j.driver.Name
		}
		q := queues[name]
		if q == nil {
			q = &queue{name: name, csi: j.driver != nil}
			queues[name] = q
			order = append(order, q)
		}
		q.jobs = append(q.jobs, j)
	}
	sort.Slice(order, func(i, k int) bool { return order[i].name < order[k].name })
	type done struct {
		q *queue
		o outcome
	}
	results := make(chan done)
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
			go func() { results <- done{q, c.read(ctx, j)} }()
		}
		if inflight == 0 {
			return
		}
		d := <-results
		inflight--
		q, o := d.q, d.o
		q.inflight--
		if ctx.Err() != nil && o.err != nil {
			continue // stopping: not the volume's fault
		}
		c.store(o)
		if q.csi && o.err != nil && isTimeout(o.err) && !q.timedOut {
			q.timedOut = true
			if len(q.jobs) > 0 {
				c.log.Warn("CSI driver timed out on NodeGetVolumeStats; skipping its other volumes this round",
					zap.String("driver", o.job.driver.Name), zap.Int("skipped", len(q.jobs)))
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

// read reads one volume's stats.
func (c *Collector) read(ctx context.Context, j job) outcome {
	o := outcome{job: j}
	switch j.source {
	case fromDriver:
		cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
		resp, err := j.driver.Client.Node.NodeGetVolumeStats(cctx, &csi.NodeGetVolumeStatsRequest{
			VolumeId: j.handle, VolumePath: j.path, StagingTargetPath: j.staging,
		})
		cancel()
		if err == nil {
			o.usage, o.health, err = fromCSI(resp, j.withCondition)
		}
		o.err = err
	case fromFilesystem:
		o.usage, o.err = c.fs.do(ctx, j.path, c.opts.CallTimeout, func() (Usage, error) {
			st, err := c.opts.FS.Statfs(j.path)
			if err != nil {
				return Usage{}, err
			}
			return fromStatfs(&st), nil
		})
	case fromDevice:
		o.usage, o.err = c.fs.do(ctx, j.path, c.opts.CallTimeout, func() (Usage, error) {
			size, err := c.opts.FS.DeviceSize(j.path)
			return fromDeviceSize(size), err
		})
	}
	o.at = time.Now()
	return o
}

func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
}

// store records an outcome. A failed read drops the claim's earlier result:
// numbers nobody can vouch for any more are worse than none (the kubelet
// drops them too). Health events are sent after the lock is released.
func (c *Collector) store(o outcome) {
	j := o.job
	log := c.log.With(zap.String("pvc", j.key.String()), zap.String("volume", string(j.volume)),
		zap.String("plugin", j.plugin), zap.Stringer("source", j.source))
	if j.driver != nil {
		log = log.With(zap.String("driver", j.driver.Name))
	}
	c.mu.Lock()
	if o.err != nil {
		c.errors.WithLabelValues(j.errorLabel()).Inc()
		delete(c.results, j.key)
		first := !c.failing[j.key]
		c.failing[j.key] = true
		c.mu.Unlock()
		if first {
			log.Warn("cannot read volume stats", zap.String("path", j.path), zap.Error(o.err))
		} else {
			log.Debug("cannot read volume stats again", zap.Error(o.err))
		}
		return
	}
	if c.failing[j.key] {
		delete(c.failing, j.key)
		log.Info("volume stats can be read again")
	}
	s := &Stats{Namespace: j.key.namespace, Claim: j.key.name, Volume: j.volume, Plugin: j.plugin, Usage: o.usage, Health: o.health, At: o.at}
	if j.driver != nil {
		s.Driver = j.driver.Name
	}
	c.results[j.key] = s
	warn, recovered := c.healthChange(j, o.health)
	c.mu.Unlock()

	if recovered {
		log.Info("volume condition is normal again")
	}
	if len(warn) > 0 {
		msg := truncate(o.health.Message, maxMessage)
		log.Warn("volume condition is abnormal", zap.String("message", msg), zap.Int("pods", len(warn)))
		if c.opts.Events != nil {
			names := c.outerNames(j.volume)
			for _, p := range warn {
				name := names[p.pod.UID]
				if name == "" {
					name = p.specName
				}
				c.opts.Events.Event(events.PodObject(p.pod), events.Warning, events.VolumeConditionAbnormal,
					fmt.Sprintf("Volume %s: %s", name, msg))
			}
		}
	}
}

// healthChange updates the claim's health and returns the pods to warn: the
// volume's pods not yet warned about this abnormal condition (a pod that
// arrives later, or a new message, gets its own event, as each pod does
// from the kubelet); recovered reports a change back to normal. c.mu is
// held.
func (c *Collector) healthChange(j job, h *Health) (warn []podVolume, recovered bool) {
	warned, wasAbnormal := c.abnormal[j.key]
	if h == nil || !h.Abnormal {
		delete(c.abnormal, j.key)
		return nil, wasAbnormal && h != nil
	}
	next := make(map[types.UID]string, len(j.pods))
	for _, p := range j.pods {
		if msg, had := warned[p.pod.UID]; !had || msg != h.Message {
			warn = append(warn, p)
		}
		next[p.pod.UID] = h.Message
	}
	c.abnormal[j.key] = next
	return warn, false
}

// outerNames returns the pods' own names of the volume, by pod UID.
func (c *Collector) outerNames(name volume.UniqueName) map[types.UID]string {
	out := map[types.UID]string{}
	if c.opts.DSW == nil {
		return out
	}
	dsw := c.opts.DSW()
	if dsw == nil {
		return out
	}
	if v := dsw.Volume(name); v != nil {
		for uid, p := range v.Pods.All() {
			if len(p.OuterNames) > 0 {
				names := append([]string(nil), p.OuterNames...)
				sort.Strings(names)
				out[uid] = names[0]
			}
		}
	}
	return out
}

// maxMessage bounds a driver's message in logs and events.
const maxMessage = 1024

// truncate cuts s to at most n bytes, at a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
