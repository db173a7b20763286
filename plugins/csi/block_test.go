package csi_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/volume"
)

func blockPVSpec(name, handle string) *volume.Spec {
	s := pvSpec(name, handle, func(pv *v1.PersistentVolume) {
		pv.Spec.CSI.FSType = ""
		pv.Spec.VolumeMode = ptr.To(v1.PersistentVolumeBlock)
	})
	s.Mode = v1.PersistentVolumeBlock
	return s
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// makeDeviceNode is what a block driver's NodePublishVolume does at the
// target (a device node here; a bind mount of the device works the same).
func makeDeviceNode(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 255))); err != nil {
		t.Errorf("mknod %s: %v", path, err)
	}
}

// A raw block CSI volume: NodeStageVolume and NodePublishVolume with the
// block capability, the staging directory and the pod's access point (a
// file the driver creates; only its parent is made), no fsGroup, no mount
// group, no service-account tokens (as the kubelet); state files say Block
// so a restart reconstructs it as one; and unpublish and unstage undo it.
func TestBlockStagePublishUnpublishUnstage(t *testing.T) {
	mounttest.RequireRoot(t)
	f := newFixture(t)
	// The kubelet passes tokenRequests' tokens to filesystem publishes only.
	tokens := &fakeTokens{}
	f.tokens = tokens
	defer func() {
		if len(tokens.keys) > 0 {
			t.Errorf("tokens requested for a block publish: %v", tokens.keys)
		}
	}()
	m := f.startRegistered(testDriver, caps{stage: true, mountGroup: true})
	f.setCSIDriver(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: testDriver},
		Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false), FSGroupPolicy: ptr.To(storagev1.FileFSGroupPolicy),
			TokenRequests: []storagev1.TokenRequest{{Audience: "vault"}}}})
	p := f.plugin()
	spec := blockPVSpec("pv-blk", "vol-blk")
	capability := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	devReq := f.deviceRequest(spec, nil)
	staging := devReq.DeviceMountPath
	podA := pod("uid-a")
	podA.FSGroup = ptr.To[int64](1234)
	req := f.setUpRequest(spec, podA, nil)
	req.DeviceMountPath = staging
	req.Dir = f.paths.PodDevicePath(podA.UID, csiplugin.Name, spec.Name)
	if err := os.MkdirAll(filepath.Dir(req.Dir), 0o750); err != nil { // the operator does
		t.Fatal(err)
	}

	gomock.InOrder(
		m.node.EXPECT().NodeStageVolume(gomock.Any(), eqProto(&csi.NodeStageVolumeRequest{
			VolumeId: "vol-blk", StagingTargetPath: staging, VolumeCapability: capability,
		})).Return(&csi.NodeStageVolumeResponse{}, nil),
		m.node.EXPECT().NodePublishVolume(gomock.Any(), eqProto(&csi.NodePublishVolumeRequest{
			VolumeId: "vol-blk", StagingTargetPath: staging, TargetPath: req.Dir, VolumeCapability: capability,
		})).DoAndReturn(func(context.Context, *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
			if exists(t, req.Dir) {
				t.Error("the target exists before NodePublishVolume: the driver creates it")
			}
			makeDeviceNode(t, req.Dir)
			return &csi.NodePublishVolumeResponse{}, nil
		}),
		m.node.EXPECT().NodeUnpublishVolume(gomock.Any(), eqProto(&csi.NodeUnpublishVolumeRequest{
			VolumeId: "vol-blk", TargetPath: req.Dir,
		})).Return(&csi.NodeUnpublishVolumeResponse{}, nil),
		m.node.EXPECT().NodeUnstageVolume(gomock.Any(), eqProto(&csi.NodeUnstageVolumeRequest{
			VolumeId: "vol-blk", StagingTargetPath: staging,
		})).Return(&csi.NodeUnstageVolumeResponse{}, nil),
	)

	if err := p.MapDevice(ctx(t), devReq); err != nil {
		t.Fatal(err)
	}
	if err := p.MapPodDevice(ctx(t), req); err != nil {
		t.Fatal(err)
	}

	// A restarted agent finds a Block volume, staged, and a Block access
	// point.
	restarted := f.plugin()
	d, err := restarted.ReconstructDevice(filepath.Dir(staging))
	if err != nil || d == nil || !d.Attributes.Block || !d.Mounted {
		t.Errorf("ReconstructDevice = %+v, %v; want a Block device found staged", d, err)
	}
	name, attrs, err := restarted.ReconstructPodDevice(podA.UID, spec.Name, req.Dir)
	if err != nil || name != uniqueName(spec) || !attrs.Block || attrs.Identity != identityOf(spec) {
		t.Errorf("ReconstructPodDevice = %s, %+v, %v", name, attrs, err)
	}

	td := f.tearDownRequest(uniqueName(spec), nil, podA, spec.Name)
	td.Dir = req.Dir
	if err := restarted.UnmapPodDevice(ctx(t), td); err != nil {
		t.Fatal(err)
	}
	if exists(t, req.Dir) || exists(t, f.podStateFile(podA, spec.Name)) {
		t.Error("access point or pod state left after unmapping")
	}
	unmap := f.deviceRequest(spec, nil)
	unmap.Spec = nil // found on disk after the restart
	if err := restarted.UnmapDevice(ctx(t), unmap); err != nil {
		t.Fatal(err)
	}
	if exists(t, staging) || exists(t, f.deviceStateFile(identityOf(spec))) {
		t.Error("staging directory or state left after unstaging")
	}
}

// A driver that reports success but leaves no block device at the target
// leaves the mapping uncertain: it is retried, or unpublished when no longer
// wanted, never handed to a runtime.
func TestBlockPublishWithoutADevice(t *testing.T) {
	f := newFixture(t)
	m := f.startRegistered(testDriver, caps{})
	p := f.plugin()
	spec := blockPVSpec("pv-blk", "vol-blk")
	req := f.setUpRequest(spec, pod("uid-a"), nil)
	req.Dir = f.paths.PodDevicePath("uid-a", csiplugin.Name, spec.Name)
	if err := os.MkdirAll(filepath.Dir(req.Dir), 0o750); err != nil {
		t.Fatal(err)
	}
	m.node.EXPECT().NodePublishVolume(gomock.Any(), gomock.Any()).DoAndReturn(
		func(_ context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
			if r.GetVolumeCapability().GetBlock() == nil || r.GetStagingTargetPath() != "" {
				t.Errorf("publish of a publish-only block volume: %v", r)
			}
			return &csi.NodePublishVolumeResponse{}, os.WriteFile(r.GetTargetPath(), []byte("a file"), 0o600)
		})
	err := p.MapPodDevice(ctx(t), req)
	if err == nil || !volume.IsUncertain(err) || !strings.Contains(err.Error(), "not a block device") {
		t.Errorf("MapPodDevice = %v, want an uncertain error saying the target is not a block device", err)
	}
}
