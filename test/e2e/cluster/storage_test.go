package cluster_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// An inline CSI volume with a nodePublishSecretRef, served by the real test
// CSI driver (test/csidriver) running as its own process and given to the
// agent with --csi-driver: the agent reads the CSIDriver object, GETs the
// secret (the only per-volume read the ClusterRole allows), publishes the
// volume (a loop device with ext4), and unpublishes it with the pod.
// (Static rather than through a kubelet-style registration socket: when
// this test was written the agent did not watch --plugin-registry-dir yet.)
func TestCSIInlineVolumeWithSecret(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "csi-inline")
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("the test CSI driver needs mkfs.ext4")
	}
	ctx := t.Context()
	driver := e2eutil.StartCSIDriver(t, e2eutil.CSIDriverOptions{
		Binary: suite.CSIDriverBin, Name: "e2e.csi.volume-agent.io", NodeID: e.node,
		StateDir: filepath.Join(e.data, "csi-state"),
	})
	suite.CreateCSIDriver(t, driver.Name(), storagev1.CSIDriverSpec{
		AttachRequired:       ptr.To(false),
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral},
	})
	secret := "csi-credentials"
	if _, err := suite.Admin.CoreV1().Secrets(e.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret},
		StringData: map[string]string{"token": "e2e"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.start("--csi-driver=" + driver.Name() + "=" + driver.Endpoint())

	pod := e.createPod(e.pod("csi", corev1.Volume{Name: "inline", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
		Driver:               driver.Name(),
		VolumeAttributes:     map[string]string{"size": "16Mi"},
		NodePublishSecretRef: &corev1.LocalObjectReference{Name: secret},
	}}}))
	e.waitCondition("csi", corev1.ConditionTrue, "VolumesMounted")
	var ext4 []mounttest.Mount
	for _, m := range mounttest.MountsUnder(t, e.podDir(pod.UID)) {
		if m.FSType == "ext4" {
			ext4 = append(ext4, m)
		}
	}
	if len(ext4) != 1 {
		t.Fatalf("want one ext4 mount (the published volume) under %s, got %+v", e.podDir(pod.UID), ext4)
	}
	mounttest.WriteFile(t, filepath.Join(ext4[0].MountPoint, "hello"), "world")
	t.Logf("published at %s (%s from %s)", ext4[0].MountPoint, ext4[0].FSType, ext4[0].Source)

	e2eutil.Poll(t, 30*time.Second, "the agent's GET of the secret in the audit log", func(context.Context) (bool, string) {
		events, err := suite.Cluster.AuditEvents()
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range events {
			if ev.UserAgent == "volume-agent/"+e.node && ev.Verb == "get" && ev.ObjectRef != nil && ev.ObjectRef.Resource == "secrets" &&
				ev.ObjectRef.Namespace == e.ns && ev.ObjectRef.Name == secret && ev.ResponseStatus != nil && ev.ResponseStatus.Code == 200 {
				return true, ""
			}
		}
		return false, "not logged"
	})

	e.deletePod("csi", 0)
	e.waitTornDown(pod.UID)
}

