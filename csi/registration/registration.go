// Package registration finds CSI drivers the way the kubelet's plugin watcher
// does: it watches a plugin registry directory for kubelet-style registration
// sockets (those node-driver-registrar serves), asks each socket who it is
// (pluginregistration v1 GetInfo), registers the CSI driver it points at in
// the driver registry (package csi/registry), and deregisters the driver when
// its socket goes away.
//
// The package owns the directory's bookkeeping only: which sockets exist,
// what each one turned out to be, and when a socket that failed is tried
// again. What a registered driver can do, and whether it still answers, is
// the registry's business.
//
// Layout: sockets directly in the directory and in its subdirectories one
// level deep are candidates (node-driver-registrar puts its socket directly
// in the directory; some deployments use <dir>/<driver>/reg.sock). Deeper
// levels are not looked at, so that pointing the watcher at a tree of driver
// directories cannot make it walk and watch all of it. Names starting with
// "." (files and subdirectories) are ignored, as the kubelet ignores them:
// that is how a socket is prepared before it is renamed into place.
//
// The watcher never sends NotifyRegistrationStatus with PluginRegistered
// false: node-driver-registrar exits when it receives one, which would turn a
// passing failure on our side into a crash loop of the driver's pod.
package registration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/volume-agent/volume-agent/csi/registry"
)

// Defaults of Options.
const (
	DefaultRescanPeriod    = 30 * time.Second
	DefaultDialTimeout     = time.Second
	DefaultGetInfoTimeout  = time.Second
	DefaultRegisterTimeout = 10 * time.Second
	DefaultNotifyTimeout   = 5 * time.Second
	DefaultMinBackoff      = 500 * time.Millisecond
	DefaultMaxBackoff      = time.Minute
)

// Options configure a Watcher. Dir and Registry are required.
type Options struct {
	// Dir is the plugin registry directory. It is created (0750) if missing.
	Dir      string
	Registry *registry.Registry
	Log      *zap.Logger
	// RescanPeriod is how often the directory is listed again, to catch
	// what fsnotify missed (events are lost when the watch is re-made, the
	// queue overflows, or the directory is a mount that was replaced).
	RescanPeriod time.Duration
	// DialTimeout bounds connecting to a registration socket (a socket that
	// refuses connections is tried again within it: it may have been bound
	// but not be listening yet); GetInfoTimeout bounds the GetInfo call
	// (the kubelet's 1 s).
	DialTimeout    time.Duration
	GetInfoTimeout time.Duration
	// RegisterTimeout bounds connecting to the driver's CSI endpoint and
	// asking it about itself (registry.Register).
	RegisterTimeout time.Duration
	// NotifyTimeout bounds NotifyRegistrationStatus.
	NotifyTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before a socket whose
	// registration failed is tried again; the wait doubles with every
	// failure in a row.
	MinBackoff, MaxBackoff time.Duration
	// OnChange, if set, is called (it must not block) whenever what
	// Sockets returns changes.
	OnChange func()
}

// State is what a socket turned out to be.
type State string

const (
	// StatePending: found, the first attempt to register it is under way.
	StatePending State = "pending"
	// StateRegistered: its driver is registered.
	StateRegistered State = "registered"
	// StateFailed: registering failed; it is tried again at NextRetry.
	StateFailed State = "failed"
	// StateNotRegistration: the socket does not serve the registration API
	// (a raw CSI socket, or something that does not speak gRPC at all). It
	// is looked at again only when the file changes.
	StateNotRegistration State = "notRegistration"
	// StateIgnored: a registration socket of another plugin type (device
	// plugins, DRA plugins). Looked at again only when the file changes.
	StateIgnored State = "ignored"
)

