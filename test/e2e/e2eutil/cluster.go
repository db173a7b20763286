package e2eutil

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// What the tests do on a control plane as its administrator, playing the
// parts of the components there are not (kubelet, external-provisioner,
// -attacher, -resizer).

// CreateNode creates the Node (labelled kubernetes.io/hostname=node and
// with labels). When the test ends the Node is deleted with what an agent
// of a later run on a node of the same name would otherwise find: the
// pods bound to it (at once, as the pod garbage collector would once the
// Node is gone; a pod with a finalizer waits for it) and the CSINode an
// agent made for it. So a test can run again in the same control plane
// (-count) with the same node name, as a node with credentials of its own
// must (ControlPlaneOptions.Nodes). The cleanup is registered first, so it
// runs after the agents the test starts later have stopped.
func (cp *ControlPlane) CreateNode(t *testing.T, node string, labels map[string]string) {
	t.Helper()
	if _, err := cp.Cluster.CreateNode(t.Context(), node, labels); err != nil {
		t.Fatalf("create node %s: %v", node, err)
	}
	t.Cleanup(func() {
		// t.Context() has ended by now. Failures are logged, not errors: the
		// test is over, and its control plane may be down (a test of an
		// outage that failed); a later run would fail to create the node.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pods, err := cp.Admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
		if err != nil {
			t.Logf("list the pods of node %s: %v", node, err)
		} else {
			for _, p := range pods.Items {
				err := cp.Admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				if err != nil && !apierrors.IsNotFound(err) {
					t.Logf("delete pod %s/%s of node %s: %v", p.Namespace, p.Name, node, err)
				}
			}
		}
		if err := cp.Admin.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("delete node %s: %v", node, err)
		}
		if err := cp.Admin.StorageV1().CSINodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("delete CSINode %s: %v", node, err)
		}
	})
}

// CreateNodeAndNamespace creates the Node (CreateNode) and the namespace,
// and waits for the namespace's default ServiceAccount: no pod can be
// created before. The namespace is left when the test ends (deleting it
// would leave its pods terminating, with no kubelet to finish them): a
// test that can run twice in one control plane names it with UniqueName.
func (cp *ControlPlane) CreateNodeAndNamespace(t *testing.T, node, namespace string, labels map[string]string) {
	t.Helper()
	ctx := t.Context()
	cp.CreateNode(t, node, labels)
	if _, err := cp.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	Poll(t, 2*time.Minute, "the namespace's default ServiceAccount", func(ctx context.Context) (bool, string) {
		_, err := cp.Admin.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
}

// CreatePod creates the pod and returns it as created (with its UID).
func (cp *ControlPlane) CreatePod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	got, err := cp.Admin.CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return got
}

// WaitBound waits until the PV binder has bound the claim to the PV, and
// returns the claim.
func (cp *ControlPlane) WaitBound(t *testing.T, namespace, claim, pv string) *corev1.PersistentVolumeClaim {
	t.Helper()
	var got *corev1.PersistentVolumeClaim
	Poll(t, 60*time.Second, "PVC "+claim+" bound to "+pv, func(ctx context.Context) (bool, string) {
		var err error
		if got, err = cp.Admin.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claim, metav1.GetOptions{}); err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == corev1.ClaimBound && got.Spec.VolumeName == pv,
			fmt.Sprintf("phase %s, volume %q", got.Status.Phase, got.Spec.VolumeName)
	})
	return got
}

// CreateCSIDriver creates the CSIDriver object of a driver; it is deleted
// when the test ends.
func (cp *ControlPlane) CreateCSIDriver(t *testing.T, name string, spec storagev1.CSIDriverSpec) {
	t.Helper()
	obj := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	if _, err := cp.Admin.StorageV1().CSIDrivers().Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CSIDriver %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cp.Admin.StorageV1().CSIDrivers().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// CreateStorageClass creates the StorageClass; it is deleted when the test
// ends.
func (cp *ControlPlane) CreateStorageClass(t *testing.T, sc *storagev1.StorageClass) {
	t.Helper()
	if _, err := cp.Admin.StorageV1().StorageClasses().Create(t.Context(), sc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create StorageClass %s: %v", sc.Name, err)
	}
	t.Cleanup(func() {
		_ = cp.Admin.StorageV1().StorageClasses().Delete(context.Background(), sc.Name, metav1.DeleteOptions{})
	})
}

// FindEvents returns the events in namespace that the field selector
// selects (involvedObject.name, reason...) and whose message contains every
// string, and a description of every event it selected, for messages.
func (cp *ControlPlane) FindEvents(ctx context.Context, namespace string, selector fields.Set, contains ...string) (found []corev1.Event, seen []string, err error) {
	list, err := cp.Admin.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: selector.String()})
	if err != nil {
		return nil, nil, err
	}
next:
	for _, ev := range list.Items {
		seen = append(seen, fmt.Sprintf("%s %s (count %d, source %s/%s)", ev.Type, ev.Message, ev.Count, ev.Source.Component, ev.Source.Host))
		for _, s := range contains {
			if !strings.Contains(ev.Message, s) {
				continue next
			}
		}
		found = append(found, ev)
	}
	return found, seen, nil
}

