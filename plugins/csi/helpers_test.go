package csi_test

// Test fixture: csi-test's gomock-based mock driver served on a unix socket,
// registered in a real registry.Registry through the real discovery calls,
// and the CSI plugin wired to it with a temporary root directory.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/driver"
	"go.uber.org/mock/gomock"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/volume"
)

const (
	testDriver = "mock.csi.volume-agent.io"
	testNodeID = "mock-node-id"
	nodeName   = "node-1"
)

// reporter makes gomock failures safe in the gRPC server's goroutines: a
// fatal failure (an unexpected call) marks the test failed and ends only the
// goroutine it happens on, as t.FailNow would, instead of letting gomock
// continue with a nil expectation. The client of such a call sees its
// context expire.
type reporter struct{ t *testing.T }

func (r reporter) Errorf(format string, args ...any) { r.t.Helper(); r.t.Errorf(format, args...) }
func (r reporter) Fatalf(format string, args ...any) {
	r.t.Helper()
	r.t.Errorf(format, args...)
	runtime.Goexit()
}
func (r reporter) Helper()          { r.t.Helper() }
func (r reporter) Cleanup(f func()) { r.t.Cleanup(f) }

// caps is what the mock driver says it can do.
type caps struct {
	stage             bool // STAGE_UNSTAGE_VOLUME
	mountGroup        bool // VOLUME_MOUNT_GROUP
	expand            bool // EXPAND_VOLUME
	controllerPublish bool // a controller service with PUBLISH_UNPUBLISH_VOLUME
	// SINGLE_NODE_MULTI_WRITER of the node and of the controller service.
	singleNodeMultiWriter, controllerSingleNodeMultiWriter bool
}

// mockDriver is one mock CSI driver process-in-a-goroutine.
type mockDriver struct {
	name       string
	endpoint   string
	identity   *driver.MockIdentityServer
	node       *driver.MockNodeServer
	controller *driver.MockControllerServer
	server     *driver.CSIDriver
	stopOnce   sync.Once
}

// publishingNode is the mock's node service plus what a real driver does
// when it answers success: a published target is a mount point, an
// unpublished one no longer (recorded in the fixture, whose mounter the
// plugin asks). What the driver answers is the mock's.
type publishingNode struct {
	csi.UnsafeNodeServer
	*driver.MockNodeServer
	f *fixture
}

func (n publishingNode) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	resp, err := n.MockNodeServer.NodePublishVolume(ctx, req)
	if err == nil && req.GetVolumeCapability().GetBlock() == nil && !n.f.unseenMounts {
		n.f.setPublished(req.GetTargetPath(), true)
	}
	return resp, err
}

func (n publishingNode) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	resp, err := n.MockNodeServer.NodeUnpublishVolume(ctx, req)
	if err == nil {
		n.f.setPublished(req.GetTargetPath(), false)
	}
	return resp, err
}

// fixtureMounter is the node's mounter, which also sees the mock drivers'
// publishes as mounts.
type fixtureMounter struct {
	plugins.Mounter
	f *fixture
}

func (m fixtureMounter) IsMountPoint(path string) (bool, error) {
	if m.f.isPublished(path) {
		return true, nil
	}
	return m.Mounter.IsMountPoint(path)
}

func (f *fixture) setPublished(path string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.published[filepath.Clean(path)] = true
	} else {
		delete(f.published, filepath.Clean(path))
	}
}

func (f *fixture) isPublished(path string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.published[filepath.Clean(path)]
}

func (m *mockDriver) stop() { m.stopOnce.Do(func() { m.server.Stop() }) }

// fixture is one test's plugin with its drivers, CSIDriver objects and
// secrets.
type fixture struct {
	t       *testing.T
	ctrl    *gomock.Controller
	paths   volume.Paths
	drivers *registry.Registry

	mu          sync.Mutex
	csiDrivers  map[string]*storagev1.CSIDriver
	secrets     map[string]map[string][]byte // "ns/name" -> data
	secretReads []string
	attachments *fakeAttachments
	attachMode  string
	noSecrets   bool
	// tokens issues service-account tokens; nil is standalone mode.
	tokens csiplugin.TokenIssuer
	// published are the targets the mock drivers published (mounted, for
	// the plugin); with unseenMounts the drivers' mounts do not reach the
	// plugin (a driver container without mount propagation).
	published    map[string]bool
	unseenMounts bool
	// outOfAttachSlots is the plugin's OutOfAttachSlots.
	outOfAttachSlots func(driver string)
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{
		t:           t,
		ctrl:        gomock.NewController(reporter{t}),
		paths:       volume.Paths{Root: t.TempDir()},
		drivers:     registry.New(zaptest.NewLogger(t)),
		csiDrivers:  map[string]*storagev1.CSIDriver{},
		secrets:     map[string]map[string][]byte{},
		attachments: newFakeAttachments(),
		attachMode:  csiplugin.AttachController,
		published:   map[string]bool{},
	}
	return f
}

