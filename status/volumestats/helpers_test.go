package volumestats

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/csiclient"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/test/csidriver"
	"github.com/volume-agent/volume-agent/volume"
)

func testLogger(t *testing.T) *zap.Logger {
	level := zap.WarnLevel
	if testing.Verbose() {
		level = zap.DebugLevel
	}
	return zaptest.NewLogger(t, zaptest.Level(level))
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// shortDir returns a new temporary directory with a path short enough for
// unix sockets, whose mounts are undone before it is removed.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vstats")
	if err != nil {
		t.Fatal(err)
	}
	dir = mounttest.Real(dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	mounttest.CleanupMounts(t, dir)
	return dir
}

// asw is a fake actual state of world a test changes between rounds.
type asw struct {
	mu   sync.Mutex
	vols map[volume.UniqueName]*cache.ActualVolume
}

func newASW() *asw { return &asw{vols: map[volume.UniqueName]*cache.ActualVolume{}} }

func (a *asw) snapshot() *cache.ActualSnapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	vols := map[volume.UniqueName]*cache.ActualVolume{}
	for k, v := range a.vols {
		vols[k] = v
	}
	return cache.NewActualSnapshot(vols, 0)
}

func (a *asw) put(v *cache.ActualVolume) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.vols[v.Name] = v
}

func (a *asw) remove(name volume.UniqueName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.vols, name)
}

// claimSpec is the spec of a pod's volume reached through claim ns/pvc
// bound to a CSI PV.
func claimSpec(driver, handle, ns, pvc string) *volume.Spec {
	spec := &volume.Spec{
		Name: "pv-" + handle,
		PV: &v1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "pv-" + handle},
			Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
				CSI: &v1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle},
			}},
		},
	}
	if pvc != "" {
		spec.PVC = &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pvc}}
	}
	return spec
}

// csiVolume is an ASW entry of a CSI volume staged at staging and mounted
// by one pod at target.
func csiVolume(spec *volume.Spec, staging string, pod types.UID, target string, state cache.MountState) *cache.ActualVolume {
	src := spec.PV.Spec.CSI
	v := &cache.ActualVolume{
		Name:   volume.SharedName(csiplugin.Name, src.Driver+"^"+src.VolumeHandle),
		Plugin: csiplugin.Name, Spec: spec,
		Attributes:  volume.Attributes{Identity: src.Driver + "^" + src.VolumeHandle, DeviceMountable: true},
		DeviceState: cache.DeviceGloballyMounted, DeviceMountPath: staging,
		Pods: cache.PodSet[cache.ActualPodMount]{},
	}
	addPod(v, pod, target, state)
	return v
}

func addPod(v *cache.ActualVolume, pod types.UID, target string, state cache.MountState) {
	v.Pods = v.Pods.With(pod, &cache.ActualPodMount{
		Pod: volume.PodRef{UID: pod, Namespace: "ns", Name: "pod-" + string(pod)}, SpecName: v.Spec.Name,
		MountPath: target, State: state, Spec: v.Spec,
	})
}

// gauge returns the value of a gauge of the collector for a claim.
func gauge(t *testing.T, c prometheus.Collector, name, ns, pvc string) (float64, bool) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelsAre(m, ns, pvc) {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// gaugeValue returns the value of an unlabelled gauge of the collector.
func gaugeValue(t *testing.T, c prometheus.Collector, name string) (float64, bool) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func labelsAre(m *dto.Metric, ns, pvc string) bool {
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	return got["namespace"] == ns && got["persistentvolumeclaim"] == pvc
}

// --- the test CSI driver, for real volumes ---

// requireLoopDevices skips the test, saying why, unless it runs as root
// where loop devices and mkfs.ext4 work.
func requireLoopDevices(t *testing.T) {
	t.Helper()
	mounttest.RequireRoot(t)
	for _, tool := range []string{"losetup", "mkfs.ext4", "blkid"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s is not installed (the test CSI driver needs it)", tool)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("skipping: no loop devices: %v", err)
	}
	// Attaching one proves it works here (it skips the test if not).
	mounttest.LoopDevice(t, 1<<20)
}

// startDriver starts the test CSI driver in-process in dir and registers it.
// When the test ends, every volume it still has is unpublished, unstaged and
// deleted, the driver is stopped, and any mount or loop device left behind
// is removed.
func startDriver(t *testing.T, reg *registry.Registry, dir, name string) (*csidriver.Driver, *registry.Driver) {
	t.Helper()
	d, err := csidriver.New(csidriver.Config{
		Name: name, NodeID: "node-1", Endpoint: filepath.Join(dir, name+".sock"), StateDir: filepath.Join(dir, name+"-state"),
		Logger: testLogger(t).Named(name),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detachLoops(t, d) })
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	drv, err := reg.Register(testCtx(t), registry.Registration{Endpoint: d.Endpoint(), Name: name, Source: registry.SourceStatic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanupVolumes(t, d, drv) })
	return d, drv
}

// cleanupVolumes undoes through the driver what a test did.
func cleanupVolumes(t *testing.T, d *csidriver.Driver, drv *registry.Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d.ResetFaults()
	for _, v := range d.Volumes() {
		for _, target := range v.TargetPaths {
			if _, err := drv.Client.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.ID, TargetPath: target}); err != nil {
				t.Errorf("cleanup: unpublish %s: %v", v.ID, err)
			}
		}
		if v.StagingPath != "" {
			if _, err := drv.Client.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.ID, StagingTargetPath: v.StagingPath}); err != nil {
				t.Errorf("cleanup: unstage %s: %v", v.ID, err)
			}
		}
		if _, err := drv.Client.Controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.ID}); err != nil {
			t.Errorf("cleanup: delete %s: %v", v.ID, err)
		}
	}
}