// SocketStatus describes one socket in the directory, for the debug
// endpoint.
type SocketStatus struct {
	Path  string `json:"path"`
	State State  `json:"state"`
	// Type, Driver, Endpoint and SupportedVersions are what GetInfo
	// returned, when it answered.
	Type              string   `json:"type,omitempty"`
	Driver            string   `json:"driver,omitempty"`
	Endpoint          string   `json:"endpoint,omitempty"`
	SupportedVersions []string `json:"supportedVersions,omitempty"`
	// LastError is why the socket is failed or not a registration socket.
	LastError string `json:"lastError,omitempty"`
	// Failures counts failed attempts in a row.
	Failures  int       `json:"failures,omitempty"`
	NextRetry time.Time `json:"nextRetry,omitzero"`
	// Since is when the socket reached its state.
	Since time.Time `json:"since"`
}

// Watcher watches the plugin registry directory. Create it with New and
// start it with Run (once).
type Watcher struct {
	opts Options
	log  *zap.Logger

	// Everything below is owned by the Run goroutine, except statuses
	// (published under mu for Sockets) and the counters tests read.
	entries map[string]*entry
	watched map[string]dirID // watched directories, by the inode watched
	fsw     *fsnotify.Watcher
	results chan result
	nextGen uint64
	wg      sync.WaitGroup

	mu       sync.Mutex
	statuses []SocketStatus

	rescans atomic.Int64  // completed rescans, for tests
	ready   chan struct{} // closed once the directory is watched and was scanned
}

// entry is the watcher's record of one socket.
type entry struct {
	path string
	id   fileID
	// gen identifies the current file at path: it changes whenever the file
	// does, so that the result of an attempt made on an earlier file is
	// recognised as stale.
	gen uint64
	// inflight is the gen of the attempt under way (possibly for an
	// earlier file), 0 when none: one attempt per socket at a time.
	inflight uint64

	state    State
	info     pluginInfo
	lastErr  string
	failures int
	backoff  time.Duration
	retryAt  time.Time
	since    time.Time
	// regName and regEndpoint are the registration this socket made and
	// still stands for; "" when none.
	regName, regEndpoint string
}

// fileID tells one file at a path from a later one at the same path.
type fileID struct {
	dev, ino uint64
	mtime    int64
}

type pluginInfo struct {
	typ, name, endpoint string
	versions            []string
}

// result is the outcome of one attempt.
type result struct {
	path  string
	gen   uint64
	state State // StateRegistered, StateFailed, StateNotRegistration or StateIgnored
	info  pluginInfo
	err   error
}

// New returns a watcher; nothing happens until Run.
func New(opts Options) *Watcher {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.RescanPeriod, DefaultRescanPeriod)
	def(&opts.DialTimeout, DefaultDialTimeout)
	def(&opts.GetInfoTimeout, DefaultGetInfoTimeout)
	def(&opts.RegisterTimeout, DefaultRegisterTimeout)
	def(&opts.NotifyTimeout, DefaultNotifyTimeout)
	def(&opts.MinBackoff, DefaultMinBackoff)
	def(&opts.MaxBackoff, DefaultMaxBackoff)
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = opts.MinBackoff
	}
	return &Watcher{
		opts:    opts,
		log:     opts.Log,
		entries: map[string]*entry{},
		watched: map[string]dirID{},
		results: make(chan result),
		ready:   make(chan struct{}),
	}
}

// Sockets returns the sockets found in the directory, sorted by path.
func (w *Watcher) Sockets() []SocketStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]SocketStatus(nil), w.statuses...)
}

