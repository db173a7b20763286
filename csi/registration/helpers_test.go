package registration

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/test/csidriver"
)

// testDir returns a fresh directory for sockets. Unix socket paths are
// limited to 108 bytes; t.TempDir's paths grow with the test name, so a
// short one is made instead when needed.
func testDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if len(dir) > 60 {
		var err error
		if dir, err = os.MkdirTemp("", "reg"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	return dir
}

func testLogger(t *testing.T) *zap.Logger {
	level := zap.WarnLevel
	if testing.Verbose() {
		level = zap.DebugLevel
	}
	return zaptest.NewLogger(t, zaptest.Level(level))
}

// env is a running watcher with its registry. regLogs records what the
// registry logs (to see deregistrations).
type env struct {
	t       *testing.T
	dir     string // the watched directory
	tmp     string // room for sockets outside it
	reg     *registry.Registry
	regLogs *observer.ObservedLogs
	w       *Watcher
}

// startWatcher runs a watcher on <tmp>/registry until the test ends. Before
// returning it waits until the directory is watched and was scanned once,
// so whatever the test creates afterwards arrives as an fsnotify event.
func startWatcher(t *testing.T, opts Options, before func(e *env)) *env {
	t.Helper()
	tmp := testDir(t)
	e := &env{t: t, tmp: tmp, dir: filepath.Join(tmp, "registry")}
	core, logs := observer.New(zapcore.DebugLevel)
	e.regLogs = logs
	e.reg = registry.New(zap.New(zapcore.NewTee(core, testLogger(t).Core())))
	if before != nil {
		before(e)
	}
	opts.Dir, opts.Registry, opts.Log = e.dir, e.reg, testLogger(t).Named("watcher")
	e.w = New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-e.w.ready:
	case err := <-done:
		t.Fatalf("Run returned early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("watcher did not start")
	}
	return e
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
	return time.Since(start)
}

// waitRescans waits until the watcher completed n more rescans.
func (e *env) waitRescans(n int64) {
	e.t.Helper()
	target := e.w.rescans.Load() + n
	eventually(e.t, 30*time.Second, "rescans", func() bool { return e.w.rescans.Load() >= target })
}

func (e *env) socket(path string) (SocketStatus, bool) {
	for _, s := range e.w.Sockets() {
		if s.Path == path {
			return s, true
		}
	}
	return SocketStatus{}, false
}

func (e *env) waitState(path string, want State) SocketStatus {
	e.t.Helper()
	var st SocketStatus
	eventually(e.t, 10*time.Second, "socket "+path+" in state "+string(want), func() bool {
		var ok bool
		st, ok = e.socket(path)
		return ok && st.State == want
	})
	return st
}

func (e *env) registered(name string) (*registry.Driver, bool) { return e.reg.Get(name) }

func (e *env) deregistrations() int {
	return e.regLogs.FilterMessage("CSI driver deregistered").Len()
}

// startDriver starts the test CSI driver in-process with its CSI socket at
// csiSocket and, if regDir is set, its registration socket in regDir. Its
// node service is only asked for NodeGetInfo and capabilities, which needs
// no root.
func startDriver(t *testing.T, name, csiSocket, stateDir, regDir string, faults ...csidriver.Fault) *csidriver.Driver {
	t.Helper()
	d, err := csidriver.New(csidriver.Config{
		Name: name, NodeID: "node-1", Endpoint: csiSocket, StateDir: stateDir, RegistrationDir: regDir,
		Faults: faults, Logger: testLogger(t).Named("driver"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d
}

// fakeRegistrar serves the registration API with whatever PluginInfo a test
// gives it, and records what it is told. With csiName set it also serves a
// minimal CSI identity and node service on the same socket.
type fakeRegistrar struct {
	mu       sync.Mutex
	info     *registerapi.PluginInfo
	infoErr  error
	statuses []bool

	getInfo atomic.Int64
	accepts atomic.Int64
	srv     *grpc.Server
}

func newFakeRegistrar(info *registerapi.PluginInfo) *fakeRegistrar {
	return &fakeRegistrar{info: info}
}

// serve listens at path (creating it under a temporary name first when
// viaRename is set, then renaming it into place, as a registrar replacing
// its socket atomically would).
func (f *fakeRegistrar) serve(t *testing.T, path string, csiName string, viaRename bool) {
	t.Helper()
	listenAt := path
	if viaRename {
		listenAt = filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	}
	lis, err := net.Listen("unix", listenAt)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	f.srv = grpc.NewServer()
	registerapi.RegisterRegistrationServer(f.srv, &fakeRegistrationServer{f: f})
	if csiName != "" {
		csi.RegisterIdentityServer(f.srv, &fakeIdentity{name: csiName})
		csi.RegisterNodeServer(f.srv, &fakeNode{})
	}
	go func() { _ = f.srv.Serve(&countingListener{Listener: lis, n: &f.accepts}) }()
	t.Cleanup(f.srv.Stop)
	if viaRename {
		if err := os.Rename(listenAt, path); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *fakeRegistrar) notified() []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]bool(nil), f.statuses...)
}

type fakeRegistrationServer struct {
	registerapi.UnimplementedRegistrationServer
	f *fakeRegistrar
}

func (s *fakeRegistrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	s.f.getInfo.Add(1)
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if s.f.infoErr != nil {
		return nil, s.f.infoErr
	}
	return s.f.info, nil
}

func (s *fakeRegistrationServer) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.statuses = append(s.f.statuses, st.GetPluginRegistered())
	return &registerapi.RegistrationStatusResponse{}, nil
}

type fakeIdentity struct {
	csi.UnimplementedIdentityServer
	name string
}

func (s *fakeIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: s.name, VendorVersion: "0.0.1"}, nil
}

func (s *fakeIdentity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (s *fakeIdentity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

type fakeNode struct{ csi.UnimplementedNodeServer }

func (s *fakeNode) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: "node-1"}, nil
}

func (s *fakeNode) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// rawCSISocket serves a gRPC server with no registration service at path, as
// a CSI driver's own socket would, counting connections and calls of any
// method (GetInfo included: gRPC hands calls of unknown services to the
// unknown-service handler).
type rawCSISocket struct {
	accepts, calls atomic.Int64
}

func serveRawCSI(t *testing.T, path string) *rawCSISocket {
	t.Helper()
	r := &rawCSISocket{}
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		r.calls.Add(1)
		return status.Error(codes.Unimplemented, "unknown service")
	}))
	go func() { _ = srv.Serve(&countingListener{Listener: lis, n: &r.accepts}) }()
	t.Cleanup(srv.Stop)
	return r
}

// serveGarbage serves a unix socket that answers every connection with an
// HTTP/1 error and closes it: something that does not speak gRPC.
func serveGarbage(t *testing.T, path string) *atomic.Int64 {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	t.Cleanup(func() { lis.Close() })
	return &n
}