// plugin returns a plugin over the fixture's state. Each call returns a new
// plugin, as a restarted agent would have.
func (f *fixture) plugin() *csiplugin.Plugin { return csiplugin.New(f.config()) }

func (f *fixture) config() csiplugin.Config {
	cfg := csiplugin.Config{
		Host: plugins.Host{
			Paths: f.paths, Mounter: fixtureMounter{Mounter: mountutil.New(), f: f}, NodeName: nodeName, HostRoot: "/",
			Log: zaptest.NewLogger(f.t),
		},
		Drivers:    f.drivers,
		CSIDriver:  f.csiDriver,
		Secrets:    f.secret,
		AttachMode: f.attachMode,
		Tokens:     f.tokens, NoTokensReason: "this test runs in standalone mode",
		OutOfAttachSlots: f.outOfAttachSlots,
	}
	if f.attachments != nil {
		cfg.Attachments = f.attachments
	}
	if f.noSecrets {
		cfg.Secrets = nil
	}
	return cfg
}

func (f *fixture) csiDriver(name string) (*storagev1.CSIDriver, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.csiDrivers[name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "storage.k8s.io", Resource: "csidrivers"}, name)
	}
	return d, nil
}

func (f *fixture) secret(_ context.Context, namespace, name string) (map[string][]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := namespace + "/" + name
	f.secretReads = append(f.secretReads, key)
	d, ok := f.secrets[key]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
	}
	return d, nil
}

func (f *fixture) setCSIDriver(d *storagev1.CSIDriver) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.csiDrivers[d.Name] = d
}

func (f *fixture) setSecret(namespace, name string, data map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := map[string][]byte{}
	for k, v := range data {
		b[k] = []byte(v)
	}
	f.secrets[namespace+"/"+name] = b
}