// Run watches the directory until ctx ends. It returns an error only when
// the directory cannot be created or watched at all. Registrations it made
// stay in the registry when it returns: the agent is stopping, and the
// drivers are still there.
func (w *Watcher) Run(ctx context.Context) error {
	if w.opts.Registry == nil {
		return errors.New("registration watcher: no registry")
	}
	if w.opts.Dir == "" {
		return errors.New("registration watcher: no directory")
	}
	// Absolute, because a socket's path may become a driver's endpoint,
	// and endpoints must be absolute.
	dir, err := filepath.Abs(w.opts.Dir)
	if err != nil {
		return fmt.Errorf("registration watcher: %w", err)
	}
	w.opts.Dir = dir
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating plugin registry directory: %w", err)
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching plugin registry directory: %w", err)
	}
	defer fsw.Close()
	w.fsw = fsw
	if err := w.watch(dir); err != nil {
		return fmt.Errorf("watching plugin registry directory %s: %w", dir, err)
	}
	w.log.Info("watching for CSI registration sockets", zap.String("dir", dir), zap.Duration("rescanPeriod", w.opts.RescanPeriod))

	// Attempts send their results to this loop; the loop must outlive them.
	ctx, cancel := context.WithCancel(ctx)
	defer w.wg.Wait()
	defer cancel()

	w.rescan(ctx)
	w.publish()
	close(w.ready)

	rescan := time.NewTicker(w.opts.RescanPeriod)
	defer rescan.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		w.armRetry(retry)
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fsw.Events:
			if !ok {
				return nil
			}
			w.handleEvent(ctx, ev)
		case err, ok := <-fsw.Errors:
			if !ok {
				return nil
			}
			// An overflow loses events; a rescan finds what they said.
			w.log.Warn("watching the plugin registry directory", zap.String("dir", dir), zap.Error(err))
			w.rescan(ctx)
		case <-rescan.C:
			w.rescan(ctx)
		case <-retry.C:
			w.retryDue(ctx)
		case res := <-w.results:
			w.finish(ctx, res)
		}
		w.publish()
	}
}

// armRetry sets the timer to the earliest retry of a failed socket.
func (w *Watcher) armRetry(t *time.Timer) {
	var next time.Time
	for _, e := range w.entries {
		if e.state == StateFailed && e.inflight == 0 && (next.IsZero() || e.retryAt.Before(next)) {
			next = e.retryAt
		}
	}
	if next.IsZero() {
		t.Stop()
		return
	}
	t.Reset(max(time.Until(next), 0))
}

func (w *Watcher) retryDue(ctx context.Context) {
	now := time.Now()
	for _, e := range w.sortedEntries() {
		if e.state == StateFailed && e.inflight == 0 && !e.retryAt.After(now) {
			w.start(ctx, e)
		}
	}
}

// --- the directory ---

// candidate reports whether path may hold a registration socket: directly
// in the directory or one level below it, with no element starting with ".".
func (w *Watcher) candidate(path string) bool {
	rel, err := filepath.Rel(w.opts.Dir, path)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return false
	}
	parts := strings.Split(rel, string(filepath.Separator))
	if len(parts) > 2 {
		return false
	}
	for _, p := range parts {
		if strings.HasPrefix(p, ".") {
			return false
		}
	}
	return true
}

// isSubdir reports whether path is a directory the watcher watches below
// the top one (a direct child not starting with ".").
func (w *Watcher) isSubdir(path string) bool {
	return filepath.Dir(path) == w.opts.Dir && !strings.HasPrefix(filepath.Base(path), ".")
}

// rescan lists the directory (and its subdirectories) and reconciles every
// socket found or known. It also re-registers drivers the registry dropped
// while their socket is still there (the registry drops a driver that
// stops answering probes and relies on its source to bring it back).
func (w *Watcher) rescan(ctx context.Context) {
	defer w.rescans.Add(1)
	dir := w.opts.Dir
	// The directory may have been removed, or removed and made again, with
	// no event yet: inotify reports a directory's removal only once its
	// inode is freed, and a registrar's bound socket keeps it alive.
	if err := os.MkdirAll(dir, 0o750); err != nil {
		w.log.Warn("cannot create the plugin registry directory", zap.String("dir", dir), zap.Error(err))
	} else if err := w.watch(dir); err != nil {
		w.log.Warn("cannot watch the plugin registry directory", zap.String("dir", dir), zap.Error(err))
	}
	seen := map[string]bool{}
	for _, p := range w.list(dir) {
		seen[p] = true
		w.sync(ctx, p)
	}
	for _, e := range w.sortedEntries() {
		if !seen[e.path] {
			w.sync(ctx, e.path)
		}
	}
	for _, e := range w.sortedEntries() {
		if e.state != StateRegistered || e.inflight != 0 || e.regName == "" {
			continue
		}
		if _, ok := w.opts.Registry.Get(e.regName); ok {
			// Registered, possibly from another endpoint that replaced
			// ours; that one's source is in charge now.
			continue
		}
		w.log.Info("CSI driver of a registration socket is no longer registered; registering it again",
			zap.String("socket", e.path), zap.String("driver", e.regName))
		e.regName, e.regEndpoint = "", ""
		e.state, e.since = StatePending, time.Now()
		w.start(ctx, e)
	}
}

