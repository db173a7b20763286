package localpv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/volume-agent/volume-agent/internal/hostroot"
	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/mountwatch"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/status/events"
)

// Event reasons on PersistentVolumes (and on the Node for class problems).
const (
	// ReasonCleanupFailed: cleaning a Released PV's disk failed; it is
	// retried with backoff and the PV is not deleted.
	ReasonCleanupFailed = "VolumeFailedDelete"
	// ReasonCleaned: the disk was cleaned; the PV is deleted and made again.
	ReasonCleaned = "LocalVolumeCleaned"
	// ReasonMissing: the disk behind a PV is gone.
	ReasonMissing = "LocalVolumeMissing"
	// ReasonBack: the disk behind a PV is back.
	ReasonBack = "LocalVolumeFound"
	// ReasonUnsupportedPolicy: a Released PV with policy Recycle.
	ReasonUnsupportedPolicy = "VolumeUnsupportedReclaimPolicy"
	// ReasonUnknownPolicy: a Released PV with a policy nobody knows.
	ReasonUnknownPolicy = "VolumeUnknownReclaimPolicy"
	// ReasonClassError: a configured class can create no PV (on the Node).
	ReasonClassError = "LocalVolumeClassError"
	// ReasonDiskMismatch: the disk at a Released PV's path is not the one
	// the PV was made from; it is not cleaned.
	ReasonDiskMismatch = "LocalVolumeDiskMismatch"
)

// Options configure a Provisioner.
type Options struct {
	// Client reaches the API server (cluster mode only: the provisioner
	// creates and deletes PVs).
	Client *kubeclient.Client
	// NodeName is this node's name.
	NodeName string
	// ConfigFile is the configuration file (--local-volumes-config).
	ConfigFile string
	// HostRoot is where the node's root filesystem is visible ("/" or
	// empty on the host, /host in the DaemonSet). Discovery directories
	// are node paths looked up below it; PVs record node paths.
	HostRoot string
	// Recorder receives events (the agent's events.Log). Optional.
	Recorder events.Recorder
	Log      *zap.Logger

	// ResyncPeriod is the longest time between two discovery passes
	// (changes trigger passes at once). Default 30s.
	ResyncPeriod time.Duration
	// ConfigSyncPeriod is how often the configuration file is read again
	// even without a file event. Default 1m.
	ConfigSyncPeriod time.Duration
	// SettlePeriod is how long a new entry must look the same (same
	// filesystem or device, same size) before it becomes a PV, so that a
	// disk caught half-way through being set up is not offered with the
	// wrong capacity. Default 2s; negative disables.
	SettlePeriod time.Duration
	// CleanupBackoff and CleanupMaxBackoff bound the retries of failed
	// cleanups (doubling). Defaults 5s and 5m.
	CleanupBackoff    time.Duration
	CleanupMaxBackoff time.Duration
	// MaxConcurrentCleanups bounds cleanups running at once. Default 4.
	MaxConcurrentCleanups int
	// RequestTimeout bounds each API request. Default 30s.
	RequestTimeout time.Duration

	// ClassInformer and NodeInformer may be shared with the agent's own
	// (kube.Source has the same ones) to save memory; the provisioner then
	// only adds handlers and does not run them. The node informer must
	// hold this node. PVInformer must select NodeSelector(NodeName) (tests
	// give their own). Nil: the provisioner runs its own.
	PVInformer    cache.SharedIndexInformer
	ClassInformer cache.SharedIndexInformer
	NodeInformer  cache.SharedIndexInformer
}

// minPassInterval is the shortest time between two passes.
const minPassInterval = 100 * time.Millisecond

// Provisioner makes this node's disks PersistentVolumes and cleans them
// when they are released. Create it with New and start it with Run.
type Provisioner struct {
	opts       Options
	log        *zap.Logger
	wake       *notify.Signal
	tracker    *tracker
	cleaner    *cleaner
	prober     prober
	identifier identifier
	metrics    *metrics
	slots      chan struct{}

	pvs, classes, nodes cache.SharedIndexInformer
	ownInformers        []cache.SharedIndexInformer

	// cfg is the configuration in use; config reports the file's state.
	cfgMu     sync.Mutex
	cfg       *Config
	cfgStatus ConfigStatus

	// Pass state: only the pass goroutine touches it.
	seen       map[string]seenEntry
	recent     map[string]recentCreate
	createErrs map[string]string
	prevState  map[string]Volume // by PV name or path
	classErrs  map[string]string
	watched    map[string]bool
	// foreign are names of PVs someone else made (not watched: they do
	// not carry the node's label); checked are the paths whose possible
	// PV names were looked up for a PV an earlier version made.
	foreign map[string]bool
	checked map[string]bool

	statusMu sync.Mutex
	status   Document

	cleanups sync.WaitGroup
	now      func() time.Time
}

