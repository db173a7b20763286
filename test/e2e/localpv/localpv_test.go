package localpv_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

const (
	capacityMetric = "volume_agent_local_volume_capacity_bytes"
	volumesMetric  = "volume_agent_local_volumes"
	cleanupsMetric = "volume_agent_local_volume_cleanups_total"
)

func roundDown(b int64) int64 {
	if b >= 10<<30 {
		return b >> 30 << 30
	}
	return b >> 20 << 20
}

// The whole life of Filesystem volumes: a tmpfs and an ext4 loop mount in
// the discovery directory become PVs with the right capacity and node
// affinity, a block device becomes a Filesystem PV with the class's fsType,
// the real binder binds claims, the real agent mounts them into a pod
// (formatting the device), and once pod and claims are deleted the
// Released PVs are cleaned, deleted and created again Available.
func TestFilesystemLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "lpv-fs")
	class := e.class("fast")
	e.storageClass(class, corev1.PersistentVolumeReclaimDelete)
	disc := e.dir("disks")
	tmpfsDir, ext4Dir, blankLink := filepath.Join(disc, "tmpfs1"), filepath.Join(disc, "ext4"), filepath.Join(disc, "blank")
	e.tmpfs(tmpfsDir, "64m")
	e.ext4(ext4Dir, 128<<20)
	e.dir("disks/plain")
	blank := mounttest.LoopDevice(t, 64<<20)
	must(t, os.Symlink(blank, blankLink))

	// A mount point an administrator's PV already uses is left alone.
	takenDir := filepath.Join(disc, "taken")
	e.tmpfs(takenDir, "8m")
	admin := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: e.name + "-admin"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "manual-" + e.name,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: takenDir}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{e.hostname}}},
			}}}},
		},
	}
	if _, err := suite.Admin.CoreV1().PersistentVolumes().Create(t.Context(), admin, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	e.writeConfig(fmt.Sprintf("storageClasses:\n  %s:\n    discoveryDir: %s\n    fsType: ext4\n    labels: {example.com/tier: fast}\n", class, disc))
	start := time.Now()
	pr := e.startProvisioner()
	tmpPV := e.waitAvailable(tmpfsDir, "")
	extPV := e.waitAvailable(ext4Dir, "")
	blkPV := e.waitAvailable(blankLink, "")
	t.Logf("3 PVs Available %v after start", time.Since(start).Round(time.Millisecond))

	var sfs unix.Statfs_t
	must(t, unix.Statfs(ext4Dir, &sfs))
	extBytes := roundDown(int64(sfs.Blocks) * sfs.Frsize)
	for _, c := range []struct {
		pv       *corev1.PersistentVolume
		name     string
		capacity int64
		fsType   string
	}{
		{tmpPV, "local-" + e.node + "-" + class + "-tmpfs1", 64 << 20, ""},
		{extPV, "local-" + e.node + "-" + class + "-ext4", extBytes, ""},
		{blkPV, "local-" + e.node + "-" + class + "-blank", 64 << 20, "ext4"},
	} {
		pv := c.pv
		q := pv.Spec.Capacity[corev1.ResourceStorage]
		fsType := ""
		if pv.Spec.Local.FSType != nil {
			fsType = *pv.Spec.Local.FSType
		}
		if pv.Name != c.name || q.Value() != c.capacity || fsType != c.fsType || affinityHostname(pv) != e.hostname ||
			pv.Spec.StorageClassName != class || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
			*pv.Spec.VolumeMode != corev1.PersistentVolumeFilesystem || pv.Labels["example.com/tier"] != "fast" {
			t.Errorf("PV %s: capacity %s, fsType %q, affinity %q, spec %+v, labels %v; want name %s, capacity %d, fsType %q, hostname %s",
				pv.Name, q.String(), fsType, affinityHostname(pv), pv.Spec, pv.Labels, c.name, c.capacity, c.fsType, e.hostname)
		}
	}
	if v := pr.waitState(filepath.Join(disc, "plain"), localpv.StateSkipped); !strings.Contains(v.Reason, "not a mount point") {
		t.Errorf("plain directory: %+v", v)
	}
	if v := pr.waitState(takenDir, localpv.StateSkipped); !strings.Contains(v.Reason, "used by PV "+admin.Name) {
		t.Errorf("taken: %+v", v)
	}
	// Metrics follow the provisioner's passes, which follow its caches.
	e2eutil.Poll(t, 30*time.Second, "the capacity metric", func(context.Context) (bool, string) {
		got, want := pr.gauge(capacityMetric, map[string]string{"class": class, "mode": "Filesystem"}), float64(64<<20+extBytes+64<<20)
		return got == want, fmt.Sprintf("%v, want %v", got, want)
	})

	// The binder binds claims; the agent mounts them into a pod.
	e.claim("data", tmpPV)
	e.claim("dev", blkPV)
	a := e.startAgent()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: e.ns},
		Spec: corev1.PodSpec{
			NodeName:                     e.node,
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", VolumeMounts: []corev1.VolumeMount{
				{Name: "data", MountPath: "/data"}, {Name: "dev", MountPath: "/dev-data"},
			}}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}},
				{Name: "dev", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "dev"}}},
			},
		},
	}
	pod, err := suite.Admin.CoreV1().Pods(e.ns).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dataPath, devPath := volumePath(a, string(pod.UID), tmpPV.Name), volumePath(a, string(pod.UID), blkPV.Name)
	e2eutil.Poll(t, 60*time.Second, "the pod's volumes mounted", func(context.Context) (bool, string) {
		for _, p := range []string{dataPath, devPath} {
			if len(mounttest.MountsAt(t, p)) == 0 {
				return false, p + " not mounted"
			}
		}
		return true, ""
	})
	mounttest.WriteFile(t, filepath.Join(dataPath, "secret"), "tenant 1")
	mounttest.WriteFile(t, filepath.Join(devPath, "secret"), "tenant 1")
	if mounttest.ReadFile(t, filepath.Join(tmpfsDir, "secret")) != "tenant 1" {
		t.Fatal("the pod's mount is not the discovered disk")
	}
	if fs := mounttest.DiskFormat(t, blank); fs != "ext4" {
		t.Fatalf("the agent did not format the device as the PV's fsType: %q", fs)
	}
	pr.waitState(tmpfsDir, localpv.StateBound)

	// Pod and claims go: the volumes are Released, cleaned, deleted and
	// made again, Available, under the same names.
	if err := suite.Admin.CoreV1().Pods(e.ns).Delete(t.Context(), "app", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	e2eutil.Poll(t, 60*time.Second, "the pod's volumes unmounted", func(context.Context) (bool, string) {
		n := len(mounttest.MountsUnder(t, filepath.Join(a.Root(), "pods")))
		return n == 0, fmt.Sprintf("%d mounts left", n)
	})
	e.deleteClaim("data")
	e.deleteClaim("dev")
	newTmp := e.waitAvailable(tmpfsDir, tmpPV.UID)
	newBlk := e.waitAvailable(blankLink, blkPV.UID)
	if newTmp.Name != tmpPV.Name || newBlk.Name != blkPV.Name {
		t.Errorf("recreated as %s and %s, want the same names", newTmp.Name, newBlk.Name)
	}
	if names, _ := os.ReadDir(tmpfsDir); len(names) != 0 {
		t.Errorf("the tmpfs still holds %v", names)
	}
	if fs := mounttest.DiskFormat(t, blank); fs != "" {
		t.Errorf("the device still has a %s filesystem", fs)
	}
	e.waitPVEvent(tmpPV.Name, localpv.ReasonCleaned, tmpfsDir)
	if got := pr.gauge(cleanupsMetric, map[string]string{"class": class, "result": "success"}); got != 2 {
		t.Errorf("successful cleanups metric %v, want 2", got)
	}
	// The ext4 PV nobody claimed was never touched.
	if pv, _ := e.pvAt(t.Context(), ext4Dir); pv == nil || pv.UID != extPV.UID {
		t.Errorf("the unclaimed PV changed: %+v", pv)
	}
}

