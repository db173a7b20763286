// Package agent wires volume-agent together: a source (manifest directory or
// API server), the populator, the two caches, the executor and operator with
// the volume plugins, the reconciler, and the local HTTP endpoints (debug
// JSON, health, Prometheus metrics). New builds the mode's parts (standalone
// or cluster) and the shared ones; Run supervises every long-running loop
// in one place, so a fatal error stops the agent and nothing outlives Run.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/blockpin"
	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/internal/subpath"
	"github.com/volume-agent/volume-agent/internal/trash"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/populator"
	"github.com/volume-agent/volume-agent/reconciler"
	"github.com/volume-agent/volume-agent/reconciler/housekeeping"
	runtimeserver "github.com/volume-agent/volume-agent/runtimeapi/server"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/ui"
	"github.com/volume-agent/volume-agent/ui/timeline"
	"github.com/volume-agent/volume-agent/volume"
)

// Agent is a running volume-agent.
type Agent struct {
	cfg        Config
	log        *zap.Logger
	mode       *mode
	source     source.Source
	dsw        *cache.DesiredStateOfWorld
	asw        *cache.ActualStateOfWorld
	executor   *operations.Executor
	populator  *populator.Populator
	reconciler *reconciler.Reconciler
	events     *events.Log
	metrics    *Metrics
	trimmer    *memoryTrimmer
	podStatus  *podstatus.Reporter
	csi        *csiParts
	api        *apiVolumes
	localPV    *localpv.Provisioner
	orphans    *housekeeping.Orphans
	history    *timeline.Ring
	page       *ui.Server
	paths      volume.Paths
	plugins    *plugins.Registry
	mounter    *mountutil.Mounter
	// pins keeps raw block devices open under pods' access points.
	pins       *blockpin.Loops
	runtimeAPI *runtimeserver.Server

	// housekeeping cleans what gone pods left, after passes.
	housekeeping *housekeeping.Loop

	debugListener   net.Listener
	metricsListener net.Listener
}

