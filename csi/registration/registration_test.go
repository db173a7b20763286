package registration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/test/csidriver"
)

// A driver whose registration socket appears in the watched directory is
// registered through the fsnotify event (the rescan period is an hour, so
// nothing else could find it), told so, and deregistered when its socket
// goes away.
func TestRegistersDriverWhenSocketAppearsAndDeregistersWhenRemoved(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: time.Hour}, nil)
	if fi, err := os.Stat(e.dir); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("watched directory not created 0750: %v %v", fi.Mode(), err)
	}
	const name = "a.reg.test"
	start := time.Now()
	d := startDriver(t, name, filepath.Join(e.tmp, "a.sock"), filepath.Join(e.tmp, "state"), e.dir)
	took := eventually(t, 5*time.Second, "driver registered", func() bool { _, ok := e.registered(name); return ok })
	t.Logf("registered %v after the socket appeared", time.Since(start))
	if took > 2*time.Second {
		t.Errorf("registration took %v", took)
	}
	drv, _ := e.registered(name)
	if drv.Endpoint != d.SocketPath() || drv.Source != registry.SourceRegistration || drv.RegistrationSocket != d.RegistrationSocketPath() {
		t.Errorf("registered %+v", drv)
	}
	if len(drv.SupportedVersions) != 1 || drv.SupportedVersions[0] != "1.0.0" {
		t.Errorf("supported versions %v", drv.SupportedVersions)
	}
	eventually(t, 5*time.Second, "NotifyRegistrationStatus", func() bool { return len(d.RegistrationStatuses()) > 0 })
	st := e.waitState(d.RegistrationSocketPath(), StateRegistered)
	if st.Driver != name || st.Endpoint != d.SocketPath() || st.Type != registerapi.CSIPlugin {
		t.Errorf("socket status %+v", st)
	}

	d.Stop() // removes the registration socket, then the CSI socket
	eventually(t, 5*time.Second, "driver deregistered", func() bool { _, ok := e.registered(name); return !ok })
	eventually(t, 5*time.Second, "socket forgotten", func() bool { return len(e.w.Sockets()) == 0 })
	if n := e.deregistrations(); n != 1 {
		t.Errorf("%d deregistrations, want 1", n)
	}
	statuses := d.RegistrationStatuses()
	if len(statuses) != 1 || !statuses[0].Registered {
		t.Errorf("registration statuses %+v, want one true", statuses)
	}
}

// Sockets that exist before the watcher starts are found by its first
// scan, in the directory and one level below it; the driver's raw CSI
// socket sitting in the same directory is recognised as not being a
// registration socket and left alone.
func TestFindsExistingSockets(t *testing.T) {
	var top, sub *csidriver.Driver
	e := startWatcher(t, Options{RescanPeriod: time.Hour}, func(e *env) {
		// The CSI socket of "top" lives in the watched directory itself,
		// as it does when a driver is deployed carelessly.
		top = startDriver(t, "top.reg.test", filepath.Join(e.dir, "top-csi.sock"), filepath.Join(e.tmp, "s1"), e.dir)
		sub = startDriver(t, "sub.reg.test", filepath.Join(e.tmp, "sub.sock"), filepath.Join(e.tmp, "s2"), filepath.Join(e.dir, "sub"))
	})
	for _, d := range []*csidriver.Driver{top, sub} {
		eventually(t, 5*time.Second, d.Name()+" registered", func() bool { _, ok := e.registered(d.Name()); return ok })
		e.waitState(d.RegistrationSocketPath(), StateRegistered)
		eventually(t, 5*time.Second, "notified", func() bool { return len(d.RegistrationStatuses()) == 1 })
	}
	raw := e.waitState(filepath.Join(e.dir, "top-csi.sock"), StateNotRegistration)
	if !strings.Contains(raw.LastError, "not the plugin registration API") {
		t.Errorf("raw socket status %+v", raw)
	}
	if n := len(e.w.Sockets()); n != 3 {
		t.Errorf("%d sockets, want 3: %+v", n, e.w.Sockets())
	}
}