// list returns the candidate sockets in dir and its subdirectories, and
// makes sure every subdirectory is watched.
func (w *Watcher) list(dir string) []string {
	var out []string
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			w.log.Warn("cannot list the plugin registry directory", zap.String("dir", dir), zap.Error(err))
		}
		return nil
	}
	for _, de := range ents {
		p := filepath.Join(dir, de.Name())
		switch {
		case strings.HasPrefix(de.Name(), "."):
		case de.Type()&os.ModeSocket != 0:
			out = append(out, p)
		case de.IsDir() && dir == w.opts.Dir:
			if err := w.watch(p); err != nil {
				w.log.Warn("cannot watch a plugin registry subdirectory", zap.String("dir", p), zap.Error(err))
			}
			out = append(out, w.list(p)...)
		}
	}
	return out
}

// dirID is a directory's inode: inotify watches inodes, not paths.
type dirID struct{ dev, ino uint64 }

// watch makes sure the directory now at p is the one watched.
func (w *Watcher) watch(p string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", p)
	}
	fid := idOf(fi)
	id := dirID{fid.dev, fid.ino}
	old, ok := w.watched[p]
	if ok && old == id {
		return nil
	}
	if ok {
		// The watch is on a directory that was removed.
		_ = w.fsw.Remove(p)
		delete(w.watched, p)
	}
	if err := w.fsw.Add(p); err != nil {
		return err
	}
	w.watched[p] = id
	return nil
}

func (w *Watcher) handleEvent(ctx context.Context, ev fsnotify.Event) {
	p := filepath.Clean(ev.Name)
	if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
		if _, ok := w.watched[p]; ok {
			// A watched directory went away: inotify dropped its watch,
			// and everything under it is gone.
			delete(w.watched, p)
			_ = w.fsw.Remove(p)
			for _, e := range w.sortedEntries() {
				if strings.HasPrefix(e.path, p+string(filepath.Separator)) {
					w.sync(ctx, e.path)
				}
			}
			if p == w.opts.Dir {
				w.log.Warn("the plugin registry directory was removed; it is made again at the next rescan", zap.String("dir", p))
			}
		}
	}
	if ev.Has(fsnotify.Create) && w.isSubdir(p) {
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			// Sockets may have been created in it before the watch was
			// added; list it now.
			if err := w.watch(p); err != nil {
				w.log.Warn("cannot watch a plugin registry subdirectory", zap.String("dir", p), zap.Error(err))
			}
			for _, s := range w.list(p) {
				w.sync(ctx, s)
			}
			return
		}
	}
	w.sync(ctx, p)
}