// New builds an agent and opens its listeners; Run starts it.
func New(cfg Config) (_ *Agent, err error) {
	if cfg, err = cfg.complete(); err != nil {
		return nil, err
	}
	paths := volume.Paths{Root: filepath.Clean(cfg.RootDir)}
	if err := os.MkdirAll(paths.PodsDir(), 0o750); err != nil {
		return nil, fmt.Errorf("creating root directory: %w", err)
	}
	if cfg.SharedRootDir {
		shareRootDir(cfg.Log, paths.Root)
	}
	m, err := newMode(cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	a, err := build(cfg, paths, m)
	if err != nil {
		return nil, err
	}
	if a.debugListener, err = listen(cfg.DebugAddress); err != nil {
		return nil, fmt.Errorf("debug endpoint: %w", err)
	}
	if a.metricsListener, err = listen(cfg.MetricsAddress); err != nil {
		a.closeListeners()
		return nil, fmt.Errorf("metrics endpoint: %w", err)
	}
	if err := a.runtimeAPI.Listen(); err != nil {
		a.closeListeners()
		return nil, fmt.Errorf("runtime API: %w", err)
	}
	return a, nil
}

// shareRootDir makes the root directory a shared mount, so that what a CSI
// driver in a container mounts below it reaches the host and the pods. It
// cannot when the directory is not shared but holds mounts already (an
// upgrade from a version that did not do it): those are left as they are,
// with a warning, and CSI drivers in containers cannot publish into the
// root until a start finds nothing mounted in it.
func shareRootDir(log *zap.Logger, root string) {
	switch res, err := mountutil.MakeShared(root); {
	case errors.Is(err, mountutil.ErrMountsBelow):
		log.Warn("the root directory is not a shared mount and cannot become one while volumes are mounted in it; mounts that CSI drivers in containers make below it will not reach the pods",
			zap.String("rootDir", root), zap.Error(err))
	case err != nil:
		log.Warn("cannot make the root directory a shared mount", zap.String("rootDir", root), zap.Error(err))
	case res == mountutil.MadeShared:
		log.Info("root directory made a shared mount", zap.String("rootDir", root))
	}
}

// build makes the parts both modes share — caches, plugins, executor,
// populator, reconciler, metrics — around the mode's, each from parts built
// before it. Whatever wakes the reconciler is handed one signal made first,
// so no part needs a reference to the reconciler.
func build(cfg Config, paths volume.Paths, m *mode) (*Agent, error) {
	log := cfg.Log
	wake := notify.New()
	clk := clock.RealClock{}
	a := &Agent{
		cfg: cfg, log: log, mode: m, source: m.source, paths: paths,
		dsw:     cache.NewDesiredStateOfWorld(clk),
		asw:     cache.NewActualStateOfWorld(clk),
		events:  events.NewLog(log.Named("events"), 200, m.sink),
		metrics: NewMetrics(),
		trimmer: &memoryTrimmer{},
		orphans: housekeeping.NewOrphans(log.Named("orphans")),
		history: timeline.New(timeline.Options{}),
		mounter: mountutil.New(), pins: &blockpin.Loops{},
	}
	// Plugins that learn about the host in the background (local PV paths)
	// have the populator try again when an answer comes.
	recheck := notify.New()
	host := plugins.Host{Paths: paths, Mounter: a.mounter, NodeName: cfg.NodeName, HostRoot: cfg.HostRoot,
		NodeMemory: m.nodeMemory, Recheck: recheck.Notify, Log: log.Named("plugins")}
	a.api = newAPIVolumes(cfg, host, m, a.dsw)
	// CSI drivers' tokenRequests share the projected volumes' token cache
	// (and so its refresh, its metrics and /debug/api-volumes).
	a.csi = newCSI(cfg, host, m, csiDeps{
		asw: a.asw, dsw: a.dsw, events: a.events, tokens: a.api.tokenIssuer(),
		// The populator is built later; the CSI parts ask it only once
		// running.
		sourcesReady: func() bool { return a.populator.Ready() },
	})
	a.plugins = plugins.NewRegistry(append([]plugins.Plugin{emptydir.New(host), hostpath.New(host), local.New(host), a.csi.plugin}, a.api.plugins...)...)
	a.executor = operations.NewExecutor(operations.ExecutorOptions{
		MaxConcurrent: cfg.MaxConcurrentOperations,
		Timeout:       cfg.OperationTimeout,
		// The reporter's lines all come from one place, so the caller
		// says nothing; finding it cost every operation of a storm a
		// stack walk.
		Observer:      &reporter{log: operationsLogger(log), events: a.events, metrics: a.metrics, trimmer: a.trimmer, history: a.history},
		OnStateChange: wake.Notify,
	})
	a.csi.retryOnChange(a.executor, wake)
	a.podStatus = m.podStatus(a.executor, log)
	a.runtimeAPI = runtimeserver.New(runtimeserver.Options{
		Socket: cfg.RuntimeSocket, Paths: paths, Errors: a.executor, Log: log.Named("runtimeapi"),
		Snapshots: func() (*cache.DesiredSnapshot, *cache.ActualSnapshot) { return a.dsw.Snapshot(), a.asw.Snapshot() },
	})
	a.populator = a.newPopulator(wake, recheck)
	a.page = a.newPage()
	a.reconciler = a.newReconciler(wake)
	if cfg.LocalVolumesConfig != "" {
		var err error
		if a.localPV, err = m.cluster.newLocalPV(cfg, a.events); err != nil {
			return nil, err
		}
	}
	a.registerMetrics()
	return a, nil
}

func (a *Agent) newPopulator(wake, recheck *notify.Signal) *populator.Populator {
	return populator.New(populator.Options{
		Source:       a.source,
		DSW:          a.dsw,
		Plugins:      a.plugins,
		Node:         a.mode.node,
		IsTerminated: a.mode.isTerminated,
		ResyncPeriod: a.cfg.ResyncPeriod,
		Recheck:      recheck.C(),
		Events:       a.events,
		Pods:         a.api.refresh,
		// Every populator pass wakes the reconciler: the first one makes
		// the sources ready (adoption, orphan cleanup) and a later one may
		// make them complete, without changing the DSW when no pod wants
		// anything.
		Observer: populatedTrigger{Metrics: a.metrics, wake: wake},
		Log:      a.log.Named("populator"),
	})
}

func (a *Agent) newReconciler(wake *notify.Signal) *reconciler.Reconciler {
	// Every pass wakes the runtime API's waiters.
	observer := multiObserver{a.metrics, burstProcs{a.cfg.Procs}, a.trimmer, pageTrigger{a.page}, a.runtimeAPI}
	if a.podStatus != nil {
		observer = append(observer, a.podStatus)
	}
	if a.csi.nodeStatus != nil {
		observer = append(observer, a.csi.nodeStatus)
	}
	operator := &operations.Operator{
		Plugins: a.plugins, ASW: a.asw, DSW: a.dsw, Paths: a.paths, Log: a.log.Named("operations"),
		Claims: a.mode.claims(), Events: a.events, Refresh: a.api.refresh, Pins: a.pins,
		SubPaths: subpath.Host{Mounter: a.mounter},
	}
	a.housekeeping = housekeeping.NewLoop(housekeeping.LoopOptions{
		DSW: a.dsw, ASW: a.asw, Paths: a.paths, IsMountPoint: a.mounter.IsMountPoint,
		SourcesComplete: func() bool { return a.populator.Ready() && a.sourcesComplete() },
		Idle:            a.executor.Idle,
		Orphans:         a.orphans,
		Period:          a.cfg.ResyncPeriod,
	})
	observer = append(observer, a.housekeeping)
	return reconciler.New(reconciler.Options{
		DSW: a.dsw, ASW: a.asw, Executor: a.executor,
		Handler:           operator,
		SetUpWithoutMount: a.setUpWithoutMount,
		SourcesReady:      a.populator.Ready,
		SourcesComplete:   a.sourcesComplete,
		ResyncPeriod:      a.cfg.ResyncPeriod,
		Wake:              wake,
		Observer:          observer,
		Log:               a.log.Named("reconciler"),
	})
}

// registerMetrics adds what is read at scrape time from the parts.
func (a *Agent) registerMetrics() {
	a.metrics.registerState(a.dsw, a.asw, a.executor, a.source, a.populator.Ready)
	a.metrics.Registry.MustRegister(driversCollector{a.csi.drivers}, a.csi.stats, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "orphans",
		Help: "Things left on disk the agent cannot clean or account for (see /debug/orphans).",
	}, func() float64 { return float64(len(a.orphans.List())) }))
	a.metrics.Registry.MustRegister(a.api.collectors()...)
	var watches watchesCollector
	if a.api.objects != nil {
		watches = append(watches, a.api.objects.Stats)
	}
	if a.mode.cluster != nil {
		kubeclient.RegisterMetrics(a.metrics.Registry)
		watches = append(watches, a.mode.cluster.source.WatchStats)
		if c := a.mode.cluster.nodeCert; c != nil {
			a.metrics.Registry.MustRegister(c.Collectors()...)
		}
	}
	if len(watches) > 0 {
		a.metrics.Registry.MustRegister(watches)
	}
	if a.localPV != nil {
		a.metrics.Registry.MustRegister(a.localPV.Collectors()...)
	}
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
	_ = a.runtimeAPI.Shutdown(context.Background())
}

