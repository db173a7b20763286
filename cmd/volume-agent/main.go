// Command volume-agent manages the volumes of the pods on its node, the way
// the kubelet's volume manager does, as a standalone program. See README.md.
//
// `volume-agent status` shows what a running agent's page shows, in a
// terminal (package ui/statuscmd).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/agent"
	"github.com/volume-agent/volume-agent/internal/logging"
	"github.com/volume-agent/volume-agent/internal/procs"
	"github.com/volume-agent/volume-agent/ui/statuscmd"
	"github.com/volume-agent/volume-agent/usage"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "status" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		err := statuscmd.Main(ctx, os.Args[2:], os.Stdout, os.Stderr)
		stop()
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "volume-agent status:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "volume-agent:", err)
		os.Exit(1)
	}
}

// heapFloor is the size of the heap floor (see run).
const heapFloor = 16 << 20

func run() error {
	if os.Getenv("GOGC") == "" {
		// The agent's heap is mostly short-lived garbage from bursts
		// (parsing manifests, thousands of operations); collecting at 50%
		// growth instead of 100% keeps the resident size of an agent on
		// every node well down for a little CPU during bursts only.
		debug.SetGCPercent(50)
		// A heap floor: held and never touched for the life of the
		// process, it counts as live heap, so a burst's garbage is
		// collected every 8 MiB or more instead of every megabyte or two
		// that 50% of a small heap allows (a dozen collections in the
		// first 200 ms of a 500-pod storm; with the floor, 15% less CPU
		// and time to set it up). Never written, its pages never become
		// resident (1 MiB more RSS measured at 500 pods).
		floor := make([]byte, heapFloor)
		defer runtime.KeepAlive(floor)
	}
	var cfg agent.Config
	var nodeLabels, logLevel string
	fs := flag.NewFlagSet("volume-agent", flag.ContinueOnError)
	fs.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node (default $NODE_NAME)")
	fs.StringVar(&nodeLabels, "node-labels", "", "standalone mode: this node's labels, k=v,k2=v2 (checked against PV node affinity)")
	fs.Func("node-ip", "standalone mode: this node's IP, or two comma-separated (one of each family), as the kubelet's flag: what status.hostIP and status.hostIPs read in subPathExpr (default: the pod's status in its manifest)", func(s string) error {
		cfg.NodeIPs = strings.Split(s, ",")
		return nil
	})
	fs.StringVar(&cfg.RootDir, "root-dir", "/var/lib/volume-agent", "directory holding pods' volume directories and the agent's state")
	fs.BoolVar(&cfg.SharedRootDir, "shared-root-dir", true, "make the root directory a mount with shared propagation at start (bound onto itself unless it lies in a shared mount already), as the kubelet does, so that mounts a CSI driver container makes below it reach the host and the pods")
	fs.StringVar(&cfg.HostRoot, "host-root", "/", "where the node's root filesystem is visible (e.g. /host in a container); hostPath and local paths are resolved within it, symbolic links as on the node")
	fs.StringVar(&cfg.PodManifestPath, "pod-manifest-path", "", "standalone mode: directory of Pod, PV, PVC, StorageClass and CSIDriver manifests (YAML or JSON)")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "cluster mode: kubeconfig file (without it and without --pod-manifest-path, the in-cluster configuration is used)")
	fs.StringVar(&cfg.NodeKubeconfig, "node-kubeconfig", "", "cluster mode: kubeconfig with the node's own identity (system:node:<name>, e.g. the kubelet's /var/lib/kubelet/kubeconfig); secrets, configMaps and service-account tokens for API volumes are requested with it, so the Node authorizer limits them to what this node's pods reference")
	fs.StringVar(&cfg.BootstrapKubeconfig, "bootstrap-kubeconfig", "", "cluster mode, a node without a kubelet: kubeconfig (e.g. with a bootstrap token) to request the node's own client certificate (system:node:<name>) with, as the kubelet does; it is kept in --node-cert-dir, renewed before it expires, and used as --node-kubeconfig would be")
	fs.StringVar(&cfg.NodeCertDir, "node-cert-dir", "", "with --bootstrap-kubeconfig: directory of the node's client certificate and key (default <root-dir>/pki)")
	var qps float64
	fs.Float64Var(&qps, "kube-api-qps", 50, "cluster mode: sustained requests per second to the API server (watches do not count), as the kubelet's default; pod condition patches have a limit of their own of the same size")
	fs.IntVar(&cfg.KubeAPIBurst, "kube-api-burst", 100, "cluster mode: request burst to the API server (and of pod condition patches)")
	fs.IntVar(&cfg.StatusWorkers, "status-workers", 16, "cluster mode: pod condition updates sent in parallel")
	fs.StringVar(&cfg.PluginRegistryDir, "plugin-registry-dir", "", "directory watched for kubelet-style CSI driver registration sockets (default <root-dir>/plugins_registry; point it at /var/lib/kubelet/plugins_registry to share node-driver-registrar's sockets)")
	fs.Func("csi-driver", "a CSI driver without a registration socket, NAME=unix:///path/csi.sock (repeatable)", func(s string) error {
		d, err := agent.ParseStaticDriver(s)
		if err == nil {
			cfg.CSIDrivers = append(cfg.CSIDrivers, d)
		}
		return err
	})
	fs.StringVar(&cfg.AttachMode, "attach-mode", "controller", "cluster mode, attach-required CSI drivers: controller (wait for the attach/detach controller's VolumeAttachment) or self (the agent creates it and attaches through the driver)")
	fs.BoolVar(&cfg.CSINodeInfo, "csi-node-info", true, "cluster mode: tell the cluster which CSI drivers are on this node, as the kubelet does: the node's CSINode, the Node's csi.volume.kubernetes.io/nodeid annotation and the drivers' topology labels; turn it off where a kubelet does it")
	fs.BoolVar(&cfg.AttachDetachAnnotation, "attach-detach-annotation", true, "cluster mode: keep the Node's volumes.kubernetes.io/controller-managed-attach-detach annotation in step with --attach-mode (\"true\" for controller, removed for self), as the kubelet does; false leaves it alone")
	fs.DurationVar(&cfg.CSIProbePeriod, "csi-probe-period", 30*time.Second, "how often registered CSI drivers are probed; three failures in a row deregister a driver")
	fs.DurationVar(&cfg.VolumeStatsAggPeriod, "volume-stats-agg-period", time.Minute, "how often the kubelet_volume_stats_* of claim-backed volumes are read (as the kubelet's flag); negative disables them")
	fs.DurationVar(&cfg.UsagePeriod, "volume-usage-period", time.Minute, "how often the usage of every emptyDir (and hostPath volume, with --measure-host-path-usage) is measured, for volume_agent_volume_used_bytes, the page and the pods over their limits; negative disables it")
	fs.IntVar(&cfg.UsageEntriesPerSecond, "usage-entries-per-second", usage.DefaultEntriesPerSecond, "directory entries per second all usage walks of the node look at together")
	fs.DurationVar(&cfg.UsageWalkTimeout, "usage-walk-timeout", usage.DefaultWalkTimeout, "how long one volume's usage walk may take; a walk cut short keeps the volume's last figures")
	fs.BoolVar(&cfg.MeasureHostPathUsage, "measure-host-path-usage", false, "measure hostPath volumes' usage too (walks of host directories)")
	fs.Func("api-volume-pod-bytes", "bytes of configMap, secret, downwardAPI and projected content one pod's volumes may hold together (a quantity: 32Mi); the agent writes it, so it counts against the agent's memory; a volume over it fails with an error naming pod, volume and sizes; negative: no bound (default 32Mi)", func(s string) error {
		return parseBytes(s, &cfg.APIVolumePodBytes)
	})
	fs.Func("api-volume-node-bytes", "bytes of that content all volumes on the node may hold together; the agent's memory limit must cover twice this (a rewrite holds the old and the new content) plus the agent's own; negative: no bound (default 128Mi)", func(s string) error {
		return parseBytes(s, &cfg.APIVolumeNodeBytes)
	})
	fs.StringVar(&cfg.EmptyDirSizeLimit, "empty-dir-size-limit", "auto", "how the sizeLimit of disk emptyDirs is enforced: quota (project quotas on the root directory's filesystem; the agent does not start without them), image (a filesystem image per volume, mounted through a loop device), auto (quota where the filesystem enforces project quotas, else image) or off (not enforced)")
	fs.StringVar(&cfg.LocalVolumesConfig, "local-volumes-config", "", "cluster mode: turn on the local volume provisioner with this configuration file (see docs/local-volumes.md); reloaded on change")
	fs.StringVar(&cfg.DebugAddress, "debug-address", "127.0.0.1:9808", "address of the debug endpoint (/debug/*, /healthz, /readyz); empty disables it")
	fs.StringVar(&cfg.RuntimeSocket, "runtime-socket", "", "unix socket of the runtime API, for container runtimes (root only; see docs/runtime-api.md; default <root-dir>/runtime.sock)")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", ":9809", "address of the Prometheus endpoint (/metrics); empty disables it")
	fs.StringVar(&cfg.HealthAddress, "health-address", "", "address of an endpoint serving only /healthz and /readyz, with connections of its own that a flood of the metrics endpoint cannot take: point the kubelet's probes at it (the deployment uses :9810); empty disables it")
	fs.DurationVar(&cfg.ResyncPeriod, "resync-period", time.Minute, "longest time between two full passes of the populator and the reconciler (changes trigger passes at once)")
	fs.DurationVar(&cfg.OperationTimeout, "operation-timeout", 2*time.Minute, "time limit of each volume operation")
	fs.IntVar(&cfg.MaxConcurrentOperations, "max-concurrent-operations", 64, "volume operations running at once")
	fs.DurationVar(&cfg.ShutdownGracePeriod, "shutdown-grace-period", 30*time.Second, "on SIGTERM, how long to wait for running operations")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	cfg.KubeAPIQPS = float32(qps)
	labels, err := parseLabels(nodeLabels)
	if err != nil {
		return err
	}
	cfg.NodeLabels = labels

	var level zapcore.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log, stopLog := logging.New(level, os.Stderr)
	defer stopLog()
	cfg.Log = log
	cfg.Procs = procs.New()
	cfg.BurstGC = os.Getenv("GOGC") == ""

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// parseBytes reads a byte count written as a quantity (32Mi, 1G, 4096).
func parseBytes(s string, into *int64) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return err
	}
	n, ok := q.AsInt64()
	if !ok || n == 0 {
		return fmt.Errorf("%q: want a whole number of bytes, positive, or negative for no bound", s)
	}
	*into = n
	return nil
}

func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--node-labels: %q is not key=value", kv)
		}
		out[k] = v
	}
	return out, nil
}
