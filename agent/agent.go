// Package agent wires volume-agent together: a source (manifest directory or
// API server), the populator, the two caches, the executor and operator with
// the volume plugins, the reconciler, and the local HTTP endpoints (debug
// JSON, health, Prometheus metrics).
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/populator"
	"github.com/volume-agent/volume-agent/reconciler"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/source/kube"
	"github.com/volume-agent/volume-agent/source/manifest"
	"github.com/volume-agent/volume-agent/status/claimstatus"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/volume"
)

// Config is the agent's configuration; cmd/volume-agent fills it from flags.
type Config struct {
	NodeName string
	// NodeLabels are this node's labels in standalone mode (used to check
	// PV node affinity); kubernetes.io/hostname is added from NodeName.
	NodeLabels map[string]string
	RootDir    string
	// HostRoot is where the node's root filesystem is visible ("/" unless
	// the agent runs in a container that mounts it elsewhere).
	HostRoot string
	// PodManifestPath selects standalone mode.
	PodManifestPath string
	// Kubeconfig selects cluster mode with a kubeconfig file; without it
	// and without PodManifestPath, the in-cluster configuration is used.
	Kubeconfig   string
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

	// LocalVolumesConfig turns on the local volume provisioner (cluster
	// mode only).
	LocalVolumesConfig string

	DebugAddress   string
	MetricsAddress string

	ResyncPeriod            time.Duration
	OperationTimeout        time.Duration
	MaxConcurrentOperations int
	// ShutdownGracePeriod bounds how long a stopping agent waits for
	// running operations.
	ShutdownGracePeriod time.Duration

	Log *zap.Logger
}

// Agent is a running volume-agent.
type Agent struct {
	cfg        Config
	log        *zap.Logger
	source     source.Source
	dsw        *cache.DesiredStateOfWorld
	asw        *cache.ActualStateOfWorld
	executor   *operations.Executor
	populator  *populator.Populator
	reconciler *reconciler.Reconciler
	events     *events.Log
	metrics    *Metrics
	cluster    *clusterParts
	podStatus  *podstatus.Reporter
	csi        *csiParts
	localPV    *localpv.Provisioner
	orphans    *reconciler.Orphans
	paths      volume.Paths
	plugins    *plugins.Registry
	mounter    *mountutil.Mounter

	debugListener   net.Listener
	metricsListener net.Listener
}