// New builds a provisioner. It reads nothing yet: Run loads the
// configuration and starts everything.
func New(o Options) (*Provisioner, error) {
	if o.Client == nil {
		return nil, errors.New("local volumes: an API client is required (the provisioner works in cluster mode only)")
	}
	if o.NodeName == "" {
		return nil, errors.New("local volumes: the node name is required")
	}
	if o.ConfigFile == "" {
		return nil, errors.New("local volumes: the configuration file is required")
	}
	if o.HostRoot == "" {
		o.HostRoot = "/"
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.ResyncPeriod <= 0 {
		o.ResyncPeriod = 30 * time.Second
	}
	if o.ConfigSyncPeriod <= 0 {
		o.ConfigSyncPeriod = time.Minute
	}
	if o.SettlePeriod == 0 {
		o.SettlePeriod = 2 * time.Second
	}
	if o.CleanupBackoff <= 0 {
		o.CleanupBackoff = 5 * time.Second
	}
	if o.CleanupMaxBackoff <= 0 {
		o.CleanupMaxBackoff = 5 * time.Minute
	}
	if o.MaxConcurrentCleanups <= 0 {
		o.MaxConcurrentCleanups = 4
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 30 * time.Second
	}
	mounter := mountutil.New()
	p := &Provisioner{
		opts:       o,
		log:        o.Log,
		wake:       notify.New(),
		tracker:    newTracker(o.CleanupBackoff, o.CleanupMaxBackoff),
		prober:     &hostProber{root: hostroot.New(o.HostRoot), mounter: mounter},
		identifier: newHostIdentifier(o.HostRoot),
		slots:      make(chan struct{}, o.MaxConcurrentCleanups),
		seen:       map[string]seenEntry{},
		recent:     map[string]recentCreate{},
		createErrs: map[string]string{},
		prevState:  map[string]Volume{},
		classErrs:  map[string]string{},
		watched:    map[string]bool{},
		foreign:    map[string]bool{},
		checked:    map[string]bool{},
		now:        time.Now,
	}
	p.cleaner = &cleaner{root: hostroot.New(o.HostRoot), mounter: mounter, identifier: p.identifier}
	p.cfgStatus.File = o.ConfigFile
	p.metrics = newMetrics(p)
	p.status = Document{Node: o.NodeName, Provisioner: ProvisionerName(o.NodeName), Config: p.cfgStatus, Classes: []ClassStatus{}, Volumes: []Volume{}, Cleanups: []Cleanup{}}

	core, storage := o.Client.Core, o.Client.Storage
	p.pvs = o.PVInformer
	if p.pvs == nil {
		// Only this node's PVs: the provisioner's memory and watch traffic
		// do not grow with the cluster's PVs.
		sel := NodeSelector(o.NodeName)
		p.pvs = p.ownInformer(cache.NewFilteredListWatchFromClient(core, "persistentvolumes", "", func(lo *metav1.ListOptions) {
			lo.LabelSelector = sel
		}), &v1.PersistentVolume{})
	}
	p.classes = o.ClassInformer
	if p.classes == nil {
		p.classes = p.ownInformer(kubeclient.ListWatch(storage, "storageclasses", "", nil), &storagev1.StorageClass{})
	}
	p.nodes = o.NodeInformer
	if p.nodes == nil {
		p.nodes = p.ownInformer(kubeclient.ListWatch(core, "nodes", "", fields.OneTermEqualSelector("metadata.name", o.NodeName)), &v1.Node{})
	}
	for _, inf := range []cache.SharedIndexInformer{p.pvs, p.classes, p.nodes} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { p.wake.Notify() },
			UpdateFunc: func(any, any) { p.wake.Notify() },
			DeleteFunc: func(obj any) { p.objectDeleted(obj); p.wake.Notify() },
		}); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (p *Provisioner) ownInformer(lw *cache.ListWatch, obj runtime.Object) cache.SharedIndexInformer {
	inf := cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})
	// Managed fields are never read and are often most of an object.
	_ = inf.SetTransform(func(o any) (any, error) {
		if m, err := meta.Accessor(o); err == nil {
			m.SetManagedFields(nil)
		}
		return o, nil
	})
	p.ownInformers = append(p.ownInformers, inf)
	return inf
}

