package csi_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

const (
	// storageClass is set on every PV and PVC; no StorageClass object
	// exists, so the binder binds statically and never provisions.
	storageClass = "manual"
	csiPlugin    = "kubernetes.io/csi"
	csiPluginDir = "kubernetes.io~csi"
)

// env is one test's world: a Node, a namespace, directories and, once
// started, an agent and drivers.
type env struct {
	t     *testing.T
	node  string
	ns    string
	root  string // the agent's --root-dir
	data  string // driver state directories (backing files)
	sock  string // sockets: a short path (sun_path holds 108 bytes)
	logs  string
	agent *agent
}

// newEnv skips the test if the suite is not set up, makes the test's
// directories, and creates the Node <name>-node and the namespace <name>.
//
// Cleanups run in reverse order: processes started later (drivers, agent)
// stop first; then everything under the root is unmounted; then loop devices
// whose backing files are under the test's directories are detached (a
// test that ends cleanly has none: that is an error).
func newEnv(t *testing.T, name string) *env {
	t.Helper()
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	name = uniqueEnvName(name)
	e := &env{t: t, node: name + "-node", ns: name, logs: t.TempDir(), data: mounttest.Real(t.TempDir())}
	t.Cleanup(func() { detachLoops(t, e.data, !t.Failed()) })
	mounttest.CleanupMounts(t, e.data)
	e.root = mounttest.TempDir(t)
	sock, err := os.MkdirTemp("", "csie2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	e.sock = sock

	ctx := t.Context()
	if _, err := suite.cluster.CreateNode(ctx, e.node, nil); err != nil {
		t.Fatalf("create node: %v", err)
	}
	if _, err := suite.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	eventually(t, 30*time.Second, "the namespace's default ServiceAccount", func(ctx context.Context) (bool, string) {
		_, err := suite.admin.CoreV1().ServiceAccounts(e.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	return e
}

var envNames = struct {
	sync.Mutex
	used map[string]int
}{used: map[string]int{}}

// uniqueEnvName makes names unique within the suite's cluster when a test
// runs more than once (-count).
func uniqueEnvName(name string) string {
	envNames.Lock()
	defer envNames.Unlock()
	envNames.used[name]++
	if n := envNames.used[name]; n > 1 {
		return fmt.Sprintf("%s-%d", name, n)
	}
	return name
}

// eventually calls cond every 100 ms until it reports done, failing the test
// after timeout with cond's last explanation.
func eventually(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	last := ""
	for {
		done, why := cond(ctx)
		if done {
			return
		}
		last = why
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not after %v: %s", what, timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// --- API objects ---

// csiDriverObject creates the CSIDriver object of a driver; it is deleted
// when the test ends.
func (e *env) csiDriverObject(d *csiDriver, spec storagev1.CSIDriverSpec) {
	e.t.Helper()
	obj := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: d.name}, Spec: spec}
	if _, err := suite.admin.StorageV1().CSIDrivers().Create(e.t.Context(), obj, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create CSIDriver %s: %v", d.name, err)
	}
	e.t.Cleanup(func() {
		_ = suite.admin.StorageV1().CSIDrivers().Delete(context.Background(), d.name, metav1.DeleteOptions{})
	})
}

// pvName is a cluster-wide unique PV name for this test.
func (e *env) pvName(name string) string { return e.ns + "-" + name }

// csiVolume is a CSI volume with a PV and a claim bound to it.
type csiVolume struct {
	driver *csiDriver
	handle string
	pv     string
	claim  string
}

// uniqueName is the agent's name of the volume.
func (v csiVolume) uniqueName() string { return csiPlugin + "/" + v.driver.name + "^" + v.handle }

// claimPV creates a volume through the driver, a PV with spec.csi for it
// (pre-bound to a claim of the same name, so the binder cannot give it to
// another test) and the claim, and waits until the binder has bound them.
func (e *env) claimPV(d *csiDriver, name string, mutate ...func(*corev1.PersistentVolume)) csiVolume {
	e.t.Helper()
	v := csiVolume{driver: d, handle: d.createVolume(name), pv: e.pvName(name), claim: name}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: v.pv},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              storageClass,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: d.name, VolumeHandle: v.handle, FSType: "ext4",
				VolumeAttributes: map[string]string{"test": e.ns},
			}},
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: e.ns, Name: name},
		},
	}
	for _, m := range mutate {
		m(pv)
	}
	ctx := e.t.Context()
	if _, err := suite.admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PV %s: %v", v.pv, err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(storageClass),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")}},
		},
	}
	if _, err := suite.admin.CoreV1().PersistentVolumeClaims(e.ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PVC %s: %v", name, err)
	}
	eventually(e.t, 60*time.Second, "PVC "+name+" bound to "+v.pv, func(ctx context.Context) (bool, string) {
		got, err := suite.admin.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == corev1.ClaimBound && got.Spec.VolumeName == v.pv,
			fmt.Sprintf("phase %s, volume %q", got.Status.Phase, got.Spec.VolumeName)
	})
	return v
}

func claimVolume(name, claim string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}}
}

// pod returns a pod on the test's node whose one container mounts every
// volume (the agent only mounts volumes some container uses).
func (e *env) pod(name string, vols ...corev1.Volume) *corev1.Pod {
	c := corev1.Container{Name: "main", Image: "registry.k8s.io/pause:3.10"}
	for _, v := range vols {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/mnt/" + v.Name})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{
			NodeName:                     e.node,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{c},
			Volumes:                      vols,
		},
	}
}

