// Package server serves the runtime API (package runtimeapi) on a unix
// socket: root only (the socket is 0600 and every connection's peer
// credentials must say uid 0), answering from immutable snapshots of the
// desired and actual states (never holding a lock of the reconciler's), and
// waking long-polling waiters after every reconciler pass: every change of
// either state is followed by one.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/reconciler"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/volume"
)

// Defaults.
const (
	// DefaultWait is how long a wait without a timeout lasts: the
	// kubelet's WaitForAttachAndMount limit.
	DefaultWait = 2*time.Minute + 3*time.Second
	// MaxWait bounds the timeout a client may ask for.
	MaxWait = 10 * time.Minute
	// DefaultMaxConnections bounds the connections served at once; more
	// wait in the socket's backlog.
	DefaultMaxConnections = 256
)

// Options configure a Server.
type Options struct {
	// Socket is the socket's path (runtimeapi.Socket(root)).
	Socket string
	Paths  volume.Paths
	// Errors gives operations' last errors (the executor).
	Errors Errors
	// Snapshots returns the current snapshots of the desired and actual
	// states (cheap: both caches keep one per generation). Without it the
	// server answers from the snapshots of the last pass.
	Snapshots      func() (*cache.DesiredSnapshot, *cache.ActualSnapshot)
	MaxConnections int
	Log            *zap.Logger
}

// Server is the runtime API. It is a reconciler.Observer: every pass hands
// it the snapshots it planned from.
type Server struct {
	opts Options

	mu      sync.Mutex
	dsw     *cache.DesiredSnapshot
	asw     *cache.ActualSnapshot
	changed chan struct{} // closed when the snapshots are replaced

	// stopped ends every request when the server shuts down.
	stopped context.Context
	stop    context.CancelFunc

	listener *net.UnixListener
	inode    uint64 // of the socket, so Shutdown removes only its own
	http     *http.Server

	waiters atomic.Int64
}

// Waiters is the number of waits in progress.
func (s *Server) Waiters() int { return int(s.waiters.Load()) }

var _ reconciler.Observer = (*Server)(nil)

// New returns a Server; Listen opens its socket, Serve serves it.
func New(opts Options) *Server {
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = DefaultMaxConnections
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	s := &Server{opts: opts, changed: make(chan struct{})}
	s.stopped, s.stop = context.WithCancel(context.Background())
	s.http = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		// Long enough for the longest wait.
		WriteTimeout:   MaxWait + 30*time.Second,
		IdleTimeout:    time.Minute,
		MaxHeaderBytes: 8 << 10,
		BaseContext:    func(net.Listener) context.Context { return s.stopped },
		ConnContext:    withPeer,
		ErrorLog:       zap.NewStdLog(opts.Log),
	}
	return s
}

// Reconciled records a pass's snapshots and wakes every waiter. It takes
// one short lock and never blocks.
func (s *Server) Reconciled(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, _ []reconciler.Action, _ time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dsw, s.asw = dsw, asw
	close(s.changed)
	s.changed = make(chan struct{})
}

// current returns the snapshots to answer from and a channel closed at the
// next pass.
func (s *Server) current() (*cache.DesiredSnapshot, *cache.ActualSnapshot, <-chan struct{}) {
	s.mu.Lock()
	dsw, asw, changed := s.dsw, s.asw, s.changed
	s.mu.Unlock()
	if s.opts.Snapshots != nil {
		// Taken after the channel: a change after this point is
		// followed by a pass that closes it.
		dsw, asw = s.opts.Snapshots()
	}
	return dsw, asw, changed
}

