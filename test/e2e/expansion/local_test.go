package expansion_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func localVolumeName(pv string) string { return e2eutil.LocalPlugin + "/" + pv }

// waitDeviceReleased waits until the agent has unmounted the device and
// forgotten the volume (no pod uses it any more).
func (e *env) waitDeviceReleased(dev, volName string) {
	e.t.Helper()
	e2eutil.Poll(e.t, 60*time.Second, "device "+dev+" unmounted by the agent", func(context.Context) (bool, string) {
		if deviceMounted(e.t, dev) {
			return false, dev + " is still mounted"
		}
		if v := volume(e.t, e.agent, volName); v != nil {
			return false, fmt.Sprintf("still in /debug/asw: %+v", v)
		}
		return true, ""
	})
}

// waitASWSize waits until /debug/asw records the size the node made the
// volume's filesystem fit.
func (e *env) waitASWSize(volName, size string) {
	e.t.Helper()
	e2eutil.Poll(e.t, 30*time.Second, "/debug/asw size of "+volName, func(context.Context) (bool, string) {
		v := volume(e.t, e.agent, volName)
		if v == nil {
			return false, "volume not in /debug/asw"
		}
		return v.Size == size, fmt.Sprintf("size %q, resizeBlocked %q", v.Size, v.ResizeBlocked)
	})
}

// checkExpansionReported checks what the node reports after growing the
// claim's volume to size for the pod: the claim's status, a
// FileSystemResizeSuccessful event on the pod and on the claim, the size in
// /debug/asw and no desired size left in /debug/dsw.
func (e *env) checkExpansionReported(claim, pod, volName, size string) {
	e.t.Helper()
	pvc := e.waitClaimExpanded(claim, size)
	if a, ok := pvc.Status.AllocatedResources[corev1.ResourceStorage]; ok && a.Cmp(resource.MustParse(size)) != 0 {
		e.t.Errorf("allocatedResources %s changed; it is the controller's", a.String())
	}
	e.waitEvent("Pod", pod, corev1.EventTypeNormal, "FileSystemResizeSuccessful", size)
	e.waitEvent("PersistentVolumeClaim", claim, corev1.EventTypeNormal, "FileSystemResizeSuccessful", size)
	e.waitASWSize(volName, size)
	e2eutil.Poll(e.t, 30*time.Second, "no desired size left in /debug/dsw", func(context.Context) (bool, string) {
		s := desiredSize(e.t, e.agent, volName)
		return s == "", "desiredSize " + s
	})
}

