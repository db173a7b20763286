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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// A pod using a claim that the real binder bound to a local PV: the agent
// mounts the PV's directory into the pod and reports the pod condition. A
// restarted agent adopts the mount.
func TestBoundLocalPV(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "bound-pv")
	pv, _ := e.createLocalPV("data", "data")
	e.createClaim("data")
	e.waitBound("data", pv.Name)
	e.start()

	pod := e.createPod(e.pod("web", e2eutil.ClaimVolume("data", "data")))
	path := e.volumePath(pod.UID, e2eutil.LocalPlugin, pv.Name)
	e.waitMounted(path)
	if got := readMarker(t, path); got != pv.Name {
		t.Errorf("the mount shows PV %q's directory, want %q's", got, pv.Name)
	}
	c := e.waitCondition("web", corev1.ConditionTrue, "VolumesMounted")
	t.Logf("condition: %s %s %q", c.Status, c.Reason, c.Message)

	// SIGTERM unmounts nothing; the next agent adopts the mount instead of
	// mounting again.
	if err := e.agent.Stop(); err != nil {
		t.Error(err)
	}
	if !mounted(t, path) {
		t.Fatalf("%s was unmounted when the agent stopped", path)
	}
	a := e.start()
	e2eutil.Poll(t, 30*time.Second, "the restarted agent reports the pod's volumes ready", func(context.Context) (bool, string) {
		for _, p := range e2eutil.Must(t, a.DSW).Pods {
			if p.UID == string(pod.UID) {
				return p.VolumesReady, fmt.Sprintf("%+v", p)
			}
		}
		return false, "pod not desired"
	})
	if n := len(mounttest.MountsAt(t, path)); n != 1 {
		t.Errorf("%d mounts at %s after the restart, want 1", n, path)
	}
	e.waitCondition("web", corev1.ConditionTrue, "VolumesMounted")
}

// A pod whose claim is not bound yet: a FailedMount event names the volume
// and the reason, and the condition is False. Once a PV appears, the real
// PV controller binds the claim and the agent mounts it.
func TestUnboundClaimThenBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "unbound-pvc")
	e.start()
	e.createClaim("data")
	pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", "data")))

	ev := e.waitEvent("app", "FailedMount", nil, `volume "data"`, "not bound")
	t.Logf("event: %s %s: %s (from %s on %s)", ev.Type, ev.Reason, ev.Message, ev.Source.Component, ev.Source.Host)
	if ev.Type != corev1.EventTypeWarning || ev.Source.Component != "volume-agent" || ev.Source.Host != e.node {
		t.Errorf("event type %s, source %+v: want a Warning from volume-agent on %s", ev.Type, ev.Source, e.node)
	}
	if ev.InvolvedObject.UID != pod.UID {
		t.Errorf("event is about UID %s, the pod is %s", ev.InvolvedObject.UID, pod.UID)
	}
	c := e.waitCondition("app", corev1.ConditionFalse, "VolumeErrors")
	if !strings.Contains(c.Message, `"data"`) || !strings.Contains(c.Message, "not bound") {
		t.Errorf("condition message %q does not name the volume and the reason", c.Message)
	}

	pv, _ := e.createLocalPV("data", "data")
	e.waitBound("data", pv.Name)
	path := e.volumePath(pod.UID, e2eutil.LocalPlugin, pv.Name)
	e.waitMounted(path)
	if got := readMarker(t, path); got != pv.Name {
		t.Errorf("the mount shows %q, want PV %q", got, pv.Name)
	}
	e.waitCondition("app", corev1.ConditionTrue, "VolumesMounted")
}

// A deleted pod (grace period 0: the object is gone at once) is torn down:
// every mount, then the pod's directory. The local PV's data stays.
func TestPodDeleted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "pod-deleted")
	pv, dir := e.createLocalPV("data", "data")
	e.createClaim("data")
	e.waitBound("data", pv.Name)
	e.start()

	pod := e.createPod(e.pod("job", e2eutil.ClaimVolume("data", "data"), e2eutil.MemoryVolume("cache")))
	e.waitMounted(e.volumePath(pod.UID, e2eutil.LocalPlugin, pv.Name), e.volumePath(pod.UID, e2eutil.EmptyDirPlugin, "cache"))
	e.waitCondition("job", corev1.ConditionTrue, "VolumesMounted")

	e.deletePod("job", 0)
	e.waitTornDown(pod.UID)
	if data, err := os.ReadFile(filepath.Join(dir, "marker")); err != nil || string(data) != pv.Name {
		t.Errorf("the local PV's data is gone after the pod: %q, %v", data, err)
	}
	if desiredPod(t, e.agent, string(pod.UID)) {
		t.Error("the deleted pod is still in the agent's desired state")
	}
}