// New builds an agent and opens its listeners; Run starts it.
func New(cfg Config) (*Agent, error) {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.NodeName == "" {
		return nil, errors.New("the node name is required (--node-name)")
	}
	if cfg.RootDir == "" || !filepath.IsAbs(cfg.RootDir) {
		return nil, fmt.Errorf("the root directory must be an absolute path, not %q", cfg.RootDir)
	}
	if cfg.ShutdownGracePeriod <= 0 {
		cfg.ShutdownGracePeriod = 30 * time.Second
	}
	if cfg.PluginRegistryDir == "" {
		cfg.PluginRegistryDir = filepath.Join(cfg.RootDir, "plugins_registry")
	}
	if cfg.CSIProbePeriod <= 0 {
		cfg.CSIProbePeriod = 30 * time.Second
	}
	switch cfg.AttachMode {
	case "", "controller", "self":
	default:
		return nil, fmt.Errorf("--attach-mode must be controller or self, not %q", cfg.AttachMode)
	}
	paths := volume.Paths{Root: filepath.Clean(cfg.RootDir)}
	if err := os.MkdirAll(paths.PodsDir(), 0o750); err != nil {
		return nil, fmt.Errorf("creating root directory: %w", err)
	}
	log := cfg.Log
	a := &Agent{cfg: cfg, log: log}

	var err error
	var sink events.Sink
	isTerminated := populator.PodTerminated
	nodeLabels := map[string]string{"kubernetes.io/hostname": cfg.NodeName}
	for k, v := range cfg.NodeLabels {
		nodeLabels[k] = v
	}
	node := func() populator.Node { return populator.Node{Name: cfg.NodeName, Labels: nodeLabels} }
	if cfg.PodManifestPath != "" {
		a.source, err = manifest.New(manifest.Options{Dir: cfg.PodManifestPath, NodeName: cfg.NodeName, Logger: log.Named("source")})
		if err != nil {
			return nil, err
		}
	} else {
		if a.cluster, err = newClusterParts(cfg, log); err != nil {
			return nil, err
		}
		a.source, sink, isTerminated = a.cluster.source, a.cluster, kube.PodTerminated
		node = func() populator.Node {
			if n, ok := a.cluster.source.Node(); ok {
				return populator.Node{Name: cfg.NodeName, Labels: n.Labels}
			}
			return populator.Node{Name: cfg.NodeName, Labels: nodeLabels}
		}
	}

	clk := clock.RealClock{}
	a.dsw = cache.NewDesiredStateOfWorld(clk)
	a.asw = cache.NewActualStateOfWorld(clk)
	a.events = events.NewLog(log.Named("events"), 200, sink)

	a.paths, a.mounter = paths, mountutil.New()
	a.orphans = reconciler.NewOrphans(log.Named("orphans"))
	host := plugins.Host{Paths: paths, Mounter: a.mounter, NodeName: cfg.NodeName, HostRoot: cfg.HostRoot, Log: log.Named("plugins")}
	a.csi = a.setupCSI(host)
	registry := plugins.NewRegistry(emptydir.New(host), hostpath.New(host), local.New(host), a.csi.plugin)
	a.plugins = registry

	var rec *reconciler.Reconciler
	trimmer := &memoryTrimmer{}
	rep := &reporter{log: log.Named("operations"), events: a.events, trimmer: trimmer}
	a.executor = operations.NewExecutor(operations.ExecutorOptions{
		MaxConcurrent: cfg.MaxConcurrentOperations,
		Timeout:       cfg.OperationTimeout,
		Observer:      rep,
		OnStateChange: func() { rec.Trigger() },
	})
	a.populator = populator.New(populator.Options{
		Source:       a.source,
		DSW:          a.dsw,
		Plugins:      registry,
		Node:         node,
		IsTerminated: isTerminated,
		ResyncPeriod: cfg.ResyncPeriod,
		Events:       a.events,
		Log:          log.Named("populator"),
	})
	a.metrics = NewMetrics(a.dsw, a.asw, a.executor, a.source, a.populator.Ready)
	rep.metrics = a.metrics
	// Every populator pass wakes the reconciler: the first one makes the
	// sources ready (adoption, orphan cleanup) and a later one may make
	// them complete, without changing the DSW when no pod wants anything.
	a.populator.SetObserver(populatedTrigger{Metrics: a.metrics, trigger: func() { rec.Trigger() }})
	a.metrics.Registry.MustRegister(driversCollector{a.csi.drivers}, a.csi.stats, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "orphans",
		Help: "Things left on disk the agent cannot clean or account for (see /debug/orphans).",
	}, func() float64 { return float64(len(a.orphans.List())) }))
	observer := multiObserver{a.metrics, trimmer}
	if a.cluster != nil {
		kubeclient.RegisterMetrics(a.metrics.Registry)
		a.podStatus = podstatus.New(a.cluster.client, a.cluster.source.Pod, a.executor, log.Named("podstatus"))
		observer = append(observer, a.podStatus)
	}
	if a.csi.nodeStatus != nil {
		observer = append(observer, a.csi.nodeStatus)
	}

	var claims operations.ClaimStatus = claimstatus.None{}
	if a.cluster != nil {
		claims = claimstatus.New(a.cluster.client, a.cluster.source.PVC)
	}
	operator := &operations.Operator{
		Plugins: registry, ASW: a.asw, DSW: a.dsw, Paths: paths, Log: log.Named("operations"),
		Claims: claims, Events: a.events,
	}
	handler := &reconciler.OperatorHandler{Operator: operator}
	rec = reconciler.New(reconciler.Options{
		DSW: a.dsw, ASW: a.asw, Executor: a.executor,
		Handler:           handler,
		SetUpWithoutMount: a.setUpWithoutMount,
		SourcesReady:      a.populator.Ready,
		SourcesComplete:   a.sourcesComplete,
		Housekeeping: func(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot) {
			a.orphans.Set("housekeeping", reconciler.CleanPodDirs(paths, dsw, asw, a.mounter.IsMountPoint))
		},
		ResyncPeriod: cfg.ResyncPeriod,
		Observer:     observer,
		Log:          log.Named("reconciler"),
	})
	a.reconciler = rec
	if cfg.LocalVolumesConfig != "" {
		if a.cluster == nil {
			return nil, errors.New("--local-volumes-config needs cluster mode: the local volume provisioner creates PersistentVolumes")
		}
		a.localPV, err = localpv.New(localpv.Options{
			Client: a.cluster.client, NodeName: cfg.NodeName, ConfigFile: cfg.LocalVolumesConfig, HostRoot: cfg.HostRoot,
			Recorder: a.events, Log: log.Named("localpv"),
			PVInformer:    a.cluster.source.PVInformer(),
			ClassInformer: a.cluster.source.StorageClassInformer(),
			NodeInformer:  a.cluster.source.NodeInformer(),
		})
		if err != nil {
			return nil, err
		}
		a.metrics.Registry.MustRegister(a.localPV.Collectors()...)
	}
	a.csi.start(a.executor, rec.Trigger)

	if a.debugListener, err = listen(cfg.DebugAddress); err != nil {
		return nil, fmt.Errorf("debug endpoint: %w", err)
	}
	if a.metricsListener, err = listen(cfg.MetricsAddress); err != nil {
		a.closeListeners()
		return nil, fmt.Errorf("metrics endpoint: %w", err)
	}
	return a, nil
}

