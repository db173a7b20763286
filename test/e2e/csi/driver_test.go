package csi_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// csiDriver is one test CSI driver of a test (its own state directory, CSI
// socket and control socket), named <suffix>.<namespace>.e2e.volume-agent.io,
// which the test can kill and start again on the same state.
type csiDriver struct {
	*e2eutil.CSIDriver
	e      *env
	name   string
	regDir string    // --registration-dir, if any
	proxy  *recorder // between the agent and the driver, if any
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

// newDriver starts a driver whose node ID is the test's node name. args
// (faults, hangs) are passed to the first start only. It is stopped with
// SIGTERM when the test ends.
func (e *env) newDriver(suffix string, o driverOptions, args ...string) *csiDriver {
	e.t.Helper()
	d := &csiDriver{e: e, name: fmt.Sprintf("%s.%s.e2e.volume-agent.io", suffix, e.ns), regDir: o.registrationDir}
	driverArgs := []string{"--default-volume-size=32Mi", "--ephemeral-volume-size=16Mi"}
	if o.attachRequired {
		driverArgs = append(driverArgs, "--attach-required")
	}
	if o.registrationDir != "" {
		driverArgs = append(driverArgs, "--registration-dir="+o.registrationDir)
	}
	d.CSIDriver = e2eutil.NewCSIDriver(e.t, e2eutil.CSIDriverOptions{
		Binary: suite.CSIDriverBin, Name: d.name, NodeID: e.node, Args: driverArgs,
		Socket:        filepath.Join(e.sock, suffix+".sock"),
		ControlSocket: filepath.Join(e.sock, suffix+"-ctl.sock"),
		StateDir:      filepath.Join(e.data, "driver-"+suffix),
		StrictLoops:   true,
		LogPath:       filepath.Join(e.logs, "driver-"+suffix+".log"),
	})
	if o.proxy {
		d.proxy = startRecorder(e.t, d.Conn, filepath.Join(e.sock, suffix+"-proxy.sock"))
	}
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
	return d.Endpoint()
}

// flag is the agent's --csi-driver flag for the driver.
func (d *csiDriver) flag() string { return "--csi-driver=" + d.name + "=" + d.endpoint() }

// start starts the driver process (again) and waits until it answers.
func (d *csiDriver) start(extra ...string) {
	d.e.t.Helper()
	if s := d.regSock(); s != "" {
		os.Remove(s) // left behind by a killed process, it must not look like a live one
	}
	d.Start(extra...)
}

func (d *csiDriver) regSock() string {
	if d.regDir == "" {
		return ""
	}
	return filepath.Join(d.regDir, d.name+"-reg.sock")
}

// waitCalls waits until the driver's count of method reaches at least n.
func (d *csiDriver) waitCalls(method string, n int) {
	d.e.t.Helper()
	e2eutil.Poll(d.e.t, 60*time.Second, fmt.Sprintf("%d %s calls to %s", n, method, d.name), func(context.Context) (bool, string) {
		c, err := d.Control.CallCounts()
		if err != nil {
			return false, err.Error()
		}
		return c[method] >= n, fmt.Sprintf("counts %v", c)
	})
}

// checkCalls checks exact call counts of the running process.
func (d *csiDriver) checkCalls(t *testing.T, want map[string]int) {
	t.Helper()
	got := d.CallCounts(t)
	for m, n := range want {
		if got[m] != n {
			t.Errorf("driver %s: %d %s calls, want %d (all counts: %v)", d.name, got[m], m, n, got)
		}
	}
}

// waitNoLoopDevices waits until no loop device is backed by a file under
// the driver's state directory.
func (d *csiDriver) waitNoLoopDevices() {
	t := d.e.t
	t.Helper()
	e2eutil.Poll(t, 30*time.Second, "no loop devices of driver "+d.name, func(context.Context) (bool, string) {
		devs := mounttest.LoopDevicesUnder(t, d.StateDir())
		return len(devs) == 0, fmt.Sprintf("losetup: %v", devs)
	})
}

// --- the recording proxy ---

// recorder is a CSI endpoint that forwards every call the agent makes to
// the driver and records the stage, publish and expand requests, so that a
// test can check what reached the driver (secrets, tokens, publish context,
// access modes), which the driver does not keep. It can also hold
// NodeStageVolume calls of chosen volumes, to hang one volume while the
// driver serves the others.
type recorder struct {
	sock      string
	srv       *grpc.Server
	ident     csi.IdentityClient
	node      csi.NodeClient
	ctrl      csi.ControllerClient
	mu        sync.Mutex
	stages    []*csi.NodeStageVolumeRequest
	publishes []*csi.NodePublishVolumeRequest
	expands   []*csi.NodeExpandVolumeRequest
	held      map[string]chan struct{} // volume ID -> closed to release
	inHold    map[string]int           // NodeStageVolume calls being held, by volume ID
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

// publishRequests returns the NodePublishVolume requests of a volume so far.
func (r *recorder) publishRequests(volumeID string) []*csi.NodePublishVolumeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*csi.NodePublishVolumeRequest
	for _, p := range r.publishes {
		if p.GetVolumeId() == volumeID {
			out = append(out, p)
		}
	}
	return out
}

// expandRequests returns the NodeExpandVolume requests of a volume so far.
func (r *recorder) expandRequests(volumeID string) []*csi.NodeExpandVolumeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*csi.NodeExpandVolumeRequest
	for _, x := range r.expands {
		if x.GetVolumeId() == volumeID {
			out = append(out, x)
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
	p.r.mu.Lock()
	p.r.publishes = append(p.r.publishes, proto.Clone(req).(*csi.NodePublishVolumeRequest))
	p.r.mu.Unlock()
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
	p.r.mu.Lock()
	p.r.expands = append(p.r.expands, proto.Clone(req).(*csi.NodeExpandVolumeRequest))
	p.r.mu.Unlock()
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