// Sockets more than one level down and names starting with "." are not
// candidates; a subdirectory made after the start is watched.
func TestDirectoryLayout(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: time.Hour}, nil)
	deep := filepath.Join(e.dir, "a", "b")
	hidden := filepath.Join(e.dir, ".hidden")
	for _, d := range []string{deep, hidden} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	deepReg := newFakeRegistrar(&registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: "deep", SupportedVersions: []string{"1.0.0"}})
	deepReg.serve(t, filepath.Join(deep, "r.sock"), "", false)
	hiddenReg := newFakeRegistrar(&registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: "hidden", SupportedVersions: []string{"1.0.0"}})
	hiddenReg.serve(t, filepath.Join(hidden, "r.sock"), "", false)
	dotReg := newFakeRegistrar(&registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: "dot", SupportedVersions: []string{"1.0.0"}})
	dotReg.serve(t, filepath.Join(e.dir, ".dot.sock"), "", false)

	// A socket in a subdirectory made after the start: found through the
	// watch added for the new directory.
	d := startDriver(t, "late.reg.test", filepath.Join(e.tmp, "late.sock"), filepath.Join(e.tmp, "s"), filepath.Join(e.dir, "late"))
	eventually(t, 5*time.Second, "driver in a new subdirectory registered", func() bool { _, ok := e.registered(d.Name()); return ok })

	for _, f := range []*fakeRegistrar{deepReg, hiddenReg, dotReg} {
		if n := f.accepts.Load(); n != 0 {
			t.Errorf("a socket that is not a candidate was dialled %d times", n)
		}
	}
	if n := len(e.w.Sockets()); n != 1 {
		t.Errorf("sockets %+v, want only the late driver's", e.w.Sockets())
	}
}

// A registrar that supports only CSI 0.x is not registered, is never told
// "not registered" (node-driver-registrar would exit), and is retried with
// backoff rather than on every rescan.
func TestRejectsUnsupportedVersionWithoutNegativeNotification(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: 10 * time.Millisecond, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}, nil)
	d := startDriver(t, "old.reg.test", filepath.Join(e.tmp, "old.sock"), filepath.Join(e.tmp, "s"), "")
	f := newFakeRegistrar(&registerapi.PluginInfo{
		Type: registerapi.CSIPlugin, Name: d.Name(), Endpoint: d.SocketPath(), SupportedVersions: []string{"0.3.0"},
	})
	path := filepath.Join(e.dir, "old-reg.sock")
	f.serve(t, path, "", false)
	st := e.waitState(path, StateFailed)
	if !strings.Contains(st.LastError, "0.3.0") || st.Driver != d.Name() {
		t.Errorf("socket status %+v", st)
	}
	// Let about 50 rescans (500 ms) pass: a retry on every rescan would
	// call GetInfo ~50 times; backoff 50, 100, 200, 200 ms allows ~5.
	e.waitRescans(50)
	calls := f.getInfo.Load()
	if calls < 2 || calls > 12 {
		t.Errorf("GetInfo called %d times over 50 rescans; want a few retries with backoff", calls)
	}
	st, _ = e.socket(path)
	if st.State != StateFailed || st.Failures < 2 || st.NextRetry.IsZero() {
		t.Errorf("socket status %+v", st)
	}
	if _, ok := e.registered(d.Name()); ok {
		t.Error("driver with only CSI 0.3.0 was registered")
	}
	if n := len(f.notified()); n != 0 {
		t.Errorf("registrar was sent %d registration statuses (%v), want none", n, f.notified())
	}
	if c := d.CallCounts(); len(c) != 0 {
		t.Errorf("the driver's CSI socket was called: %v", c)
	}
}

