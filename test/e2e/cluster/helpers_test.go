package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

const (
	// storageClass is set on every PV and PVC; no StorageClass object
	// exists, so the binder binds statically and never provisions.
	storageClass  = "manual"
	conditionType = corev1.PodConditionType("volume-agent.io/VolumesReady")
)

// env is one test's world: a Node, a namespace, a root directory and,
// once started, an agent.
type env struct {
	t     *testing.T
	node  string
	ns    string
	root  string
	data  string // PV and hostPath directories
	agent *e2eutil.Agent
}

// newEnv skips the test if the suite is not set up, and creates the Node
// <name>-node (labelled kubernetes.io/hostname) and the namespace <name>,
// waiting for its default ServiceAccount (Pods cannot be created before).
// When the test runs again (-count) the names are <name>-2... (UniqueName),
// but for a node with credentials of its own (credentialNodes), whose
// name the API server learnt at its start: it keeps its name, and the
// first run deleted the Node and its pods when it ended.
func newEnv(t *testing.T, name string) *env {
	t.Helper()
	suite.Require(t)
	recordInputs(t)
	// data first: cleanups run in reverse, so it is removed only after the
	// agent has stopped and everything under the root is unmounted.
	data := t.TempDir()
	ns := e2eutil.UniqueName(name)
	node := ns + "-node"
	if slices.Contains(credentialNodes, name+"-node") {
		node = name + "-node"
	}
	e := &env{t: t, node: node, ns: ns, data: data, root: mounttest.TempDir(t)}
	suite.CreateNodeAndNamespace(t, e.node, e.ns, nil)
	return e
}

// start starts an agent for the test's node (cluster mode, as the deploy/
// ServiceAccount), with extra flags if given. It is stopped when the test
// ends, before the root is unmounted.
func (e *env) start(extraArgs ...string) *e2eutil.Agent {
	e.t.Helper()
	e.agent = suite.StartAgent(e.t, e.node, e.root, extraArgs...)
	return e.agent
}

// pod returns a pod on the test's node whose one container mounts every
// volume.
func (e *env) pod(name string, vols ...corev1.Volume) *corev1.Pod {
	return e2eutil.Pod(e.ns, e.node, name, vols...)
}

func (e *env) createPod(pod *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	return suite.CreatePod(e.t, pod)
}

// pvName is a cluster-wide unique PV name for this test.
func (e *env) pvName(name string) string { return e.ns + "-" + name }

// createLocalPV creates a local PV on a new directory (holding a file
// "marker" with the PV's name), with node affinity to the test's node,
// pre-bound to the claim ns/claimName. Pre-binding keeps the binder from
// giving it to another test's claim: every test uses class "manual" and
// the same size. The binder still does the binding.
func (e *env) createLocalPV(name, claimName string) (*corev1.PersistentVolume, string) {
	e.t.Helper()
	dir := filepath.Join(e.data, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	pvName := e.pvName(name)
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte(pvName), 0o644); err != nil {
		e.t.Fatal(err)
	}
	pv := e2eutil.PreBoundPV(pvName, "1Gi", storageClass, e.ns, claimName, corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}})
	pv.Spec.NodeAffinity = e2eutil.NodeAffinity(corev1.LabelHostname, e.node)
	got, err := suite.Admin.CoreV1().PersistentVolumes().Create(e.t.Context(), pv, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create PV %s: %v", pvName, err)
	}
	return got, dir
}

func claimSpec() corev1.PersistentVolumeClaimSpec {
	return corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		StorageClassName: ptr.To(storageClass),
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}
}

func (e *env) createClaim(name string) {
	e.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: claimSpec()}
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(e.t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PVC %s: %v", name, err)
	}
}

// waitBound waits until the binder has bound the claim to the PV.
func (e *env) waitBound(claim, pv string) {
	e.t.Helper()
	suite.WaitBound(e.t, e.ns, claim, pv)
}

// volumePath is where the agent mounts a pod's volume.
func (e *env) volumePath(uid types.UID, plugin, name string) string {
	return e2eutil.VolumeDir(e.root, string(uid), plugin, name)
}

func (e *env) podDir(uid types.UID) string { return e2eutil.PodDir(e.root, string(uid)) }

func (e *env) waitMounted(paths ...string) {
	e.t.Helper()
	e.waitMountedWithin(60*time.Second, paths...)
}

func (e *env) waitMountedWithin(timeout time.Duration, paths ...string) {
	e.t.Helper()
	e2eutil.Poll(e.t, timeout, "mounted", func(context.Context) (bool, string) {
		for _, p := range paths {
			if !mounted(e.t, p) {
				return false, p + " is not a mount point"
			}
		}
		return true, ""
	})
}