// objectDeleted queues the cleaning of a disk whose Released PV (policy
// Delete) was deleted before the provisioner cleaned it.
func (p *Provisioner) objectDeleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pv, ok := obj.(*v1.PersistentVolume)
	if !ok || !isOurs(pv, ProvisionerName(p.opts.NodeName)) {
		return
	}
	if pv.Status.Phase != v1.VolumeReleased || pv.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimDelete {
		return
	}
	t := target{PV: pv.Name, UID: pv.UID, Class: pv.Spec.StorageClassName, Path: pvPath(pv), Block: wantsBlockDevice(pv), Mode: modeOf(pv), Identity: identityOf(pv)}
	if pv.Spec.ClaimRef != nil {
		t.ClaimUID = pv.Spec.ClaimRef.UID
	}
	p.tracker.pvDeleted(t, p.now())
}

// Run loads the configuration, starts the watches and runs passes until
// ctx ends; then it stops running cleanups (killing cleaner commands) and
// waits for them. It returns nil when ctx ends.
func (p *Provisioner) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	// Nothing it started outlives Run.
	var watches sync.WaitGroup
	defer func() {
		cancel()
		watches.Wait()
		p.cleanups.Wait()
	}()
	for _, inf := range p.ownInformers {
		watches.Go(func() { inf.Run(ctx.Done()) })
	}
	// Every watch starts before the first read of what it watches, so a
	// change made in between is reported rather than left to a rescan.
	cw, err := newConfigWatcher(p.opts.ConfigFile, p.log)
	if err != nil {
		p.log.Warn("cannot watch the local volumes configuration; it is re-read every period", zap.Error(err))
	} else {
		defer cw.close()
	}
	p.reloadConfig(true)
	dw, err := newDirWatcher(p.log)
	if err != nil {
		return fmt.Errorf("local volumes: watching discovery directories: %w", err)
	}
	defer dw.close()
	watches.Go(func() { dw.run(ctx, p.wake.Notify) })
	if mw, err := mountwatch.Start(ctx, p.log, p.wake.Notify); err != nil {
		p.log.Warn("cannot watch the mount table; mounts are noticed by the periodic rescan", zap.Error(err))
	} else {
		defer func() { cancel(); <-mw.Done() }()
	}

	var cfgEvents <-chan struct{}
	if cw != nil {
		cfgEvents = cw.changed()
	}
	cfgTick := time.NewTicker(p.opts.ConfigSyncPeriod)
	defer cfgTick.Stop()
	resync := time.NewTicker(p.opts.ResyncPeriod)
	defer resync.Stop()
	var retry *time.Timer
	var retryC <-chan time.Time
	waitStart := p.now()
	nextWarn := waitStart.Add(10 * time.Second)
	for {
		if p.synced() {
			// Take the pending wake-up now, before the pass looks at
			// anything: whatever it announced, the pass sees. A change
			// during the pass wakes the loop again, and it stays pending
			// until the select below, which then starts the next pass
			// at once: a change is never left to the rescan.
			select {
			case <-p.wake.C():
			default:
			}
			wake := p.pass(ctx, dw)
			if retry != nil {
				retry.Stop()
				retry, retryC = nil, nil
			}
			if !wake.IsZero() {
				retry = time.NewTimer(max(wake.Sub(p.now()), 10*time.Millisecond))
				retryC = retry.C
			}
		} else if now := p.now(); now.After(nextWarn) {
			p.log.Warn("local volumes: still waiting for the API server caches", zap.Duration("waited", now.Sub(waitStart).Round(time.Second)))
			nextWarn = now.Add(10 * time.Second)
		}
		var poll <-chan time.Time
		if !p.synced() {
			poll = time.After(50 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			if retry != nil {
				retry.Stop()
			}
			return nil
		case <-p.wake.C():
		case <-cfgEvents:
			p.reloadConfig(false)
		case <-cfgTick.C:
			if cw != nil {
				cw.refresh() // a directory that was missing may exist now
			}
			p.reloadConfig(false)
		case <-resync.C:
		case <-retryC:
			retry, retryC = nil, nil
		case <-poll:
		}
		// Coalesce bursts (a pod's many mounts, a ConfigMap swap): every
		// mount on the node wakes the provisioner.
		select {
		case <-ctx.Done():
		case <-time.After(minPassInterval):
		}
	}
}

