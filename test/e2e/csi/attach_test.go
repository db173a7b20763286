package csi_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// nodeVolumesInUse returns the node's status.volumesInUse.
func (e *env) nodeVolumesInUse(ctx context.Context) ([]corev1.UniqueVolumeName, error) {
	n, err := suite.Admin.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return n.Status.VolumesInUse, nil
}

// waitInUse waits until the node reports (or stops reporting) the volume in
// use.
func (e *env) waitInUse(v csiVolume, want bool) {
	e.t.Helper()
	e2eutil.Poll(e.t, 60*time.Second, fmt.Sprintf("volume %s in the node's volumesInUse: %v", v.uniqueName(), want), func(ctx context.Context) (bool, string) {
		inUse, err := e.nodeVolumesInUse(ctx)
		if err != nil {
			return false, err.Error()
		}
		return slices.Contains(inUse, corev1.UniqueVolumeName(v.uniqueName())) == want, fmt.Sprintf("volumesInUse %v", inUse)
	})
}

// An attach-required driver with the attach/detach controller's part played
// by the test: the agent reports the volume in node.status.volumesInUse
// and waits; the test attaches it through the driver's
// ControllerPublishVolume (as external-attacher would), creates the
// VolumeAttachment under the kubelet's name and marks it attached with
// attachment metadata; the agent then stages with exactly that publish
// context. The agent never writes VolumeAttachments in this mode, and stops
// reporting the volume once it is unstaged.
func TestAttachByController(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "attach-ctrl")
	d := e.newDriver("drv", driverOptions{attachRequired: true, proxy: true})
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(true)})
	v := e.claimPV(d, "data")
	a := e.startAgent(agentOptions{args: []string{d.flag(), "--attach-mode=controller"}})

	pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", v.claim)))
	e.waitInUse(v, true)
	vaName := attachmentName(v.handle, d.name, e.node)
	if got := csiplugin.AttachmentName(v.handle, d.name, e.node); got != vaName {
		t.Errorf("AttachmentName = %s, want the kubelet's %s", got, vaName)
	}
	e2eutil.Poll(t, 30*time.Second, "the agent waiting for the VolumeAttachment", func(context.Context) (bool, string) {
		op, ok := e2eutil.Must(t, a.Operations).Find(v.uniqueName(), "verify_attached")
		return ok && op.State == "backoff" && e2eutil.ContainsAll(op.LastError, "waiting for VolumeAttachment "+vaName), fmt.Sprintf("%+v", op)
	})
	d.checkCalls(t, map[string]int{"NodeStageVolume": 0, "ControllerPublishVolume": 0})
	// Waiting for the controller is normal: no event, an info line, no
	// stack trace (the kubelet says nothing at all).
	e.checkQuietWait(a, "app")

	// The controller's part: attach, then record it.
	ctx := t.Context()
	pub, err := csi.NewControllerClient(d.Conn).ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId: v.handle, NodeId: e.node,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
	})
	if err != nil {
		t.Fatalf("ControllerPublishVolume: %v", err)
	}
	metadata := map[string]string{"e2e-token": e.ns}
	maps.Copy(metadata, pub.GetPublishContext())
	va, err := suite.Admin.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: vaName},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: d.name, NodeName: e.node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(v.pv)},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create VolumeAttachment: %v", err)
	}
	t.Cleanup(func() {
		_ = suite.Admin.StorageV1().VolumeAttachments().Delete(context.Background(), vaName, metav1.DeleteOptions{})
	})
	// An attach error is a failure: a Warning on the pod.
	va.Status = storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{Message: "e2e: no such disk", Time: metav1.Now()}}
	if va, err = suite.Admin.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set the VolumeAttachment's attach error: %v", err)
	}
	ev := e.waitEvent("app", "FailedAttachVolume", "attach failed: e2e: no such disk")
	if ev.Type != corev1.EventTypeWarning {
		t.Errorf("attach error event %+v, want a Warning", ev)
	}
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: metadata}
	if _, err := suite.Admin.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("mark VolumeAttachment attached: %v", err)
	}

	staging, target := e.stagingPath(v), e.publishPath(pod.UID, v.pv)
	e.waitMounted(staging, target)
	checkExt4FromLoop(t, target)
	stages := d.proxy.stageRequests(v.handle)
	if len(stages) != 1 || !maps.Equal(stages[0].GetPublishContext(), metadata) {
		t.Errorf("NodeStageVolume requests %v; want one with publish context %v", stages, metadata)
	}
	d.checkCalls(t, map[string]int{"ControllerPublishVolume": 1}) // the test's own

	e.deletePod("app")
	e.waitGone(target, e.podDir(pod.UID), staging)
	d.waitCalls("NodeUnstageVolume", 1)
	e.waitInUse(v, false)
	// Detaching is the controller's business: the agent leaves it alone.
	got, err := suite.Admin.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
	if err != nil || !got.Status.Attached {
		t.Errorf("VolumeAttachment after the pod was deleted: %+v, %v; want it untouched", got, err)
	}
	d.checkCalls(t, map[string]int{"ControllerUnpublishVolume": 0})
	d.waitNoLoopDevices()
}

