package csi_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/volume-agent/volume-agent/test/csidriver"
)

// csiDriver is one test CSI driver of a test: a process of
// cmd/test-csi-driver with its own state directory, CSI socket and control
// socket, which the test can kill and start again on the same state.
type csiDriver struct {
	e      *env
	name   string
	suffix string
	state  string // --state-dir
	sock   string // the CSI socket
	ctl    string // the control socket
	regDir string // --registration-dir, if any
	args   []string
	p      *proc
	conn   *grpc.ClientConn // to the driver itself (not the proxy)
	proxy  *recorder        // between the agent and the driver, if any
}

type driverOptions struct {
	attachRequired bool
	// registrationDir makes the driver serve a registration socket there.
	registrationDir string
	// proxy puts a recording proxy between the agent and the driver.
	proxy bool
	// deferStart leaves starting the driver to the test (d.start).
	deferStart bool
}

// newDriver starts a driver named <suffix>.<namespace>.e2e.volume-agent.io
// whose node ID is the test's node name. args (faults, hangs) are passed to
// the first start only. It is stopped with SIGTERM when the test ends.
func (e *env) newDriver(suffix string, o driverOptions, args ...string) *csiDriver {
	e.t.Helper()
	d := &csiDriver{
		e: e, suffix: suffix, name: fmt.Sprintf("%s.%s.e2e.volume-agent.io", suffix, e.ns),
		state:  filepath.Join(e.data, "driver-"+suffix),
		sock:   filepath.Join(e.sock, suffix+".sock"),
		ctl:    filepath.Join(e.sock, suffix+"-ctl.sock"),
		regDir: o.registrationDir,
	}
	d.args = []string{
		"--endpoint=unix://" + d.sock, "--name=" + d.name, "--node-id=" + e.node,
		"--state-dir=" + d.state, "--control-socket=" + d.ctl,
		"--default-volume-size=32Mi", "--ephemeral-volume-size=16Mi",
	}
	if o.attachRequired {
		d.args = append(d.args, "--attach-required")
	}
	if o.registrationDir != "" {
		d.args = append(d.args, "--registration-dir="+o.registrationDir)
	}
	var err error
	if d.conn, err = grpc.NewClient("unix://"+d.sock, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { d.conn.Close() })
	if o.proxy {
		d.proxy = startRecorder(e.t, d.conn, filepath.Join(e.sock, suffix+"-proxy.sock"))
	}
	e.t.Cleanup(d.stop)
	if !o.deferStart {
		d.start(args...)
	}
	return d
}

// endpoint is where the agent reaches the driver: the proxy if there is one.
func (d *csiDriver) endpoint() string {
	if d.proxy != nil {
		return "unix://" + d.proxy.sock
	}
	return "unix://" + d.sock
}

// flag is the agent's --csi-driver flag for the driver.
func (d *csiDriver) flag() string { return "--csi-driver=" + d.name + "=" + d.endpoint() }

// start starts the driver process (again) and waits until it answers.
func (d *csiDriver) start(extra ...string) {
	t := d.e.t
	t.Helper()
	if d.p != nil && !d.p.exited() {
		t.Fatalf("driver %s is already running", d.name)
	}
	// Sockets a killed process left behind must not look like a live one.
	for _, s := range []string{d.sock, d.ctl, d.regSock()} {
		if s != "" {
			os.Remove(s)
		}
	}
	p, err := startProc("driver "+d.suffix, suite.driverBin, filepath.Join(d.e.logs, "driver-"+d.suffix+".log"),
		append(slices.Clone(d.args), extra...)...)
	if err != nil {
		t.Fatalf("starting driver %s: %v", d.name, err)
	}
	d.p = p
	eventually(t, 30*time.Second, "driver "+d.name+" answers", func(ctx context.Context) (bool, string) {
		if p.exited() {
			t.Fatalf("driver %s exited during start-up (%v):\n%s", d.name, p.waitErr, tail(p.logPath, 20))
		}
		if !exists(t, d.ctl) { // the last socket the driver opens
			return false, "no control socket yet"
		}
		_, err := csi.NewIdentityClient(d.conn).Probe(ctx, &csi.ProbeRequest{})
		return err == nil, fmt.Sprint(err)
	})
}