func (p *Provisioner) synced() bool {
	return p.pvs.HasSynced() && p.classes.HasSynced() && p.nodes.HasSynced()
}

// config returns the configuration in use.
func (p *Provisioner) config() *Config {
	p.cfgMu.Lock()
	defer p.cfgMu.Unlock()
	return p.cfg
}

// reloadConfig reads the file and, when its content changed, swaps in the
// new configuration: the classes that are valid, plus the previous
// definition of any class that is now invalid. An unreadable or
// unparsable file keeps the whole previous configuration.
func (p *Provisioner) reloadConfig(first bool) {
	data, err := os.ReadFile(p.opts.ConfigFile)
	sum := sha256Hex(data)
	p.cfgMu.Lock()
	defer p.cfgMu.Unlock()
	if err != nil {
		msg := fmt.Sprintf("%s: cannot read: %v", p.opts.ConfigFile, err)
		if len(p.cfgStatus.Errors) != 1 || p.cfgStatus.Errors[0] != msg {
			p.log.Error("local volumes configuration not loaded; keeping the previous one", zap.String("error", msg))
			p.metrics.configReloads.WithLabelValues("failure").Inc()
		}
		p.cfgStatus.Errors = []string{msg}
		// Whatever comes back is parsed again, even the content in use.
		p.cfgStatus.SHA256 = ""
		if p.cfg == nil {
			p.cfg = &Config{Classes: map[string]*Class{}}
		}
		p.setConfigStatus()
		return
	}
	if !first && sum == p.cfgStatus.SHA256 && p.cfg != nil {
		return
	}
	next, classErrs, fatal := ParseConfig(p.opts.ConfigFile, data)
	p.cfgStatus.SHA256 = sum
	if fatal != nil {
		p.log.Error("local volumes configuration rejected; keeping the previous one", zap.Error(fatal))
		p.metrics.configReloads.WithLabelValues("failure").Inc()
		p.cfgStatus.Errors = []string{fatal.Error()}
		if p.cfg == nil {
			p.cfg = &Config{Classes: map[string]*Class{}}
		}
		p.setConfigStatus()
		p.wake.Notify()
		return
	}
	merged := mergeConfig(p.cfg, next, classErrs)
	p.cfgStatus.Errors = nil
	for _, e := range classErrs {
		p.cfgStatus.Errors = append(p.cfgStatus.Errors, e.Error())
	}
	if len(classErrs) > 0 {
		p.log.Error("local volumes configuration: some classes rejected (their previous definition, if any, is kept)", zap.Error(joinErrors(classErrs)))
		p.metrics.configReloads.WithLabelValues("partial").Inc()
	} else {
		p.metrics.configReloads.WithLabelValues("success").Inc()
	}
	p.cfg = merged
	p.cfgStatus.Loaded = p.now()
	p.log.Info("local volumes configuration loaded", zap.Strings("classes", merged.classNames()), zap.Int("errors", len(classErrs)))
	p.setConfigStatus()
	p.wake.Notify()
}

// setConfigStatus publishes the config status; cfgMu is held.
func (p *Provisioner) setConfigStatus() {
	p.statusMu.Lock()
	p.status.Config = p.cfgStatus
	p.status.Config.Errors = append([]string(nil), p.cfgStatus.Errors...)
	p.statusMu.Unlock()
}

