package csi_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/csi/registry"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/volume"
)

// The whole life of a staged volume used by two pods, with exact requests in
// exact order: NodeStage carries the handle, the staging path, the
// capability (fsType, sorted PV mount options, the access mode for the PV's
// access modes), the volume context, the publish context from attaching and
// the stage secret; NodePublish carries the staging path, the target, the
// publish secret, readonly and the pod's attributes. State files exist
// before the driver is called, and a restarted plugin unpublishes and
// unstages from them alone (Spec nil).
func TestStagePublishUnpublishUnstageSequence(t *testing.T) {
	f := newFixture(t)
	m := f.startRegistered(testDriver, caps{stage: true})
	f.setCSIDriver(&storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: testDriver},
		Spec:       storagev1.CSIDriverSpec{PodInfoOnMount: ptr.To(true), AttachRequired: ptr.To(false)},
	})
	f.setSecret("secrets", "stage", map[string]string{"user": "admin", "password": "s3cret"})
	f.setSecret("secrets", "publish", map[string]string{"token": "t0ken"})
	spec := pvSpec("pv-1", "vol-1", func(pv *v1.PersistentVolume) {
		pv.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}
		pv.Spec.MountOptions = []string{"noatime", "discard", "noatime"}
		pv.Spec.CSI.FSType = "xfs"
		pv.Spec.CSI.VolumeAttributes = map[string]string{"pool": "fast"}
		pv.Spec.CSI.NodeStageSecretRef = &v1.SecretReference{Namespace: "secrets", Name: "stage"}
		pv.Spec.CSI.NodePublishSecretRef = &v1.SecretReference{Namespace: "secrets", Name: "publish"}
	})
	publishContext := map[string]string{"devicePath": "/dev/mock0"}
	capability := mountCap("xfs", []string{"discard", "noatime"}, csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "")
	devReq := f.deviceRequest(spec, publishContext)
	staging := devReq.DeviceMountPath
	podA, podB := pod("uid-a"), pod("uid-b")
	reqA, reqB := f.setUpRequest(spec, podA, publishContext), f.setUpRequest(spec, podB, publishContext)
	reqA.DeviceMountPath, reqB.DeviceMountPath = staging, staging

	publishWant := func(p *volumeRequestPod) *csi.NodePublishVolumeRequest {
		return &csi.NodePublishVolumeRequest{
			VolumeId: "vol-1", PublishContext: publishContext, StagingTargetPath: staging, TargetPath: p.dir,
			VolumeCapability: capability, Secrets: map[string]string{"token": "t0ken"},
			VolumeContext: map[string]string{
				"pool":                                   "fast",
				"csi.storage.k8s.io/pod.name":            p.pod.Name,
				"csi.storage.k8s.io/pod.namespace":       p.pod.Namespace,
				"csi.storage.k8s.io/pod.uid":             string(p.pod.UID),
				"csi.storage.k8s.io/serviceAccount.name": p.pod.ServiceAccount,
				"csi.storage.k8s.io/ephemeral":           "false",
			},
		}
	}
	a := &volumeRequestPod{pod: podA, dir: reqA.Dir}
	b := &volumeRequestPod{pod: podB, dir: reqB.Dir}

	gomock.InOrder(
		m.node.EXPECT().NodeStageVolume(gomock.Any(), eqProto(&csi.NodeStageVolumeRequest{
			VolumeId: "vol-1", PublishContext: publishContext, StagingTargetPath: staging,
			VolumeCapability: capability, Secrets: map[string]string{"user": "admin", "password": "s3cret"},
			VolumeContext: map[string]string{"pool": "fast"},
		})).DoAndReturn(func(context.Context, *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
			// Written before the driver was asked: a crash now still
			// knows what to unstage.
			st, err := csiplugin.ReadDeviceState(f.deviceStateFile(identityOf(spec)))
			if err != nil {
				t.Errorf("no device state file during NodeStageVolume: %v", err)
			} else if st.Driver != testDriver || st.VolumeID != "vol-1" || st.StagingPath != staging || !st.Staged ||
				st.PV != "pv-1" || st.VolumeName != uniqueName(spec) {
				t.Errorf("device state during NodeStageVolume: %+v", st)
			}
			if fi, err := os.Stat(staging); err != nil || !fi.IsDir() {
				t.Errorf("staging directory missing during NodeStageVolume: %v", err)
			}
			return &csi.NodeStageVolumeResponse{}, nil
		}),
		m.node.EXPECT().NodePublishVolume(gomock.Any(), eqProto(publishWant(a))).DoAndReturn(checkPodState(t, f, a, spec, staging)),
		m.node.EXPECT().NodePublishVolume(gomock.Any(), eqProto(publishWant(b))).DoAndReturn(checkPodState(t, f, b, spec, staging)),
		m.node.EXPECT().NodeUnpublishVolume(gomock.Any(), eqProto(&csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: a.dir})).
			Return(&csi.NodeUnpublishVolumeResponse{}, nil),
		m.node.EXPECT().NodeUnpublishVolume(gomock.Any(), eqProto(&csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: b.dir})).
			Return(&csi.NodeUnpublishVolumeResponse{}, nil),
		m.node.EXPECT().NodeUnstageVolume(gomock.Any(), eqProto(&csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging})).
			Return(&csi.NodeUnstageVolumeResponse{}, nil),
	)

	p := f.plugin()
	if err := p.MountDevice(ctx(t), devReq); err != nil {
		t.Fatalf("MountDevice: %v", err)
	}
	if err := p.SetUp(ctx(t), reqA); err != nil {
		t.Fatalf("SetUp pod A: %v", err)
	}
	if err := p.SetUp(ctx(t), reqB); err != nil {
		t.Fatalf("SetUp pod B: %v", err)
	}
	if got := f.secretReads; strings.Join(got, ",") != "secrets/stage,secrets/publish,secrets/publish" {
		t.Errorf("secrets read: %v", got)
	}

	// A restarted agent: a new plugin, nothing but the state files.
	p = f.plugin()
	for _, x := range []*volumeRequestPod{a, b} {
		if err := p.TearDown(ctx(t), f.tearDownRequest(uniqueName(spec), nil, x.pod, spec.Name)); err != nil {
			t.Fatalf("TearDown %s: %v", x.pod.Name, err)
		}
		if exists(t, f.podStateFile(x.pod, spec.Name)) || exists(t, x.dir) {
			t.Errorf("pod state file or target of %s left after TearDown", x.pod.Name)
		}
	}
	unmount := f.deviceRequest(spec, nil)
	unmount.Spec = nil
	if err := p.UnmountDevice(ctx(t), unmount); err != nil {
		t.Fatalf("UnmountDevice: %v", err)
	}
	if exists(t, f.deviceStateFile(identityOf(spec))) || exists(t, staging) {
		t.Errorf("device state file or staging directory left after UnmountDevice")
	}
}