// waitTornDown waits until nothing is mounted in the pod's directory and
// the directory is gone.
func (e *env) waitTornDown(uid types.UID) {
	e.t.Helper()
	dir := e.podDir(uid)
	e2eutil.Poll(e.t, 60*time.Second, "pod "+string(uid)+" torn down", func(context.Context) (bool, string) {
		if n := mountsUnder(e.t, dir); n > 0 {
			return false, fmt.Sprintf("%d mounts left under %s", n, dir)
		}
		if mounttest.Exists(e.t, dir) {
			return false, dir + " still exists"
		}
		return true, ""
	})
}

// condition returns the pod's volume-agent.io/VolumesReady condition.
func condition(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == conditionType {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// waitCondition waits until the pod's condition has the status and reason.
func (e *env) waitCondition(name string, status corev1.ConditionStatus, reason string) *corev1.PodCondition {
	e.t.Helper()
	var cond *corev1.PodCondition
	e2eutil.Poll(e.t, 60*time.Second, fmt.Sprintf("pod %s condition %s=%s (%s)", name, conditionType, status, reason), func(ctx context.Context) (bool, string) {
		pod, err := suite.Admin.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		cond = condition(pod)
		if cond == nil {
			return false, "no condition"
		}
		return cond.Status == status && cond.Reason == reason, fmt.Sprintf("%s %s: %s", cond.Status, cond.Reason, cond.Message)
	})
	return cond
}

// waitConditionStatus waits until the pod's condition has the status,
// whatever the reason.
func (e *env) waitConditionStatus(name string, status corev1.ConditionStatus) *corev1.PodCondition {
	e.t.Helper()
	var cond *corev1.PodCondition
	e2eutil.Poll(e.t, 60*time.Second, fmt.Sprintf("pod %s condition %s=%s", name, conditionType, status), func(ctx context.Context) (bool, string) {
		pod, err := suite.Admin.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if cond = condition(pod); cond == nil {
			return false, "no condition"
		}
		return cond.Status == status, fmt.Sprintf("%s %s: %s", cond.Status, cond.Reason, cond.Message)
	})
	return cond
}

// waitEvent waits for an event on the pod with the reason whose message
// contains every one of the given strings (and that match accepts, unless
// it is nil), and returns it.
func (e *env) waitEvent(pod, reason string, match func(*corev1.Event) bool, contains ...string) *corev1.Event {
	e.t.Helper()
	return suite.WaitEvent(e.t, e.ns, fields.Set{"involvedObject.name": pod, "reason": reason}, match, contains...)
}

// patchStatus applies a strategic merge patch to a pod's status as the
// administrator (the tests play the kubelet's part).
func (e *env) patchStatus(name, patch string) {
	e.t.Helper()
	if _, err := suite.Admin.CoreV1().Pods(e.ns).Patch(e.t.Context(), name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		e.t.Fatalf("patch status of pod %s: %v", name, err)
	}
}

func (e *env) deletePod(name string, grace int64) {
	e.t.Helper()
	if err := suite.Admin.CoreV1().Pods(e.ns).Delete(e.t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		e.t.Fatalf("delete pod %s: %v", name, err)
	}
}

// barrier creates a pod with one Memory emptyDir and waits until the agent
// has mounted it. The agent's pod informer delivers changes in order, so
// once it is mounted the agent has seen every pod change made before, and
// has run a reconciler pass on it: what it did not do by then, it will not
// do for those changes.
func (e *env) barrier(name string) types.UID {
	e.t.Helper()
	pod := e.createPod(e.pod(name, e2eutil.MemoryVolume("scratch")))
	e.waitMounted(e.volumePath(pod.UID, e2eutil.EmptyDirPlugin, "scratch"))
	return pod.UID
}

// readMarker reads the marker file of a local PV through a pod's mount.
func readMarker(t *testing.T, mountPath string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(mountPath, "marker"))
	if err != nil {
		t.Fatalf("reading the PV's marker through the mount: %v", err)
	}
	return string(data)
}

// mounted reports whether path is a mount point.
func mounted(t *testing.T, path string) bool {
	t.Helper()
	return len(mounttest.MountsAt(t, path)) > 0
}

// mountsUnder counts the mounts at or below dir.
func mountsUnder(t *testing.T, dir string) int {
	t.Helper()
	return len(mounttest.MountsUnder(t, dir))
}

// desiredPod reports whether the agent's desired state has the pod.
func desiredPod(t *testing.T, a *e2eutil.Agent, uid string) bool {
	t.Helper()
	return e2eutil.Must(t, a.DSW).PodByUID(uid) != nil
}