func (d *csiDriver) regSock() string {
	if d.regDir == "" {
		return ""
	}
	return filepath.Join(d.regDir, d.name+"-reg.sock")
}

// kill9 kills the driver with SIGKILL, as a crash would.
func (d *csiDriver) kill9() {
	d.e.t.Logf("kill -9 driver %s (pid %d)", d.name, d.p.cmd.Process.Pid)
	d.p.kill()
}

// stop stops the driver with SIGTERM; its mounts stay.
func (d *csiDriver) stop() {
	t := d.e.t
	if d.p == nil {
		return
	}
	if !d.p.terminate(20 * time.Second) {
		t.Errorf("driver %s did not stop within 20s of SIGTERM", d.name)
	}
	if t.Failed() {
		t.Logf("--- last lines of driver %s's log ---\n%s", d.name, tail(d.p.logPath, 40))
	}
}

func (d *csiDriver) control() *csidriver.ControlClient { return csidriver.NewControlClient(d.ctl) }

// calls returns the running process's call counts by method.
func (d *csiDriver) calls(t *testing.T) map[string]int {
	t.Helper()
	c, err := d.control().CallCounts()
	if err != nil {
		t.Fatalf("driver %s call counts: %v", d.name, err)
	}
	return c
}

// waitCalls waits until the driver's count of method reaches at least n.
func (d *csiDriver) waitCalls(method string, n int) {
	d.e.t.Helper()
	eventually(d.e.t, 60*time.Second, fmt.Sprintf("%d %s calls to %s", n, method, d.name), func(context.Context) (bool, string) {
		c, err := d.control().CallCounts()
		if err != nil {
			return false, err.Error()
		}
		return c[method] >= n, fmt.Sprintf("counts %v", c)
	})
}

// checkCalls checks exact call counts of the running process.
func (d *csiDriver) checkCalls(t *testing.T, want map[string]int) {
	t.Helper()
	got := d.calls(t)
	for m, n := range want {
		if got[m] != n {
			t.Errorf("driver %s: %d %s calls, want %d (all counts: %v)", d.name, got[m], m, n, got)
		}
	}
}

// createVolume creates a volume through the driver's controller service,
// as an external-provisioner would, and returns its ID.
func (d *csiDriver) createVolume(name string) string {
	t := d.e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := csi.NewControllerClient(d.conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: d.e.ns + "-" + name,
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20},
	})
	if err != nil {
		t.Fatalf("CreateVolume %s on %s: %v", name, d.name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

// volume returns what the driver knows of a volume.
func (d *csiDriver) volume(t *testing.T, id string) (csidriver.VolumeInfo, bool) {
	t.Helper()
	vols, err := d.control().Volumes()
	if err != nil {
		t.Fatalf("driver %s volumes: %v", d.name, err)
	}
	for _, v := range vols {
		if v.ID == id {
			return v, true
		}
	}
	return csidriver.VolumeInfo{}, false
}

// --- the recording proxy ---

// recorder is a CSI endpoint that forwards every call the agent makes to
// the driver and records the node requests, so that a test can check what
// reached the driver (secrets, publish context), which the driver does not
// keep. It can also hold NodeStageVolume calls of chosen volumes, to hang
// one volume while the driver serves the others.
type recorder struct {
	sock   string
	srv    *grpc.Server
	ident  csi.IdentityClient
	node   csi.NodeClient
	ctrl   csi.ControllerClient
	mu     sync.Mutex
	stages []*csi.NodeStageVolumeRequest
	held   map[string]chan struct{} // volume ID -> closed to release
	inHold map[string]int           // NodeStageVolume calls being held, by volume ID
}

func startRecorder(t *testing.T, target *grpc.ClientConn, sock string) *recorder {
	t.Helper()
	r := &recorder{
		sock: sock, srv: grpc.NewServer(),
		ident: csi.NewIdentityClient(target), node: csi.NewNodeClient(target), ctrl: csi.NewControllerClient(target),
		held: map[string]chan struct{}{}, inHold: map[string]int{},
	}
	csi.RegisterIdentityServer(r.srv, &proxyIdentity{r: r})
	csi.RegisterNodeServer(r.srv, &proxyNode{r: r})
	csi.RegisterControllerServer(r.srv, &proxyController{r: r})
	os.Remove(sock)
	lis, err := listenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.srv.Serve(lis) }()
	t.Cleanup(func() {
		r.releaseAll()
		r.srv.Stop()
	})
	return r
}

// hold makes NodeStageVolume of the volume wait until release.
func (r *recorder) hold(volumeID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held[volumeID] = make(chan struct{})
}

func (r *recorder) release(volumeID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.held[volumeID]; ok {
		close(ch)
		delete(r.held, volumeID)
	}
}

func (r *recorder) releaseAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, ch := range r.held {
		close(ch)
		delete(r.held, id)
	}
}