func (e *env) createPod(pod *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	got, err := suite.admin.CoreV1().Pods(pod.Namespace).Create(e.t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return got
}

// deletePod deletes a pod at once (there is no kubelet to wait for).
func (e *env) deletePod(name string) {
	e.t.Helper()
	if err := suite.admin.CoreV1().Pods(e.ns).Delete(e.t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		e.t.Fatalf("delete pod %s: %v", name, err)
	}
}

// waitEvent waits for an event on the pod with the reason whose message
// contains every one of the given strings, and returns it.
func (e *env) waitEvent(pod, reason string, contains ...string) *corev1.Event {
	e.t.Helper()
	var found *corev1.Event
	eventually(e.t, 60*time.Second, fmt.Sprintf("a %s event on pod %s containing %q", reason, pod, contains), func(ctx context.Context) (bool, string) {
		list, err := suite.admin.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": pod, "reason": reason}.String(),
		})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
	next:
		for i := range list.Items {
			ev := &list.Items[i]
			seen = append(seen, ev.Message)
			for _, s := range contains {
				if !strings.Contains(ev.Message, s) {
					continue next
				}
			}
			found = ev
			return true, ""
		}
		return false, fmt.Sprintf("events: %q", seen)
	})
	return found
}

// --- paths and mounts ---

// publishPath is where the agent publishes a CSI volume for a pod: the PV
// name for PVs, the pod's volume name for inline volumes.
func (e *env) publishPath(uid types.UID, specName string) string {
	return filepath.Join(e.root, "pods", string(uid), "volumes", csiPluginDir, specName)
}

// stagingPath is where the agent stages a CSI PV (driver^handle is safe as
// one path element for the test driver's names and IDs).
func (e *env) stagingPath(v csiVolume) string {
	return filepath.Join(e.root, "plugins", csiPluginDir, "mounts", v.driver.name+"^"+v.handle, "globalmount")
}

func (e *env) podDir(uid types.UID) string { return filepath.Join(e.root, "pods", string(uid)) }

// mountAt returns the mount at path, if there is one.
func mountAt(t *testing.T, path string) (mounttest.Mount, bool) {
	t.Helper()
	ms := mounttest.MountsAt(t, path)
	if len(ms) == 0 {
		return mounttest.Mount{}, false
	}
	return ms[len(ms)-1], true
}

// waitMounted waits until every path is a mount point.
func (e *env) waitMounted(paths ...string) {
	e.t.Helper()
	eventually(e.t, 60*time.Second, "mounted", func(context.Context) (bool, string) {
		for _, p := range paths {
			if _, ok := mountAt(e.t, p); !ok {
				return false, p + " is not a mount point"
			}
		}
		return true, ""
	})
}

// waitGone waits until nothing is mounted at or under any path and the
// paths no longer exist.
func (e *env) waitGone(paths ...string) {
	e.t.Helper()
	eventually(e.t, 60*time.Second, "unmounted and removed", func(context.Context) (bool, string) {
		for _, p := range paths {
			if n := len(mounttest.MountsUnder(e.t, p)); n > 0 {
				return false, fmt.Sprintf("%d mounts left at or under %s", n, p)
			}
			if exists(e.t, p) {
				return false, p + " still exists"
			}
		}
		return true, ""
	})
}

// checkExt4FromLoop checks that path is an ext4 filesystem of a loop
// device and returns the mount.
func checkExt4FromLoop(t *testing.T, path string) mounttest.Mount {
	t.Helper()
	m, ok := mountAt(t, path)
	if !ok {
		t.Fatalf("%s is not mounted", path)
	}
	if m.FSType != "ext4" || !strings.HasPrefix(m.Source, "/dev/loop") {
		t.Fatalf("%s: %s from %s, want ext4 from a loop device", path, m.FSType, m.Source)
	}
	return m
}

// --- loop devices ---

// loopDevices lists the loop devices whose backing file is under dir.
func loopDevices(t *testing.T, dir string) map[string]string {
	t.Helper()
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		t.Fatalf("losetup --list: %v", err)
	}
	devs := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.HasPrefix(f[1], dir+"/") {
			devs[f[0]] = f[1]
		}
	}
	return devs
}

// waitNoLoopDevices waits until no loop device is backed by a file under
// the driver's state directory.
func (d *csiDriver) waitNoLoopDevices() {
	t := d.e.t
	t.Helper()
	eventually(t, 30*time.Second, "no loop devices of driver "+d.name, func(context.Context) (bool, string) {
		devs := loopDevices(t, mounttest.Real(d.state))
		return len(devs) == 0, fmt.Sprintf("losetup: %v", devs)
	})
}

// detachLoops detaches (after unmounting) every loop device backed by a
// file under dir; complain reports them as an error.
func detachLoops(t *testing.T, dir string, complain bool) {
	for dev, file := range loopDevices(t, dir) {
		if complain {
			t.Errorf("loop device %s (backed by %s) left attached", dev, file)
		} else {
			t.Logf("detaching %s (backed by %s)", dev, file)
		}
		mounttest.DetachLoop(t, dev)
	}
}

// inlineHandle is the volume ID the kubelet (and the agent) gives an inline
// volume: csi-<sha256(pod UID + volume name)>.
func inlineHandle(uid types.UID, specName string) string {
	sum := sha256.Sum256([]byte(string(uid) + specName))
	return "csi-" + hex.EncodeToString(sum[:])
}

// attachmentName is the VolumeAttachment name the kubelet and the
// attach/detach controller use: csi-<sha256(handle + driver + node)>.
func attachmentName(handle, driver, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

func listenUnix(path string) (net.Listener, error) { return net.Listen("unix", path) }

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
