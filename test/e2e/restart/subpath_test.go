package restart_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/subpath"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// podWithSubPaths mounts sub-paths of a disk emptyDir, a tmpfs and a
// shared local directory PV.
func podWithSubPaths(name string) *corev1.Pod {
	pod := newPod(name, diskVolume("disk"), e2eutil.MemoryVolume("mem"), e2eutil.ClaimVolume("data", "shared"))
	c := &pod.Spec.Containers[0]
	c.Env = []corev1.EnvVar{{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	c.VolumeMounts = append(c.VolumeMounts,
		corev1.VolumeMount{Name: "disk", MountPath: "/out", SubPath: "out"},
		corev1.VolumeMount{Name: "mem", MountPath: "/cache", SubPath: "a/b"},
		corev1.VolumeMount{Name: "data", MountPath: "/mine", SubPathExpr: "pods/$(POD)"},
	)
	return pod
}

// subPathMounts lists the mounts under a pod's volume-subpaths.
func subPathMounts(t *testing.T, root, uid string) []mounttest.Mount {
	return mounttest.MountsUnder(t, filepath.Join(e2eutil.PodDir(root, uid), "volume-subpaths"))
}

// Sub-paths across a crash: the agent is killed, one pod is removed and a
// stray sub-path bind mount is left (what a crash between preparing and a
// spec change can leave) while it is down. After the start, the removed
// pod's sub-paths are gone before its volumes, the stray one is gone, and
// the remaining pod's sub-paths are the same mounts as before (checked,
// not made again), ready through the runtime API.
func TestSubPathsAcrossCrash(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	host := mounttest.TempDir(t)
	shared := mkdirAll(t, filepath.Join(host, "shared"))
	m := e2eutil.NewManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.Write("storage.yaml", localPV("shared", shared, "shared"), e2eutil.PVC("shared", "shared"))
	m.Write("stays.yaml", podWithSubPaths("stays"))
	m.Write("gone.yaml", podWithSubPaths("gone"))
	a.Start()
	a.waitSettled(time.Minute)
	uids := a.podUIDs("stays", "gone")
	stays, gone := uids["stays"], uids["gone"]
	staysSubPaths := subPathMounts(t, root, stays)
	if len(staysSubPaths) != 3 || len(subPathMounts(t, root, gone)) != 3 {
		t.Fatalf("sub-path mounts before: %v", mounttest.MountPoints(mounttest.MountsUnder(t, root)))
	}
	if _, err := os.Stat(filepath.Join(shared, "pods", "gone")); err != nil {
		t.Errorf("subPathExpr directory not created in the PV: %v", err)
	}

	a.Kill()
	m.Remove("gone.yaml")
	stray := e2eutil.SubPathTarget(root, stays, e2eutil.EmptyDirPlugin, "disk", "old-container", 7)
	if err := (subpath.Host{Mounter: mountutil.New()}).Prepare(subpath.Request{VolumeDir: e2eutil.VolumeDir(root, stays, e2eutil.EmptyDirPlugin, "disk"), SubPath: "out", Target: stray}); err != nil {
		t.Fatal(err)
	}
	a.Start()
	e2eutil.PollErr(t, time.Minute, "the removed pod torn down, sub-paths and all", func() error {
		if ms := mounttest.MountsUnder(t, e2eutil.PodDir(root, gone)); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mounttest.MountPoints(ms))
		}
		if mounttest.Exists(t, e2eutil.PodDir(root, gone)) {
			return errors.New("its directory is still there")
		}
		if mounttest.Exists(t, stray) {
			return fmt.Errorf("the stray sub-path %s is still there", stray)
		}
		return nil
	})
	a.waitSettled(time.Minute)
	p, err := a.RuntimeClient().Wait(t.Context(), stays, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := e2eutil.CheckReadyPaths(p); err != nil {
		t.Error(err)
	}
	if got := subPathMounts(t, root, stays); !sameMounts(staysSubPaths, got) {
		t.Errorf("the remaining pod's sub-paths changed: %v -> %v", mounttest.MountPoints(staysSubPaths), mounttest.MountPoints(got))
	}
	checkNoStackedMounts(t, mountCounts(t, root))
	// Only sub-paths were checked: nothing was mounted again.
	ops, err := a.opCounts()
	if err != nil {
		t.Fatal(err)
	}
	for op := range ops {
		if op != "prepare_subpaths" && op != "unmount_volume" {
			t.Errorf("after the restart %s ran: %v", op, ops)
		}
	}
	if got := ops["unmount_volume"]; got[e2eutil.EmptyDirPlugin] != 2 || got[e2eutil.LocalPlugin] != 1 {
		t.Errorf("unmount_volume after the restart: %v, want the removed pod's 3 volumes", got)
	}
	if _, err := os.Stat(filepath.Join(shared, "pods", "gone")); err != nil {
		t.Errorf("the removed pod's data in the PV: %v", err)
	}
}

// A volume is never torn down under a sub-path bind mount of it: while a
// sub-path cannot be removed (something is mounted on top of it, as a
// runtime with shared propagation might do), the removed pod's volume stays
// mounted and the problem is reported; once it can, all goes.
func TestVolumeStaysWhileSubPathBusy(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	m := e2eutil.NewManifests(t)
	a, root := newStandaloneAgent(t, m)
	pod := newPod("busy", e2eutil.MemoryVolume("mem"))
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "mem", MountPath: "/x", SubPath: "x"})
	m.Write("busy.yaml", pod)
	a.Start()
	a.waitSettled(time.Minute)
	uid := a.podUIDs("busy")["busy"]
	target := e2eutil.SubPathTarget(root, uid, e2eutil.EmptyDirPlugin, "mem", "main", 1)
	// A mount below the sub-path's target makes unmounting it fail
	// (EBUSY).
	below := mkdirAll(t, filepath.Join(target, "below"))
	mounttest.MountTmpfs(t, below)

	m.Remove("busy.yaml")
	vol := e2eutil.VolumeDir(root, uid, e2eutil.EmptyDirPlugin, "mem")
	e2eutil.PollErr(t, time.Minute, "the unmount to fail on the busy sub-path", func() error {
		ops, err := a.Operations()
		if err != nil {
			return err
		}
		for _, o := range ops.Operations {
			if o.Operation == "unmount_volume" && strings.Contains(o.LastError, "sub-paths") {
				return nil
			}
		}
		return fmt.Errorf("operations: %+v", ops.Operations)
	})
	if len(mounttest.MountsAt(t, vol)) != 1 {
		t.Fatalf("the volume %s was torn down under a sub-path bind mount of it", vol)
	}
	if err := mounttest.UnmountUnder(below); err != nil {
		t.Fatal(err)
	}
	e2eutil.PollErr(t, time.Minute, "the pod torn down", func() error {
		if ms := mounttest.MountsUnder(t, e2eutil.PodDir(root, uid)); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mounttest.MountPoints(ms))
		}
		if mounttest.Exists(t, e2eutil.PodDir(root, uid)) {
			return errors.New("its directory is still there")
		}
		return nil
	})
}