// A raw CSI socket (gRPC without the registration service) and a socket
// that does not speak gRPC at all are looked at once, not on every rescan;
// when the file changes they are looked at again.
func TestNonRegistrationSocketsAreNotRetried(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: 10 * time.Millisecond, MinBackoff: 10 * time.Millisecond}, nil)
	rawPath := filepath.Join(e.dir, "csi.sock")
	raw := serveRawCSI(t, rawPath)
	garbagePath := filepath.Join(e.dir, "http.sock")
	garbage := serveGarbage(t, garbagePath)

	st := e.waitState(rawPath, StateNotRegistration)
	if !strings.Contains(st.LastError, "registration API") {
		t.Errorf("raw socket status %+v", st)
	}
	st = e.waitState(garbagePath, StateNotRegistration)
	if !strings.Contains(st.LastError, "does not speak gRPC") {
		t.Errorf("non-gRPC socket status %+v", st)
	}
	e.waitRescans(30)
	if a, c := raw.accepts.Load(), raw.calls.Load(); a != 1 || c != 1 {
		t.Errorf("raw CSI socket: %d connections, %d calls over 30 rescans; want 1 and 1", a, c)
	}
	if n := garbage.Load(); n != 1 {
		t.Errorf("non-gRPC socket: %d connections over 30 rescans, want 1", n)
	}

	// Touching the file (new mtime) makes it worth another look.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(rawPath, later, later); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "raw socket looked at again", func() bool { return raw.calls.Load() == 2 })
	e.waitRescans(10)
	if c := raw.calls.Load(); c != 2 {
		t.Errorf("raw socket called %d times after one change, want 2", c)
	}
	if len(e.reg.List()) != 0 {
		t.Errorf("registered %+v", e.reg.List())
	}
}

// A socket of another plugin type (device plugin, DRA) is ignored with a
// log, not retried, never notified.
func TestOtherPluginTypesAreIgnored(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: 10 * time.Millisecond}, nil)
	f := newFakeRegistrar(&registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: "gpu.example.com", SupportedVersions: []string{"v1beta1.DRAPlugin"}})
	path := filepath.Join(e.dir, "dra.sock")
	f.serve(t, path, "", false)
	st := e.waitState(path, StateIgnored)
	if st.Type != registerapi.DRAPlugin || st.Driver != "gpu.example.com" {
		t.Errorf("status %+v", st)
	}
	e.waitRescans(20)
	if n := f.getInfo.Load(); n != 1 {
		t.Errorf("GetInfo called %d times, want 1", n)
	}
	if n := len(f.notified()); n != 0 {
		t.Errorf("notified %v", f.notified())
	}
}

// A driver whose Probe fails is not registered; the socket is retried with
// backoff and the driver is registered (and told so, once) when it answers.
func TestDriverNotReadyIsRetriedUntilRegistered(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: time.Hour}, nil)
	d := startDriver(t, "slow.reg.test", filepath.Join(e.tmp, "slow.sock"), filepath.Join(e.tmp, "s"), e.dir,
		csidriver.Fault{Method: "Probe", Code: codes.Unavailable})
	eventually(t, 10*time.Second, "Probe retried", func() bool { return d.CallCount("Probe") >= 2 })
	st, _ := e.socket(d.RegistrationSocketPath())
	if st.State != StateFailed || !strings.Contains(st.LastError, "Probe") || st.Driver != d.Name() {
		t.Errorf("socket status %+v", st)
	}
	if _, ok := e.registered(d.Name()); ok {
		t.Fatal("driver registered although its Probe fails")
	}
	if s := d.RegistrationStatuses(); len(s) != 0 {
		t.Fatalf("registration statuses %+v, want none while it fails", s)
	}
	if err := d.ClearFault("Probe"); err != nil {
		t.Fatal(err)
	}
	took := eventually(t, 10*time.Second, "driver registered after Probe recovered", func() bool { _, ok := e.registered(d.Name()); return ok })
	t.Logf("registered %v after Probe recovered (%d Probe calls)", took, d.CallCount("Probe"))
	eventually(t, 5*time.Second, "notified", func() bool { return len(d.RegistrationStatuses()) == 1 })
	if s := d.RegistrationStatuses(); !s[0].Registered {
		t.Errorf("registration statuses %+v", s)
	}
	e.waitState(d.RegistrationSocketPath(), StateRegistered)
}

