package restart_test

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// storageClass is set on every PV and PVC; no StorageClass object exists, so
// the binder binds statically and never provisions.
const storageClass = "manual"

// clusterEnv is one cluster test's Node, namespace, root directory and
// data directory, on a control plane.
type clusterEnv struct {
	t    *testing.T
	cp   *e2eutil.ControlPlane
	node string
	ns   string
	data string // local PV directories
	root string
}

var envSeq atomic.Int64

// newClusterEnv creates the Node <name>-<n>-node and the namespace <name>-<n> (and
// waits for its default ServiceAccount, without which pods cannot be
// created).
func newClusterEnv(t *testing.T, cp *e2eutil.ControlPlane, name string) *clusterEnv {
	t.Helper()
	// Unique on the shared control plane also with -count=N.
	name = fmt.Sprintf("%s-%d", name, envSeq.Add(1))
	e := &clusterEnv{t: t, cp: cp, node: name + "-node", ns: name, data: t.TempDir()}
	e.root = mounttest.TempDir(t) // unmounted after the agent (registered later) stops
	cp.CreateNodeAndNamespace(t, e.node, e.ns, nil)
	return e
}

// newAgent prepares the env's agent: cluster mode, as the deploy/
// ServiceAccount.
func (e *clusterEnv) newAgent(extra ...string) *agent {
	return newAgent(e.t, e2eutil.AgentOptions{Root: e.root, Node: e.node, Kubeconfig: e.cp.Kubeconfig, Args: extra})
}

// pod is a pod on the env's node whose container mounts every volume.
func (e *clusterEnv) pod(name string, vols ...corev1.Volume) *corev1.Pod {
	return e2eutil.Pod(e.ns, e.node, name, vols...)
}

func (e *clusterEnv) createPod(p *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	return e.cp.CreatePod(e.t, p)
}

// deletePod deletes a pod at once (grace period 0: there is no kubelet) and
// waits until it is gone from the API.
func (e *clusterEnv) deletePod(name string) {
	e.t.Helper()
	zero := int64(0)
	pods := e.cp.Admin.CoreV1().Pods(e.ns)
	if err := pods.Delete(e.t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		e.t.Fatalf("delete pod %s: %v", name, err)
	}
	e2eutil.PollErr(e.t, 30*time.Second, "pod "+name+" gone from the API", func() error {
		_, err := pods.Get(e.t.Context(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			err = errors.New("still there")
		}
		return err
	})
}

// localPV creates a local PV named <ns>-<name> on a new directory with node
// affinity to the env's node, pre-bound to claim (so no other test's claim
// gets it), and the claim, and waits until they are bound. It returns the
// PV's name and directory.
func (e *clusterEnv) localPV(name, claim string) (string, string) {
	e.t.Helper()
	ctx := e.t.Context()
	dir := mkdirAll(e.t, filepath.Join(e.data, name))
	pvName := e.ns + "-" + name
	pv := e2eutil.PreBoundPV(pvName, "1Gi", storageClass, e.ns, claim, corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}})
	pv.Spec.NodeAffinity = e2eutil.NodeAffinity(corev1.LabelHostname, e.node)
	if _, err := e.cp.Admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PV %s: %v", pvName, err)
	}
	e.createClaim(claim, "1Gi")
	e.waitBound(claim, pvName)
	return pvName, dir
}

func (e *clusterEnv) createClaim(name, size string) {
	e.t.Helper()
	class := storageClass
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if _, err := e.cp.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(e.t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PVC %s: %v", name, err)
	}
}

func (e *clusterEnv) waitBound(claim, pv string) {
	e.t.Helper()
	e.cp.WaitBound(e.t, e.ns, claim, pv)
}

func (e *clusterEnv) podDir(uid types.UID) string { return e2eutil.PodDir(e.root, string(uid)) }

// waitTornDown waits until nothing is mounted in the pod's directory and
// the directory is gone.
func (e *clusterEnv) waitTornDown(uid types.UID) {
	e.t.Helper()
	e2eutil.PollErr(e.t, time.Minute, "pod "+string(uid)+" torn down", func() error {
		if ms := mounttest.MountsUnder(e.t, e.podDir(uid)); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mounttest.MountPoints(ms))
		}
		if mounttest.Exists(e.t, e.podDir(uid)) {
			return errors.New("the pod directory still exists")
		}
		return nil
	})
}