type volumeRequestPod struct {
	pod volume.PodInfo
	dir string
}

// checkPodState checks, from inside NodePublishVolume, that the pod's state
// file was written before the call.
func checkPodState(t *testing.T, f *fixture, p *volumeRequestPod, spec *volume.Spec, staging string) func(context.Context, *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	return func(context.Context, *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
		st, err := csiplugin.ReadPodState(f.podStateFile(p.pod, spec.Name))
		if err != nil {
			t.Errorf("no pod state file during NodePublishVolume: %v", err)
		} else if st.Driver != testDriver || st.VolumeID != spec.PV.Spec.CSI.VolumeHandle || st.TargetPath != p.dir ||
			st.StagingPath != staging || st.PodUID != string(p.pod.UID) || st.SpecName != spec.Name || st.Inline {
			t.Errorf("pod state during NodePublishVolume: %+v", st)
		}
		if fi, err := os.Stat(filepath.Dir(p.dir)); err != nil || !fi.IsDir() {
			t.Errorf("the target's parent is missing during NodePublishVolume: %v", err)
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
}

// inlineHandle is the kubelet's volume ID for an inline volume.
func inlineHandle(podUID, specName string) string {
	sum := sha256.Sum256([]byte(podUID + specName))
	return "csi-" + hex.EncodeToString(sum[:])
}

// NodePublishVolume's content for the cases that change it.
func TestNodePublishRequest(t *testing.T) {
	type tc struct {
		name      string
		caps      caps
		csiDriver *storagev1.CSIDriverSpec // nil: no CSIDriver object
		spec      *volume.Spec
		pod       func(volume.PodInfo) volume.PodInfo
		want      func(req *csiPublishInputs) *csi.NodePublishVolumeRequest
	}
	rwo := csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	cases := []tc{{
		name: "PV, staging driver, no podInfoOnMount", caps: caps{stage: true},
		csiDriver: &storagev1.CSIDriverSpec{},
		spec:      pvSpec("pv-1", "vol-1", func(pv *v1.PersistentVolume) { pv.Spec.CSI.VolumeAttributes = map[string]string{"a": "b"} }),
		want: func(in *csiPublishInputs) *csi.NodePublishVolumeRequest {
			return &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: in.staging, TargetPath: in.dir,
				VolumeCapability: mountCap("ext4", nil, rwo, ""), VolumeContext: map[string]string{"a": "b"}}
		},
	}, {
		name: "PV, requiresRepublish", caps: caps{stage: true},
		csiDriver: &storagev1.CSIDriverSpec{RequiresRepublish: ptr.To(true)},
		spec:      pvSpec("pv-1", "vol-1"),
		want: func(in *csiPublishInputs) *csi.NodePublishVolumeRequest {
			return &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: in.staging, TargetPath: in.dir,
				VolumeCapability: mountCap("ext4", nil, rwo, "")}
		},
	}, {
		name: "PV, driver without staging: no staging path", caps: caps{},
		spec: pvSpec("pv-1", "vol-1"),
		want: func(in *csiPublishInputs) *csi.NodePublishVolumeRequest {
			return &csi.NodePublishVolumeRequest{VolumeId: "vol-1", TargetPath: in.dir, VolumeCapability: mountCap("ext4", nil, rwo, "")}
		},
	}, {
		name: "PV read-only in the pod", caps: caps{stage: true},
		spec: func() *volume.Spec { s := pvSpec("pv-1", "vol-1"); s.ReadOnly = true; return s }(),
		want: func(in *csiPublishInputs) *csi.NodePublishVolumeRequest {
			return &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: in.staging, TargetPath: in.dir,
				VolumeCapability: mountCap("ext4", nil, rwo, ""), Readonly: true}
		},
	}, {
		name: "PV read-only in its source, ReadOnlyMany", caps: caps{stage: true},
		spec: pvSpec("pv-1", "vol-1", func(pv *v1.PersistentVolume) {
			pv.Spec.CSI.ReadOnly = true
			pv.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadOnlyMany}
		}),
		want: func(in *csiPublishInputs) *csi.NodePublishVolumeRequest {
			return &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: in.staging, TargetPath: in.dir,
				VolumeCapability: mountCap("ext4", nil, csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, ""), Readonly: true}
		},
	}, {
		name: "inline, podInfoOnMount, publish secret from the pod's namespace", caps: caps{stage: true},
		csiDriver: &storagev1.CSIDriverSpec{PodInfoOnMount: ptr.To(true), VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}},
		spec: func() *volume.Spec {
			s := inlineSpec("scratch", map[string]string{"size": "1Mi"})
			s.Volume.CSI.FSType = ptr.To("ext3")
			s.Volume.CSI.NodePublishSecretRef = &v1.LocalObjectReference{Name: "inline-secret"}
			return s
		}(),
		want: func(in *csiPublishInputs) *csi.NodePublishVolumeRequest {
			return &csi.NodePublishVolumeRequest{
				VolumeId: inlineHandle(string(in.pod.UID), "scratch"), TargetPath: in.dir,
				VolumeCapability: mountCap("ext3", nil, rwo, ""), Secrets: map[string]string{"k": "v"},
				VolumeContext: map[string]string{
					"size":                                   "1Mi",
					"csi.storage.k8s.io/ephemeral":           "true",
					"csi.storage.k8s.io/pod.name":            in.pod.Name,
					"csi.storage.k8s.io/pod.namespace":       in.pod.Namespace,
					"csi.storage.k8s.io/pod.uid":             string(in.pod.UID),
					"csi.storage.k8s.io/serviceAccount.name": in.pod.ServiceAccount,
				},
			}
		},
	}, {
		name: "inline without podInfoOnMount still says ephemeral", caps: caps{},
		csiDriver: &storagev1.CSIDriverSpec{VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}},
		spec:      inlineSpec("scratch", nil),
		want: func(in *csiPublishInputs) *csi.NodePublishVolumeRequest {
			return &csi.NodePublishVolumeRequest{VolumeId: inlineHandle(string(in.pod.UID), "scratch"), TargetPath: in.dir,
				VolumeCapability: mountCap("", nil, rwo, ""), VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true"}}
		},
	}, {
		name: "fsGroup and VOLUME_MOUNT_GROUP: volume mount group", caps: caps{stage: true, mountGroup: true},
		spec: pvSpec("pv-1", "vol-1"),
		pod:  func(p volume.PodInfo) volume.PodInfo { p.FSGroup = ptr.To[int64](4321); return p },
		want: func(in *csiPublishInputs) *csi.NodePublishVolumeRequest {
			return &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: in.staging, TargetPath: in.dir,
				VolumeCapability: mountCap("ext4", nil, rwo, "4321")}
		},
	}, {
		name: "fsGroup without VOLUME_MOUNT_GROUP: no mount group (the agent applies it)", caps: caps{stage: true},
		spec: pvSpec("pv-1", "vol-1"),
		pod:  func(p volume.PodInfo) volume.PodInfo { p.FSGroup = ptr.To(int64(os.Getegid())); return p },
		want: func(in *csiPublishInputs) *csi.NodePublishVolumeRequest {
			return &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: in.staging, TargetPath: in.dir,
				VolumeCapability: mountCap("ext4", nil, rwo, "")}
		},
	}, {
		name: "VOLUME_MOUNT_GROUP but fsGroupPolicy None: no mount group", caps: caps{stage: true, mountGroup: true},
		csiDriver: &storagev1.CSIDriverSpec{FSGroupPolicy: ptr.To(storagev1.NoneFSGroupPolicy)},
		spec:      pvSpec("pv-1", "vol-1"),
		pod:       func(p volume.PodInfo) volume.PodInfo { p.FSGroup = ptr.To[int64](4321); return p },
		want: func(in *csiPublishInputs) *csi.NodePublishVolumeRequest {
			return &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: in.staging, TargetPath: in.dir,
				VolumeCapability: mountCap("ext4", nil, rwo, "")}
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			m := f.startRegistered(testDriver, c.caps)
			if c.csiDriver != nil {
				f.setCSIDriver(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: testDriver}, Spec: *c.csiDriver})
			}
			f.setSecret("ns-1", "inline-secret", map[string]string{"k": "v"})
			p := pod("uid-1")
			if c.pod != nil {
				p = c.pod(p)
			}
			req := f.setUpRequest(c.spec, p, nil)
			in := &csiPublishInputs{pod: p, dir: req.Dir, staging: req.DeviceMountPath}
			m.node.EXPECT().NodePublishVolume(gomock.Any(), eqProto(c.want(in))).DoAndReturn(
				func(_ context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
					// A driver creates the target.
					return &csi.NodePublishVolumeResponse{}, os.MkdirAll(r.TargetPath, 0o750)
				})
			before := time.Now()
			if err := f.plugin().SetUp(ctx(t), req); err != nil {
				t.Fatalf("SetUp: %v", err)
			}
			republish := c.csiDriver != nil && c.csiDriver.RequiresRepublish != nil && *c.csiDriver.RequiresRepublish
			if republish != !req.RefreshAt.IsZero() || (republish && req.RefreshAt.Before(before.Add(csiplugin.RepublishPeriod))) {
				t.Errorf("RefreshAt = %v, want now + %v exactly for requiresRepublish drivers", req.RefreshAt, csiplugin.RepublishPeriod)
			}
			st, err := csiplugin.ReadPodState(f.podStateFile(p, c.spec.Name))
			if err != nil {
				t.Fatalf("pod state after SetUp: %v", err)
			}
			if st.Inline != (c.spec.PV == nil) || st.VolumeID != c.want(in).VolumeId {
				t.Errorf("pod state %+v", st)
			}
		})
	}
}

