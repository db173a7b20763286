package agent

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/volume-agent/volume-agent/agent/httpserve"
	"github.com/volume-agent/volume-agent/internal/disklimit"
	"github.com/volume-agent/volume-agent/internal/procs"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/usage"
)

// Config is the agent's configuration; cmd/volume-agent fills it from flags.
type Config struct {
	NodeName string
	// NodeLabels are this node's labels in standalone mode (used to check
	// PV node affinity); kubernetes.io/hostname is added from NodeName.
	NodeLabels map[string]string
	// NodeIPs are this node's IPs in standalone mode (--node-ip, as the
	// kubelet's: one, or one of each family), what status.hostIP(s) read
	// in subPathExpr; complete writes them in canonical form.
	NodeIPs []string
	RootDir string
	// SharedRootDir makes the root directory a shared mount at start
	// (mountutil.MakeShared), as the kubelet makes its own.
	SharedRootDir bool
	// HostRoot is where the node's root filesystem is visible ("/" unless
	// the agent runs in a container that mounts it elsewhere).
	HostRoot string
	// PodManifestPath selects standalone mode.
	PodManifestPath string
	// Kubeconfig selects cluster mode with a kubeconfig file; without it
	// and without PodManifestPath, the in-cluster configuration is used.
	Kubeconfig string
	// NodeKubeconfig, in cluster mode, is a kubeconfig with the node's own
	// identity (system:node:<name>, e.g. the kubelet's): secrets,
	// configMaps, ClusterTrustBundles and service-account tokens are then
	// requested with it, and the API server's Node authorizer limits them
	// to what the node's pods reference, as it does for the kubelet.
	NodeKubeconfig string
	// BootstrapKubeconfig, in cluster mode, makes the node's identity a
	// client certificate obtained and rotated the kubelet's way
	// (internal/nodecert): used as NodeKubeconfig is. NodeCertDir keeps it
	// (default <root>/pki).
	BootstrapKubeconfig string
	NodeCertDir         string
	// KubeAPIQPS and KubeAPIBurst limit each API client's requests (the
	// main one, pod condition patches, and the node's): default 50 and
	// 100, as the kubelet's.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// StatusWorkers patch pod conditions in parallel (cluster mode).
	StatusWorkers int

	// PluginRegistryDir is watched for kubelet-style CSI registration
	// sockets (default <root>/plugins_registry).
	PluginRegistryDir string
	// CSIDrivers are drivers configured without a registration socket.
	CSIDrivers []StaticDriver
	// AttachMode is "controller" (an attach/detach controller owns
	// VolumeAttachments) or "self" (the agent attaches) in cluster mode.
	AttachMode string
	// CSIProbePeriod is how often registered drivers are probed.
	CSIProbePeriod time.Duration
	// CSINodeInfo writes the node's CSINode and the Node's CSI annotation
	// and topology labels for the registered drivers (cluster mode).
	CSINodeInfo bool
	// AttachDetachAnnotation keeps the Node's
	// controller-managed-attach-detach annotation in step with AttachMode
	// (cluster mode).
	AttachDetachAnnotation bool
	// VolumeStatsAggPeriod is how often volume stats are read (the
	// kubelet's --volume-stats-agg-period); 0: 1m, negative: never.
	VolumeStatsAggPeriod time.Duration
	// UsagePeriod is how often emptyDir (and hostPath) usage is measured;
	// 0: 1m, negative: never. UsageEntriesPerSecond bounds the entries
	// all walks look at together, UsageWalkTimeout one walk (0: the
	// defaults of package usage). MeasureHostPathUsage measures hostPath
	// volumes too. UsageSource answers cheaply for the volumes it backs
	// besides the sizeLimit enforcement (asked before it; nil: none).
	UsagePeriod           time.Duration
	UsageEntriesPerSecond int
	UsageWalkTimeout      time.Duration
	MeasureHostPathUsage  bool
	UsageSource           usage.Source

	// APIVolumePodBytes and APIVolumeNodeBytes bound the content of API
	// volumes (configMap, secret, downwardAPI, projected) of one pod and
	// of the node: the agent writes it, so its pages are charged to the
	// agent's memory cgroup (package plugins/apivolume/budget). 0: the
	// default (DefaultAPIVolumePodBytes, DefaultAPIVolumeNodeBytes);
	// negative: no bound.
	APIVolumePodBytes  int64
	APIVolumeNodeBytes int64

	// EmptyDirSizeLimit is how disk emptyDirs' sizeLimit is enforced
	// (internal/disklimit: auto, quota, image, off; "" is auto).
	EmptyDirSizeLimit string

	// LocalVolumesConfig turns on the local volume provisioner (cluster
	// mode only).
	LocalVolumesConfig string

	DebugAddress   string
	MetricsAddress string
	// HealthAddress serves /healthz and /readyz alone ("" disables it;
	// the debug and metrics endpoints serve them too), with connections
	// of its own that no flood of the metrics endpoint can take: point
	// the kubelet's probes at it.
	HealthAddress string
	// HTTP bounds what clients of both endpoints can make the agent hold.
	HTTP httpserve.Limits
	// RuntimeSocket is the runtime API's unix socket (default
	// <root>/runtime.sock).
	RuntimeSocket string

	ResyncPeriod            time.Duration
	OperationTimeout        time.Duration
	MaxConcurrentOperations int
	// ShutdownGracePeriod bounds how long a stopping agent waits for
	// running operations.
	ShutdownGracePeriod time.Duration
	// Procs is the runtime tuning of the process (internal/procs): spare
	// Ps during a burst of teardown, and the CPUs manifests are parsed
	// on. nil leaves the runtime's default alone (several agents in one
	// test process).
	Procs *procs.Tuning
	// BurstGC lets the GC run less often during bursts (agent/burst.GC);
	// off when GOGC is set, and for several agents in one test process.
	BurstGC bool

	Log *zap.Logger
}