// RuntimeSocket is the runtime API's socket.
func (a *Agent) RuntimeSocket() string { return a.cfg.RuntimeSocket }

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
	return len(a.source.UnreadInputs()) == 0
}

// emptyTrash finishes the removals an earlier run left in the trash (it
// stopped half way), then looks again every resync period; what cannot be
// removed (another mount inside) is reported as an orphan. It runs beside
// the reconciler: a huge leftover tree never holds up volumes.
func (a *Agent) emptyTrash(ctx context.Context) error {
	period := a.cfg.ResyncPeriod
	if period <= 0 {
		period = time.Minute
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		var problems []housekeeping.Problem
		for _, l := range trash.Empty(ctx, a.paths.TrashDir()) {
			problems = append(problems, housekeeping.Problem{Path: l.Path, Reason: "cannot finish deleting it: " + l.Err.Error()})
		}
		a.orphans.Set("trash", problems)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// reconstruct rebuilds the actual state from disk before anything runs, so
// the first plans see what is already mounted.
func (a *Agent) reconstruct() error {
	start := time.Now()
	pins, err := a.pins.Snapshot()
	if err != nil {
		return fmt.Errorf("listing the pins of raw block volumes: %w", err)
	}
	r, err := housekeeping.Reconstruct(a.paths, a.plugins, a.mounter.IsMountPoint, func(path string) (bool, error) {
		return a.blockMapped(pins, path)
	})
	if err != nil {
		return fmt.Errorf("reconstructing state from %s: %w", a.paths.Root, err)
	}
	a.sweepPins(r)
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

// blockMapped reports whether a raw block volume's access point holds a
// pinned block device: evidence enough, after a restart, that it is mapped.
func (a *Agent) blockMapped(pins *blockpin.Snapshot, path string) (bool, error) {
	if mounted, err := a.mounter.IsMountPoint(path); err != nil || !mounted {
		// A driver may make a device node rather than a mount.
		if info, serr := os.Lstat(path); serr != nil || info.Mode().Type() != os.ModeDevice {
			return false, err
		}
	}
	return pins.Pinned(path)
}

// sweepPins releases pins below the pods directory that no reconstructed
// access point accounts for (a pin always sits on an access point, so this
// finds nothing unless something else removed one).
func (a *Agent) sweepPins(r *housekeeping.Reconstruction) {
	known := map[string]bool{}
	for _, v := range r.Volumes {
		if !v.Attributes.Block {
			continue
		}
		for _, m := range v.Pods {
			known[m.MountPath] = true
		}
	}
	released, err := a.pins.Sweep(a.paths.PodsDir(), func(p string) bool { return known[p] })
	if err != nil {
		a.log.Warn("cannot release pins of access points no volume accounts for", zap.Error(err))
	}
	for _, p := range released {
		a.log.Warn("released the pin of an access point no volume accounts for", zap.String("path", p))
	}
}

// populatedTrigger is the populator's observer: the metrics, and a
// reconciler pass after every populator pass.
type populatedTrigger struct {
	*Metrics
	wake *notify.Signal
}

func (p populatedTrigger) Populated(took time.Duration, pods int) {
	p.Metrics.Populated(took, pods)
	p.wake.Notify()
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
		if a.mode.cluster != nil {
			return "waiting for the API server: not every watch has listed yet", false
		}
		return "sources not read completely yet", false
	}
	if !a.populator.Ready() {
		return "desired state not populated yet", false
	}
	return "", true
}

// Run runs the agent until ctx ends or one of its loops fails, and returns
// that failure (nil when ctx ended). Stopping unmounts nothing: mounts stay
// for the pods that use them, and the next start adopts them. Run waits up
// to the shutdown grace period for running operations (one still running
// then is left to finish on its own); when it returns, every loop it started
// has returned. Call it once.
func (a *Agent) Run(ctx context.Context) error {
	defer a.mode.close()
	a.log.Info("starting", zap.String("node", a.cfg.NodeName), zap.String("rootDir", a.cfg.RootDir),
		zap.String("debugAddress", a.DebugAddress()), zap.String("metricsAddress", a.MetricsAddress()))
	if err := a.reconstruct(); err != nil {
		a.closeListeners()
		return err
	}
	a.mode.startEvents()

	l := newLoops(ctx)
	servers := a.serve(l)
	l.run("source", a.source.Run)
	l.run("populator", untilDone(a.populator.Run))
	l.run("trash", a.emptyTrash)
	logDriverConfig(a.log, a.cfg.CSIDrivers, a.cfg.PluginRegistryDir)
	a.csi.registerStatic(l.ctx, a.cfg.CSIDrivers)
	a.csi.start(l, a.cfg.CSIDrivers, a.cfg.CSIProbePeriod)
	if a.localPV != nil {
		l.run("local volume provisioner", a.localPV.Run)
	}
	l.run("reconciler", untilDone(a.reconciler.Run))
	l.run("housekeeping", untilDone(a.housekeeping.Run))
	l.run("volume refresh", untilDone(a.api.refresh.Run))
	// Per-object watches start and stop with the pods that reference
	// them; whatever is still watched stops with the agent.
	l.run("object watches", untilDone(func(ctx context.Context) { <-ctx.Done(); a.api.stop() }))
	l.run("page", untilDone(a.page.Run))
	if a.podStatus != nil {
		l.run("pod status", untilDone(func(ctx context.Context) { a.podStatus.Run(ctx, a.cfg.StatusWorkers) }))
	}

	<-l.ctx.Done()
	if ctx.Err() == nil {
		a.log.Error("stopping after a fatal error", zap.Error(context.Cause(l.ctx)))
	}
	a.log.Info("stopping: waiting for running operations; nothing will be unmounted")
	waitCtx, waitCancel := context.WithTimeout(context.Background(), a.cfg.ShutdownGracePeriod)
	if werr := a.executor.Wait(waitCtx); werr != nil {
		a.log.Warn("operations still running at exit", zap.Error(werr))
	}
	waitCancel()
	// The endpoints answer until the operations are done, so a stopping
	// agent can still be inspected.
	for _, s := range servers {
		shutdownCtx, c := context.WithTimeout(context.Background(), time.Second)
		_ = s.Shutdown(shutdownCtx)
		c()
	}
	err := l.wait()
	a.trimmer.wait()
	a.log.Info("stopped")
	return err
}

// shutdowner is a server Run shuts down last.
type shutdowner interface {
	Shutdown(ctx context.Context) error
}

// serve starts the HTTP endpoints and the runtime API; Run shuts them down
// last.
func (a *Agent) serve(l *loops) []shutdowner {
	var servers []shutdowner
	limits := a.cfg.HTTP
	start := func(name string, lis net.Listener, h http.Handler) {
		s := newHTTPServer(h, limits)
		conns := newConnLimiter(limits.MaxConnections)
		s.ConnState = conns.ConnState
		servers = append(servers, s)
		l.goUntilStopped(name, func() error {
			if err := s.Serve(conns.Listener(lis)); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if a.debugListener != nil {
		// It shows what the node's pods are and serves the page to
		// browsers: a page of another site must not reach it by name.
		start("debug endpoint", a.debugListener, hostCheck(a.debugMux(), a.debugListener.Addr(), a.cfg.DebugAddress))
	}
	l.goUntilStopped("runtime API", a.runtimeAPI.Serve)
	servers = append(servers, a.runtimeAPI)
	if a.metricsListener != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.Registry, promhttp.HandlerOpts{}))
		// Probes reach the pod's address, not loopback where the debug
		// endpoint listens: health and readiness are served here too.
		a.healthHandlers(mux)
		start("metrics endpoint", a.metricsListener, mux)
	}
	return servers
}