// A Block class on a loop device (linked from the discovery directory):
// a Block PV of the device's size, which the agent maps into a pod as a raw
// block volume; once released, wipefs cleans it and the PV comes back.
func TestBlockClass(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "lpv-block")
	class := e.class("raw")
	e.storageClass(class, corev1.PersistentVolumeReclaimDelete)
	disc := e.dir("raw")
	dev := mounttest.LoopDevice(t, 48<<20)
	mounttest.Mkfs(t, "ext4", dev)
	link := filepath.Join(disc, "disk0")
	must(t, os.Symlink(dev, link))
	mounttest.WriteFile(t, filepath.Join(disc, "notes.txt"), "not a disk")
	e.writeConfig(fmt.Sprintf("storageClasses:\n  %s:\n    discoveryDir: %s\n    volumeMode: Block\n    blockCleanup: {method: wipefs}\n", class, disc))
	pr := e.startProvisioner()

	pv := e.waitAvailable(link, "")
	q := pv.Spec.Capacity[corev1.ResourceStorage]
	if *pv.Spec.VolumeMode != corev1.PersistentVolumeBlock || q.Value() != 48<<20 || pv.Spec.Local.FSType != nil || affinityHostname(pv) != e.hostname {
		t.Fatalf("PV %s: mode %s, capacity %s, spec %+v", pv.Name, *pv.Spec.VolumeMode, q.String(), pv.Spec)
	}
	if v := pr.waitState(filepath.Join(disc, "notes.txt"), localpv.StateSkipped); !strings.Contains(v.Reason, "neither a directory nor a block device (a regular file)") {
		t.Errorf("notes.txt: %+v", v)
	}
	e.claim("raw", pv)
	pr.waitState(link, localpv.StateBound)

	// The agent maps the provisioned Block PV into a pod (volumeDevices):
	// the pod's access point is the device behind the link, and nothing
	// formats it.
	a := e.startAgent()
	pod, err := suite.Admin.CoreV1().Pods(e.ns).Create(t.Context(),
		e2eutil.DevicePod(e.ns, e.node, "app", e2eutil.ClaimVolume("raw", "raw")), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ap := e2eutil.DevicePath(a.Root(), string(pod.UID), e2eutil.LocalPlugin, pv.Name)
	want, err := e2eutil.Rdev(dev)
	if err != nil {
		t.Fatal(err)
	}
	e2eutil.PollErr(t, 60*time.Second, "the pod's block volume mapped", func() error {
		got, err := e2eutil.Rdev(ap)
		if err != nil || got != want {
			return fmt.Errorf("%s: %d, %v (want %d)", ap, got, err, want)
		}
		return nil
	})
	if err := e2eutil.WriteAt(ap, 1<<20, []byte("tenant 1")); err != nil {
		t.Fatal(err)
	}
	if fs := mounttest.DiskFormat(t, dev); fs != "ext4" {
		t.Errorf("the mapped device's filesystem changed to %q: a Block volume must never be formatted", fs)
	}
	if err := suite.Admin.CoreV1().Pods(e.ns).Delete(t.Context(), "app", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	e2eutil.PollErr(t, 60*time.Second, "the access point gone", func() error {
		if mounttest.Exists(t, ap) {
			return fmt.Errorf("%s still there", ap)
		}
		return nil
	})

	e.deleteClaim("raw")
	again := e.waitAvailable(link, pv.UID)
	if fs := mounttest.DiskFormat(t, dev); fs != "" {
		t.Errorf("the device still has a %s filesystem after wipefs", fs)
	}
	if again.Name != pv.Name || *again.Spec.VolumeMode != corev1.PersistentVolumeBlock {
		t.Errorf("recreated %+v", again)
	}
}

// A cleaner that fails: an event on the PV, retries with backoff, the PV is
// never deleted. Deleted by an administrator, the PV is not made again
// while the disk is dirty. A configuration change (no restart) to a working
// method lets the next retry clean it, and the disk is offered again.
func TestFailingCleaner(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "lpv-fail")
	class := e.class("raw")
	e.storageClass(class, corev1.PersistentVolumeReclaimDelete)
	disc := e.dir("raw")
	dev := mounttest.LoopDevice(t, 16<<20)
	mounttest.Mkfs(t, "ext4", dev)
	link := filepath.Join(disc, "disk0")
	must(t, os.Symlink(dev, link))
	fail := filepath.Join(t.TempDir(), "fail.sh")
	must(t, os.WriteFile(fail, []byte("#!/bin/sh\necho \"refusing to clean $LOCAL_PV_BLKDEVICE\" >&2\nexit 1\n"), 0o755))
	cfg := "storageClasses:\n  %s:\n    discoveryDir: %s\n    volumeMode: Block\n    blockCleanup: %s\n"
	e.writeConfig(fmt.Sprintf(cfg, class, disc, "{method: command, command: ["+fail+"]}"))
	pr := e.startProvisioner()

	pv := e.waitAvailable(link, "")
	e.claim("raw", pv)
	e.deleteClaim("raw")
	ev := e.waitPVEvent(pv.Name, localpv.ReasonCleanupFailed, "exited with status 1", "refusing to clean "+dev)
	t.Logf("event: %s %s: %s", ev.Type, ev.Reason, ev.Message)
	if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.UID != pv.UID {
		t.Errorf("event %+v", ev)
	}
	e2eutil.Poll(t, 60*time.Second, "retries", func(context.Context) (bool, string) {
		for _, c := range pr.p.Status().Cleanups {
			if c.UID == pv.UID {
				return c.Attempts >= 3 && c.State == localpv.CleanupFailed, fmt.Sprintf("%+v", c)
			}
		}
		return false, "no cleanup"
	})
	// A retry in progress shows the volume as cleaning for a moment: the
	// failure is what it settles on between attempts.
	e2eutil.Poll(t, 60*time.Second, "the volume reported as failing to clean", func(ctx context.Context) (bool, string) {
		v, _ := pr.volume(link)
		return v.State == localpv.StateCleanupFailed && strings.Contains(v.LastError, "exited with status 1"), fmt.Sprintf("%+v", v)
	})
	if got := e.waitPhase(pv.Name, corev1.VolumeReleased); got.UID != pv.UID {
		t.Fatal("the PV was replaced")
	}
	if fs := mounttest.DiskFormat(t, dev); fs != "ext4" {
		t.Fatalf("the device was changed: %q", fs)
	}
	if got := pr.gauge(cleanupsMetric, map[string]string{"class": class, "result": "failure"}); got < 3 {
		t.Errorf("failed cleanups metric %v", got)
	}
	// Repeated identical failures are aggregated into one event.
	e2eutil.Poll(t, 60*time.Second, "the event's count to grow", func(ctx context.Context) (bool, string) {
		ev := e.waitPVEvent(pv.Name, localpv.ReasonCleanupFailed)
		return ev.Count >= 2, fmt.Sprintf("count %d", ev.Count)
	})

	// An administrator deletes the PV: its disk still holds the last
	// tenant's data, so it is not offered again until a cleanup succeeds.
	if err := suite.Admin.CoreV1().PersistentVolumes().Delete(t.Context(), pv.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2eutil.Poll(t, 60*time.Second, "the PV deleted", func(ctx context.Context) (bool, string) {
		got, err := e.pvAt(ctx, link)
		return err == nil && got == nil, fmt.Sprint(got, err)
	})
	pr.waitPasses(3)
	if got, _ := e.pvAt(t.Context(), link); got != nil {
		t.Fatalf("an uncleaned disk was offered again as %s", got.Name)
	}
	e2eutil.Poll(t, 60*time.Second, "the deleted PV's disk reported as not cleaned", func(ctx context.Context) (bool, string) {
		v, _ := pr.volume(link)
		return v.State == localpv.StateCleanupFailed && strings.Contains(v.Reason, "deleted before its disk was cleaned"), fmt.Sprintf("%+v", v)
	})

	e.writeConfig(fmt.Sprintf(cfg, class, disc, "{method: wipefs}"))
	e.waitAvailable(link, pv.UID)
	if fs := mounttest.DiskFormat(t, dev); fs != "" {
		t.Errorf("the device still has a %s filesystem", fs)
	}
}

// A disk unmounted while its PV is Bound: the PV is kept, reported as
// missing (status, event, metric), and when its claim goes away it is not
// cleaned (nothing to clean) nor deleted. Remounted, it is cleaned and
// offered again.
func TestMissingDisk(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "lpv-missing")
	class := e.class("fast")
	e.storageClass(class, corev1.PersistentVolumeReclaimDelete)
	disc := e.dir("disks")
	diskDir := filepath.Join(disc, "d1")
	dev := e.ext4(diskDir, 32<<20)
	mounttest.WriteFile(t, filepath.Join(diskDir, "marker"), "tenant 1")
	e.writeConfig(fmt.Sprintf("storageClasses:\n  %s: {discoveryDir: %s}\n", class, disc))
	pr := e.startProvisioner()
	pv := e.waitAvailable(diskDir, "")
	e.claim("data", pv)
	pr.waitState(diskDir, localpv.StateBound)

	must(t, unix.Unmount(diskDir, 0))
	v := pr.waitState(diskDir, localpv.StateMissing)
	if !strings.Contains(v.Reason, "no longer a mount point") || v.PV != pv.Name {
		t.Errorf("status %+v", v)
	}
	e.waitPVEvent(pv.Name, localpv.ReasonMissing, diskDir, "no longer a mount point")
	if got := pr.gauge(volumesMetric, map[string]string{"class": class, "state": "missing"}); got != 1 {
		t.Errorf("missing metric %v", got)
	}

	e.deleteClaim("data")
	e.waitPhase(pv.Name, corev1.VolumeReleased)
	pr.waitPasses(3)
	if got, err := suite.Admin.CoreV1().PersistentVolumes().Get(t.Context(), pv.Name, metav1.GetOptions{}); err != nil || got.UID != pv.UID {
		t.Fatalf("the PV of a missing disk was deleted: %v", err)
	}
	if v, _ := pr.volume(diskDir); v.State != localpv.StateMissing {
		t.Fatalf("status %+v", v)
	}
	for _, c := range pr.p.Status().Cleanups {
		if c.UID == pv.UID {
			t.Fatalf("a missing disk was cleaned: %+v", c)
		}
	}

	// Back: the old tenant's data is still there, so it is cleaned first.
	mounttest.MountDevice(t, dev, diskDir, "ext4")
	if mounttest.ReadFile(t, filepath.Join(diskDir, "marker")) != "tenant 1" {
		t.Fatal("the data changed while the disk was away")
	}
	again := e.waitAvailable(diskDir, pv.UID)
	if _, err := os.Stat(filepath.Join(diskDir, "marker")); !os.IsNotExist(err) {
		t.Errorf("the old tenant's data is offered again: %v", err)
	}
	e.waitPVEvent(pv.Name, localpv.ReasonBack, diskDir)
	if again.Name != pv.Name {
		t.Errorf("recreated as %s", again.Name)
	}
	e2eutil.Poll(t, 30*time.Second, "the missing metric back to 0", func(context.Context) (bool, string) {
		got := pr.gauge(volumesMetric, map[string]string{"class": class, "state": "missing"})
		return got == 0, fmt.Sprint(got)
	})
}

