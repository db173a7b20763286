package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	localPlugin   = "kubernetes.io~local-volume"
	emptyDirPlug  = "kubernetes.io~empty-dir"
	hostPathPlug  = "kubernetes.io~host-path"
)

// env is one test's world: a Node, a namespace, a root directory and,
// once started, an agent.
type env struct {
	t     *testing.T
	node  string
	ns    string
	root  string
	data  string // PV and hostPath directories
	agent *agent
}

// newEnv skips the test if the suite is not set up, and creates the Node
// <name>-node (labelled kubernetes.io/hostname) and the namespace <name>,
// waiting for its default ServiceAccount (Pods cannot be created before).
func newEnv(t *testing.T, name string) *env {
	t.Helper()
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	recordInputs(t)
	// data first: cleanups run in reverse, so it is removed only after the
	// agent has stopped and everything under the root is unmounted.
	data := t.TempDir()
	e := &env{t: t, node: name + "-node", ns: name, data: data, root: newRoot(t)}
	ctx := t.Context()
	if _, err := suite.cluster.CreateNode(ctx, e.node, nil); err != nil {
		t.Fatalf("create node: %v", err)
	}
	if _, err := suite.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	eventually(t, 2*time.Minute, "the namespace's default ServiceAccount", func(ctx context.Context) (bool, string) {
		_, err := suite.admin.CoreV1().ServiceAccounts(e.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	return e
}

// start starts the test's agent, with extra flags if given.
func (e *env) start(extraArgs ...string) *agent {
	e.t.Helper()
	e.agent = startAgent(e.t, e.node, e.root, extraArgs...)
	return e.agent
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
			NodeName: e.node,
			// The agent has no projected-volume plugin (yet): no token volume.
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

func memoryVolume(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("1Mi"))},
	}}
}

func claimVolume(name, claim string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}}
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
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              storageClass,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: e.ns, Name: claimName},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{e.node}}},
			}}}},
		},
	}
	got, err := suite.admin.CoreV1().PersistentVolumes().Create(e.t.Context(), pv, metav1.CreateOptions{})
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
	if _, err := suite.admin.CoreV1().PersistentVolumeClaims(e.ns).Create(e.t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PVC %s: %v", name, err)
	}
}

// waitBound waits until the binder has bound the claim to the PV.
func (e *env) waitBound(claim, pv string) {
	e.t.Helper()
	eventually(e.t, 60*time.Second, "PVC "+claim+" bound to "+pv, func(ctx context.Context) (bool, string) {
		got, err := suite.admin.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == corev1.ClaimBound && got.Spec.VolumeName == pv,
			fmt.Sprintf("phase %s, volume %q", got.Status.Phase, got.Spec.VolumeName)
	})
}

// volumePath is where the agent mounts a pod's volume.
func (e *env) volumePath(uid types.UID, plugin, name string) string {
	return filepath.Join(e.root, "pods", string(uid), "volumes", plugin, name)
}

func (e *env) podDir(uid types.UID) string { return filepath.Join(e.root, "pods", string(uid)) }

func (e *env) waitMounted(paths ...string) {
	e.t.Helper()
	e.waitMountedWithin(60*time.Second, paths...)
}

func (e *env) waitMountedWithin(timeout time.Duration, paths ...string) {
	e.t.Helper()
	eventually(e.t, timeout, "mounted", func(context.Context) (bool, string) {
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
	eventually(e.t, 60*time.Second, "pod "+string(uid)+" torn down", func(context.Context) (bool, string) {
		if n := mountsUnder(e.t, dir); n > 0 {
			return false, fmt.Sprintf("%d mounts left under %s", n, dir)
		}
		if exists(e.t, dir) {
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
	eventually(e.t, 60*time.Second, fmt.Sprintf("pod %s condition %s=%s (%s)", name, conditionType, status, reason), func(ctx context.Context) (bool, string) {
		pod, err := suite.admin.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
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
	eventually(e.t, 60*time.Second, fmt.Sprintf("pod %s condition %s=%s", name, conditionType, status), func(ctx context.Context) (bool, string) {
		pod, err := suite.admin.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
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
// contains every one of the given strings, and returns it.
func (e *env) waitEvent(pod, reason string, match func(*corev1.Event) bool, contains ...string) *corev1.Event {
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
			seen = append(seen, fmt.Sprintf("%s (count %d, source %s/%s)", ev.Message, ev.Count, ev.Source.Component, ev.Source.Host))
			for _, s := range contains {
				if !strings.Contains(ev.Message, s) {
					continue next
				}
			}
			if match == nil || match(ev) {
				found = ev
				return true, ""
			}
		}
		return false, fmt.Sprintf("events: %q", seen)
	})
	return found
}

// patchStatus applies a strategic merge patch to a pod's status as the
// administrator (the tests play the kubelet's part).
func (e *env) patchStatus(name, patch string) {
	e.t.Helper()
	if _, err := suite.admin.CoreV1().Pods(e.ns).Patch(e.t.Context(), name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		e.t.Fatalf("patch status of pod %s: %v", name, err)
	}
}

func (e *env) deletePod(name string, grace int64) {
	e.t.Helper()
	if err := suite.admin.CoreV1().Pods(e.ns).Delete(e.t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
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
	pod := e.createPod(e.pod(name, memoryVolume("scratch")))
	e.waitMounted(e.volumePath(pod.UID, emptyDirPlug, "scratch"))
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