// sync reconciles what is at path with what the watcher knows of it.
func (w *Watcher) sync(ctx context.Context, path string) {
	if !w.candidate(path) {
		return
	}
	e := w.entries[path]
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		if e != nil {
			w.remove(e)
		}
		return
	}
	id := idOf(fi)
	if e == nil {
		e = &entry{path: path, id: id, state: StatePending, since: time.Now()}
		w.entries[path] = e
		w.log.Debug("socket found in the plugin registry directory", zap.String("socket", path))
		w.start(ctx, e)
		return
	}
	if e.id == id {
		return
	}
	// Same path, another file (or the same one touched): a registrar that
	// restarted, or a raw socket that may have become something else. Look
	// at it afresh. A registration the old file made stays until the new
	// attempt is done, so a driver whose registrar restarts is not
	// unregistered in between.
	w.log.Info("socket in the plugin registry directory was replaced", zap.String("socket", path),
		zap.String("driver", e.info.name))
	e.id = id
	e.state, e.since, e.lastErr = StatePending, time.Now(), ""
	e.failures, e.backoff, e.retryAt = 0, 0, time.Time{}
	w.start(ctx, e)
}

// remove forgets a socket that is gone, deregistering its driver.
func (w *Watcher) remove(e *entry) {
	delete(w.entries, e.path)
	if e.regName != "" {
		w.log.Info("registration socket removed", zap.String("socket", e.path), zap.String("driver", e.regName))
		w.release(e, "registration socket removed")
	} else {
		w.log.Debug("socket removed from the plugin registry directory", zap.String("socket", e.path))
	}
}

// release withdraws the registration e stands for, unless another socket
// stands for the same one.
func (w *Watcher) release(e *entry, why string) {
	name, endpoint := e.regName, e.regEndpoint
	e.regName, e.regEndpoint = "", ""
	w.deregister(name, endpoint, why)
}

func (w *Watcher) deregister(name, endpoint, why string) {
	if name == "" {
		return
	}
	for _, o := range w.entries {
		if o.regName == name && o.regEndpoint == endpoint {
			return
		}
	}
	w.opts.Registry.Deregister(name, endpoint, why)
}

// start begins an attempt for e's current file, unless one is under way (its
// result, stale by then, starts the next one).
func (w *Watcher) start(ctx context.Context, e *entry) {
	w.nextGen++
	e.gen = w.nextGen
	if e.inflight != 0 {
		return
	}
	w.launch(ctx, e)
}

func (w *Watcher) launch(ctx context.Context, e *entry) {
	e.inflight = e.gen
	path, gen := e.path, e.gen
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		res := w.attempt(ctx, path)
		res.path, res.gen = path, gen
		select {
		case w.results <- res:
		case <-ctx.Done():
		}
	}()
}

// finish records the result of an attempt.
func (w *Watcher) finish(ctx context.Context, res result) {
	e := w.entries[res.path]
	if e != nil && e.inflight == res.gen {
		e.inflight = 0
	}
	if e == nil || e.gen != res.gen {
		// The file changed or went away while the attempt ran: what it
		// registered no longer has a socket standing for it.
		if res.state == StateRegistered {
			w.deregister(res.info.name, res.info.endpoint, "registration socket removed or replaced while registering")
		}
		// The current file's attempt waited for this one (if the attempt
		// was this entry's; a socket removed and made again while it ran
		// is a new entry with an attempt of its own).
		if e != nil && e.inflight == 0 {
			w.launch(ctx, e)
		}
		return
	}
	now := time.Now()
	if e.state != res.state {
		e.since = now
	}
	e.state = res.state
	if res.info.name != "" || res.state != StateFailed {
		// A failed attempt that learnt nothing (the registrar does not
		// answer) keeps what the socket said before: it still stands for
		// its driver until it goes away or is replaced.
		e.info = res.info
	}
	log := w.log.With(zap.String("socket", e.path))
	if res.info.name != "" {
		log = log.With(zap.String("driver", res.info.name))
	}
	switch res.state {
	case StateRegistered:
		if e.regName != "" && (e.regName != res.info.name || e.regEndpoint != res.info.endpoint) {
			w.release(e, "registration socket now registers "+res.info.name+" at "+res.info.endpoint)
		}
		e.regName, e.regEndpoint = res.info.name, res.info.endpoint
		e.lastErr, e.failures, e.backoff, e.retryAt = "", 0, 0, time.Time{}
		log.Info("CSI driver registered through its registration socket", zap.String("endpoint", res.info.endpoint),
			zap.Strings("supportedVersions", res.info.versions))
	case StateFailed:
		w.release(e, "registration socket failed: "+res.err.Error())
		e.lastErr = res.err.Error()
		e.failures++
		if e.backoff == 0 {
			e.backoff = w.opts.MinBackoff
		} else {
			e.backoff = min(2*e.backoff, w.opts.MaxBackoff)
		}
		e.retryAt = now.Add(e.backoff)
		log.Warn("cannot register CSI driver from registration socket; will retry", zap.Error(res.err),
			zap.Int("failures", e.failures), zap.Duration("retryIn", e.backoff))
	case StateNotRegistration, StateIgnored:
		w.release(e, "socket is no longer a CSI registration socket")
		e.lastErr, e.failures, e.backoff, e.retryAt = "", 0, 0, time.Time{}
		if res.err != nil {
			e.lastErr = res.err.Error()
		}
		// Logged once per file: it is not looked at again until it
		// changes.
		log.Info("ignoring socket in the plugin registry directory", zap.String("state", string(res.state)),
			zap.String("reason", e.lastErr))
	}
}