// The configuration changes while the provisioner runs: a new class is
// picked up without a restart, a broken file keeps the previous
// configuration, a broken class keeps its previous definition, and a
// class whose StorageClass is missing reports it without stopping the
// others until the StorageClass appears.
func TestConfigReload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "lpv-config")
	a, b, c := e.class("a"), e.class("b"), e.class("c")
	e.storageClass(a, corev1.PersistentVolumeReclaimDelete)
	e.storageClass(b, corev1.PersistentVolumeReclaimRetain)
	dirA, dirB, dirC := e.dir("a"), e.dir("b"), e.dir("c")
	for _, d := range []string{dirA, dirB, dirC} {
		e.tmpfs(filepath.Join(d, "1"), "4m")
	}
	classA := fmt.Sprintf("  %s: {discoveryDir: %s}\n", a, dirA)
	e.writeConfig("storageClasses:\n" + classA)
	pr := e.startProvisioner()
	e.waitAvailable(filepath.Join(dirA, "1"), "")

	e.writeConfig("storageClasses:\n" + classA + fmt.Sprintf("  %s: {discoveryDir: %s}\n", b, dirB))
	pvB := e.waitAvailable(filepath.Join(dirB, "1"), "")
	if pvB.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Errorf("class b's PV has policy %s, want the StorageClass's Retain", pvB.Spec.PersistentVolumeReclaimPolicy)
	}

	// A broken file: both classes stay in force.
	e.writeConfig("storageClasses: [\n")
	e2eutil.Poll(t, 30*time.Second, "the bad file reported", func(context.Context) (bool, string) {
		errs := pr.p.Status().Config.Errors
		return len(errs) == 1 && strings.Contains(errs[0], "not valid YAML"), fmt.Sprint(errs)
	})
	e.tmpfs(filepath.Join(dirA, "2"), "4m")
	e.tmpfs(filepath.Join(dirB, "2"), "4m")
	e.waitAvailable(filepath.Join(dirA, "2"), "")
	e.waitAvailable(filepath.Join(dirB, "2"), "")

	// A broken class b (its previous definition is kept), a new class c
	// without its StorageClass (reported, the others go on).
	e.writeConfig("storageClasses:\n" + classA + fmt.Sprintf("  %s: {discoveryDir: %s, volumeMode: Raw}\n  %s: {discoveryDir: %s}\n", b, dirB, c, dirC))
	e2eutil.Poll(t, 30*time.Second, "the bad class reported", func(context.Context) (bool, string) {
		errs := pr.p.Status().Config.Errors
		return len(errs) == 1 && strings.Contains(errs[0], fmt.Sprintf(`storage class %q: volumeMode: "Raw" is neither Filesystem nor Block`, b)), fmt.Sprint(errs)
	})
	if got := pr.gauge("volume_agent_local_volume_config_errors", nil); got != 1 {
		t.Errorf("config errors metric %v", got)
	}
	v := pr.waitState(filepath.Join(dirC, "1"), localpv.StateSkipped)
	if !strings.Contains(v.Reason, fmt.Sprintf("StorageClass %q not found", c)) {
		t.Errorf("class c: %+v", v)
	}
	e.tmpfs(filepath.Join(dirB, "3"), "4m")
	e.waitAvailable(filepath.Join(dirB, "3"), "")
	classes := map[string]localpv.ClassStatus{}
	for _, cs := range pr.p.Status().Classes {
		classes[cs.Name] = cs
	}
	if classes[b].VolumeMode != corev1.PersistentVolumeFilesystem || !strings.Contains(classes[c].Error, "not found") || classes[a].Error != "" {
		t.Errorf("classes %+v", classes)
	}

	e.storageClass(c, corev1.PersistentVolumeReclaimDelete)
	e.waitAvailable(filepath.Join(dirC, "1"), "")
}