// pass looks at everything once and acts: it creates PVs for new entries,
// starts cleanups of Released PVs and deletes cleaned ones. It returns
// when the next pass is due at the latest for a retry or a settling entry.
func (p *Provisioner) pass(ctx context.Context, dw *dirWatcher) time.Time {
	start := p.now()
	cfg := p.config()
	in := &planInput{
		Now: start, Node: p.opts.NodeName, Config: cfg,
		ClassErr: map[string]string{}, Classes: map[string]*storagev1.StorageClass{},
		Backing: map[types.UID]probe{}, Recent: p.recent, Seen: p.seen, CreateErrs: p.createErrs, Foreign: p.foreign,
		Settle: max(p.opts.SettlePeriod, 0),
	}
	docErr := ""
	node, hostname := p.node()
	switch {
	case node == nil:
		docErr = fmt.Sprintf("Node %s not found: no PV is created until it exists (PVs name its %s label)", p.opts.NodeName, v1.LabelHostname)
	case hostname == "":
		hostname = p.opts.NodeName
	}
	in.Hostname = hostname

	for _, o := range p.pvs.GetStore().List() {
		in.PVs = append(in.PVs, o.(*v1.PersistentVolume))
	}
	prov := ProvisionerName(p.opts.NodeName)
	for _, pv := range in.PVs {
		if isOurs(pv, prov) {
			in.Backing[pv.UID] = p.prober.probe(pvPath(pv))
		}
	}

	// Watch before listing, so that an entry made while the pass lists
	// the directory starts another pass.
	var dirs []string
	for _, name := range cfg.classNames() {
		dirs = append(dirs, p.discoveryDir(cfg.Classes[name]))
	}
	dw.set(dirs)
	seenNow := map[string]bool{}
	for _, name := range cfg.classNames() {
		c := cfg.Classes[name]
		if docErr != "" {
			in.ClassErr[name] = docErr
		} else if o, ok, _ := p.classes.GetStore().GetByKey(name); !ok {
			in.ClassErr[name] = fmt.Sprintf("StorageClass %q not found: create it (provisioner kubernetes.io/no-provisioner) to have PVs made for this class", name)
		} else {
			in.Classes[name] = o.(*storagev1.StorageClass)
		}
		names, err := readDirNames(p.discoveryDir(c))
		if err != nil {
			in.ClassErr[name] = fmt.Sprintf("discovery directory %s: %v", c.DiscoveryDir, unwrapPathError(err))
			continue
		}
		for _, n := range names {
			e := entry{Class: c, Name: n, Path: filepath.Join(c.DiscoveryDir, n)}
			e.Probe = p.prober.probe(e.Path)
			in.Entries = append(in.Entries, e)
			seenNow[e.Path] = true
			if s, ok := p.seen[e.Path]; !ok || s.Identity != e.Probe.Identity {
				p.seen[e.Path] = seenEntry{Identity: e.Probe.Identity, Since: start}
			}
		}
	}
	for path := range p.seen {
		if !seenNow[path] {
			delete(p.seen, path)
		}
	}
	in.Cleanups = p.tracker.snapshot()

	out := plan(in)

	for _, uid := range out.Forget {
		p.tracker.forget(uid)
	}
	for path, r := range p.recent {
		if start.Sub(r.At) >= recentTTL || in.pathHasPV(path) {
			delete(p.recent, path)
		}
	}
	for i := range out.Create {
		p.create(ctx, &out.Create[i])
	}
	for _, d := range out.Delete {
		p.delete(ctx, d)
	}
	for _, t := range out.Clean {
		p.startCleanup(ctx, t, cfg)
	}
	p.report(cfg, in, out, node != nil, docErr, start)
	return out.Wake
}

func (in *planInput) pathHasPV(path string) bool {
	for _, pv := range in.PVs {
		if pvPath(pv) == path {
			return true
		}
	}
	return false
}

// node returns this node's object and its hostname label.
func (p *Provisioner) node() (*v1.Node, string) {
	o, ok, err := p.nodes.GetStore().GetByKey(p.opts.NodeName)
	if err != nil || !ok {
		return nil, ""
	}
	n := o.(*v1.Node)
	return n, n.Labels[v1.LabelHostname]
}

func (p *Provisioner) create(ctx context.Context, r *createRequest) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	if !p.checked[r.Path] {
		found, err := p.adoptEarlier(ctx, r.Names)
		if err != nil {
			p.createErrs[r.Path] = fmt.Sprintf("looking for an existing PV of %s: %v", r.Path, err)
			p.log.Error("local volume not created: cannot look for an existing one", zap.String("path", r.Path), zap.Error(err))
			p.metrics.discoveryErrors.WithLabelValues(r.Class, "create").Inc()
			return
		}
		p.checked[r.Path] = true
		if found {
			// The next pass sees what was found (labelled, or a taken name).
			p.wake.Notify()
			return
		}
	}
	// The disk's identity goes with the PV: its cleanup will clean this
	// disk and nothing else that comes to be at the path.
	id, err := p.identifier.identify(ctx, r.Path, wantsBlockDevice(r.PV))
	if err != nil {
		msg := fmt.Sprintf("not creating PV %s for %s: identifying its disk: %v", r.PV.Name, r.Path, err)
		p.createErrs[r.Path] = msg
		p.log.Error("local volume not created: its disk cannot be identified", zap.String("pv", r.PV.Name), zap.String("path", r.Path), zap.Error(err))
		p.metrics.discoveryErrors.WithLabelValues(r.Class, "create").Inc()
		return
	}
	id.annotate(r.PV.Annotations)
	out := &v1.PersistentVolume{}
	err = p.opts.Client.Core.Post().Resource("persistentvolumes").Body(r.PV).Do(ctx).Into(out)
	mode := string(*r.PV.Spec.VolumeMode)
	switch {
	case err == nil:
		p.log.Info("local volume created", zap.String("pv", r.PV.Name), zap.String("path", r.Path), zap.String("class", r.Class),
			zap.String("capacity", storageOf(r.PV)), zap.String("volumeMode", mode), zap.Stringer("disk", id))
		p.metrics.created.WithLabelValues(r.Class, mode).Inc()
	case apierrors.IsAlreadyExists(err):
		// Made before a restart and the cache lags, or someone else's:
		// look.
		if _, err := p.adoptEarlier(ctx, []string{r.PV.Name}); err != nil {
			p.log.Warn("local volume exists already and cannot be read", zap.String("pv", r.PV.Name), zap.Error(err))
		}
		p.wake.Notify()
		if p.foreign[r.PV.Name] {
			return // the next pass takes the other name
		}
	default:
		msg := fmt.Sprintf("creating PV %s for %s: %v", r.PV.Name, r.Path, err)
		p.createErrs[r.Path] = msg
		p.log.Error("local volume not created", zap.String("pv", r.PV.Name), zap.String("path", r.Path), zap.Error(err))
		p.metrics.discoveryErrors.WithLabelValues(r.Class, "create").Inc()
		return
	}
	delete(p.createErrs, r.Path)
	p.recent[r.Path] = recentCreate{Name: r.PV.Name, At: p.now()}
}

