package registry_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/test/csidriver"
)

// The registry against the repo's test CSI driver, run in-process (its
// identity and node-info calls need no root), and against a minimal fake
// server for answers the test driver never gives.

// socketDir returns a directory for sockets: unix socket paths are limited
// to 108 bytes, and t.TempDir's grow with the test's name.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "registry")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func testLogger(t *testing.T) *zap.Logger {
	if testing.Verbose() {
		return zaptest.NewLogger(t)
	}
	return zap.NewNop()
}

// startDriver runs the test driver with its socket in dir; cfg.Name,
// cfg.Endpoint and cfg.StateDir are filled in when empty.
func startDriver(t *testing.T, dir string, cfg csidriver.Config) (*csidriver.Driver, string) {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "test.csi.example.com"
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = filepath.Join(dir, "csi.sock")
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(dir, "state")
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "node-1"
	}
	cfg.Logger = testLogger(t).Named("driver")
	d, err := csidriver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d, "unix://" + cfg.Endpoint
}

func register(t *testing.T, r *registry.Registry, reg registry.Registration) (*registry.Driver, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	return r.Register(ctx, reg)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// What the driver says about itself is what the registry records.
func TestRegisterRecordsWhatTheDriverSays(t *testing.T) {
	cases := []struct {
		name  string
		cfg   csidriver.Config
		check func(t *testing.T, d *registry.Driver)
	}{
		{"staging driver", csidriver.Config{}, func(t *testing.T, d *registry.Driver) {
			if !d.StageUnstage || !d.Expand || !d.VolumeStats || d.ControllerPublish || d.VolumeMountGroup || d.VolumeCondition {
				t.Errorf("capabilities stage %v expand %v stats %v publish %v mountGroup %v: want stage, expand and stats only",
					d.StageUnstage, d.Expand, d.VolumeStats, d.ControllerPublish, d.VolumeMountGroup)
			}
			for _, c := range []string{"STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME", "GET_VOLUME_STATS", "SINGLE_NODE_MULTI_WRITER"} {
				if !slices.Contains(d.NodeCapabilities, c) {
					t.Errorf("node capabilities %v lack %s", d.NodeCapabilities, c)
				}
			}
		}},
		{"publish-only driver", csidriver.Config{DisableStaging: true}, func(t *testing.T, d *registry.Driver) {
			if d.StageUnstage || slices.Contains(d.NodeCapabilities, "STAGE_UNSTAGE_VOLUME") {
				t.Errorf("a driver without STAGE_UNSTAGE_VOLUME recorded as staging (%v)", d.NodeCapabilities)
			}
		}},
		{"driver needing attachment", csidriver.Config{AttachRequired: true}, func(t *testing.T, d *registry.Driver) {
			if !d.ControllerPublish {
				t.Error("a driver with PUBLISH_UNPUBLISH_VOLUME not recorded as publishing")
			}
		}},
		{"volume condition (CSI 1.12)", csidriver.Config{VolumeCondition: true}, func(t *testing.T, d *registry.Driver) {
			if !d.VolumeCondition || !slices.Contains(d.NodeCapabilities, "VOLUME_CONDITION") || slices.Contains(d.NodeCapabilities, "4") {
				t.Errorf("volume condition %v, capabilities %v: want VOLUME_CONDITION by name", d.VolumeCondition, d.NodeCapabilities)
			}
		}},
		{"topology and volume limit", csidriver.Config{Name: "topo.csi.example.com", Topology: true, MaxVolumesPerNode: 7}, func(t *testing.T, d *registry.Driver) {
			key := csidriver.TopologyKey("topo.csi.example.com")
			if d.Topology[key] != "node-1" || len(d.Topology) != 1 || d.MaxVolumesPerNode != 7 {
				t.Errorf("topology %v, max volumes %d: want {%s: node-1}, 7", d.Topology, d.MaxVolumesPerNode, key)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := socketDir(t)
			_, endpoint := startDriver(t, dir, c.cfg)
			r := registry.New(testLogger(t))
			d, err := register(t, r, registry.Registration{
				Endpoint: endpoint, Source: registry.SourceRegistration, RegistrationSocket: "/plugins_registry/x-reg.sock",
				SupportedVersions: []string{"1.0.0"},
			})
			if err != nil {
				t.Fatalf("Register: %v", err)
			}
			name := c.cfg.Name
			if name == "" {
				name = "test.csi.example.com"
			}
			if d.Name != name || d.NodeID != "node-1" || d.Endpoint != endpoint || d.VendorVersion == "" ||
				d.Source != registry.SourceRegistration || d.RegistrationSocket != "/plugins_registry/x-reg.sock" ||
				!slices.Equal(d.SupportedVersions, []string{"1.0.0"}) || d.Client == nil || d.RegisteredAt.IsZero() {
				t.Errorf("driver %+v: want %s, node-1, its endpoint, a vendor version, how it registered and a client", d, name)
			}
			c.check(t, d)
			if got, ok := r.Get(name); !ok || got != d {
				t.Errorf("Get(%s) = %v, %v: want the registered driver", name, got, ok)
			}
			if got, ok := r.ByEndpoint(endpoint); !ok || got != d {
				t.Errorf("ByEndpoint = %v, %v: want the registered driver", got, ok)
			}
			if got, err := r.Client(name); err != nil || got != d {
				t.Errorf("Client(%s) = %v, %v: want the registered driver", name, got, err)
			}
		})
	}
}

// fakeCSI answers identity and node-info calls as told.
type fakeCSI struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	name   string
	nodeID string
	ready  bool
	caps   []csi.NodeServiceCapability_RPC_Type
}

func (f *fakeCSI) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: f.name, VendorVersion: "0.0.1"}, nil
}