type csiPublishInputs struct {
	pod          volume.PodInfo
	dir, staging string
}

// A driver without STAGE_UNSTAGE_VOLUME is never asked to stage or unstage,
// but its device state is still recorded (attachments need it).
func TestNoStagingDriver(t *testing.T) {
	f := newFixture(t)
	f.startRegistered(testDriver, caps{}) // no NodeStage/NodeUnstage expected: any call fails the test
	spec := pvSpec("pv-1", "vol-1")
	p := f.plugin()
	req := f.deviceRequest(spec, nil)
	if err := p.MountDevice(ctx(t), req); err != nil {
		t.Fatalf("MountDevice: %v", err)
	}
	st, err := csiplugin.ReadDeviceState(f.deviceStateFile(identityOf(spec)))
	if err != nil || st.Staged {
		t.Fatalf("device state %+v, %v: want a state with staged=false", st, err)
	}
	if exists(t, req.DeviceMountPath) {
		t.Errorf("staging directory %s created for a driver that does not stage", req.DeviceMountPath)
	}
	req.Spec = nil
	if err := p.UnmountDevice(ctx(t), req); err != nil {
		t.Fatalf("UnmountDevice: %v", err)
	}
	if exists(t, f.deviceStateFile(identityOf(spec))) {
		t.Errorf("device state left after UnmountDevice")
	}
}

