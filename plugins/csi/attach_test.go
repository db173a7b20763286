package csi_test

import (
	"crypto/sha256"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/plugins"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/volume"
)

// attachmentName is the kubelet's and the attach/detach controller's name of
// a VolumeAttachment, computed independently of the plugin.
func attachmentName(handle, driver, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

func TestAttachmentName(t *testing.T) {
	if got, want := csiplugin.AttachmentName("vol-1", testDriver, nodeName), attachmentName("vol-1", testDriver, nodeName); got != want {
		t.Errorf("AttachmentName = %s, want %s", got, want)
	}
}

func attachRequest(spec *volume.Spec) *plugins.AttachRequest {
	return &plugins.AttachRequest{VolumeName: uniqueName(spec), Spec: spec}
}

// Controller mode: the agent only waits, and only trusts an attachment once
// the node reports the volume in use.
func TestAttachController(t *testing.T) {
	f := newFixture(t)
	f.startRegistered(testDriver, caps{stage: true, controllerPublish: true}) // no controller call may happen
	spec := pvSpec("pv-1", "vol-1")
	name := attachmentName("vol-1", testDriver, nodeName)
	p := f.plugin()
	attach := func() (*plugins.AttachResult, error) { return p.Attach(ctx(t), attachRequest(spec)) }

	// Attached, but not reported in use: not trusted yet.
	f.attachments.put(&storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: storagev1.VolumeAttachmentStatus{Attached: true}})
	if _, err := attach(); err == nil || !strings.Contains(err.Error(), "reported in use") {
		t.Errorf("Attach before volumesInUse: %v", err)
	}
	f.attachments.setInUse(uniqueName(spec))
	f.attachments.Delete(ctx(t), name)
	if _, err := attach(); err == nil || !strings.Contains(err.Error(), "waiting for VolumeAttachment "+name) {
		t.Errorf("Attach without a VolumeAttachment: %v", err)
	}
	f.attachments.put(&storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if _, err := attach(); err == nil || !strings.Contains(err.Error(), "to be attached") {
		t.Errorf("Attach before status.attached: %v", err)
	}
	f.attachments.put(&storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{Message: "no such disk"}}})
	if _, err := attach(); err == nil || !strings.Contains(err.Error(), "no such disk") || volume.IsUncertain(err) {
		t.Errorf("Attach with an attach error: %v", err)
	}
	// Out of attach slots: the driver's allocatable count is out of date,
	// and the node-info manager hears of it (another error does not tell).
	var outOfSlots []string
	f.outOfAttachSlots = func(driver string) { outOfSlots = append(outOfSlots, driver) }
	p = f.plugin()
	if _, err := attach(); err == nil || len(outOfSlots) != 0 {
		t.Errorf("Attach with another attach error: %v; out of slots %v", err, outOfSlots)
	}
	f.attachments.put(&storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{Message: "too many volumes", ErrorCode: ptr.To(int32(codes.ResourceExhausted))}}})
	if _, err := attach(); err == nil || !slices.Equal(outOfSlots, []string{testDriver}) {
		t.Errorf("Attach out of slots: %v; out of slots %v", err, outOfSlots)
	}
	meta := map[string]string{"lun": "3"}
	f.attachments.put(&storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: meta}})
	res, err := attach()
	if err != nil || !reflect.DeepEqual(res.PublishContext, meta) {
		t.Fatalf("Attach = %+v, %v; want publish context %v", res, err, meta)
	}
	if calls := f.attachments.callLog(); len(calls) != 1 { // the test's own delete
		t.Errorf("controller mode wrote VolumeAttachments: %v", calls)
	}
	// Detach leaves the attachment to the controller.
	if err := p.Detach(ctx(t), attachRequest(spec)); err != nil {
		t.Errorf("Detach: %v", err)
	}
	if calls := f.attachments.callLog(); len(calls) != 1 {
		t.Errorf("controller mode detach wrote VolumeAttachments: %v", calls)
	}
}

