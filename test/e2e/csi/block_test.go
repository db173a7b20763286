package csi_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// blockPV creates a raw block volume through the driver, a Block PV for it
// pre-bound to a Block claim of the same name, and the claim.
func (e *env) blockPV(d *csiDriver, name string) csiVolume {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	resp, err := csi.NewControllerClient(d.Conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:          e.ns + "-" + name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER},
		}},
	})
	if err != nil {
		e.t.Fatalf("CreateVolume %s: %v", name, err)
	}
	v := csiVolume{driver: d, handle: resp.GetVolume().GetVolumeId(), pv: e.pvName(name), claim: name}
	pv := e2eutil.PreBoundPV(v.pv, "32Mi", storageClass, e.ns, name, corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
		Driver: d.name, VolumeHandle: v.handle,
	}})
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(storageClass),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")}},
		},
	}
	e2eutil.AsBlock(pv, pvc)
	if _, err := suite.Admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PV %s: %v", v.pv, err)
	}
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PVC %s: %v", name, err)
	}
	suite.WaitBound(e.t, e.ns, name, v.pv)
	return v
}

func (e *env) accessPoint(uid types.UID, specName string) string {
	return e2eutil.DevicePath(e.root, string(uid), e2eutil.CSIPlugin, specName)
}

// A raw block CSI volume (volumeMode Block) of the test driver, used by two
// pods: staged once with the block capability (nothing formatted, nothing
// mounted in the staging directory), published per pod onto the pod's
// access point (a file the driver bind-mounts the device onto), pinned;
// data written through one pod's access point is read through the other's
// and on the driver's device; deleting the pods unpublishes each once,
// unstages once, and leaves no access point, pin or loop device behind and
// the volume unformatted.
func TestBlockVolume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "block")
	d := e.newDriver("drv", driverOptions{})
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	v := e.blockPV(d, "disk")
	a := e.startAgent(agentOptions{args: []string{d.flag()}})

	writer := e.createPod(e2eutil.DevicePod(e.ns, e.node, "writer", e2eutil.ClaimVolume("disk", v.claim)))
	reader := e.createPod(e2eutil.DevicePod(e.ns, e.node, "reader", e2eutil.ClaimVolume("disk", v.claim)))
	apW, apR := e.accessPoint(writer.UID, v.pv), e.accessPoint(reader.UID, v.pv)
	var info struct{ dev string }
	e2eutil.PollErr(t, 60*time.Second, "both access points mapped and pinned", func() error {
		vi, ok := d.Volume(t, v.handle)
		if !ok || vi.LoopDevice == "" {
			return fmt.Errorf("driver's volume: %+v", vi)
		}
		info.dev = vi.LoopDevice
		want, err := e2eutil.Rdev(vi.LoopDevice)
		if err != nil {
			return err
		}
		for _, ap := range []string{apW, apR} {
			if got, err := e2eutil.Rdev(ap); err != nil || got != want {
				return fmt.Errorf("%s: %d, %v (want %d)", ap, got, err, want)
			}
		}
		if pins := e2eutil.Pins(t, e.root); pins[apW] == "" || pins[apR] == "" || len(pins) != 2 {
			return fmt.Errorf("pins %v", pins)
		}
		asw, err := a.ASW()
		if err != nil {
			return err
		}
		av := asw.Volume(v.uniqueName())
		if av == nil || av.Mode != "Block" || av.DeviceMountState != "GloballyMounted" || av.DeviceMountPath != e.stagingPath(v) || len(av.Pods) != 2 {
			return fmt.Errorf("asw: %+v", av)
		}
		for _, p := range av.Pods {
			if p.MountState != "Mounted" || (p.MountPath != apW && p.MountPath != apR) {
				return fmt.Errorf("asw pod: %+v", p)
			}
		}
		return nil
	})
	if ms, _ := mountAt(t, e.stagingPath(v)); ms.MountPoint != "" {
		t.Errorf("something is mounted at the staging directory of a block volume: %+v", ms)
	}

	data := []byte("through the writer's access point")
	if err := e2eutil.WriteAt(apW, 1<<20, data); err != nil {
		t.Fatal(err)
	}
	for _, from := range []string{apR, info.dev} {
		if got, err := e2eutil.ReadAt(from, 1<<20, len(data)); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s reads %q (%v)", from, got, err)
		}
	}
	d.checkCalls(t, map[string]int{"NodeStageVolume": 1, "NodePublishVolume": 2})

	e.deletePod("writer")
	e.deletePod("reader")
	e.waitGone(apW, apR, e.podDir(writer.UID), e.podDir(reader.UID))
	d.waitCalls("NodeUnstageVolume", 1)
	d.checkCalls(t, map[string]int{"NodeStageVolume": 1, "NodePublishVolume": 2, "NodeUnpublishVolume": 2, "NodeUnstageVolume": 1})
	if pins := e2eutil.Pins(t, e.root); len(pins) != 0 {
		t.Errorf("pins left: %v", pins)
	}
	d.waitNoLoopDevices()
	vi, _ := d.Volume(t, v.handle)
	out, _ := exec.Command("blkid", "-p", "-s", "TYPE", "-o", "value", vi.BackingFile).Output()
	if fs := strings.TrimSpace(string(out)); fs != "" {
		t.Errorf("the block volume holds a %s filesystem: it must never be formatted", fs)
	}
	if got, err := e2eutil.ReadAt(vi.BackingFile, 1<<20, len(data)); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the data is gone from the volume: %q (%v)", got, err)
	}
}