// standalone reports whether the agent reads a manifest directory instead
// of the API server.
func (c *Config) standalone() bool { return c.PodManifestPath != "" }

// complete checks the configuration and fills in defaults.
func (c Config) complete() (Config, error) {
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	if c.NodeName == "" {
		return c, errors.New("the node name is required (--node-name)")
	}
	if c.RootDir == "" || !filepath.IsAbs(c.RootDir) {
		return c, fmt.Errorf("the root directory must be an absolute path, not %q", c.RootDir)
	}
	switch c.AttachMode {
	case "", "controller", "self":
	default:
		return c, fmt.Errorf("--attach-mode must be controller or self, not %q", c.AttachMode)
	}
	if c.NodeKubeconfig != "" && c.standalone() {
		return c, errors.New("--node-kubeconfig needs cluster mode: it is the node's identity on the API server")
	}
	if c.BootstrapKubeconfig != "" && c.standalone() {
		return c, errors.New("--bootstrap-kubeconfig needs cluster mode: it obtains the node's identity on the API server")
	}
	if c.BootstrapKubeconfig != "" && c.NodeKubeconfig != "" {
		return c, errors.New("--bootstrap-kubeconfig and --node-kubeconfig both give the node's identity: set one")
	}
	if c.NodeCertDir == "" {
		c.NodeCertDir = filepath.Join(c.RootDir, "pki")
	}
	ips, err := nodeIPs(c.NodeIPs, c.standalone())
	if err != nil {
		return c, err
	}
	c.NodeIPs = ips
	if c.LocalVolumesConfig != "" && c.standalone() {
		return c, errors.New("--local-volumes-config needs cluster mode: the local volume provisioner creates PersistentVolumes")
	}
	if _, err := disklimit.ParseMode(c.EmptyDirSizeLimit); err != nil {
		return c, err
	}
	if c.ShutdownGracePeriod <= 0 {
		c.ShutdownGracePeriod = 30 * time.Second
	}
	if c.RuntimeSocket == "" {
		c.RuntimeSocket = runtimeapi.Socket(c.RootDir)
	}
	if c.PluginRegistryDir == "" {
		c.PluginRegistryDir = filepath.Join(c.RootDir, "plugins_registry")
	}
	if c.CSIProbePeriod <= 0 {
		c.CSIProbePeriod = 30 * time.Second
	}
	if c.StatusWorkers <= 0 {
		c.StatusWorkers = 16
	}
	// The kubelet's defaults: what a node is expected to ask of the API
	// server.
	if c.KubeAPIQPS <= 0 {
		c.KubeAPIQPS = 50
	}
	if c.KubeAPIBurst <= 0 {
		c.KubeAPIBurst = 100
	}
	c.HTTP = c.HTTP.WithDefaults()
	if c.APIVolumePodBytes == 0 {
		c.APIVolumePodBytes = DefaultAPIVolumePodBytes
	}
	if c.APIVolumeNodeBytes == 0 {
		c.APIVolumeNodeBytes = DefaultAPIVolumeNodeBytes
	}
	return c, nil
}

// The API-volume budgets' defaults. A pod: 32 full-size (1 MiB) Secrets or
// ConfigMaps, far more than real pods mount (the injected
// kube-api-access volume is three small files). The node: 128 MiB, which
// deploy/base/daemonset.yaml's memory limit covers twice over (a rewrite
// holds the old and the new content until it swaps them) on top of what
// the agent itself needs.
const (
	DefaultAPIVolumePodBytes  = 32 << 20
	DefaultAPIVolumeNodeBytes = 128 << 20
)

// nodeIPs checks --node-ip as the kubelet does (one IP, or two of different
// families; not 0.0.0.0 or ::, which the kubelet reads as "detect it" and
// the agent cannot) and writes each in canonical form.
func nodeIPs(raw []string, standalone bool) ([]string, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if !standalone {
		return nil, errors.New("--node-ip needs standalone mode: in cluster mode the Node's addresses are the node's IPs")
	}
	if len(raw) > 2 {
		return nil, fmt.Errorf("--node-ip %q: at most two IPs (one of each family)", strings.Join(raw, ","))
	}
	var out []string
	var fams []bool
	for _, s := range raw {
		ip := net.ParseIP(strings.TrimSpace(s))
		if ip == nil || ip.IsUnspecified() {
			return nil, fmt.Errorf("--node-ip: %q is not a node IP", s)
		}
		out, fams = append(out, ip.String()), append(fams, ip.To4() != nil)
	}
	if len(out) == 2 && fams[0] == fams[1] {
		return nil, fmt.Errorf("--node-ip %q: two IPs must be one IPv4 and one IPv6", strings.Join(raw, ","))
	}
	return out, nil
}