// adoptEarlier looks the names up (GET, never a list): a PV this node's
// provisioner made (AnnProvisionedBy) without LabelNode — an earlier
// version made no label — gets it, so that the watch sees it from now on;
// a PV someone else made has its name remembered as taken. It reports
// whether any exists.
func (p *Provisioner) adoptEarlier(ctx context.Context, names []string) (bool, error) {
	found := false
	for _, name := range names {
		pv := &v1.PersistentVolume{}
		err := p.opts.Client.Core.Get().Resource("persistentvolumes").Name(name).Do(ctx).Into(pv)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return found, err
		}
		found = true
		switch {
		case !isOurs(pv, ProvisionerName(p.opts.NodeName)):
			if !p.foreign[name] {
				p.log.Info("a PV of another provisioner has the name; using the fallback name", zap.String("pv", name))
			}
			p.foreign[name] = true
		case !labelled(pv, p.opts.NodeName):
			// The resource version makes the patch fail if the PV changed
			// since it was read; the next pass tries again.
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
				"labels": map[string]string{LabelNode: NodeLabelValue(p.opts.NodeName)}, "resourceVersion": pv.ResourceVersion,
			}})
			if err := p.opts.Client.Core.Patch(types.MergePatchType).Resource("persistentvolumes").Name(name).Body(patch).Do(ctx).Error(); err != nil {
				return found, fmt.Errorf("labelling PV %s: %w", name, err)
			}
			p.log.Info("labelled a local volume made by an earlier version, so that the node's PV watch sees it",
				zap.String("pv", name), zap.String("label", NodeSelector(p.opts.NodeName)))
		}
	}
	return found, nil
}

func (p *Provisioner) delete(ctx context.Context, d deleteRequest) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	uid := d.UID
	// The UID precondition: never delete a newer PV of the same name.
	err := p.opts.Client.Core.Delete().Resource("persistentvolumes").Name(d.Name).
		Body(&metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}).Do(ctx).Error()
	switch {
	case err == nil:
		p.log.Info("local volume cleaned and deleted; it will be created again", zap.String("pv", d.Name))
		p.metrics.deleted.WithLabelValues(d.Class, d.Mode).Inc()
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
	default:
		p.log.Error("deleting a cleaned local volume failed; retrying", zap.String("pv", d.Name), zap.Error(err))
		p.metrics.discoveryErrors.WithLabelValues(d.Class, "delete").Inc()
	}
}

