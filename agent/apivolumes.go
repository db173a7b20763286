package agent

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/apivolume"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/refresh"
	"github.com/volume-agent/volume-agent/source/apiobjects"
	"github.com/volume-agent/volume-agent/source/manifest"
	"github.com/volume-agent/volume-agent/source/objectwatch"
	"github.com/volume-agent/volume-agent/tokens"
)

// apiVolumes serves configMap, secret, downwardAPI and projected volumes
// and keeps them current.
type apiVolumes struct {
	plugins []plugins.Plugin
	status  *apivolume.Status
	refresh *refresh.Refresher
	// objects and tokens exist in cluster mode only.
	objects *apiobjects.Cluster
	tokens  *tokens.Manager
	// credentials says whose credentials read secrets and request tokens.
	credentials string
	metrics     *apiVolumeMetrics
}

// newAPIVolumes builds the plugins and what feeds them: in standalone mode
// the manifest directory (no tokens: there is no API server), in cluster
// mode per-object watches and TokenRequests, made with the node's own
// credentials when cfg.NodeKubeconfig is set. The refresher gives pod
// volumes new content generations in dsw.
func newAPIVolumes(cfg Config, host plugins.Host, m *mode, dsw refresh.Desired) *apiVolumes {
	log := cfg.Log
	a := &apiVolumes{metrics: newAPIVolumeMetrics()}
	src := apivolume.Sources{
		NoTokensReason:       noTokensReason + " (set automountServiceAccountToken: false, or remove the projection)",
		NoTrustBundlesReason: "clusterTrustBundle projections need an API server, and this agent runs in standalone mode",
	}
	ropts := refresh.Options{Desired: dsw, Observer: a.metrics, Log: log.Named("refresh")}
	// The refresher is told about changes; it is built last, from the
	// parts below.
	var onChange func(kind, ns, name string)
	changed := func(kind, ns, name string) { onChange(kind, ns, name) }
	if c := m.cluster; c == nil {
		ms := m.source.(*manifest.Source)
		src.Objects = apiobjects.Manifest{Store: ms}
		src.NodeAllocatable = hostAllocatable(cfg.RootDir)
		ms.OnObjectChange(changed)
		a.credentials = "none (standalone mode)"
	} else {
		a.credentials = "the agent's own (its ServiceAccount)"
		if c.nodeClient != nil {
			a.credentials = "the node's (" + cfg.NodeKubeconfig + ")"
			if c.nodeCert != nil {
				a.credentials = "the node's own certificate (" + cfg.NodeCertDir + ")"
			}
		}
		client := c.objectsClient()
		a.objects = apiobjects.NewCluster(apiobjects.ClusterOptions{Client: client, OnChange: changed, Limiter: c.listing, Log: log.Named("objects")})
		a.tokens = tokens.New(tokens.Options{Requester: client, Observer: a.metrics})
		src.Objects, src.Tokens, src.TrustBundles = a.objects, a.tokens, a.objects
		src.NodeAllocatable = func() v1.ResourceList {
			if n, ok := c.source.Node(); ok {
				return n.Status.Allocatable
			}
			return nil
		}
		ropts.Watches, ropts.Tokens = a.objects, a.tokens
	}
	a.refresh = refresh.New(ropts)
	onChange = a.refresh.ObjectChanged
	src.Pods = a.refresh
	a.plugins, a.status = apivolume.New(host, src)
	log.Info("API volumes: configMap, secret, downwardAPI, projected", zap.String("credentials", a.credentials))
	return a
}

// noTokensReason says why standalone mode has no service-account tokens,
// in the error of every volume that needs one.
const noTokensReason = "service-account tokens need an API server, and this agent runs in standalone mode"

// tokenIssuer is the token cache for other plugins (CSI tokenRequests), nil
// in standalone mode.
func (a *apiVolumes) tokenIssuer() csiplugin.TokenIssuer {
	if a.tokens == nil {
		return nil
	}
	return a.tokens
}

func (a *apiVolumes) collectors() []prometheus.Collector {
	return []prometheus.Collector{a.metrics.refreshSeconds, a.metrics.tokenRequests}
}

func (a *apiVolumes) stop() {
	if a.objects != nil {
		a.objects.Stop()
	}
}

// APIVolumesDocument is GET /debug/api-volumes: what each API volume was
// built from and when it was last written, what is watched, and the
// tokens' lifetimes. Never any content: no data, no token.
type APIVolumesDocument struct {
	Credentials string                   `json:"credentials"`
	Volumes     []apivolume.VolumeStatus `json:"volumes"`
	Watches     []objectwatch.KeyStatus  `json:"watches"`
	Tokens      []tokens.Status          `json:"tokens"`
	Refresh     refresh.Stats            `json:"refresh"`
}

func (a *apiVolumes) document() APIVolumesDocument {
	d := APIVolumesDocument{Credentials: a.credentials, Volumes: a.status.List(), Refresh: a.refresh.Stats(),
		Watches: []objectwatch.KeyStatus{}, Tokens: []tokens.Status{}}
	if a.objects != nil {
		d.Watches = a.objects.Status()
	}
	if a.tokens != nil {
		d.Tokens = a.tokens.Status()
	}
	return d
}

type apiVolumeMetrics struct {
	refreshSeconds *prometheus.HistogramVec
	tokenRequests  *prometheus.CounterVec
}

func newAPIVolumeMetrics() *apiVolumeMetrics {
	return &apiVolumeMetrics{
		refreshSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "volume_refresh_seconds",
			Help:    "Time from a change of what a volume is built from (object, pod metadata, token due, republish due) to the volume's content catching up, by plugin.",
			Buckets: buckets,
		}, []string{"plugin"}),
		tokenRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "token_requests_total",
			Help: "Service-account token requests (new tokens and refreshes), by result (success, failure).",
		}, []string{"result"}),
	}
}

func (m *apiVolumeMetrics) Refreshed(plugin string, took time.Duration) {
	m.refreshSeconds.WithLabelValues(plugin).Observe(took.Seconds())
}

func (m *apiVolumeMetrics) TokenRequested(err error) {
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.tokenRequests.WithLabelValues(result).Inc()
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

// hostAllocatable is standalone mode's node allocatable, for unset limits
// of resourceFieldRef items: the machine's CPUs and memory and the size of
// the filesystem of the root directory (there is no Node object).
func hostAllocatable(rootDir string) func() v1.ResourceList {
	return func() v1.ResourceList {
		out := v1.ResourceList{v1.ResourceCPU: *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI)}
		if mem, err := memTotal(); err == nil {
			out[v1.ResourceMemory] = *resource.NewQuantity(mem, resource.BinarySI)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(rootDir, &st); err == nil {
			out[v1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(st.Blocks)*st.Bsize, resource.BinarySI)
		}
		return out
	}
}

func memTotal() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
}