// A pod being deleted while its containers still run (per its status) keeps
// its volumes; they are torn down once the containers have terminated, or
// when the pod object is removed.
func TestTerminatingPodKeepsVolumesWhileRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "terminating")
	e.start()
	running := `{"status":{"phase":"Running","containerStatuses":[{"name":"main","image":"registry.k8s.io/pause:3.10","imageID":"","ready":true,"restartCount":0,"state":{"running":{"startedAt":"2026-01-01T00:00:00Z"}}}]}}`
	uids := map[string]string{}
	for _, name := range []string{"stops", "removed"} {
		pod := e.createPod(e.pod(name, e2eutil.MemoryVolume("scratch")))
		uids[name] = string(pod.UID)
		e.waitMounted(e.volumePath(pod.UID, e2eutil.EmptyDirPlugin, "scratch"))
		e.patchStatus(name, running)
		e.deletePod(name, 300) // graceful: the object stays, with a deletion timestamp
	}
	for name := range uids {
		got, err := suite.Admin.CoreV1().Pods(e.ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil || got.DeletionTimestamp == nil {
			t.Fatalf("pod %s after a graceful delete: %v, deletionTimestamp %v", name, err, got.GetDeletionTimestamp())
		}
	}

	e.barrier("barrier-1")
	for name, uid := range uids {
		path := e.volumePath(k8stypes.UID(uid), e2eutil.EmptyDirPlugin, "scratch")
		if !mounted(t, path) {
			t.Errorf("pod %s: terminating with a running container, but its volume was unmounted", name)
		}
		if !desiredPod(t, e.agent, uid) {
			t.Errorf("pod %s: terminating with a running container, but no longer desired", name)
		}
	}

	// The container has stopped: the kubelet would now tear the volumes down.
	e.patchStatus("stops", `{"status":{"containerStatuses":[{"name":"main","image":"registry.k8s.io/pause:3.10","imageID":"","ready":false,"restartCount":0,"state":{"terminated":{"exitCode":0,"reason":"Completed","startedAt":"2026-01-01T00:00:00Z","finishedAt":"2026-01-01T00:01:00Z"}}}]}}`)
	e.waitTornDown(k8stypes.UID(uids["stops"]))
	if path := e.volumePath(k8stypes.UID(uids["removed"]), e2eutil.EmptyDirPlugin, "scratch"); !mounted(t, path) {
		t.Errorf("pod removed: unmounted with pod stops, though its container still runs")
	}

	// The object is removed (force delete) while the status still says
	// running: nothing is left to wait for.
	e.deletePod("removed", 0)
	e.waitTornDown(k8stypes.UID(uids["removed"]))
}

// A pod bound to another node is none of the agent's business: it is not
// even in its cache (field selector), let alone mounted.
func TestPodOnOtherNodeIgnored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "other-node")
	other := e.node + "-other"
	suite.CreateNode(t, other, nil)
	e.start()
	p := e.pod("elsewhere", e2eutil.MemoryVolume("scratch"))
	p.Spec.NodeName = other
	pod := e.createPod(p)
	barrier := e.barrier("barrier")

	if desiredPod(t, e.agent, string(pod.UID)) {
		t.Error("a pod of another node is in the agent's desired state")
	}
	if mounttest.Exists(t, e.podDir(pod.UID)) {
		t.Errorf("%s exists for a pod of another node", e.podDir(pod.UID))
	}
	if n, want := mountsUnder(t, e.root), mountsUnder(t, e.podDir(barrier)); n != want {
		t.Errorf("%d mounts under the root, but only the barrier pod's %d are the agent's", n, want)
	}
	got, err := suite.Admin.CoreV1().Pods(e.ns).Get(t.Context(), "elsewhere", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := condition(got); c != nil {
		t.Errorf("the agent set a condition on a pod of another node: %+v", c)
	}
}