// startDriver serves a mock driver named name on a new unix socket. The
// identity and discovery calls may come any number of times; tests set
// exact expectations for the node and controller calls they care about.
func (f *fixture) startDriver(name string, c caps) *mockDriver {
	f.t.Helper()
	// Socket paths are limited to 108 bytes: t.TempDir() can be too long.
	dir, err := os.MkdirTemp("", "csimock")
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { os.RemoveAll(dir) })
	m := &mockDriver{
		name:       name,
		endpoint:   "unix://" + filepath.Join(dir, "csi.sock"),
		identity:   driver.NewMockIdentityServer(f.ctrl),
		node:       driver.NewMockNodeServer(f.ctrl),
		controller: driver.NewMockControllerServer(f.ctrl),
	}
	m.identity.EXPECT().GetPluginInfo(gomock.Any(), gomock.Any()).Return(
		&csi.GetPluginInfoResponse{Name: name, VendorVersion: "0.0.1"}, nil).AnyTimes()
	m.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).Return(
		&csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil).AnyTimes()
	var pluginCaps []*csi.PluginCapability
	if c.controllerPublish {
		pluginCaps = append(pluginCaps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE},
		}})
		ctrlCaps := []*csi.ControllerServiceCapability{{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{
				Type: csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
			}},
		}}
		if c.controllerSingleNodeMultiWriter {
			ctrlCaps = append(ctrlCaps, &csi.ControllerServiceCapability{
				Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{
					Type: csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
				}},
			})
		}
		m.controller.EXPECT().ControllerGetCapabilities(gomock.Any(), gomock.Any()).Return(
			&csi.ControllerGetCapabilitiesResponse{Capabilities: ctrlCaps}, nil).AnyTimes()
	}
	m.identity.EXPECT().GetPluginCapabilities(gomock.Any(), gomock.Any()).Return(
		&csi.GetPluginCapabilitiesResponse{Capabilities: pluginCaps}, nil).AnyTimes()
	m.node.EXPECT().NodeGetInfo(gomock.Any(), gomock.Any()).Return(
		&csi.NodeGetInfoResponse{NodeId: testNodeID}, nil).AnyTimes()
	var nodeCaps []*csi.NodeServiceCapability
	addCap := func(t csi.NodeServiceCapability_RPC_Type) {
		nodeCaps = append(nodeCaps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: t},
		}})
	}
	if c.stage {
		addCap(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
	}
	if c.mountGroup {
		addCap(csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP)
	}
	if c.expand {
		addCap(csi.NodeServiceCapability_RPC_EXPAND_VOLUME)
	}
	if c.singleNodeMultiWriter {
		addCap(csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
	}
	m.node.EXPECT().NodeGetCapabilities(gomock.Any(), gomock.Any()).Return(
		&csi.NodeGetCapabilitiesResponse{Capabilities: nodeCaps}, nil).AnyTimes()

	m.server = driver.NewCSIDriver(&driver.CSIDriverServers{
		Identity: struct {
			csi.UnsafeIdentityServer
			*driver.MockIdentityServer
		}{MockIdentityServer: m.identity},
		Node: publishingNode{MockNodeServer: m.node, f: f},
		Controller: struct {
			csi.UnsafeControllerServer
			*driver.MockControllerServer
		}{MockControllerServer: m.controller},
	})
	l, err := net.Listen("unix", filepath.Join(dir, "csi.sock"))
	if err != nil {
		f.t.Fatal(err)
	}
	if err := m.server.Start(l); err != nil {
		l.Close()
		f.t.Fatalf("starting the mock driver: %v", err)
	}
	f.t.Cleanup(m.stop)
	return m
}

// register registers a started mock driver the way a static --csi-driver
// does: through discovery.
func (f *fixture) register(m *mockDriver) *registry.Driver {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := f.drivers.Register(ctx, registry.Registration{Endpoint: m.endpoint, Name: m.name, Source: registry.SourceStatic})
	if err != nil {
		f.t.Fatalf("registering %s: %v", m.name, err)
	}
	f.t.Cleanup(func() { f.drivers.Deregister(m.name, "", "test over") })
	return d
}

// startRegistered is startDriver and register.
func (f *fixture) startRegistered(name string, c caps) *mockDriver {
	f.t.Helper()
	m := f.startDriver(name, c)
	f.register(m)
	return m
}

// ctx is a context for one plugin call: long enough for anything a mock
// does, short enough that a call a failed expectation left hanging ends.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// protoEq matches a gRPC request equal (proto.Equal) to want.
type protoEq struct{ want proto.Message }

func eqProto(want proto.Message) gomock.Matcher {
	return gomock.GotFormatterAdapter(gomock.GotFormatterFunc(func(got any) string {
		if m, ok := got.(proto.Message); ok {
			return prototext.Format(m)
		}
		return fmt.Sprint(got)
	}), protoEq{want})
}

func (m protoEq) Matches(x any) bool {
	got, ok := x.(proto.Message)
	return ok && proto.Equal(got, m.want)
}

func (m protoEq) String() string { return prototext.Format(m.want) }

// --- volumes ---

// pvSpec is a CSI PV of the test driver, as the populator builds it.
func pvSpec(name, handle string, mutate ...func(*v1.PersistentVolume)) *volume.Spec {
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: testDriver, VolumeHandle: handle, FSType: "ext4",
			}},
		},
	}
	for _, m := range mutate {
		m(pv)
	}
	return &volume.Spec{Name: name, PV: pv, Mode: v1.PersistentVolumeFilesystem}
}

// inlineSpec is an inline CSI volume of a pod.
func inlineSpec(name string, attrs map[string]string) *volume.Spec {
	return &volume.Spec{
		Name: name, InlineEphemeral: true, Mode: v1.PersistentVolumeFilesystem,
		Volume: &v1.Volume{Name: name, VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{
			Driver: testDriver, VolumeAttributes: attrs,
		}}},
	}
}

func identityOf(spec *volume.Spec) string {
	return spec.PV.Spec.CSI.Driver + "^" + spec.PV.Spec.CSI.VolumeHandle
}

func uniqueName(spec *volume.Spec) volume.UniqueName {
	return volume.SharedName(csiplugin.Name, identityOf(spec))
}