// A local PV on a block device (a loop device the agent formats with ext4)
// grows: the test grows the device and plays the external resizer
// (e2eutil's ControlPlane.PlayResizer: claim request, claim status
// allocatedResources, PV capacity, NodeResizePending, as since Kubernetes
// 1.34); the agent grows the filesystem and reports the new capacity on the
// claim's status.
//
// Online growth of a mounted ext4 needs CAP_SYS_RESOURCE. Where the kernel
// refuses it (as on the VM this suite was written on), the agent must say so
// on the claim (NodeResizeError condition) and grow the filesystem offline
// the next time it mounts the device: the test then replaces the pod.
func TestLocalBlockVolumeExpansion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "expand")
	for _, tool := range []string{"mkfs.ext4", "resize2fs", "e2fsck"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	ctx := t.Context()
	small, large := resource.MustParse("64Mi"), resource.MustParse("128Mi")
	dev := mounttest.LoopDevice(t, small.Value()) // detached after the agent stops (registered first)

	// Claims of class "manual" (no StorageClass object) cannot be resized:
	// the PersistentVolumeClaimResize admission plugin wants a class that
	// allows expansion. This one provisions nothing.
	class := e.ns + "-expandable"
	suite.CreateStorageClass(t, &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: class},
		Provisioner:          "kubernetes.io/no-provisioner",
		AllowVolumeExpansion: ptr.To(true),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingImmediate),
	})
	pvName := e.pvName("disk")
	pv := e2eutil.PreBoundPV(pvName, small.String(), class, e.ns, "disk",
		corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dev, FSType: ptr.To("ext4")}})
	pv.Spec.NodeAffinity = e2eutil.NodeAffinity(corev1.LabelHostname, e.node)
	if _, err := suite.Admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec := claimSpec()
	spec.StorageClassName = ptr.To(class)
	spec.Resources.Requests[corev1.ResourceStorage] = small
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "disk"}, Spec: spec,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitBound("disk", pvName)
	e.start()

	pod := e.createPod(e.pod("db", e2eutil.ClaimVolume("disk", "disk")))
	path := e.volumePath(pod.UID, e2eutil.LocalPlugin, pvName)
	e.waitMounted(path)
	e.waitCondition("db", corev1.ConditionTrue, "VolumesMounted")
	before := mounttest.FSSize(t, path)
	if m := mounttest.MountAt(t, path); m.FSType != "ext4" {
		t.Fatalf("%s is %s, want the ext4 the agent made", path, m.FSType)
	}
	mounttest.WriteFile(t, filepath.Join(path, "data"), "kept across the resize")

	// The device grows (as a cloud disk would after ControllerExpandVolume);
	// the user asks for more; the resizer records it.
	mounttest.GrowLoop(t, dev, large.Value())
	suite.PlayResizer(t, e.ns, "disk", pvName, large.String())
	claims := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns)

	// Grown, or refused with the reason on the claim.
	var resizeErr *corev1.PersistentVolumeClaimCondition
	grown := func(ctx context.Context) (bool, string) {
		pvc, err := claims.Get(ctx, "disk", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got := pvc.Status.Capacity[corev1.ResourceStorage]
		_, pending := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
		done := got.Cmp(large) == 0 && !pending
		for _, c := range pvc.Status.Conditions {
			if c.Type == corev1.PersistentVolumeClaimNodeResizeError {
				if done {
					return false, "capacity updated, but the NodeResizeError condition is still there"
				}
				resizeErr = c.DeepCopy()
			}
		}
		return done, fmt.Sprintf("capacity %s, allocatedResourceStatuses %v, conditions %+v", got.String(), pvc.Status.AllocatedResourceStatuses, pvc.Status.Conditions)
	}
	e2eutil.Poll(t, 60*time.Second, "the agent grows the volume or reports why not on the claim", func(ctx context.Context) (bool, string) {
		done, why := grown(ctx)
		return done || resizeErr != nil, why
	})
	if done, _ := grown(ctx); !done {
		t.Logf("online growth refused, reported on the claim as %s: %s", resizeErr.Reason, resizeErr.Message)
		if !strings.Contains(resizeErr.Message, "resize") {
			t.Errorf("NodeResizeError message %q does not say what failed", resizeErr.Message)
		}
		// Offline: the device is unmounted with its last pod and grown
		// before it is mounted for the next.
		e.deletePod("db", 0)
		e.waitTornDown(pod.UID)
		globalMount := e2eutil.GlobalMount(e.root, e2eutil.LocalPlugin, pvName)
		e2eutil.Poll(t, 60*time.Second, "the device unmounted", func(context.Context) (bool, string) {
			return !mounted(t, globalMount), globalMount + " still mounted"
		})
		pod = e.createPod(e.pod("db-2", e2eutil.ClaimVolume("disk", "disk")))
		path = e.volumePath(pod.UID, e2eutil.LocalPlugin, pvName)
		e.waitMounted(path)
		e.waitCondition("db-2", corev1.ConditionTrue, "VolumesMounted")
	}
	e2eutil.Poll(t, 60*time.Second, "the agent reports the new capacity on the claim", grown)
	after := mounttest.FSSize(t, path)
	t.Logf("filesystem at %s: %d MiB before, %d MiB after", path, before>>20, after>>20)
	if after <= before || after < small.Value() {
		t.Errorf("the filesystem did not grow: %d bytes before, %d after", before, after)
	}
	if got := mounttest.ReadFile(t, filepath.Join(path, "data")); got != "kept across the resize" {
		t.Errorf("data after the resize: %q", got)
	}
}