// The provisioner stops in the middle of a slow cleanup: the cleaner is
// killed, the PV is not deleted, and the next provisioner cleans it again
// from scratch before deleting and recreating it. A PV created just before
// a crash (its deterministic name already taken) is adopted, not
// duplicated.
func TestRestartDuringCleanup(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "lpv-restart")
	class := e.class("raw")
	e.storageClass(class, corev1.PersistentVolumeReclaimDelete)
	disc := e.dir("raw")
	dev := mounttest.LoopDevice(t, 16<<20)
	mounttest.Mkfs(t, "ext4", dev)
	link := filepath.Join(disc, "disk0")
	must(t, os.Symlink(dev, link))
	tmp := t.TempDir()
	logFile, gate := filepath.Join(tmp, "starts"), filepath.Join(tmp, "gate")
	slow := filepath.Join(tmp, "slow.sh")
	must(t, os.WriteFile(slow, []byte(fmt.Sprintf(`#!/bin/sh
echo "$$" >> %s
while [ ! -e %s ]; do sleep 0.05; done
exec wipefs -a "$LOCAL_PV_BLKDEVICE"
`, logFile, gate)), 0o755))
	e.writeConfig(fmt.Sprintf("storageClasses:\n  %s:\n    discoveryDir: %s\n    volumeMode: Block\n    blockCleanup: {method: command, command: [%s]}\n", class, disc, slow))

	// The PV as a provisioner that crashed right after creating it left
	// it (before its cache showed it).
	name := localpv.PVName(localpv.DefaultNamePattern, e.node, class, "disk0")
	half := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{localpv.AnnProvisionedBy: localpv.ProvisionerName(e.node)}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              class,
			VolumeMode:                    ptr.To(corev1.PersistentVolumeBlock),
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: link}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{e.hostname}}},
			}}}},
		},
	}
	if _, err := suite.Admin.CoreV1().PersistentVolumes().Create(t.Context(), half, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pr := e.startProvisioner()
	pv := e.waitAvailable(link, "")
	pr.waitState(link, localpv.StateAvailable)
	pr.waitPasses(2)
	if pv.Name != name || countPVs(t, e, link) != 1 {
		t.Fatalf("the half-created PV was not adopted: %s, %d PVs at the path", pv.Name, countPVs(t, e, link))
	}

	e.claim("raw", pv)
	e.deleteClaim("raw")
	e2eutil.Poll(t, 60*time.Second, "the cleaner started", func(context.Context) (bool, string) {
		return len(starts(t, logFile)) == 1, fmt.Sprint(starts(t, logFile))
	})
	pr.waitState(link, localpv.StateCleaning)
	pr.stop()
	first := starts(t, logFile)[0]
	if err := unix.Kill(atoi(t, first), 0); err == nil {
		t.Errorf("the cleaner (pid %s) outlived the provisioner", first)
	}
	if got := e.waitPhase(pv.Name, corev1.VolumeReleased); got.UID != pv.UID {
		t.Fatal("the PV was deleted before its cleanup finished")
	}
	if fs := mounttest.DiskFormat(t, dev); fs != "ext4" {
		t.Fatalf("device: %q", fs)
	}

	e.startProvisioner()
	e2eutil.Poll(t, 60*time.Second, "the cleaner started again", func(context.Context) (bool, string) {
		return len(starts(t, logFile)) == 2, fmt.Sprint(starts(t, logFile))
	})
	mounttest.WriteFile(t, gate, "")
	again := e.waitAvailable(link, pv.UID)
	if fs := mounttest.DiskFormat(t, dev); fs != "" {
		t.Errorf("the device still has a %s filesystem", fs)
	}
	if again.Name != name || len(starts(t, logFile)) != 2 {
		t.Errorf("recreated as %s after %d cleaner runs", again.Name, len(starts(t, logFile)))
	}
}

func countPVs(t *testing.T, e *env, path string) int {
	t.Helper()
	list, err := suite.Admin.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, pv := range list.Items {
		if pv.Spec.Local != nil && pv.Spec.Local.Path == path {
			n++
		}
	}
	return n
}

func starts(t *testing.T, path string) []string {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(data))
}

func atoi(t *testing.T, s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}