// (a) Offline expansion of an ext4 local block PV: the device grows while no
// pod uses the volume; when a pod comes back, the agent grows the filesystem
// before the pod gets it (e2fsck + resize2fs on the unmounted device, which
// needs no privilege the kernel may refuse), then reports the new size.
func TestLocalExt4OfflineBeforePublish(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "ext4-offline")
	dev := mounttest.LoopDevice(t, 100*mib)
	pv := e.createLocalPV("data", "data", dev, "ext4", "100Mi")
	e.createClaim("data", "100Mi", pv.Name)
	e.start()
	vol := localVolumeName(pv.Name)

	writer := e.createPod("writer", "data", false)
	path := e.podMountPath(vol, writer.UID)
	before := mounttest.FSSize(t, path)
	if err := os.WriteFile(filepath.Join(path, "marker"), []byte("written before the expansion"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v := volume(t, e.agent, vol); v.Size != "" {
		t.Errorf("/debug/asw size %q before any expansion, want none", v.Size)
	}
	e.deletePod(writer)
	e.waitDeviceReleased(dev, vol)

	mounttest.GrowLoop(t, dev, 200*mib)
	suite.PlayResizer(e.t, e.ns, "data", pv.Name, "200Mi")

	reader := e.createPod("reader", "data", false)
	path = e.podMountPath(vol, reader.UID)
	// Grown before the pod's mount existed: the first look at it already
	// shows the new size. (The online path cannot have done it: the pod's
	// mount is the first moment it could run, and resize2fs of a mounted
	// ext4 needs a capability this machine may lack.)
	now := mounttest.FSSize(t, path)
	t.Logf("filesystem: %d bytes on the 100 MiB device, %d bytes on the 200 MiB one at the pod's first look", before, now)
	if !grownTo(now, before, 100*mib, 200*mib) {
		t.Errorf("the pod got a filesystem of %d bytes (was %d): not grown to the 200 MiB device before publishing", now, before)
	}
	if data, err := os.ReadFile(filepath.Join(path, "marker")); err != nil || string(data) != "written before the expansion" {
		t.Errorf("data after the expansion: %q, %v", data, err)
	}
	e.checkExpansionReported("data", "reader", vol, "200Mi")
	e.noEvent("PersistentVolumeClaim", "data", "VolumeResizeFailed")
}

// (b) Online expansion of an ext4 local block PV while its pod runs. Where
// the kernel refuses (resize2fs of a mounted ext4 needs CAP_SYS_RESOURCE),
// TestLocalExt4OnlineRefusedThenOffline runs instead.
func TestLocalExt4Online(t *testing.T) {
	t.Parallel()
	suite.Require(t)
	if why := onlineExt4Refused(t); why != "" {
		t.Skipf("skipping: this kernel refuses to grow a mounted ext4 filesystem (%s); TestLocalExt4OnlineRefusedThenOffline covers this machine", why)
	}
	e := newEnv(t, "ext4-online")
	dev := mounttest.LoopDevice(t, 100*mib)
	pv := e.createLocalPV("data", "data", dev, "ext4", "100Mi")
	e.createClaim("data", "100Mi", pv.Name)
	e.start()
	vol := localVolumeName(pv.Name)
	pod := e.createPod("app", "data", false)
	path := e.podMountPath(vol, pod.UID)
	before := mounttest.FSSize(t, path)

	mounttest.GrowLoop(t, dev, 200*mib)
	suite.PlayResizer(e.t, e.ns, "data", pv.Name, "200Mi")
	e2eutil.Poll(t, 60*time.Second, "the pod's filesystem grown online", func(context.Context) (bool, string) {
		now := mounttest.FSSize(t, path)
		return grownTo(now, before, 100*mib, 200*mib), fmt.Sprintf("%d bytes (was %d)", now, before)
	})
	e.checkExpansionReported("data", "app", vol, "200Mi")
}

// (b, where the kernel refuses online ext4 growth) The agent tries online,
// fails as the kernel says, and reports it: a VolumeResizeFailed event and a
// NodeResizeError condition, with the claim still NodeResizeInProgress. When
// the pod is restarted, the offline path grows the filesystem before the new
// pod gets it and the error is cleared.
func TestLocalExt4OnlineRefusedThenOffline(t *testing.T) {
	t.Parallel()
	suite.Require(t)
	why := onlineExt4Refused(t)
	if why == "" {
		t.Skip("skipping: this kernel grows mounted ext4 filesystems; TestLocalExt4Online covers it")
	}
	t.Logf("online ext4 growth is refused here: %s", why)
	e := newEnv(t, "ext4-refused")
	dev := mounttest.LoopDevice(t, 100*mib)
	pv := e.createLocalPV("data", "data", dev, "ext4", "100Mi")
	e.createClaim("data", "100Mi", pv.Name)
	e.start()
	vol := localVolumeName(pv.Name)
	first := e.createPod("first", "data", false)
	path := e.podMountPath(vol, first.UID)
	before := mounttest.FSSize(t, path)

	mounttest.GrowLoop(t, dev, 200*mib)
	suite.PlayResizer(e.t, e.ns, "data", pv.Name, "200Mi")
	e.waitEvent("PersistentVolumeClaim", "data", corev1.EventTypeWarning, "VolumeResizeFailed", "Permission denied")
	e2eutil.Poll(t, 30*time.Second, "PVC data: NodeResizeError, still in progress", func(context.Context) (bool, string) {
		pvc := e.claim("data")
		c := pvcCondition(pvc, corev1.PersistentVolumeClaimNodeResizeError)
		capacity := pvc.Status.Capacity[corev1.ResourceStorage]
		return c != nil && c.Status == corev1.ConditionTrue && strings.Contains(c.Message, "Permission denied") &&
			pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] == corev1.PersistentVolumeClaimNodeResizeInProgress &&
			capacity.Cmp(resource.MustParse("100Mi")) == 0, describeClaimStatus(pvc)
	})
	if now := mounttest.FSSize(t, path); now != before {
		t.Errorf("filesystem changed from %d to %d bytes although resize2fs failed", before, now)
	}
	if v := volume(t, e.agent, vol); v.Size != "" || v.ResizeBlocked != "" {
		t.Errorf("/debug/asw size %q, resizeBlocked %q: want neither (an ordinary failure, retried with backoff)", v.Size, v.ResizeBlocked)
	}

	e.deletePod(first)
	e.waitDeviceReleased(dev, vol)
	second := e.createPod("second", "data", false)
	path = e.podMountPath(vol, second.UID)
	if now := mounttest.FSSize(t, path); !grownTo(now, before, 100*mib, 200*mib) {
		t.Errorf("the restarted pod got a filesystem of %d bytes (was %d): not grown offline", now, before)
	}
	e.checkExpansionReported("data", "second", vol, "200Mi")
}

// (b) Online expansion of an xfs local block PV (xfs_growfs on the mount)
// while its pod runs. mkfs.xfs wants at least 300 MiB.
func TestLocalXFSOnline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "xfs-online")
	requireTools(t, "mkfs.xfs", "xfs_growfs")
	dev := mounttest.LoopDevice(t, 320*mib)
	pv := e.createLocalPV("data", "data", dev, "xfs", "320Mi")
	e.createClaim("data", "320Mi", pv.Name)
	e.start()
	vol := localVolumeName(pv.Name)
	pod := e.createPod("app", "data", false)
	path := e.podMountPath(vol, pod.UID)
	before := mounttest.FSSize(t, path)

	mounttest.GrowLoop(t, dev, 400*mib)
	suite.PlayResizer(e.t, e.ns, "data", pv.Name, "400Mi")
	e2eutil.Poll(t, 60*time.Second, "the pod's xfs grown online", func(context.Context) (bool, string) {
		now := mounttest.FSSize(t, path)
		return grownTo(now, before, 320*mib, 400*mib), fmt.Sprintf("%d bytes (was %d)", now, before)
	})
	t.Logf("xfs: %d bytes before, %d after", before, mounttest.FSSize(t, path))
	e.checkExpansionReported("data", "app", vol, "400Mi")
	e.noEvent("PersistentVolumeClaim", "data", "VolumeResizeFailed")
}