// A NodeStageVolume whose outcome is unknown (the call timed out) leaves
// the state file, so a restarted agent unstages the volume with no spec.
func TestUncertainStageThenUnstageFromState(t *testing.T) {
	f := newFixture(t)
	m := f.startRegistered(testDriver, caps{stage: true})
	spec := pvSpec("pv-1", "vol-1")
	req := f.deviceRequest(spec, nil)
	gomock.InOrder(
		m.node.EXPECT().NodeStageVolume(gomock.Any(), gomock.Any()).DoAndReturn(
			func(ctx context.Context, _ *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
				<-ctx.Done() // hang until the caller gives up
				return nil, ctx.Err()
			}),
		m.node.EXPECT().NodeUnstageVolume(gomock.Any(), eqProto(&csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: req.DeviceMountPath})).
			Return(&csi.NodeUnstageVolumeResponse{}, nil),
	)
	short, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := f.plugin().MountDevice(short, req)
	if !volume.IsUncertain(err) {
		t.Fatalf("MountDevice after a timed out NodeStageVolume: %v, want an uncertain error", err)
	}
	req.Spec = nil
	if err := f.plugin().UnmountDevice(ctx(t), req); err != nil {
		t.Fatalf("UnmountDevice from the state file: %v", err)
	}
}

