package expansion_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

func blockCapability() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// deviceSize is the size of the block device at path.
func deviceSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, io.SeekEnd)
}

// A raw block CSI volume in use grows on the controller; the node finishes
// with NodeExpandVolume (block capability, the pod's access point as the
// volume path, once, with no filesystem to grow), the device the pod has
// grows, and the claim's status and an event say so.
func TestCSIBlockOnlineExpansion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "csi-block-grow")
	drv := e.startDriver()
	resp, err := drv.ctrl.CreateVolume(t.Context(), &csi.CreateVolumeRequest{
		Name: "data", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib}, VolumeCapabilities: []*csi.VolumeCapability{blockCapability()},
	})
	if err != nil {
		t.Fatal(err)
	}
	handle := resp.GetVolume().GetVolumeId()
	pv := e2eutil.PreBoundPV(e.pvName("data"), "64Mi", storageClass, e.ns, "data",
		corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: drv.Name(), VolumeHandle: handle}})
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(storageClass),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
		},
	}
	e2eutil.AsBlock(pv, pvc)
	e.createPV(pv)
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	suite.WaitBound(t, e.ns, "data", pv.Name)
	vol := e2eutil.CSIPlugin + "/" + drv.Name() + "^" + handle
	e.start("--csi-driver=" + drv.Name() + "=" + drv.Endpoint())
	pod := suite.CreatePod(t, e2eutil.DevicePod(e.ns, e.node, "app", e2eutil.ClaimVolume("data", "data")))
	ap := e2eutil.DevicePath(e.root, string(pod.UID), e2eutil.CSIPlugin, pv.Name)
	e2eutil.Poll(t, 60*time.Second, "the access point mapped", func(context.Context) (bool, string) {
		n, err := deviceSize(ap)
		return err == nil && n == 64*mib, fmt.Sprintf("%d bytes (%v)", n, err)
	})

	g, err := drv.ctrl.ControllerExpandVolume(t.Context(), &csi.ControllerExpandVolumeRequest{
		VolumeId: handle, CapacityRange: &csi.CapacityRange{RequiredBytes: 96 * mib}, VolumeCapability: blockCapability(),
	})
	if err != nil || !g.GetNodeExpansionRequired() {
		t.Fatalf("ControllerExpandVolume: %v, %v", g, err)
	}
	suite.PlayResizer(t, e.ns, "data", pv.Name, "96Mi")
	e.checkExpansionReported("data", "app", vol, "96Mi")
	e.waitEvent("Pod", "app", corev1.EventTypeNormal, "FileSystemResizeSuccessful", "raw block volume")
	if n, err := deviceSize(ap); err != nil || n != 96*mib {
		t.Errorf("the pod's device has %d bytes (%v), want %d", n, err, 96*mib)
	}
	if n := drv.calls(t, "NodeExpandVolume"); n != 1 {
		t.Errorf("NodeExpandVolume called %d times, want 1", n)
	}
}