// publish makes the current state visible to Sockets.
func (w *Watcher) publish() {
	out := make([]SocketStatus, 0, len(w.entries))
	for _, e := range w.sortedEntries() {
		st := SocketStatus{
			Path: e.path, State: e.state, Type: e.info.typ, Driver: e.info.name, Endpoint: e.info.endpoint,
			SupportedVersions: e.info.versions, LastError: e.lastErr, Failures: e.failures, Since: e.since,
		}
		if e.state == StateFailed {
			st.NextRetry = e.retryAt
		}
		out = append(out, st)
	}
	w.mu.Lock()
	changed := !slices.EqualFunc(w.statuses, out, sameStatus)
	w.statuses = out
	w.mu.Unlock()
	if changed && w.opts.OnChange != nil {
		w.opts.OnChange()
	}
}

func sameStatus(a, b SocketStatus) bool {
	return a.Path == b.Path && a.State == b.State && a.Driver == b.Driver && a.Endpoint == b.Endpoint &&
		a.LastError == b.LastError && a.Failures == b.Failures && a.Since.Equal(b.Since)
}

// Drivers returns the names of the CSI drivers that sockets in the
// directory named (by GetInfo), whatever became of their registration.
func (w *Watcher) Drivers() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, s := range w.statuses {
		if s.Driver != "" && s.Type == registerapi.CSIPlugin && !slices.Contains(out, s.Driver) {
			out = append(out, s.Driver)
		}
	}
	return out
}