// Self mode: the agent records the attachment, creates the VolumeAttachment,
// calls ControllerPublishVolume with the driver's node ID and marks it
// attached with the publish context; Detach (from the state file alone)
// calls ControllerUnpublishVolume and deletes the VolumeAttachment.
func TestAttachSelf(t *testing.T) {
	f := newFixture(t)
	f.attachMode = csiplugin.AttachSelf
	m := f.startRegistered(testDriver, caps{stage: true, controllerPublish: true})
	f.setSecret("secrets", "ctrl", map[string]string{"key": "value"})
	spec := pvSpec("pv-1", "vol-1", func(pv *v1.PersistentVolume) {
		pv.Spec.CSI.ControllerPublishSecretRef = &v1.SecretReference{Namespace: "secrets", Name: "ctrl"}
		pv.Spec.CSI.VolumeAttributes = map[string]string{"pool": "fast"}
	})
	name := attachmentName("vol-1", testDriver, nodeName)
	publishContext := map[string]string{"devicePath": "/dev/mock7"}
	gomock.InOrder(
		m.controller.EXPECT().ControllerPublishVolume(gomock.Any(), eqProto(&csi.ControllerPublishVolumeRequest{
			VolumeId: "vol-1", NodeId: testNodeID,
			VolumeCapability: mountCap("ext4", nil, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, ""),
			Secrets:          map[string]string{"key": "value"}, VolumeContext: map[string]string{"pool": "fast"},
		})).Return(&csi.ControllerPublishVolumeResponse{PublishContext: publishContext}, nil),
		m.controller.EXPECT().ControllerUnpublishVolume(gomock.Any(), eqProto(&csi.ControllerUnpublishVolumeRequest{
			VolumeId: "vol-1", NodeId: testNodeID,
		})).Return(&csi.ControllerUnpublishVolumeResponse{}, nil),
	)
	res, err := f.plugin().Attach(ctx(t), attachRequest(spec))
	if err != nil || !reflect.DeepEqual(res.PublishContext, publishContext) {
		t.Fatalf("Attach = %+v, %v", res, err)
	}
	va, ok := f.attachments.Get(name)
	if !ok {
		t.Fatalf("no VolumeAttachment %s", name)
	}
	if va.Spec.Attacher != testDriver || va.Spec.NodeName != nodeName || va.Spec.Source.PersistentVolumeName == nil ||
		*va.Spec.Source.PersistentVolumeName != "pv-1" || !va.Status.Attached || !reflect.DeepEqual(va.Status.AttachmentMetadata, publishContext) {
		t.Errorf("VolumeAttachment %+v", va)
	}
	st, err := csiplugin.ReadDeviceState(f.deviceStateFile(identityOf(spec)))
	if err != nil || st.Attachment != name || st.AttachMode != csiplugin.AttachSelf {
		t.Errorf("device state %+v, %v: want the attachment recorded", st, err)
	}

	// Attached already (a second pass): nothing is asked again.
	if res, err := f.plugin().Attach(ctx(t), attachRequest(spec)); err != nil || !reflect.DeepEqual(res.PublishContext, publishContext) {
		t.Errorf("second Attach = %+v, %v", res, err)
	}

	// Detach after a restart, from the state file.
	if err := f.plugin().Detach(ctx(t), &plugins.AttachRequest{VolumeName: uniqueName(spec)}); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if _, ok := f.attachments.Get(name); ok {
		t.Errorf("VolumeAttachment %s still exists after Detach", name)
	}
	if want := []string{"create " + name, "patch " + name, "delete " + name}; !reflect.DeepEqual(f.attachments.callLog(), want) {
		t.Errorf("VolumeAttachment calls %v, want %v", f.attachments.callLog(), want)
	}
	if exists(t, f.deviceStateFile(identityOf(spec))) {
		t.Errorf("device state left after Detach")
	}
}

// Standalone: ControllerPublishVolume is called directly, no
// VolumeAttachment.
func TestAttachLocal(t *testing.T) {
	f := newFixture(t)
	f.attachMode = csiplugin.AttachLocal
	f.attachments = nil
	m := f.startRegistered(testDriver, caps{stage: true, controllerPublish: true})
	spec := pvSpec("pv-1", "vol-1")
	gomock.InOrder(
		m.controller.EXPECT().ControllerPublishVolume(gomock.Any(), gomock.Any()).
			Return(&csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"a": "b"}}, nil),
		m.controller.EXPECT().ControllerUnpublishVolume(gomock.Any(), eqProto(&csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-1", NodeId: testNodeID})).
			Return(&csi.ControllerUnpublishVolumeResponse{}, nil),
	)
	p := f.plugin()
	if _, err := p.Attach(ctx(t), attachRequest(spec)); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if err := p.Detach(ctx(t), &plugins.AttachRequest{VolumeName: uniqueName(spec)}); err != nil {
		t.Fatalf("Detach: %v", err)
	}
}