// kill -9 in the middle of mounting 100 pods × 3 volumes in cluster mode,
// three times (pods deleted while the agent is down after the first kill,
// one more created after the second), then a last start: every volume is
// mounted exactly once, data written before the kills is intact, nothing of
// the deleted pods is left.
func TestClusterKillDuringMount(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	cp := sharedControlPlane(t)
	const pods = 100
	e := newClusterEnv(t, cp, "kill")
	pvName, sharedDir := e.localPV("data", "data")
	podSpec := func(i int) *corev1.Pod {
		return e.pod(fmt.Sprintf("pod-%03d", i), e2eutil.MemoryVolume("mem"), diskVolume("disk"), e2eutil.ClaimVolume("data", "data"))
	}
	for i := range pods {
		e.createPod(podSpec(i))
	}
	a := e.newAgent()
	written, sharedData := killRounds(t, a, e.root, []int{5, 100, 2}, 30, func(round int) {
		switch round {
		case 0:
			for i := range 10 {
				e.deletePod(fmt.Sprintf("pod-%03d", i))
			}
		case 1:
			e.createPod(podSpec(pods))
		}
	})
	a.Start()
	uids := a.waitSettled(3 * time.Minute)
	if len(uids) != pods-10+1 {
		t.Errorf("%d pods desired, want %d", len(uids), pods-10+1)
	}
	checkKillOutcome(t, e.root, uids, pvName, sharedDir, written, sharedData)
}

// The agent restarts while kube-apiserver is down: it must wait, mounts in
// place, for as long as the API server stays away (that wait is what this
// test is about), saying on /readyz that it waits for the API server; once
// the API server is back it becomes ready and adopts every mount without
// unmounting (or mounting) anything.
func TestRestartWhileAPIServerDown(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	const pods, outage = 10, 10 * time.Second
	cp := privateControlPlane(t) // the outage must not disturb other tests
	e := newClusterEnv(t, cp, "outage")
	pvName, _ := e.localPV("data", "data")
	for i := range pods {
		e.createPod(e.pod(fmt.Sprintf("pod-%02d", i), e2eutil.MemoryVolume("mem"), diskVolume("disk"), e2eutil.ClaimVolume("data", "data")))
	}
	a := e.newAgent()
	a.Start()
	uids := a.waitSettled(2 * time.Minute)
	if len(uids) != pods {
		t.Fatalf("%d pods desired, want %d", len(uids), pods)
	}
	for uid := range uids {
		mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(e.root, uid, e2eutil.EmptyDirPlugin, "mem"), "f"), uid)
		mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(e.root, uid, e2eutil.EmptyDirPlugin, "disk"), "f"), uid)
	}
	before := mounttest.MountsUnder(t, e.root)
	if len(before) != 2*pods {
		t.Fatalf("%d mounts, want %d", len(before), 2*pods)
	}

	a.stop()
	cp.Cluster.StopAPIServer() // a private control plane: stopped with the test whatever happens
	if err := a.Launch(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	checks, lastBody := 0, ""
	for time.Since(start) < outage { // the outage is the subject: the agent must keep waiting
		time.Sleep(500 * time.Millisecond)
		if a.Process().Exited() {
			t.Fatalf("the agent exited during the outage: %v\n%s", a.Process().Err(), a.Process().Tail(30))
		}
		if now := mounttest.MountsUnder(t, e.root); !sameMounts(before, now) {
			t.Fatalf("%v into the outage, the mounts changed:\nbefore %v\nnow    %v", time.Since(start).Round(time.Millisecond), mounttest.MountPoints(before), mounttest.MountPoints(now))
		}
		code, body, err := a.Readyz()
		if err != nil {
			continue // not listening yet
		}
		checks++
		lastBody = body
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "API server") {
			t.Fatalf("/readyz during the outage: %d %q, want 503 mentioning the API server", code, body)
		}
	}
	if checks == 0 {
		t.Fatal("/readyz never answered during the outage")
	}
	t.Logf("%d checks during a %v outage: mounts unchanged, /readyz 503 %q", checks, outage, lastBody)

	restart := time.Now()
	if err := cp.Cluster.StartAPIServer(t.Context()); err != nil {
		t.Fatalf("restarting kube-apiserver: %v", err)
	}
	// client-go's reflectors retry the list with a backoff that may have
	// grown during the outage.
	if err := a.WaitReady(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("ready %v after the API server came back", time.Since(restart).Round(time.Millisecond))
	if got := a.waitSettled(time.Minute); !maps.Equal(got, uids) {
		t.Errorf("desired pods after the outage: %v, want %v", got, uids)
	}
	if now := mounttest.MountsUnder(t, e.root); !sameMounts(before, now) {
		t.Errorf("the mounts changed:\nbefore %v\nnow    %v", mounttest.MountPoints(before), mounttest.MountPoints(now))
	}
	a.checkOps("after the restart during the outage", nil)
	for uid := range uids {
		for _, f := range []string{filepath.Join(e2eutil.VolumeDir(e.root, uid, e2eutil.EmptyDirPlugin, "mem"), "f"), filepath.Join(e2eutil.VolumeDir(e.root, uid, e2eutil.EmptyDirPlugin, "disk"), "f")} {
			if got, err := os.ReadFile(f); err != nil || string(got) != uid {
				t.Errorf("%s: %q, %v", f, got, err)
			}
		}
		if !mounttest.Exists(t, e2eutil.VolumeDir(e.root, uid, e2eutil.LocalPlugin, pvName)) {
			t.Errorf("pod %s lost its local volume", uid)
		}
	}
}