// deviceRequest is what the operator passes to MountDevice/UnmountDevice.
func (f *fixture) deviceRequest(spec *volume.Spec, publishContext map[string]string) *plugins.DeviceRequest {
	id := identityOf(spec)
	return &plugins.DeviceRequest{
		VolumeName: uniqueName(spec), Spec: spec, Identity: id, PublishContext: publishContext,
		DeviceMountPath: f.paths.DeviceMountPath(csiplugin.Name, id),
		Log:             zaptest.NewLogger(f.t),
	}
}

func pod(uid string) volume.PodInfo {
	return volume.PodInfo{
		PodRef:         volume.PodRef{UID: types.UID(uid), Namespace: "ns-1", Name: "pod-" + uid},
		ServiceAccount: "sa-1",
	}
}

// setUpRequest is what the operator passes to SetUp.
func (f *fixture) setUpRequest(spec *volume.Spec, p volume.PodInfo, publishContext map[string]string) *plugins.SetUpRequest {
	req := &plugins.SetUpRequest{
		Spec: spec, Pod: p, PublishContext: publishContext,
		Dir: f.paths.PodVolumeDir(p.UID, csiplugin.Name, spec.Name),
		Log: zaptest.NewLogger(f.t),
	}
	if spec.PV != nil {
		req.VolumeName = uniqueName(spec)
		req.DeviceMountPath = f.paths.DeviceMountPath(csiplugin.Name, identityOf(spec))
	} else {
		req.VolumeName = volume.PodScopedName(csiplugin.Name, p.UID, spec.Name)
	}
	return req
}

// tearDownRequest is what the operator passes to TearDown; spec may be nil
// (a mount found on disk after a restart).
func (f *fixture) tearDownRequest(name volume.UniqueName, spec *volume.Spec, p volume.PodInfo, specName string) *plugins.TearDownRequest {
	return &plugins.TearDownRequest{
		VolumeName: name, Spec: spec, Pod: p.PodRef,
		Dir: f.paths.PodVolumeDir(p.UID, csiplugin.Name, specName),
		Log: zaptest.NewLogger(f.t),
	}
}

func (f *fixture) podStateFile(p volume.PodInfo, specName string) string {
	return f.paths.PodVolumeStateFile(p.UID, csiplugin.Name, specName)
}

func (f *fixture) deviceStateFile(identity string) string {
	return f.paths.VolumeStateFile(csiplugin.Name, identity)
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// mountCap is the volume capability the plugin sends for a filesystem
// volume.
func mountCap(fsType string, flags []string, mode csi.VolumeCapability_AccessMode_Mode, mountGroup string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
			FsType: fsType, MountFlags: flags, VolumeMountGroup: mountGroup,
		}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// --- VolumeAttachments ---

// fakeAttachments is an in-memory VolumeAttachment API.
type fakeAttachments struct {
	mu      sync.Mutex
	objects map[string]*storagev1.VolumeAttachment
	inUse   map[volume.UniqueName]bool
	calls   []string
}

func newFakeAttachments() *fakeAttachments {
	return &fakeAttachments{objects: map[string]*storagev1.VolumeAttachment{}, inUse: map[volume.UniqueName]bool{}}
}

func (a *fakeAttachments) Get(name string) (*storagev1.VolumeAttachment, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	va, ok := a.objects[name]
	if !ok {
		return nil, false
	}
	return va.DeepCopy(), true
}

func (a *fakeAttachments) Create(_ context.Context, va *storagev1.VolumeAttachment) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, "create "+va.Name)
	if _, ok := a.objects[va.Name]; !ok {
		a.objects[va.Name] = va.DeepCopy()
	}
	return nil
}

func (a *fakeAttachments) PatchStatus(_ context.Context, name string, s storagev1.VolumeAttachmentStatus) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, "patch "+name)
	va, ok := a.objects[name]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Group: "storage.k8s.io", Resource: "volumeattachments"}, name)
	}
	va.Status = s
	return nil
}

func (a *fakeAttachments) Delete(_ context.Context, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, "delete "+name)
	delete(a.objects, name)
	return nil
}

func (a *fakeAttachments) ReportedInUse(name volume.UniqueName) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inUse[name]
}

func (a *fakeAttachments) put(va *storagev1.VolumeAttachment) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.objects[va.Name] = va.DeepCopy()
}

func (a *fakeAttachments) setInUse(name volume.UniqueName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inUse[name] = true
}

func (a *fakeAttachments) callLog() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.calls...)
}
