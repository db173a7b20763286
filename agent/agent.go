// Package agent wires volume-agent together: a source (manifest directory or
// API server), the populator, the two caches, the executor and operator with
// the volume plugins, the reconciler, and the local HTTP endpoints (debug
// JSON, health, Prometheus metrics). New builds the mode's parts (standalone
// or cluster) and the shared ones; Run supervises every long-running loop
// in one place, so a fatal error stops the agent and nothing outlives Run.
//
// What is not wiring lives in packages of its own, each given its tunables
// and the parts it reads as interfaces: agent/httpserve (the endpoints'
// connection caps, timeouts and host check), agent/metrics (the Prometheus
// metrics), agent/opreport (what people hear of each operation's outcome),
// agent/burst (the runtime's spare Ps and memory trimming around bursts)
// and agent/debug (the debug endpoint's documents).
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

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/agent/burst"
	"github.com/volume-agent/volume-agent/agent/debug"
	"github.com/volume-agent/volume-agent/agent/httpserve"
	"github.com/volume-agent/volume-agent/agent/metrics"
	"github.com/volume-agent/volume-agent/agent/opreport"
	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/blockpin"
	"github.com/volume-agent/volume-agent/internal/disklimit"
	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/internal/subpath"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/plugins/image"
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
	"github.com/volume-agent/volume-agent/usage"
	"github.com/volume-agent/volume-agent/volume"
)

// Agent is a running volume-agent: what Run starts, waits for and
// serves. build makes and wires its parts (see parts).
type Agent struct {
	cfg  Config
	log  *zap.Logger
	mode *mode
	// disk is what an earlier run left: Run adopts its volumes before
	// anything else runs, and empties its trash.
	disk *disk

	// The loops Run starts.
	source       source.Source
	populator    *populator.Populator
	reconciler   *reconciler.Reconciler
	housekeeping *housekeeping.Loop
	csi          *csiParts
	api          *apiVolumes
	localPV      *localpv.Provisioner
	page         *ui.Server
	podStatus    *podstatus.Reporter
	usage        *usage.Measurer

	// What Run waits for as it stops.
	executor *operations.Executor
	trimmer  *burst.Trimmer

	// The endpoints: the runtime API, and the debug and metrics
	// endpoints' handlers and listeners (nil when disabled).
	runtimeAPI      *runtimeserver.Server
	debugHandler    http.Handler
	metricsHandler  http.Handler
	healthHandler   http.Handler
	debugListener   net.Listener
	metricsListener net.Listener
	healthListener  net.Listener
}