// A pod deleted while the agent is down is torn down after its start:
// tmpfs, disk emptyDir, its bind mount of a local PV another pod keeps
// using, its directory. The other pod's mounts are adopted untouched.
func TestClusterPodDeletedWhileDown(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	cp := sharedControlPlane(t)
	e := newClusterEnv(t, cp, "deleted")
	pvName, dir := e.localPV("data", "data")
	gone := e.createPod(e.pod("gone", e2eutil.MemoryVolume("mem"), diskVolume("disk"), e2eutil.ClaimVolume("data", "data")))
	stays := e.createPod(e.pod("stays", e2eutil.MemoryVolume("mem"), e2eutil.ClaimVolume("data", "data")))
	a := e.newAgent()
	a.Start()
	a.waitSettled(time.Minute)
	mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(e.root, string(gone.UID), e2eutil.LocalPlugin, pvName), "from-gone"), "data")
	mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(e.root, string(gone.UID), e2eutil.EmptyDirPlugin, "disk"), "f"), "disk")
	staysMounts := mounttest.MountsUnder(t, e.podDir(stays.UID))
	if len(staysMounts) != 2 || len(mounttest.MountsUnder(t, e.podDir(gone.UID))) != 2 {
		t.Fatalf("mounts: %v", mounttest.MountPoints(mounttest.MountsUnder(t, e.root)))
	}

	a.stop()
	e.deletePod("gone")
	a.Start()
	e.waitTornDown(gone.UID)
	if got := a.waitSettled(time.Minute); !maps.Equal(got, map[string]bool{string(stays.UID): true}) {
		t.Errorf("desired pods %v", got)
	}
	if got := mounttest.MountsUnder(t, e.podDir(stays.UID)); !sameMounts(staysMounts, got) {
		t.Errorf("the other pod's mounts changed: %v -> %v", mounttest.MountPoints(staysMounts), mounttest.MountPoints(got))
	}
	if dirs := podDirs(t, e.root); !maps.Equal(dirs, map[string]bool{string(stays.UID): true}) {
		t.Errorf("pod directories %v", dirs)
	}
	a.checkOps("after the restart", map[string]map[string]float64{"unmount_volume": {e2eutil.EmptyDirPlugin: 2, e2eutil.LocalPlugin: 1}})
	if got := mounttest.ReadFile(t, filepath.Join(dir, "from-gone")); got != "data" {
		t.Errorf("local PV data: %q", got)
	}
}