// startCleanup runs a cleanup in the background unless the tracker says
// it must not run now.
func (p *Provisioner) startCleanup(ctx context.Context, t target, cfg *Config) {
	class := cfg.Classes[t.Class]
	method := "removeContents"
	if t.Block {
		method = "unknown"
		if class != nil {
			method = class.Cleanup.Method
		}
	}
	if !p.tracker.start(t, method, p.now()) {
		return
	}
	p.log.Info("cleaning local volume", zap.String("pv", t.PV), zap.String("path", t.Path), zap.String("method", method))
	p.cleanups.Add(1)
	go func() {
		defer p.cleanups.Done()
		defer p.wake.Notify()
		select {
		case p.slots <- struct{}{}:
			defer func() { <-p.slots }()
		case <-ctx.Done():
			p.tracker.finish(t.UID, ctx.Err(), p.now())
			return
		}
		start := p.now()
		var err error
		identity := ""
		if class == nil {
			err = fmt.Errorf("storage class %q is not in the configuration: its cleanup method is unknown", t.Class)
		} else {
			identity, err = p.cleaner.clean(ctx, t, class)
		}
		if identity != "" {
			p.metrics.identityChecks.WithLabelValues(t.Class, identity).Inc()
		}
		if identity == identityUnrecorded {
			p.log.Warn("local volume records no disk identity (made by an older version or by hand): cleaning it after checking only that the path is still a mount point or a block device and nothing uses it",
				zap.String("pv", t.PV), zap.String("path", t.Path))
		}
		took := p.now().Sub(start)
		result := "success"
		if err != nil {
			result = "failure"
		}
		// Counted before the result is published: a pass may delete the
		// PV the moment the tracker says it is clean.
		p.metrics.cleanups.WithLabelValues(t.Class, t.Mode, method, result).Inc()
		p.metrics.cleanupDuration.WithLabelValues(t.Class, t.Mode, method, result).Observe(took.Seconds())
		rec := p.tracker.finish(t.UID, err, p.now())
		obj := events.Object{Kind: "PersistentVolume", Name: t.PV, UID: string(t.UID)}
		if err != nil {
			if ctx.Err() != nil {
				p.log.Info("local volume cleanup stopped: the provisioner is stopping", zap.String("pv", t.PV))
				return
			}
			var mismatch *DiskMismatchError
			if errors.As(err, &mismatch) {
				p.log.Error("local volume not cleaned: its path leads to another disk", zap.String("pv", t.PV), zap.String("path", t.Path),
					zap.Stringer("recorded", mismatch.Recorded), zap.Stringer("found", mismatch.Current), zap.String("reason", mismatch.Why), zap.Int("attempt", rec.Attempts))
				p.event(obj, events.Warning, ReasonDiskMismatch, fmt.Sprintf("%v; the PV stays Released until that disk is back at the path (checked again with backoff); "+
					"delete the PV to give up on that disk (the disk now at the path is then offered as a new PV)", err))
				return
			}
			// The same message for every attempt, so that the event
			// correlator counts repeats on one event instead of adding one
			// per retry.
			msg := fmt.Sprintf("cleaning %s failed: %v; retrying with backoff, the PV is not deleted until a cleanup succeeds", t.Path, err)
			p.log.Error("local volume cleanup failed", zap.String("pv", t.PV), zap.String("path", t.Path), zap.Int("attempt", rec.Attempts), zap.Error(err))
			p.event(obj, events.Warning, ReasonCleanupFailed, msg)
			return
		}
		p.log.Info("local volume cleaned", zap.String("pv", t.PV), zap.String("path", t.Path), zap.Duration("took", took))
		if !rec.PVGone {
			p.event(obj, events.Normal, ReasonCleaned, fmt.Sprintf("cleaned %s (%s) in %v; deleting the PV so that the disk is offered again", t.Path, method, took.Round(time.Millisecond)))
		}
	}()
}

func (p *Provisioner) event(obj events.Object, eventType, reason, msg string) {
	if p.opts.Recorder != nil {
		p.opts.Recorder.Event(obj, eventType, reason, msg)
	}
}