func (w *Watcher) sortedEntries() []*entry {
	out := make([]*entry, 0, len(w.entries))
	for _, e := range w.entries {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out
}

func idOf(fi os.FileInfo) fileID {
	id := fileID{mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino
	}
	return id
}

// --- one attempt ---

// attempt asks the socket who it is and registers its driver. It runs
// outside the loop, so a socket that hangs delays nobody else.
func (w *Watcher) attempt(ctx context.Context, path string) result {
	// Connect first, on our own, so that "nothing listens" (a stale socket
	// file: try again later) can be told from "something listens but does
	// not speak gRPC" (not a registration socket).
	raw, err := dialUnix(ctx, path, w.opts.DialTimeout)
	if err != nil {
		return result{state: StateFailed, err: fmt.Errorf("cannot connect: %w", err)}
	}
	var used atomic.Bool
	conn, err := grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			if used.CompareAndSwap(false, true) {
				return raw, nil
			}
			d := net.Dialer{Timeout: w.opts.DialTimeout}
			return d.DialContext(ctx, "unix", path)
		}))
	if err != nil {
		raw.Close()
		return result{state: StateFailed, err: fmt.Errorf("connecting to %s: %w", path, err)}
	}
	defer conn.Close()
	defer func() {
		// gRPC owns (and closes) the connection once its dialer took it.
		if used.CompareAndSwap(false, true) {
			raw.Close()
		}
	}()
	client := registerapi.NewRegistrationClient(conn)

	gctx, cancel := context.WithTimeout(ctx, w.opts.GetInfoTimeout)
	var p peer.Peer
	pi, err := client.GetInfo(gctx, &registerapi.InfoRequest{}, grpc.Peer(&p))
	cancel()
	if err != nil {
		switch {
		case status.Code(err) == codes.Unimplemented:
			return result{state: StateNotRegistration, err: errors.New("serves gRPC but not the plugin registration API (a raw CSI socket?)")}
		case p.Addr == nil && status.Code(err) == codes.Unavailable:
			// Connected, but no gRPC transport came up: whatever listens
			// there does not speak gRPC.
			return result{state: StateNotRegistration, err: fmt.Errorf("does not speak gRPC: %w", err)}
		}
		return result{state: StateFailed, err: fmt.Errorf("GetInfo: %w", err)}
	}
	info := pluginInfo{typ: pi.GetType(), name: pi.GetName(), endpoint: pi.GetEndpoint(), versions: pi.GetSupportedVersions()}
	if info.typ != registerapi.CSIPlugin {
		return result{state: StateIgnored, info: info, err: fmt.Errorf("plugin type %q is not %q", info.typ, registerapi.CSIPlugin)}
	}
	if info.name == "" {
		return result{state: StateFailed, info: info, err: errors.New("GetInfo returned no driver name")}
	}
	if err := ValidateVersions(info.versions); err != nil {
		return result{state: StateFailed, info: info, err: err}
	}
	if info.endpoint == "" {
		// Some drivers serve registration and CSI on one socket.
		info.endpoint = path
	}
	rctx, cancel := context.WithTimeout(ctx, w.opts.RegisterTimeout)
	_, err = w.opts.Registry.Register(rctx, registry.Registration{
		Endpoint: info.endpoint, Name: info.name, Source: registry.SourceRegistration,
		RegistrationSocket: path, SupportedVersions: info.versions,
	})
	cancel()
	if err != nil {
		return result{state: StateFailed, info: info, err: fmt.Errorf("registering driver at %s: %w", info.endpoint, err)}
	}
	nctx, cancel := context.WithTimeout(ctx, w.opts.NotifyTimeout)
	_, err = client.NotifyRegistrationStatus(nctx, &registerapi.RegistrationStatus{PluginRegistered: true})
	cancel()
	if err != nil {
		// The driver is registered all the same; the registrar only logs
		// what it is told.
		w.log.Warn("cannot tell the registrar its driver is registered", zap.String("socket", path),
			zap.String("driver", info.name), zap.Error(err))
	}
	return result{state: StateRegistered, info: info}
}

// dialUnix connects to a unix socket within timeout. A socket that refuses
// connections is tried again until the timeout: bind(2) creates the file (and
// the fsnotify event) before listen(2) lets it accept, so a socket that has
// just appeared refuses connections for a moment.
func dialUnix(ctx context.Context, path string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	wait := 5 * time.Millisecond
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return c, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// ValidateVersions checks that a registrar supports a CSI version this
// agent speaks: at least one 1.x version, parsed the way the kubelet parses
// them ("1.0.0", "v1.2.0", "1.5"). Unparsable versions are skipped.
func ValidateVersions(versions []string) error {
	if len(versions) == 0 {
		return errors.New("the registrar lists no supported CSI versions")
	}
	for _, v := range versions {
		pv, err := utilversion.ParseGeneric(v)
		if err == nil && pv.Major() == 1 {
			return nil
		}
	}
	return fmt.Errorf("none of the CSI versions the registrar supports %q is 1.x, the only one this agent speaks", versions)
}