func listen(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	return net.Listen("tcp", addr)
}

func (a *Agent) closeListeners() {
	for _, l := range []net.Listener{a.debugListener, a.metricsListener} {
		if l != nil {
			l.Close()
		}
	}
}

// DebugAddress is where the debug endpoint listens ("" if disabled).
func (a *Agent) DebugAddress() string { return addrOf(a.debugListener) }

// MetricsAddress is where the metrics endpoint listens ("" if disabled).
func (a *Agent) MetricsAddress() string { return addrOf(a.metricsListener) }

func addrOf(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// setUpWithoutMount asks the volume's plugin whether it sets the volume up
// without a mount (for adopting volumes found after a restart).
func (a *Agent) setUpWithoutMount(plugin string, spec *volume.Spec) bool {
	p, ok := a.plugins.ByName(plugin)
	if !ok || spec == nil {
		return false
	}
	s, ok := p.(plugins.SetUpWithoutMount)
	return ok && s.SetUpWithoutMount(spec)
}

// sourcesComplete: no input of the source is unreadable (see
// source.Completeness).
func (a *Agent) sourcesComplete() bool {
	c, ok := a.source.(source.Completeness)
	return !ok || len(c.UnreadInputs()) == 0
}

// reconstruct rebuilds the actual state from disk before anything runs, so
// the first plans see what is already mounted.
func (a *Agent) reconstruct() error {
	start := time.Now()
	r, err := reconciler.Reconstruct(a.paths, a.plugins, a.mounter.IsMountPoint)
	if err != nil {
		return fmt.Errorf("reconstructing state from %s: %w", a.paths.Root, err)
	}
	a.asw.AddReconstructed(r.Volumes)
	a.orphans.Set("reconstruction", r.Problems)
	pods, devices := 0, 0
	for _, v := range r.Volumes {
		pods += len(v.Pods)
		if v.DeviceReconstructed {
			devices++
		}
	}
	a.metrics.reconstructed.Add(float64(pods))
	a.log.Info("reconstructed state from disk: nothing is torn down before the sources are read completely",
		zap.Int("podVolumes", pods), zap.Int("deviceMounts", devices), zap.Int("problems", len(r.Problems)),
		zap.Duration("took", time.Since(start)))
	return nil
}

// populatedTrigger is the populator's observer: the metrics, and a
// reconciler pass after every populator pass.
type populatedTrigger struct {
	*Metrics
	trigger func()
}

func (p populatedTrigger) Populated(took time.Duration, pods int) {
	p.Metrics.Populated(took, pods)
	p.trigger()
}

// multiObserver fans a reconciler pass out to several observers.
type multiObserver []reconciler.Observer

func (m multiObserver) Reconciled(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, actions []reconciler.Action, took time.Duration) {
	for _, o := range m {
		o.Reconciled(dsw, asw, actions, took)
	}
}

// readiness says whether the agent acts on a complete view of its sources.
func (a *Agent) readiness() (string, bool) {
	if !a.source.HasSynced() {
		if a.cluster != nil {
			return "waiting for the API server: not every watch has listed yet", false
		}
		return "sources not read completely yet", false
	}
	if !a.populator.Ready() {
		return "desired state not populated yet", false
	}
	return "", true
}

// Run runs the agent until ctx ends. Stopping unmounts nothing: mounts stay
// for the pods that use them, and the next start adopts them.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("starting", zap.String("node", a.cfg.NodeName), zap.String("rootDir", a.cfg.RootDir),
		zap.String("debugAddress", a.DebugAddress()), zap.String("metricsAddress", a.MetricsAddress()))

	if err := a.reconstruct(); err != nil {
		return err
	}
	var servers []*http.Server
	if a.debugListener != nil {
		servers = append(servers, &http.Server{Handler: a.debugMux(), ReadHeaderTimeout: 10 * time.Second})
	}
	if a.metricsListener != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.Registry, promhttp.HandlerOpts{}))
		// Probes reach the pod's address, not loopback where the debug
		// endpoint listens: health and readiness are served here too.
		a.healthHandlers(mux)
		servers = append(servers, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second})
	}
	listeners := []net.Listener{}
	for _, l := range []net.Listener{a.debugListener, a.metricsListener} {
		if l != nil {
			listeners = append(listeners, l)
		}
	}

	var wg sync.WaitGroup
	errc := make(chan error, 1+len(servers))
	for i, s := range servers {
		wg.Add(1)
		go func(s *http.Server, l net.Listener) {
			defer wg.Done()
			if err := s.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}(s, listeners[i])
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(3)
	go func() {
		defer wg.Done()
		if err := a.source.Run(runCtx); err != nil && runCtx.Err() == nil {
			errc <- fmt.Errorf("source: %w", err)
		}
	}()
	go func() { defer wg.Done(); a.populator.Run(runCtx) }()
	logDriverConfig(a.log, a.cfg.CSIDrivers, a.cfg.PluginRegistryDir)
	a.csi.run(runCtx, a.cfg.CSIDrivers, a.cfg.CSIProbePeriod)
	if a.localPV != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.localPV.Run(runCtx); err != nil && runCtx.Err() == nil {
				errc <- fmt.Errorf("local volume provisioner: %w", err)
			}
		}()
	}
	go func() { defer wg.Done(); a.reconciler.Run(runCtx) }()
	if a.cluster != nil {
		a.cluster.start()
		defer a.cluster.stop()
		workers := a.cfg.StatusWorkers
		if workers <= 0 {
			workers = 4
		}
		wg.Add(1)
		go func() { defer wg.Done(); a.podStatus.Run(runCtx, workers) }()
	}

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		a.log.Error("stopping after a fatal error", zap.Error(err))
	}
	cancel()
	a.log.Info("stopping: waiting for running operations; nothing will be unmounted")
	waitCtx, waitCancel := context.WithTimeout(context.Background(), a.cfg.ShutdownGracePeriod)
	if werr := a.executor.Wait(waitCtx); werr != nil {
		a.log.Warn("operations still running at exit", zap.Error(werr))
	}
	waitCancel()
	for _, s := range servers {
		shutdownCtx, c := context.WithTimeout(context.Background(), time.Second)
		_ = s.Shutdown(shutdownCtx)
		c()
	}
	wg.Wait()
	a.log.Info("stopped")
	return err
}