// WaitEvent waits (60 s at most) until FindEvents finds an event that match
// accepts (any if match is nil) and returns it.
func (cp *ControlPlane) WaitEvent(t *testing.T, namespace string, selector fields.Set, match func(*corev1.Event) bool, contains ...string) *corev1.Event {
	t.Helper()
	var found *corev1.Event
	Poll(t, 60*time.Second, fmt.Sprintf("an event %v containing %q", selector, contains), func(ctx context.Context) (bool, string) {
		evs, seen, err := cp.FindEvents(ctx, namespace, selector, contains...)
		if err != nil {
			return false, err.Error()
		}
		for i := range evs {
			if match == nil || match(&evs[i]) {
				found = &evs[i]
				return true, ""
			}
		}
		return false, fmt.Sprintf("events: %q", seen)
	})
	return found
}

// PlayResizer does what a user and the external-resizer (v1.34+, with
// RecoverVolumeExpansionFailure) do to grow a claim once the storage itself
// can be bigger: the user raises the request; the resizer records the new
// size in the claim's status.allocatedResources with
// ControllerResizeInProgress (and a Resizing condition), expands the
// storage (the caller did), sets the PV's capacity, and finally marks the
// claim NodeResizePending with the FileSystemResizePending condition.
//
// The order matters: between the PV's new capacity and NodeResizePending the
// claim must already carry allocatedResources, or the node would take the
// claim for one of an old controller (no allocatedResources: the PV's
// capacity above the claim's capacity means "expand") and race the
// resizer's last patch.
func (cp *ControlPlane) PlayResizer(t *testing.T, namespace, claim, pv, size string) {
	t.Helper()
	ctx := t.Context()
	pvcs := cp.Admin.CoreV1().PersistentVolumeClaims(namespace)
	now := time.Now().UTC().Format(time.RFC3339)
	spec := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, size)
	if _, err := pvcs.Patch(ctx, claim, types.StrategicMergePatchType, []byte(spec), metav1.PatchOptions{}); err != nil {
		t.Fatalf("raise the request of PVC %s: %v", claim, err)
	}
	controller := fmt.Sprintf(`{"status":{"allocatedResources":{"storage":%q},"allocatedResourceStatuses":{"storage":"ControllerResizeInProgress"},`+
		`"conditions":[{"type":"Resizing","status":"True","lastTransitionTime":%q}]}}`, size, now)
	if _, err := pvcs.Patch(ctx, claim, types.StrategicMergePatchType, []byte(controller), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("mark PVC %s ControllerResizeInProgress: %v", claim, err)
	}
	cp.PatchPVCapacity(t, pv, size)
	node := fmt.Sprintf(`{"status":{"allocatedResourceStatuses":{"storage":"NodeResizePending"},`+
		`"conditions":[{"type":"Resizing","$patch":"delete"},{"type":"FileSystemResizePending","status":"True","lastTransitionTime":%q,`+
		`"message":"Waiting for user to (re-)start a pod to finish file system resize of volume on node."}]}}`, now)
	if _, err := pvcs.Patch(ctx, claim, types.StrategicMergePatchType, []byte(node), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("mark PVC %s NodeResizePending: %v", claim, err)
	}
	t.Logf("played the resizer: PV %s and PVC %s at %s, node expansion pending", pv, claim, size)
}

// PatchPVCapacity sets the PV's capacity, as the resize controller does
// once the storage grew (or as an administrator might, wrongly, to shrink).
func (cp *ControlPlane) PatchPVCapacity(t *testing.T, pv, size string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"capacity":{"storage":%q}}}`, size)
	if _, err := cp.Admin.CoreV1().PersistentVolumes().Patch(t.Context(), pv, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch capacity of PV %s: %v", pv, err)
	}
}

// AgentPod creates the pod the DaemonSet would run on node (named
// volume-agent-<node>, in the agent's namespace, as its ServiceAccount,
// with no volumes), unless it exists, and returns it and a kubeconfig with
// a new token bound to it, as the kubelet would project into it: its user
// carries node's name (authentication.kubernetes.io/node-name), to which
// the deploy/ admission policies confine the agent's writes. The node must
// exist. A pod this call created is deleted, and its tokens with it, when
// the test ends.
func (cp *ControlPlane) AgentPod(t *testing.T, node string) (*corev1.Pod, string) {
	t.Helper()
	ctx := t.Context()
	sa := cp.ServiceAccount
	pods := cp.Admin.CoreV1().Pods(sa.Namespace)
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "volume-agent-" + node, Labels: map[string]string{"app.kubernetes.io/name": "volume-agent"}},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			ServiceAccountName:           sa.Name,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "volume-agent", Image: "volume-agent"}},
		},
	}, metav1.CreateOptions{})
	switch {
	case err == nil:
		t.Cleanup(func() {
			_ = pods.Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
	case apierrors.IsAlreadyExists(err):
		if pod, err = pods.Get(ctx, "volume-agent-"+node, metav1.GetOptions{}); err != nil {
			t.Fatalf("the agent's pod on node %s: %v", node, err)
		}
	default:
		t.Fatalf("create the agent's pod on node %s: %v", node, err)
	}
	kubeconfig, err := cp.Cluster.PodTokenKubeconfig(ctx, pod)
	if err != nil {
		t.Fatalf("token bound to pod %s: %v", pod.Name, err)
	}
	return pod, kubeconfig
}