// parts are all of the agent's parts as build makes and wires them; the
// Agent keeps what Run needs of them.
type parts struct {
	cfg Config
	// limits enforces disk emptyDirs' sizeLimit (its Usage reads theirs).
	limits     *disklimit.Enforcer
	log        *zap.Logger
	mode       *mode
	source     source.Source
	dsw        *cache.DesiredStateOfWorld
	asw        *cache.ActualStateOfWorld
	executor   *operations.Executor
	populator  *populator.Populator
	reconciler *reconciler.Reconciler
	events     *events.Log
	metrics    *metrics.Metrics
	trimmer    *burst.Trimmer
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
	usage      *usage.Measurer // nil: not measured

	// housekeeping cleans what gone pods left, after passes.
	housekeeping *housekeeping.Loop
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
	if a.healthListener, err = listen(cfg.HealthAddress); err != nil {
		a.closeListeners()
		return nil, fmt.Errorf("health endpoint: %w", err)
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
	p := &parts{
		cfg: cfg, log: log, mode: m, source: m.source, paths: paths,
		dsw:     cache.NewDesiredStateOfWorld(clk),
		asw:     cache.NewActualStateOfWorld(clk),
		events:  events.NewLog(log.Named("events"), 200, m.sink),
		metrics: metrics.New(),
		trimmer: burst.NewTrimmer(burst.TrimmerOptions{}),
		orphans: housekeeping.NewOrphans(log.Named("orphans")),
		history: timeline.New(timeline.Options{}),
		mounter: mountutil.New(), pins: &blockpin.Loops{},
	}
	// Plugins that learn about the host in the background (local PV paths)
	// have the populator try again when an answer comes.
	recheck := notify.New()
	host := plugins.Host{Paths: paths, Mounter: p.mounter, NodeName: cfg.NodeName, HostRoot: cfg.HostRoot,
		NodeMemory: m.nodeMemory, Recheck: recheck.Notify, Log: log.Named("plugins")}
	p.api = newAPIVolumes(cfg, host, m, p.dsw, p.metrics)
	// CSI drivers' tokenRequests share the projected volumes' token cache
	// (and so its refresh, its metrics and /debug/api-volumes).
	p.csi = newCSI(cfg, host, m, csiDeps{
		asw: p.asw, dsw: p.dsw, events: p.events, tokens: p.api.tokenIssuer(),
		// The populator is built later; the CSI parts ask it only once
		// running.
		sourcesReady: func() bool { return p.populator.Ready() },
	})
	mode, _ := disklimit.ParseMode(cfg.EmptyDirSizeLimit) // checked by complete
	var err error
	if p.limits, err = disklimit.New(disklimit.Options{Mode: mode, Root: paths.Root,
		StateDir: filepath.Join(paths.Root, "plugins", volume.EscapePlugin(emptydir.Name)), Log: log.Named("disklimit")}); err != nil {
		return nil, err
	}
	p.plugins = plugins.NewRegistry(append([]plugins.Plugin{emptydir.New(host).WithLimits(p.limits), hostpath.New(host), local.New(host), p.csi.plugin, image.New()}, p.api.plugins...)...)
	p.executor = operations.NewExecutor(operations.ExecutorOptions{
		MaxConcurrent: cfg.MaxConcurrentOperations,
		Timeout:       cfg.OperationTimeout,
		Observer: operationObservers{p.metrics, p.trimmer, p.history,
			opreport.New(opreport.Options{Log: log.Named("operations"), Events: p.events})},
		OnStateChange: wake.Notify,
	})
	p.csi.retryOnChange(p.executor, wake)
	p.usage = p.newUsage(wake.Notify)
	p.podStatus = m.podStatus(failuresWithLimits{p.executor, p.usage}, log)
	p.runtimeAPI = runtimeserver.New(runtimeserver.Options{
		Socket: cfg.RuntimeSocket, Paths: paths, Errors: failuresWithLimits{p.executor, p.usage}, Log: log.Named("runtimeapi"),
		Snapshots: func() (*cache.DesiredSnapshot, *cache.ActualSnapshot) { return p.dsw.Snapshot(), p.asw.Snapshot() },
	})
	p.populator = p.newPopulator(wake, recheck)
	p.page = p.newPage()
	p.reconciler = p.newReconciler(wake)
	if cfg.LocalVolumesConfig != "" {
		var err error
		if p.localPV, err = m.cluster.newLocalPV(cfg, p.events); err != nil {
			return nil, err
		}
	}
	p.registerMetrics()
	return p.agent(), nil
}

func (p *parts) newPopulator(wake, recheck *notify.Signal) *populator.Populator {
	return populator.New(populator.Options{
		Source:       p.source,
		DSW:          p.dsw,
		Plugins:      p.plugins,
		Node:         p.mode.node,
		IsTerminated: p.mode.isTerminated,
		ResyncPeriod: p.cfg.ResyncPeriod,
		Recheck:      recheck.C(),
		// subPathExpr reads what the API volumes read, the same way.
		EnvObjects:      p.api.env,
		EnvChanged:      p.api.envChanged.C(),
		NodeAllocatable: p.api.allocatable,
		Events:          p.events,
		Pods:            p.api.refresh,
		// Every populator pass wakes the reconciler: the first one makes
		// the sources ready (adoption, orphan cleanup) and a later one may
		// make them complete, without changing the DSW when no pod wants
		// anything.
		Observer: populatedTrigger{Metrics: p.metrics, wake: wake},
		Log:      p.log.Named("populator"),
	})
}

func (p *parts) newReconciler(wake *notify.Signal) *reconciler.Reconciler {
	// Every pass wakes the runtime API's waiters.
	gc := p.mode.gc
	if gc == nil && p.cfg.BurstGC {
		gc = burst.NewGC(burst.GCOptions{})
	}
	observer := multiObserver{p.metrics, burst.NewProcs(p.cfg.Procs, 0), gc, p.trimmer, pageTrigger{p.page}, p.runtimeAPI}
	if p.podStatus != nil {
		observer = append(observer, p.podStatus)
	}
	if p.csi.nodeStatus != nil {
		observer = append(observer, p.csi.nodeStatus)
	}
	operator := &operations.Operator{
		Plugins: p.plugins, ASW: p.asw, DSW: p.dsw, Paths: p.paths, Log: p.log.Named("operations"),
		Claims: p.mode.claims(), Events: p.events, Refresh: p.api.refresh, Pins: p.pins,
		SubPaths: subpath.Host{Mounter: p.mounter},
	}
	p.housekeeping = housekeeping.NewLoop(housekeeping.LoopOptions{
		DSW: p.dsw, ASW: p.asw, Paths: p.paths, IsMountPoint: p.mounter.IsMountPoint,
		SourcesComplete: func() bool { return p.populator.Ready() && p.sourcesComplete() },
		Idle:            p.executor.Idle,
		Orphans:         p.orphans,
		Period:          p.cfg.ResyncPeriod,
	})
	observer = append(observer, p.housekeeping)
	return reconciler.New(reconciler.Options{
		DSW: p.dsw, ASW: p.asw, Executor: p.executor,
		Handler:           operator,
		SetUpWithoutMount: p.setUpWithoutMount,
		SourcesReady:      p.populator.Ready,
		SourcesComplete:   p.sourcesComplete,
		ResyncPeriod:      p.cfg.ResyncPeriod,
		Wake:              wake,
		Observer:          observer,
		Log:               p.log.Named("reconciler"),
	})
}

// registerMetrics adds what is read at scrape time from the parts.
func (p *parts) registerMetrics() {
	state := metrics.State{
		DSW: p.dsw, ASW: p.asw, Operations: p.executor, Source: p.source, SourcesReady: p.populator.Ready,
		Drivers: p.csi.drivers, Orphans: p.orphans, APIVolumeBytes: p.api.budget.Total,
	}
	if p.api.objects != nil {
		state.Watches = append(state.Watches, p.api.objects.Stats)
	}
	if p.mode.cluster != nil {
		kubeclient.RegisterMetrics(p.metrics.Registry)
		state.Watches = append(state.Watches, p.mode.cluster.source.WatchStats)
		if c := p.mode.cluster.nodeCert; c != nil {
			p.metrics.Registry.MustRegister(c.Collectors()...)
		}
	}
	p.metrics.RegisterState(state)
	p.metrics.Registry.MustRegister(p.csi.stats)
	if p.usage != nil {
		p.metrics.Registry.MustRegister(p.usage)
	}
	if p.localPV != nil {
		p.metrics.Registry.MustRegister(p.localPV.Collectors()...)
	}
}

// agent is the running agent made of p.
func (p *parts) agent() *Agent {
	short := p.cfg.HTTP.ShortWriteTimeout
	mux := http.NewServeMux()
	mux.Handle("/metrics", httpserve.WriteDeadline(promhttp.HandlerFor(p.metrics.Registry, promhttp.HandlerOpts{}), short))
	// Probes reach the pod's address, not loopback where the debug
	// endpoint listens: health and readiness are served here too, and
	// on the health endpoint of their own.
	debug.RegisterHealth(mux, p.readiness)
	health := http.NewServeMux()
	debug.RegisterHealth(health, p.readiness)
	return &Agent{
		cfg: p.cfg, log: p.log, mode: p.mode,
		disk: &disk{
			paths: p.paths, asw: p.asw, plugins: p.plugins, mounter: p.mounter, pins: p.pins,
			orphans: p.orphans, metrics: p.metrics, period: p.cfg.ResyncPeriod, log: p.log,
		},
		source: p.source, populator: p.populator, reconciler: p.reconciler, housekeeping: p.housekeeping,
		csi: p.csi, api: p.api, localPV: p.localPV, page: p.page, podStatus: p.podStatus, usage: p.usage,
		executor: p.executor, trimmer: p.trimmer,
		runtimeAPI: p.runtimeAPI, debugHandler: p.debugMux(), metricsHandler: mux,
		healthHandler: httpserve.WriteDeadline(health, short),
	}
}

func listen(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	return net.Listen("tcp", addr)
}

func (a *Agent) closeListeners() {
	for _, l := range []net.Listener{a.debugListener, a.metricsListener, a.healthListener} {
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

// HealthAddress is where the health endpoint listens ("" if disabled).
func (a *Agent) HealthAddress() string { return addrOf(a.healthListener) }

func addrOf(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// setUpWithoutMount asks the volume's plugin whether it sets the volume up
// without a mount (for adopting volumes found after a restart). It is an
// optional capability of plugins (package plugins): a plugin without it
// always mounts.
func (p *parts) setUpWithoutMount(plugin string, spec *volume.Spec) bool {
	pl, ok := p.plugins.ByName(plugin)
	if !ok || spec == nil {
		return false
	}
	s, ok := pl.(plugins.SetUpWithoutMount)
	return ok && s.SetUpWithoutMount(spec)
}

// sourcesComplete: no input of the source is unreadable (see
// source.Completeness).
func (p *parts) sourcesComplete() bool {
	return len(p.source.UnreadInputs()) == 0
}

// populatedTrigger is the populator's observer: the metrics, and a
// reconciler pass after every populator pass.
type populatedTrigger struct {
	*metrics.Metrics
	wake *notify.Signal
}

func (p populatedTrigger) Populated(took time.Duration, pods int) {
	p.Metrics.Populated(took, pods)
	p.wake.Notify()
}

var (
	_ operations.Observer = operationObservers(nil)
	_ reconciler.Observer = multiObserver(nil)
	_ populator.Observer  = populatedTrigger{}
	_ reconciler.Observer = pageTrigger{}
)

// operationObservers fan a finished operation out to several observers.
type operationObservers []operations.Observer

func (o operationObservers) OperationFinished(key operations.Key, op *operations.Operation, took time.Duration, err error, retryIn time.Duration) {
	for _, x := range o {
		x.OperationFinished(key, op, took, err, retryIn)
	}
}

// multiObserver fans a reconciler pass out to several observers.
type multiObserver []reconciler.Observer

func (m multiObserver) Reconciled(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, actions []reconciler.Action, took time.Duration) {
	for _, o := range m {
		o.Reconciled(dsw, asw, actions, took)
	}
}

var _ reconciler.ChangeObserver = multiObserver(nil)

func (m multiObserver) ReconciledChanged(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, actions []reconciler.Action, took time.Duration, chg reconciler.Changed) {
	for _, o := range m {
		if co, ok := o.(reconciler.ChangeObserver); ok {
			co.ReconciledChanged(dsw, asw, actions, took, chg)
		} else {
			o.Reconciled(dsw, asw, actions, took)
		}
	}
}

// readiness says whether the agent acts on a complete view of its sources.
func (p *parts) readiness() (string, bool) {
	if !p.source.HasSynced() {
		if p.mode.cluster != nil {
			return "waiting for the API server: not every watch has listed yet", false
		}
		return "sources not read completely yet", false
	}
	if !p.populator.Ready() {
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
		zap.String("debugAddress", a.DebugAddress()), zap.String("metricsAddress", a.MetricsAddress()),
		zap.String("healthAddress", a.HealthAddress()))
	if err := a.disk.reconstruct(); err != nil {
		a.closeListeners()
		return err
	}
	a.mode.startEvents()

	l := newLoops(ctx)
	servers := a.serve(l)
	l.run("source", a.source.Run)
	l.run("populator", untilDone(a.populator.Run))
	l.run("trash", a.disk.emptyTrash)
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
	if a.usage != nil {
		l.run("volume usage", untilDone(a.usage.Run))
	}
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
	a.trimmer.Wait()
	a.log.Info("stopped")
	return err
}

// healthWriteStall is how long a health reply write may make no progress
// before its connection may be closed to make room: short enough that
// flooding connections are evictable faster than any flood that has to
// stall each of them can open more than the cap.
const healthWriteStall = 200 * time.Millisecond

// shutdowner is a server Run shuts down last.
type shutdowner interface {
	Shutdown(ctx context.Context) error
}

// debugMux routes the debug endpoint to the parts it shows.
func (p *parts) debugMux() *http.ServeMux {
	o := debug.Options{
		DSW: p.dsw, ASW: p.asw, SourcesReady: p.populator.Ready, Operations: p.executor, Source: p.source,
		Drivers: p.csi.driversDocument, APIVolumes: p.api.document,
		Orphans: p.orphans, Events: p.events, Readiness: p.readiness, Page: p.page,
	}
	if c := p.mode.cluster; c != nil {
		o.Watches = c.source.Watches
	}
	if p.localPV != nil {
		o.LocalVolumes = p.localPV.Status
	}
	return debug.NewMux(o)
}

// serve starts the HTTP endpoints and the runtime API; Run shuts them down
// last.
func (a *Agent) serve(l *loops) []shutdowner {
	var servers []shutdowner
	start := func(name string, lis net.Listener, h http.Handler, limits httpserve.Limits) {
		s := httpserve.New(h, limits)
		servers = append(servers, s)
		l.goUntilStopped(name, func() error {
			if err := s.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if a.debugListener != nil {
		// It shows what the node's pods are and serves the page to
		// browsers: a page of another site must not reach it by name.
		start("debug endpoint", a.debugListener, httpserve.HostCheck(a.debugHandler, a.debugListener.Addr(), a.cfg.DebugAddress), a.cfg.HTTP)
	}
	l.goUntilStopped("runtime API", a.runtimeAPI.Serve)
	servers = append(servers, a.runtimeAPI)
	if a.metricsListener != nil {
		start("metrics endpoint", a.metricsListener, a.metricsHandler, a.cfg.HTTP)
	}
	if a.healthListener != nil {
		// The kubelet probes from the node's address, which every local
		// user shares: a per-peer cap below the total would only lower
		// the probes' share. A reply of a few bytes not written at once
		// is a client that does not read.
		limits := a.cfg.HTTP
		limits.MaxConnectionsPerPeer = limits.MaxConnections
		limits.WriteStall = min(limits.WriteStall, healthWriteStall)
		start("health endpoint", a.healthListener, a.healthHandler, limits)
	}
	return servers
}