// A driver that is not registered gives a clear, final error naming it,
// and nothing is written or asked.
func TestDriverNotRegistered(t *testing.T) {
	f := newFixture(t)
	spec := pvSpec("pv-1", "vol-1")
	p := f.plugin()
	check := func(what string, err error) {
		t.Helper()
		var nr *registry.NotRegisteredError
		if !errors.As(err, &nr) || nr.Driver != testDriver {
			t.Errorf("%s: %v, want a NotRegisteredError for %s", what, err, testDriver)
			return
		}
		if volume.IsUncertain(err) {
			t.Errorf("%s: %v is uncertain; nothing was asked of any driver", what, err)
		}
		if !strings.Contains(err.Error(), `CSI driver "`+testDriver+`" is not registered`) {
			t.Errorf("%s: message %q does not say which driver is not registered", what, err)
		}
	}
	devReq := f.deviceRequest(spec, nil)
	check("MountDevice", p.MountDevice(ctx(t), devReq))
	if exists(t, f.deviceStateFile(identityOf(spec))) || exists(t, devReq.DeviceMountPath) {
		t.Errorf("MountDevice wrote state or made the staging directory for an unregistered driver")
	}
	podInfo := pod("uid-1")
	check("SetUp", p.SetUp(ctx(t), f.setUpRequest(spec, podInfo, nil)))
	if exists(t, f.podStateFile(podInfo, spec.Name)) {
		t.Errorf("SetUp wrote pod state for an unregistered driver")
	}

	// Teardown from state files of a driver that went away keeps them for
	// the retry.
	m := f.startRegistered(testDriver, caps{stage: true})
	m.node.EXPECT().NodeStageVolume(gomock.Any(), gomock.Any()).Return(&csi.NodeStageVolumeResponse{}, nil)
	m.node.EXPECT().NodePublishVolume(gomock.Any(), gomock.Any()).Return(&csi.NodePublishVolumeResponse{}, nil)
	if err := p.MountDevice(ctx(t), devReq); err != nil {
		t.Fatal(err)
	}
	setUp := f.setUpRequest(spec, podInfo, nil)
	if err := p.SetUp(ctx(t), setUp); err != nil {
		t.Fatal(err)
	}
	m.stop()
	f.drivers.Deregister(testDriver, "", "test")
	check("TearDown", p.TearDown(ctx(t), f.tearDownRequest(setUp.VolumeName, nil, podInfo, spec.Name)))
	devReq.Spec = nil
	check("UnmountDevice", p.UnmountDevice(ctx(t), devReq))
	if !exists(t, f.podStateFile(podInfo, spec.Name)) || !exists(t, f.deviceStateFile(identityOf(spec))) {
		t.Errorf("state files removed although the driver never unpublished or unstaged")
	}
}