// A registrar whose GetInfo has no endpoint serves CSI on the registration
// socket itself; that socket becomes the driver's endpoint.
func TestEmptyEndpointMeansTheRegistrationSocket(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: time.Hour}, nil)
	f := newFakeRegistrar(&registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: "both.reg.test", SupportedVersions: []string{"1.2.0", "0.3.0"}})
	path := filepath.Join(e.dir, "both.sock")
	f.serve(t, path, "both.reg.test", false)
	eventually(t, 5*time.Second, "registered", func() bool { _, ok := e.registered("both.reg.test"); return ok })
	drv, _ := e.registered("both.reg.test")
	if drv.Endpoint != path {
		t.Errorf("endpoint %q, want %q", drv.Endpoint, path)
	}
	eventually(t, 5*time.Second, "notified", func() bool { return len(f.notified()) == 1 })
	if s := f.notified(); !s[0] {
		t.Errorf("notified %v", s)
	}
}

// A socket replaced by a new file at the same path (a restarted registrar
// renaming its socket into place) registers again, pointing the driver at
// the new endpoint without deregistering it in between.
func TestReplacedSocketRegistersAgain(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: time.Hour}, nil)
	const name = "moving.reg.test"
	d1 := startDriver(t, name, filepath.Join(e.tmp, "d1.sock"), filepath.Join(e.tmp, "s1"), "")
	d2 := startDriver(t, name, filepath.Join(e.tmp, "d2.sock"), filepath.Join(e.tmp, "s2"), "")
	path := filepath.Join(e.dir, "moving-reg.sock")
	f1 := newFakeRegistrar(&registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: name, Endpoint: d1.SocketPath(), SupportedVersions: []string{"1.0.0"}})
	f1.serve(t, path, "", false)
	eventually(t, 5*time.Second, "registered at d1", func() bool { drv, ok := e.registered(name); return ok && drv.Endpoint == d1.SocketPath() })
	e.waitState(path, StateRegistered)

	f2 := newFakeRegistrar(&registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: name, Endpoint: d2.SocketPath(), SupportedVersions: []string{"1.0.0"}})
	f2.serve(t, path, "", true)
	f1.srv.Stop()
	eventually(t, 5*time.Second, "registered at d2", func() bool { drv, ok := e.registered(name); return ok && drv.Endpoint == d2.SocketPath() })
	eventually(t, 5*time.Second, "new registrar notified", func() bool { return len(f2.notified()) == 1 })
	if n := e.deregistrations(); n != 0 {
		t.Errorf("driver was deregistered %d times while its socket was replaced", n)
	}
	if _, ok := e.socket(filepath.Join(e.dir, ".tmp-moving-reg.sock")); ok {
		t.Error("a socket whose name starts with '.' was looked at")
	}
	if n := len(e.w.Sockets()); n != 1 {
		t.Errorf("sockets %+v", e.w.Sockets())
	}
}

// The registry drops a driver that stops answering probes and relies on its
// source to bring it back: the next rescan registers it again while its
// socket is still there.
func TestDriverDroppedByRegistryIsRegisteredAgain(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: 20 * time.Millisecond}, nil)
	d := startDriver(t, "dropped.reg.test", filepath.Join(e.tmp, "dropped.sock"), filepath.Join(e.tmp, "s"), e.dir)
	eventually(t, 5*time.Second, "registered", func() bool { _, ok := e.registered(d.Name()); return ok })
	e.reg.Deregister(d.Name(), d.SocketPath(), "stopped answering probes (test)")
	eventually(t, 5*time.Second, "registered again", func() bool { _, ok := e.registered(d.Name()); return ok })
	eventually(t, 5*time.Second, "notified twice", func() bool { return len(d.RegistrationStatuses()) == 2 })
	e.waitRescans(10)
	if n := len(d.RegistrationStatuses()); n != 2 {
		t.Errorf("%d registration statuses, want 2", n)
	}
}