// checkQuietWait checks that while the agent waits for the attach/detach
// controller the pod has no Warning event and the agent logs the wait at
// info level, without a stack trace.
func (e *env) checkQuietWait(a *e2eutil.Agent, pod string) {
	e.t.Helper()
	evs, _, err := suite.FindEvents(e.t.Context(), e.ns, fields.Set{"involvedObject.name": pod, "type": corev1.EventTypeWarning})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, ev := range evs {
		e.t.Errorf("Warning event while waiting for the attachment: %s: %s", ev.Reason, ev.Message)
	}
	var lines []string
	// The log is written in batches: wait for the line.
	e2eutil.Poll(e.t, 10*time.Second, "the wait logged at info level", func(context.Context) (bool, string) {
		lines = nil
		waiting := false
		for _, line := range strings.Split(a.Process().Log(), "\n") {
			if strings.Contains(line, `"operation":"verify_attached"`) {
				lines = append(lines, line)
				waiting = waiting || strings.Contains(line, `"msg":"operation waiting"`) && strings.Contains(line, `"level":"info"`)
			}
		}
		return waiting, fmt.Sprintf("verify_attached lines: %q", lines)
	})
	for _, line := range lines {
		if strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"stacktrace"`) {
			e.t.Errorf("the wait was logged as an error or with a stack trace: %s", line)
		}
	}
}

// --attach-mode=self, with deploy/self-attach's RBAC: the agent creates the
// VolumeAttachment under the kubelet's name, attaches through the driver's
// ControllerPublishVolume, marks it attached with the publish context, and
// after the pod is deleted unstages, calls ControllerUnpublishVolume and
// deletes the VolumeAttachment.
func TestSelfAttach(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "attach-self")
	d := e.newDriver("drv", driverOptions{attachRequired: true})
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(true)})
	v := e.claimPV(d, "data")
	e.startAgent(agentOptions{kubeconfig: suite.selfAttachKubeconfig, args: []string{d.flag(), "--attach-mode=self"}})

	pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", v.claim)))
	staging, target := e.stagingPath(v), e.publishPath(pod.UID, v.pv)
	e.waitMounted(staging, target)
	checkExt4FromLoop(t, target)

	ctx := t.Context()
	vaName := attachmentName(v.handle, d.name, e.node)
	va, err := suite.Admin.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the agent's VolumeAttachment %s: %v", vaName, err)
	}
	if va.Spec.Attacher != d.name || va.Spec.NodeName != e.node || ptr.Deref(va.Spec.Source.PersistentVolumeName, "") != v.pv ||
		!va.Status.Attached || va.Status.AttachmentMetadata["attachedTo"] != e.node {
		t.Errorf("VolumeAttachment %s: spec %+v, status %+v", vaName, va.Spec, va.Status)
	}
	info, _ := d.Volume(t, v.handle)
	if !slices.Equal(info.AttachedNodes, []string{e.node}) {
		t.Errorf("driver's attachments of %s: %v, want [%s]", v.handle, info.AttachedNodes, e.node)
	}
	d.checkCalls(t, map[string]int{"ControllerPublishVolume": 1, "NodeStageVolume": 1, "NodePublishVolume": 1})

	e.deletePod("app")
	e.waitGone(target, e.podDir(pod.UID), staging)
	e2eutil.Poll(t, 60*time.Second, "VolumeAttachment "+vaName+" deleted", func(ctx context.Context) (bool, string) {
		_, err := suite.Admin.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	d.checkCalls(t, map[string]int{"NodeUnpublishVolume": 1, "NodeUnstageVolume": 1, "ControllerUnpublishVolume": 1})
	info, _ = d.Volume(t, v.handle)
	if len(info.AttachedNodes) != 0 {
		t.Errorf("driver's attachments after detach: %v", info.AttachedNodes)
	}
	d.waitNoLoopDevices()
}