// A pod whose phase is Succeeded runs nothing any more: its volumes are torn
// down though the object stays.
func TestSucceededPodTornDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "succeeded")
	pv, _ := e.createLocalPV("data", "data")
	e.createClaim("data")
	e.waitBound("data", pv.Name)
	e.start()

	pod := e.createPod(e.pod("batch", e2eutil.ClaimVolume("data", "data"), e2eutil.MemoryVolume("scratch")))
	e.waitMounted(e.volumePath(pod.UID, e2eutil.LocalPlugin, pv.Name), e.volumePath(pod.UID, e2eutil.EmptyDirPlugin, "scratch"))
	e.waitCondition("batch", corev1.ConditionTrue, "VolumesMounted")

	e.patchStatus("batch", `{"status":{"phase":"Succeeded","containerStatuses":[{"name":"main","image":"registry.k8s.io/pause:3.10","imageID":"","ready":false,"restartCount":0,"state":{"terminated":{"exitCode":0,"reason":"Completed"}}}]}}`)
	e.waitTornDown(pod.UID)
	if _, err := suite.Admin.CoreV1().Pods(e.ns).Get(t.Context(), "batch", metav1.GetOptions{}); err != nil {
		t.Errorf("the pod object: %v (it should still exist)", err)
	}
}

// A generic ephemeral volume: the real ephemeral-volume controller creates
// the claim <pod>-<volume> owned by the pod, the binder binds it to a
// pre-created PV, the agent mounts it. When the pod is gone, the garbage
// collector removes the claim.
func TestGenericEphemeralVolume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "ephemeral")
	claimName := "worker-scratch"
	pv, _ := e.createLocalPV("scratch", claimName)
	e.start()

	p := e.pod("worker", corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{
		Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: claimSpec()}},
	}})
	pod := e.createPod(p)
	e.waitBound(claimName, pv.Name)
	pvc, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Get(t.Context(), claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(pvc); ref == nil || ref.UID != pod.UID {
		t.Errorf("claim %s is controlled by %+v, want the pod %s", claimName, ref, pod.UID)
	}
	path := e.volumePath(pod.UID, e2eutil.LocalPlugin, pv.Name)
	e.waitMounted(path)
	if got := readMarker(t, path); got != pv.Name {
		t.Errorf("the mount shows %q, want PV %q", got, pv.Name)
	}
	e.waitCondition("worker", corev1.ConditionTrue, "VolumesMounted")

	e.deletePod("worker", 0)
	e.waitTornDown(pod.UID)
	e2eutil.Poll(t, 60*time.Second, "the garbage collector deletes the ephemeral claim", func(ctx context.Context) (bool, string) {
		_, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, claimName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// A mount that keeps failing (a hostPath of type Directory that does not
// exist) is retried with backoff and reported as one FailedMount event
// whose count grows (the event correlator patches it instead of creating
// more), with the condition False; once the directory exists, it mounts.
func TestFailingMountEventsAggregate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "failing-mount")
	e.start()
	dir := filepath.Join(e.data, "not-yet")
	pod := e.createPod(e.pod("host", corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: ptr.To(corev1.HostPathDirectory)},
	}}))

	ev := e.waitEvent("host", "FailedMount", func(ev *corev1.Event) bool { return ev.Count >= 2 }, `"host"`)
	t.Logf("event (count %d): %s", ev.Count, ev.Message)
	// The reason should be MountFailed, but the agent computes conditions
	// in its reconciler pass, which only sees the failure if the operation
	// happened to fail before the pass ended (it mostly says
	// WaitingForVolumes): only the status is checked.
	e.waitConditionStatus("host", corev1.ConditionFalse)

	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The retry comes after the backoff, which is at most about 2 minutes.
	path := e.volumePath(pod.UID, e2eutil.HostPathPlugin, "host")
	e2eutil.Poll(t, 150*time.Second, "mounted after the directory appeared", func(context.Context) (bool, string) {
		return mounted(t, path), path + " not mounted"
	})
	e.waitCondition("host", corev1.ConditionTrue, "VolumesMounted")
}