func (f *fakeCSI) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (f *fakeCSI) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(f.ready)}, nil
}

func (f *fakeCSI) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: f.nodeID}, nil
}

func (f *fakeCSI) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, c := range f.caps {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}},
		})
	}
	return resp, nil
}

// Capabilities are recorded by name, whichever spec version defined them;
// VolumeCondition comes from VOLUME_CONDITION (4, what the kubelet reads),
// not from spec 1.13's alpha GET_VOLUME_HEALTH (7), which the agent does
// not call.
func TestCapabilityNamesAndVolumeCondition(t *testing.T) {
	cases := []struct {
		caps      []csi.NodeServiceCapability_RPC_Type
		names     []string
		condition bool
	}{
		{caps: []csi.NodeServiceCapability_RPC_Type{2, 4}, names: []string{"GET_VOLUME_STATS", "VOLUME_CONDITION"}, condition: true},
		{caps: []csi.NodeServiceCapability_RPC_Type{2, 7}, names: []string{"GET_VOLUME_STATS", "GET_VOLUME_HEALTH"}},
		{caps: []csi.NodeServiceCapability_RPC_Type{99, 1}, names: []string{"UNKNOWN(99)", "STAGE_UNSTAGE_VOLUME"}},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.names, ","), func(t *testing.T) {
			dir := socketDir(t)
			ep := serveFake(t, filepath.Join(dir, "f.sock"), &fakeCSI{name: "caps.csi.example.com", nodeID: "n", ready: true, caps: c.caps})
			d, err := register(t, registry.New(testLogger(t)), registry.Registration{Endpoint: ep})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(d.NodeCapabilities, c.names) || d.VolumeCondition != c.condition {
				t.Errorf("capabilities %v, volume condition %v; want %v, %v", d.NodeCapabilities, d.VolumeCondition, c.names, c.condition)
			}
		})
	}
}

func serveFake(t *testing.T, path string, f *fakeCSI) string {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, f)
	csi.RegisterNodeServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return "unix://" + path
}