// A registrar whose GetInfo fails is retried with growing waits, logged
// each time, and registered once GetInfo works.
func TestGetInfoFailureBacksOff(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: 10 * time.Millisecond, MinBackoff: 20 * time.Millisecond, MaxBackoff: 80 * time.Millisecond}, nil)
	f := newFakeRegistrar(&registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: "flaky.reg.test", SupportedVersions: []string{"1.0.0"}})
	f.infoErr = status.Error(codes.Internal, "registrar is confused")
	path := filepath.Join(e.dir, "flaky.sock")
	f.serve(t, path, "flaky.reg.test", false)
	eventually(t, 5*time.Second, "several failures", func() bool { st, _ := e.socket(path); return st.Failures >= 4 })
	st, _ := e.socket(path)
	if st.State != StateFailed || !strings.Contains(st.LastError, "registrar is confused") {
		t.Errorf("status %+v", st)
	}
	if wait := time.Until(st.NextRetry); wait > 80*time.Millisecond {
		t.Errorf("next retry in %v, more than the maximum backoff", wait)
	}
	f.mu.Lock()
	f.infoErr = nil
	f.mu.Unlock()
	eventually(t, 5*time.Second, "registered", func() bool { _, ok := e.registered("flaky.reg.test"); return ok })
	eventually(t, 5*time.Second, "notified", func() bool { return len(f.notified()) > 0 })
	if s := f.notified(); len(s) != 1 || !s[0] {
		t.Errorf("notified %v", s)
	}
}

// A registry directory that is removed (a host directory re-created, say)
// is made and watched again at the next rescan, and sockets in the new one
// are found.
func TestDirectoryRemovedAndMadeAgain(t *testing.T) {
	e := startWatcher(t, Options{RescanPeriod: 20 * time.Millisecond}, nil)
	d1 := startDriver(t, "first.reg.test", filepath.Join(e.tmp, "first.sock"), filepath.Join(e.tmp, "s1"), e.dir)
	eventually(t, 5*time.Second, "registered", func() bool { _, ok := e.registered(d1.Name()); return ok })
	if err := os.RemoveAll(e.dir); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "deregistered", func() bool { _, ok := e.registered(d1.Name()); return !ok })
	eventually(t, 5*time.Second, "directory made again", func() bool { _, err := os.Stat(e.dir); return err == nil })
	e.waitRescans(2)
	d2 := startDriver(t, "second.reg.test", filepath.Join(e.tmp, "second.sock"), filepath.Join(e.tmp, "s2"), e.dir)
	eventually(t, 5*time.Second, "registered from the new directory", func() bool { _, ok := e.registered(d2.Name()); return ok })
}

func TestValidateVersions(t *testing.T) {
	for _, tc := range []struct {
		versions []string
		ok       bool
	}{
		{[]string{"1.0.0"}, true},
		{[]string{"0.3.0", "1.2.0"}, true},
		{[]string{"v1.5.0"}, true},
		{[]string{"1.10"}, true},
		{[]string{"0.3.0"}, false},
		{[]string{"0.2.0", "0.3.0"}, false},
		{[]string{"2.0.0"}, false},
		{[]string{"garbage", "1"}, false},
		{nil, false},
	} {
		if err := ValidateVersions(tc.versions); (err == nil) != tc.ok {
			t.Errorf("ValidateVersions(%q) = %v, want ok=%v", tc.versions, err, tc.ok)
		}
	}
}