// holding returns how many NodeStageVolume calls of the volume are held.
func (r *recorder) holding(volumeID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inHold[volumeID]
}

// stageRequests returns the NodeStageVolume requests of a volume so far.
func (r *recorder) stageRequests(volumeID string) []*csi.NodeStageVolumeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*csi.NodeStageVolumeRequest
	for _, s := range r.stages {
		if s.GetVolumeId() == volumeID {
			out = append(out, s)
		}
	}
	return out
}

type proxyIdentity struct {
	csi.UnimplementedIdentityServer
	r *recorder
}

func (p *proxyIdentity) GetPluginInfo(ctx context.Context, req *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return p.r.ident.GetPluginInfo(ctx, req)
}

func (p *proxyIdentity) GetPluginCapabilities(ctx context.Context, req *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return p.r.ident.GetPluginCapabilities(ctx, req)
}

func (p *proxyIdentity) Probe(ctx context.Context, req *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return p.r.ident.Probe(ctx, req)
}

type proxyNode struct {
	csi.UnimplementedNodeServer
	r *recorder
}

func (p *proxyNode) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	r := p.r
	r.mu.Lock()
	r.stages = append(r.stages, proto.Clone(req).(*csi.NodeStageVolumeRequest))
	hold := r.held[req.GetVolumeId()]
	if hold != nil {
		r.inHold[req.GetVolumeId()]++
	}
	r.mu.Unlock()
	if hold != nil {
		defer func() {
			r.mu.Lock()
			r.inHold[req.GetVolumeId()]--
			r.mu.Unlock()
		}()
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return r.node.NodeStageVolume(ctx, req)
}

func (p *proxyNode) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	return p.r.node.NodeUnstageVolume(ctx, req)
}

func (p *proxyNode) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	return p.r.node.NodePublishVolume(ctx, req)
}

func (p *proxyNode) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	return p.r.node.NodeUnpublishVolume(ctx, req)
}

func (p *proxyNode) NodeGetCapabilities(ctx context.Context, req *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return p.r.node.NodeGetCapabilities(ctx, req)
}

func (p *proxyNode) NodeGetInfo(ctx context.Context, req *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return p.r.node.NodeGetInfo(ctx, req)
}

func (p *proxyNode) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	return p.r.node.NodeGetVolumeStats(ctx, req)
}

func (p *proxyNode) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	return p.r.node.NodeExpandVolume(ctx, req)
}

type proxyController struct {
	csi.UnimplementedControllerServer
	r *recorder
}

func (p *proxyController) ControllerGetCapabilities(ctx context.Context, req *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return p.r.ctrl.ControllerGetCapabilities(ctx, req)
}

func (p *proxyController) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	return p.r.ctrl.ControllerPublishVolume(ctx, req)
}

func (p *proxyController) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	return p.r.ctrl.ControllerUnpublishVolume(ctx, req)
}