// A driver that cannot be used is not registered, and a driver registered
// before under the same name stays.
func TestRegisterRefuses(t *testing.T) {
	cases := []struct {
		name    string
		setup   func(t *testing.T, dir string) registry.Registration
		wantErr string
	}{
		{"not a unix socket", func(*testing.T, string) registry.Registration {
			return registry.Registration{Endpoint: "tcp://127.0.0.1:1"}
		}, "is not a unix socket path"},
		{"nothing listening", func(_ *testing.T, dir string) registry.Registration {
			return registry.Registration{Endpoint: "unix://" + filepath.Join(dir, "none.sock")}
		}, "GetPluginInfo"},
		{"another name than announced", func(t *testing.T, dir string) registry.Registration {
			_, ep := startDriver(t, dir, csidriver.Config{Endpoint: filepath.Join(dir, "other.sock"), Name: "other.csi.example.com"})
			return registry.Registration{Endpoint: ep, Name: "test.csi.example.com"}
		}, `calls itself "other.csi.example.com", not "test.csi.example.com"`},
		{"NodeGetInfo fails", func(t *testing.T, dir string) registry.Registration {
			_, ep := startDriver(t, dir, csidriver.Config{Endpoint: filepath.Join(dir, "b.sock"),
				Faults: []csidriver.Fault{{Method: "NodeGetInfo", Code: codes.Internal}}})
			return registry.Registration{Endpoint: ep}
		}, "NodeGetInfo"},
		{"not ready", func(t *testing.T, dir string) registry.Registration {
			return registry.Registration{Endpoint: serveFake(t, filepath.Join(dir, "f.sock"), &fakeCSI{name: "test.csi.example.com", nodeID: "n"})}
		}, "not ready"},
		{"empty node ID", func(t *testing.T, dir string) registry.Registration {
			return registry.Registration{Endpoint: serveFake(t, filepath.Join(dir, "f.sock"), &fakeCSI{name: "test.csi.example.com", ready: true})}
		}, "empty node ID"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := socketDir(t)
			_, goodEndpoint := startDriver(t, dir, csidriver.Config{})
			r := registry.New(testLogger(t))
			good, err := register(t, r, registry.Registration{Endpoint: goodEndpoint})
			if err != nil {
				t.Fatal(err)
			}
			_, err = register(t, r, c.setup(t, dir))
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Register: %v, want an error with %q", err, c.wantErr)
			}
			if list := r.List(); len(list) != 1 || list[0].Endpoint != goodEndpoint {
				t.Errorf("registered %v, want only the driver at %s", list, goodEndpoint)
			}
			if d, ok := r.Get("test.csi.example.com"); !ok || d != good {
				t.Errorf("the driver registered before was replaced: %+v", d)
			}
		})
	}
}

// A driver registering again at the same endpoint keeps its connection
// (calls in flight on it must not be cancelled); a driver of the same name
// at a new endpoint replaces the old one.
func TestReRegister(t *testing.T) {
	dir := socketDir(t)
	_, ep1 := startDriver(t, dir, csidriver.Config{Endpoint: filepath.Join(dir, "1.sock")})
	_, ep2 := startDriver(t, dir, csidriver.Config{Endpoint: filepath.Join(dir, "2.sock")})
	r := registry.New(testLogger(t))
	first, err := register(t, r, registry.Registration{Endpoint: ep1})
	if err != nil {
		t.Fatal(err)
	}
	again, err := register(t, r, registry.Registration{Endpoint: ep1})
	if err != nil {
		t.Fatal(err)
	}
	if again.Client != first.Client {
		t.Error("re-registering at the same endpoint made a new connection")
	}
	if err := first.Client.Probe(t.Context()); err != nil {
		t.Errorf("the connection of the first registration no longer works: %v", err)
	}
	moved, err := register(t, r, registry.Registration{Endpoint: ep2})
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := r.Get(moved.Name); d.Endpoint != ep2 || d.Client == first.Client {
		t.Errorf("driver at %s with the first connection %v, want the new endpoint %s and connection", d.Endpoint, d.Client == first.Client, ep2)
	}
	if _, ok := r.ByEndpoint(ep1); ok {
		t.Errorf("%s still has a driver", ep1)
	}
	// The old connection is closed only later: calls in flight finish.
	if err := first.Client.Probe(t.Context()); err != nil {
		t.Errorf("the replaced connection was closed at once: %v", err)
	}
}

// Deregistering removes only the registration it names, signals the
// change, and the driver is then reported as not registered.
func TestDeregister(t *testing.T) {
	dir := socketDir(t)
	_, ep := startDriver(t, dir, csidriver.Config{})
	r := registry.New(testLogger(t))
	var mu sync.Mutex
	var registered []string
	r.OnRegistered(func(name string) {
		mu.Lock()
		defer mu.Unlock()
		registered = append(registered, name)
	})
	changed := r.Changed()
	d, err := register(t, r, registry.Registration{Endpoint: ep})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Error("registering did not signal a change")
	}
	mu.Lock()
	if !slices.Equal(registered, []string{d.Name}) {
		t.Errorf("listeners called with %v, want [%s]", registered, d.Name)
	}
	mu.Unlock()

	// An old socket going away does not remove the newer registration.
	r.Deregister(d.Name, "unix:///old/endpoint.sock", "socket removed")
	if _, ok := r.Get(d.Name); !ok {
		t.Fatal("deregistering another endpoint removed the driver")
	}
	select {
	case <-r.Changed():
		t.Error("a deregistration that changed nothing signalled a change")
	default:
	}

	r.Deregister(d.Name, ep, "socket removed")
	if _, ok := r.Get(d.Name); ok {
		t.Fatal("driver still registered")
	}
	select {
	case <-r.Changed():
	default:
		t.Error("deregistering did not signal a change")
	}
	_, err = r.Client(d.Name)
	var nre *registry.NotRegisteredError
	if !errors.As(err, &nre) || nre.Driver != d.Name || !strings.Contains(err.Error(), d.Name) {
		t.Errorf("Client of a deregistered driver: %v, want a NotRegisteredError naming it", err)
	}

	// "" deregisters whatever endpoint the driver has.
	if _, err := register(t, r, registry.Registration{Endpoint: ep}); err != nil {
		t.Fatal(err)
	}
	r.Deregister(d.Name, "", "configuration removed")
	if len(r.List()) != 0 {
		t.Errorf("registered %v after deregistering without an endpoint", r.List())
	}
}