// detachLoops detaches loop devices the driver left attached (after a
// failed cleanup); mounts are undone by shortDir's cleanup.
func detachLoops(t *testing.T, d *csidriver.Driver) {
	for _, v := range d.Volumes() {
		if v.LoopDevice == "" {
			continue
		}
		_ = mounttest.UnmountUnder(filepath.Dir(v.BackingFile))
		if out, err := exec.Command("losetup", "-d", v.LoopDevice).CombinedOutput(); err != nil {
			t.Errorf("cleanup: losetup -d %s: %v: %s", v.LoopDevice, err, strings.TrimSpace(string(out)))
		}
	}
}

var mountCap = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// provision creates a volume through the driver's controller service and
// stages and publishes it through its node service, as the agent would.
func provision(t *testing.T, drv *registry.Driver, dir, name string, size int64) (handle, staging, target string) {
	t.Helper()
	ctx := testCtx(t)
	cv, err := drv.Client.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{mountCap},
	})
	if err != nil {
		t.Fatal(err)
	}
	handle = cv.GetVolume().GetVolumeId()
	staging = filepath.Join(dir, "plugins", name, "globalmount")
	target = filepath.Join(dir, "pods", name, "volumes", "kubernetes.io~csi", name, "mount")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.Client.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: handle, StagingTargetPath: staging, VolumeCapability: mountCap, PublishContext: cv.GetVolume().GetVolumeContext(),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.Client.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: handle, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap,
	}); err != nil {
		t.Fatal(err)
	}
	return handle, staging, target
}

// --- a fake CSI driver, for tests that need no root ---

// fakeDriver serves a CSI identity and node service whose
// NodeGetVolumeStats answers from a table, recording every request.
type fakeDriver struct {
	name      string
	stats     bool // advertises GET_VOLUME_STATS
	staging   bool // advertises STAGE_UNSTAGE_VOLUME
	condition bool // advertises VOLUME_CONDITION (4)

	mu       sync.Mutex
	answers  map[string]*csi.NodeGetVolumeStatsResponse // by volume ID
	fail     map[string]error
	requests []*csi.NodeGetVolumeStatsRequest
}

func (f *fakeDriver) serve(t *testing.T, reg *registry.Registry, dir string) *registry.Driver {
	t.Helper()
	path := filepath.Join(dir, f.name+".sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, &fakeIdentity{f: f})
	csi.RegisterNodeServer(srv, &fakeNode{f: f})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	drv, err := reg.Register(testCtx(t), registry.Registration{Endpoint: path, Name: f.name, Source: registry.SourceStatic})
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

func (f *fakeDriver) set(id string, resp *csi.NodeGetVolumeStatsResponse, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.answers == nil {
		f.answers, f.fail = map[string]*csi.NodeGetVolumeStatsResponse{}, map[string]error{}
	}
	f.answers[id], f.fail[id] = resp, err
}

func (f *fakeDriver) calls() []*csi.NodeGetVolumeStatsRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*csi.NodeGetVolumeStatsRequest(nil), f.requests...)
}

type fakeIdentity struct {
	csi.UnimplementedIdentityServer
	f *fakeDriver
}

func (s *fakeIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: s.f.name, VendorVersion: "0.0.1"}, nil
}

func (s *fakeIdentity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (s *fakeIdentity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

type fakeNode struct {
	csi.UnimplementedNodeServer
	f *fakeDriver
}

func (s *fakeNode) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: "node-1"}, nil
}

func (s *fakeNode) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	add := func(t csi.NodeServiceCapability_RPC_Type) {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	if s.f.stats {
		add(csi.NodeServiceCapability_RPC_GET_VOLUME_STATS)
	}
	if s.f.staging {
		add(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
	}
	if s.f.condition {
		add(csiclient.NodeVolumeCondition)
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (s *fakeNode) NodeGetVolumeStats(_ context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.requests = append(s.f.requests, req)
	if err := s.f.fail[req.GetVolumeId()]; err != nil {
		return nil, err
	}
	return s.f.answers[req.GetVolumeId()], nil
}

// withCondition adds volume_condition (field 2) to a response, as a driver
// built with CSI spec 1.12 sends it.
func withCondition(resp *csi.NodeGetVolumeStatsResponse, abnormal bool, message string) *csi.NodeGetVolumeStatsResponse {
	resp.ProtoReflect().SetUnknown(csiclient.AppendVolumeCondition(nil, csiclient.VolumeCondition{Abnormal: abnormal, Message: message}))
	return resp
}

// localVolume is an ASW entry of a local PV reached through claim ns/pvc,
// mounted by one pod at path (its access point for Block).
func localVolume(pv, ns, pvc string, block bool, pod types.UID, path string) *cache.ActualVolume {
	spec := &volume.Spec{
		Name: pv,
		PV: &v1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: pv},
			Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
				Local: &v1.LocalVolumeSource{Path: "/mnt/disks/" + pv},
			}},
		},
		PVC:  &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pvc}},
		Mode: v1.PersistentVolumeFilesystem,
	}
	if block {
		spec.Mode = v1.PersistentVolumeBlock
	}
	v := &cache.ActualVolume{
		Name: volume.SharedName(local.Name, pv), Plugin: local.Name, Spec: spec,
		Attributes: volume.Attributes{Identity: pv}, Pods: cache.PodSet[cache.ActualPodMount]{},
	}
	addPod(v, pod, path, cache.Mounted)
	return v
}

func usage(capacity, avail, used, inodes, ifree, iused int64) *csi.NodeGetVolumeStatsResponse {
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: capacity, Available: avail, Used: used},
		{Unit: csi.VolumeUsage_INODES, Total: inodes, Available: ifree, Used: iused},
	}}
}