// Secrets: a volume naming a secret cannot be staged without it, and a
// plugin that cannot read secrets says so.
func TestSecretErrors(t *testing.T) {
	spec := pvSpec("pv-1", "vol-1", func(pv *v1.PersistentVolume) {
		pv.Spec.CSI.NodeStageSecretRef = &v1.SecretReference{Namespace: "secrets", Name: "missing"}
	})
	f := newFixture(t)
	f.startRegistered(testDriver, caps{stage: true}) // NodeStageVolume must not be called
	err := f.plugin().MountDevice(ctx(t), f.deviceRequest(spec, nil))
	if err == nil || !strings.Contains(err.Error(), "reading secret secrets/missing") || volume.IsUncertain(err) {
		t.Errorf("MountDevice with a missing secret: %v", err)
	}
	f.noSecrets = true
	err = f.plugin().MountDevice(ctx(t), f.deviceRequest(spec, nil))
	if err == nil || !strings.Contains(err.Error(), "cannot read secrets") {
		t.Errorf("MountDevice without a secret reader: %v", err)
	}
}

// A driver whose mounts do not reach the agent's mount namespace (a
// container without Bidirectional propagation, a root directory that is not
// shared) answers NodePublishVolume with success and leaves nothing at the
// target: the pod would write to the node's disk. The publish is uncertain
// (unpublished if the pod goes, retried while it stays) and says why.
func TestPublishedButNotMounted(t *testing.T) {
	spec := pvSpec("pv-1", "vol-1")
	f := newFixture(t)
	f.unseenMounts = true
	m := f.startRegistered(testDriver, caps{})
	m.node.EXPECT().NodePublishVolume(gomock.Any(), gomock.Any()).Return(&csi.NodePublishVolumeResponse{}, nil)
	err := f.plugin().SetUp(ctx(t), f.setUpRequest(spec, pod("uid-1"), nil))
	if err == nil || !volume.IsUncertain(err) || !strings.Contains(err.Error(), "nothing is mounted there") ||
		!strings.Contains(err.Error(), "Bidirectional") {
		t.Errorf("SetUp = %v; want an uncertain error about mount propagation", err)
	}
}