func TestListSortedCopies(t *testing.T) {
	dir := socketDir(t)
	r := registry.New(testLogger(t))
	for _, name := range []string{"b.csi.example.com", "c.csi.example.com", "a.csi.example.com"} {
		_, ep := startDriver(t, dir, csidriver.Config{Name: name, Endpoint: filepath.Join(dir, name+".sock"), StateDir: filepath.Join(dir, name)})
		if _, err := register(t, r, registry.Registration{Endpoint: ep}); err != nil {
			t.Fatal(err)
		}
	}
	list := r.List()
	var names []string
	for _, d := range list {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"a.csi.example.com", "b.csi.example.com", "c.csi.example.com"}) {
		t.Errorf("List names %v, want them sorted", names)
	}
	list[0].NodeID = "changed"
	if d, _ := r.Get("a.csi.example.com"); d.NodeID != "node-1" {
		t.Error("changing List's result changed the registry")
	}
}

// A driver that stops answering probes is deregistered after the allowed
// failures in a row, not before.
func TestRunProbes(t *testing.T) {
	cases := []struct {
		name         string
		failures     int // probes that fail; 0: all
		wantDeregged bool
	}{
		{"fewer failures than allowed", 2, false},
		{"stops answering", 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := socketDir(t)
			drv, ep := startDriver(t, dir, csidriver.Config{})
			r := registry.New(testLogger(t))
			d, err := register(t, r, registry.Registration{Endpoint: ep})
			if err != nil {
				t.Fatal(err)
			}
			registeredAt := d.LastProbe
			if err := drv.SetFault("Probe", codes.Unavailable, c.failures); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				r.Run(ctx, 5*time.Millisecond, 3)
			}()
			t.Cleanup(func() { cancel(); <-done })

			if c.wantDeregged {
				eventually(t, "the driver to be deregistered", func() bool { _, ok := r.Get(d.Name); return !ok })
				return
			}
			// Once the failures are used up a probe succeeds.
			eventually(t, "a successful probe after the failures", func() bool {
				if _, ok := r.Get(d.Name); !ok {
					t.Fatal("driver deregistered after fewer failures than allowed")
				}
				return len(drv.Faults()) == 0 && successfulProbeSince(r, d.Name, registeredAt)
			})
		})
	}
}

func successfulProbeSince(r *registry.Registry, name string, since time.Time) bool {
	for _, d := range r.List() {
		if d.Name == name {
			return d.LastProbe.After(since)
		}
	}
	return false
}

// A statically configured driver is registered once it answers, however
// late it starts.
func TestStaticWaitsForTheDriver(t *testing.T) {
	dir := socketDir(t)
	socket := filepath.Join(dir, "csi.sock")
	core, logs := observer.New(zapcore.WarnLevel)
	r := registry.New(zap.New(core))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Static(ctx, "test.csi.example.com", "unix://"+socket)
	}()
	t.Cleanup(func() { cancel(); <-done })

	// The first attempt finds nothing; the driver starts after it.
	eventually(t, "a failed first attempt", func() bool {
		return logs.FilterMessage("static CSI driver not reachable yet").Len() > 0
	})
	if _, ok := r.Get("test.csi.example.com"); ok {
		t.Fatal("registered before the driver started")
	}
	startDriver(t, dir, csidriver.Config{Endpoint: socket})
	eventually(t, "the static driver to be registered", func() bool { _, ok := r.Get("test.csi.example.com"); return ok })
	if d, _ := r.Get("test.csi.example.com"); d.Source != registry.SourceStatic {
		t.Errorf("source %q, want %q", d.Source, registry.SourceStatic)
	}
}