// report publishes the pass's results (debug document, gauges) and emits
// events for state changes worth an administrator's attention.
func (p *Provisioner) report(cfg *Config, in *planInput, out *planOutput, synced bool, docErr string, start time.Time) {
	now := p.now()
	next := map[string]Volume{}
	for i := range out.Volumes {
		v := &out.Volumes[i]
		key := v.PV
		if key == "" {
			key = "path:" + v.Path
		}
		prev, had := p.prevState[key]
		v.Since = now
		if had && prev.State == v.State && prev.UID == v.UID {
			v.Since = prev.Since
		}
		next[key] = *v
		if v.UID == "" {
			continue
		}
		obj := events.Object{Kind: "PersistentVolume", Name: v.PV, UID: string(v.UID)}
		changed := !had || prev.State != v.State || prev.UID != v.UID
		switch {
		case v.State == StateMissing && changed:
			p.log.Warn("local volume's disk is missing", zap.String("pv", v.PV), zap.String("reason", v.Reason))
			p.event(obj, events.Warning, ReasonMissing, v.Reason)
		case had && prev.State == StateMissing && v.State != StateMissing && prev.UID == v.UID:
			p.log.Info("local volume's disk is back", zap.String("pv", v.PV))
			p.event(obj, events.Normal, ReasonBack, fmt.Sprintf("the disk at %s is back", v.Path))
		case v.State == StateReleased && changed && v.ReclaimPolicy == v1.PersistentVolumeReclaimRecycle:
			p.event(obj, events.Warning, ReasonUnsupportedPolicy, v.Reason)
		case v.State == StateReleased && changed && v.ReclaimPolicy != v1.PersistentVolumeReclaimRetain && v.ReclaimPolicy != v1.PersistentVolumeReclaimDelete:
			p.event(obj, events.Warning, ReasonUnknownPolicy, v.Reason)
		}
	}
	p.prevState = next

	classes := []ClassStatus{}
	for _, name := range cfg.classNames() {
		c := cfg.Classes[name]
		cs := ClassStatus{Name: name, DiscoveryDir: c.DiscoveryDir, VolumeMode: c.VolumeMode, FSType: c.FSType,
			NamePattern: c.NamePattern, CleanupMethod: c.Cleanup.Method, Error: in.ClassErr[name]}
		if sc := in.Classes[name]; sc != nil {
			cs.ReclaimPolicy = string(v1.PersistentVolumeReclaimDelete)
			if sc.ReclaimPolicy != nil {
				cs.ReclaimPolicy = string(*sc.ReclaimPolicy)
			}
		}
		if cs.Error != "" && cs.Error != p.classErrs[name] && docErr == "" {
			p.log.Error("local volume class creates no PV", zap.String("class", name), zap.String("error", cs.Error))
			p.metrics.discoveryErrors.WithLabelValues(name, "class").Inc()
			p.event(events.Object{Kind: "Node", Name: p.opts.NodeName}, events.Warning, ReasonClassError, fmt.Sprintf("class %s: %s", name, cs.Error))
		}
		classes = append(classes, cs)
	}
	p.classErrs = in.ClassErr

	took := p.now().Sub(start)
	p.metrics.passDuration.Observe(took.Seconds())
	p.statusMu.Lock()
	defer p.statusMu.Unlock()
	p.status.Hostname = in.Hostname
	p.status.Synced = synced
	p.status.Passes++
	p.status.LastPass = start
	p.status.LastPassTook = took
	p.status.Error = docErr
	p.status.Classes = classes
	p.status.Volumes = out.Volumes
	if p.status.Volumes == nil {
		p.status.Volumes = []Volume{}
	}
}

// Status returns the debug document (/debug/local-volumes).
func (p *Provisioner) Status() Document {
	p.statusMu.Lock()
	doc := p.status
	doc.Classes = append([]ClassStatus(nil), p.status.Classes...)
	doc.Volumes = append([]Volume(nil), p.status.Volumes...)
	doc.Config.Errors = append([]string(nil), p.status.Config.Errors...)
	p.statusMu.Unlock()
	doc.Cleanups = p.tracker.snapshot()
	// Cleanups move between passes: show their live state.
	byUID := map[types.UID]Cleanup{}
	for _, c := range doc.Cleanups {
		byUID[c.UID] = c
	}
	for i := range doc.Volumes {
		v := &doc.Volumes[i]
		c, ok := byUID[v.UID]
		if !ok || (v.State != StateCleaning && v.State != StateCleanupFailed) {
			continue
		}
		switch c.State {
		case CleanupFailed:
			v.State, v.LastError = StateCleanupFailed, c.LastError
		case CleanupRunning, CleanupPending, CleanupSucceeded:
			v.State = StateCleaning
		}
	}
	return doc
}

func storageOf(pv *v1.PersistentVolume) string {
	q := pv.Spec.Capacity[v1.ResourceStorage]
	return q.String()
}

// readDirNames lists a directory's names, sorted.
func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}

func unwrapPathError(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return strings.TrimSpace(pe.Err.Error())
	}
	return err.Error()
}

// discoveryDir is where a class's discovery directory is visible to the
// agent, resolved within the host root.
func (p *Provisioner) discoveryDir(c *Class) string {
	dir, err := hostroot.New(p.opts.HostRoot).Resolve(c.DiscoveryDir)
	if err != nil {
		// Only a link loop: listing the unresolved path says so.
		return filepath.Join(p.opts.HostRoot, c.DiscoveryDir)
	}
	return dir
}