// Listen creates the socket, readable and writable by root only. It is
// bound in a new 0700 directory and only then renamed into place, so no one
// else can connect even for an instant. A socket left by an agent that
// crashed is replaced; one another process still serves is an error.
func (s *Server) Listen() error {
	path := s.opts.Socket
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("%s exists and is not a socket", path)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := runtimeapi.Dial(ctx, path)
		cancel()
		if err == nil {
			c.Close()
			return fmt.Errorf("another process (a second agent on the same root directory?) serves %s", path)
		}
		if err := os.Remove(path); err != nil {
			return err
		}
	}
	tmpDir, err := os.MkdirTemp(dir, "."+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, filepath.Base(path))
	l, err := runtimeapi.ListenShort(tmp)
	if err != nil {
		return fmt.Errorf("runtime API socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	var st unix.Stat_t
	err = os.Chmod(tmp, 0o600)
	if err == nil {
		err = unix.Lstat(tmp, &st)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		l.Close()
		return fmt.Errorf("runtime API socket: %w", err)
	}
	s.listener, s.inode = l, st.Ino
	return nil
}

// Serve serves the socket Listen opened until Shutdown.
func (s *Server) Serve() error {
	l := &peerListener{UnixListener: s.listener, slots: make(chan struct{}, s.opts.MaxConnections)}
	if err := s.http.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown ends every wait (ShuttingDown), stops serving and removes the
// socket.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	err := s.http.Shutdown(ctx)
	if s.listener != nil {
		s.listener.Close()
		var st unix.Stat_t
		if unix.Lstat(s.opts.Socket, &st) == nil && st.Ino == s.inode {
			_ = os.Remove(s.opts.Socket)
		}
	}
	return err
}

// Handler is the API: peer check first, then the routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/pods", s.list)
	mux.HandleFunc("GET /v1/pods/{uid}", s.pod)
	mux.HandleFunc("GET /v1/pods/{uid}/wait", s.wait)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			writeError(w, http.StatusMethodNotAllowed, runtimeapi.CodeBadRequest, "the runtime API is read-only: use GET")
			return
		}
		writeError(w, http.StatusNotFound, runtimeapi.CodeNotFound, "no such path: "+r.URL.Path+" (the API is under /"+runtimeapi.Version+"/)")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := authorize(r.Context()); err != nil {
			s.opts.Log.Warn("runtime API: refused a client", zap.Error(err))
			writeError(w, http.StatusForbidden, runtimeapi.CodeForbidden, err.Error())
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (s *Server) list(w http.ResponseWriter, _ *http.Request) {
	dsw, asw, _ := s.current()
	if dsw == nil {
		writeJSON(w, http.StatusOK, &runtimeapi.PodList{APIVersion: runtimeapi.Version, Pods: []runtimeapi.PodSummary{}})
		return
	}
	writeJSON(w, http.StatusOK, List(dsw, asw))
}

func (s *Server) pod(w http.ResponseWriter, r *http.Request) {
	uid := types.UID(r.PathValue("uid"))
	dsw, asw, _ := s.current()
	p, ok := lookup(dsw, uid)
	if !ok {
		writeNotFound(w, uid)
		return
	}
	writeJSON(w, http.StatusOK, View(p, dsw, asw, s.opts.Errors, s.opts.Paths))
}

// wait answers when the pod's volumes are ready, or when the timeout
// passes with the pod as it is then (ready false, Message saying why), or
// PodNotFound if the pod never appeared on this node. It wakes on every
// reconciler pass, not on a timer.
func (s *Server) wait(w http.ResponseWriter, r *http.Request) {
	uid := types.UID(r.PathValue("uid"))
	timeout, err := parseTimeout(r.URL.Query().Get("timeout"))
	if err != nil {
		writeError(w, http.StatusBadRequest, runtimeapi.CodeBadRequest, err.Error())
		return
	}
	s.waiters.Add(1)
	defer s.waiters.Add(-1)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var last *runtimeapi.Pod
	for {
		dsw, asw, changed := s.current()
		if p, ok := lookup(dsw, uid); ok {
			last = View(p, dsw, asw, s.opts.Errors, s.opts.Paths)
			if last.Ready {
				writeJSON(w, http.StatusOK, last)
				return
			}
		} else {
			last = nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			if last == nil {
				writeNotFound(w, uid)
				return
			}
			last.Message = fmt.Sprintf("timed out after %v: %s", timeout, last.Message)
			writeJSON(w, http.StatusOK, last)
			return
		case <-r.Context().Done():
			if s.stopped.Err() != nil {
				writeError(w, http.StatusServiceUnavailable, runtimeapi.CodeShuttingDown, "volume-agent is stopping")
			}
			return
		}
	}
}

// parseTimeout reads a Go duration ("90s") or a number of seconds.
func parseTimeout(v string) (time.Duration, error) {
	if v == "" {
		return DefaultWait, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		secs, serr := strconv.ParseFloat(v, 64)
		if serr != nil {
			return 0, fmt.Errorf("timeout %q is neither a duration (90s) nor a number of seconds", v)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d < 0 || d > MaxWait {
		return 0, fmt.Errorf("timeout %v is outside [0, %v]", d, MaxWait)
	}
	return d, nil
}

func writeNotFound(w http.ResponseWriter, uid types.UID) {
	writeError(w, http.StatusNotFound, runtimeapi.CodePodNotFound, fmt.Sprintf("no pod with UID %q on this node", uid))
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, &runtimeapi.ErrorDocument{Error: runtimeapi.ErrorBody{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// peer is what the kernel says about the process at the other end of a
// connection (SO_PEERCRED), read when it connected.
type peer struct {
	cred *unix.Ucred
	err  error
}

type peerKey struct{}

// peerListener reads each connection's peer credentials and bounds the
// connections open at once.
type peerListener struct {
	*net.UnixListener
	slots chan struct{}
}

type peerConn struct {
	net.Conn
	peer    peer
	release sync.Once
	slots   chan struct{}
}

func (c *peerConn) Close() error {
	c.release.Do(func() { <-c.slots })
	return c.Conn.Close()
}

func (l *peerListener) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.UnixListener.AcceptUnix()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &peerConn{Conn: c, peer: peerOf(c), slots: l.slots}, nil
}

func peerOf(c *net.UnixConn) peer {
	raw, err := c.SyscallConn()
	if err != nil {
		return peer{err: err}
	}
	var p peer
	if err := raw.Control(func(fd uintptr) {
		p.cred, p.err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peer{err: err}
	}
	return p
}

func withPeer(ctx context.Context, c net.Conn) context.Context {
	p := peer{err: errors.New("not a unix socket connection")}
	if pc, ok := c.(*peerConn); ok {
		p = pc.peer
	}
	return context.WithValue(ctx, peerKey{}, p)
}

// authorize lets root (uid 0) in and no one else.
func authorize(ctx context.Context) error {
	p, ok := ctx.Value(peerKey{}).(peer)
	switch {
	case !ok:
		return errors.New("the peer of the connection is unknown")
	case p.err != nil:
		return fmt.Errorf("reading the peer's credentials: %w", p.err)
	case p.cred.Uid != 0:
		return fmt.Errorf("the runtime API answers root (uid 0) only; this client runs as uid %d (pid %d)", p.cred.Uid, p.cred.Pid)
	}
	return nil
}
