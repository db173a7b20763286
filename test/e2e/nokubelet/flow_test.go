package nokubelet_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
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

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/csidriver"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

const mib = 1 << 20

// The whole life of a claim of an attach-required, topology-aware driver on
// a node with no kubelet, each step timed (the table is logged at the end):
//
//  1. the driver registers with the agent through its registration socket
//     (/debug/drivers: the node ID, topology and volume limit of its
//     NodeGetInfo);
//  2. the agent publishes the driver on the node as the kubelet would:
//     CSINode entry, node ID annotation, topology label, controller-managed
//     attach;
//  3. external-provisioner provisions the claim (Immediate binding) on the
//     node's topology: the PV's node affinity is the driver's segment;
//  4. a pod uses the claim: the attach/detach controller creates the
//     VolumeAttachment, external-attacher attaches it with the node ID
//     from the CSINode (not the node's name: the driver refuses any other);
//  5. the agent stages and publishes it and the pod's VolumesReady
//     condition turns True; data written through the published path;
//     the agent restarts, and nothing the cluster sees changes: no
//     CSINode or Node write, no detach, the condition stays True;
//  6. the claim grows: the expand controller, external-resizer
//     (ControllerExpandVolume) and the agent (NodeExpandVolume, online,
//     xfs): the claim's capacity is the new size and no resize condition
//     is left;
//  7. the pod goes: the agent unpublishes and unstages, the attach/detach
//     controller and external-attacher detach (ControllerUnpublishVolume)
//     and the VolumeAttachment is deleted;
//  8. the claim goes: external-provisioner deletes the volume;
//  9. the driver stops: its registration socket goes, the agent
//     deregisters it, and the node stops publishing it.
//
// The driver runs in a mount namespace of its own, as in a container with a
// Bidirectional mount of the kubelet's directory: its mounts reach the
// agent's namespace because the agent made its root directory shared.
//
// The audit log shows each write done by the component that should do it
// (the VolumeAttachment created by the attach/detach controller and marked
// attached by external-attacher...). The pod gets no Warning event, as with
// a kubelet.
func TestNoKubeletFlow(t *testing.T) {
	e := newEnv(t, "flow")
	s := newSteps(t)
	ctx := t.Context()
	admin := suite.Admin
	driverName := e.ns + ".nokubelet.e2e.volume-agent.io"
	// Not the node's name: external-attacher must take it from the CSINode.
	nodeID := "csi-id-of-" + e.node
	const maxVolumes = 8
	topology := map[string]string{csidriver.TopologyKey(driverName): nodeID}

	regDir := filepath.Join(e.sock, "registry")
	if err := os.Mkdir(regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	suite.CreateCSIDriver(t, driverName, storagev1.CSIDriverSpec{
		AttachRequired:       ptr.To(true),
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
	})
	agent := suite.StartAgent(t, e.node, e.root, "--attach-mode=controller", "--plugin-registry-dir="+regDir)
	driver := e2eutil.NewCSIDriver(t, e2eutil.CSIDriverOptions{
		Binary: suite.CSIDriverBin, Name: driverName, NodeID: nodeID,
		Socket:        shortPath(t, filepath.Join(e.sock, "csi.sock")),
		ControlSocket: filepath.Join(e.sock, "control.sock"),
		StateDir:      filepath.Join(t.TempDir(), "driver"),
		StrictLoops:   true,
		LogPath:       filepath.Join(e.logs, "driver.log"),
		// As in a container with a Bidirectional mount of the kubelet's
		// directory: its mounts reach the agent and the pods only
		// because the agent made its root directory shared.
		OwnMountNamespace: true,
		Args: []string{
			"--registration-dir=" + regDir, "--attach-required", "--topology",
			fmt.Sprintf("--max-volumes-per-node=%d", maxVolumes), "--default-fstype=xfs",
		},
	})
	shortPath(t, filepath.Join(regDir, driverName+"-reg.sock"))

	driverStarted := time.Now()
	s.run("driver registered with the agent", func() {
		driver.Start()
		e2eutil.Poll(t, 60*time.Second, "driver "+driverName+" on /debug/drivers", func(context.Context) (bool, string) {
			drivers, err := agent.Drivers()
			if err != nil {
				return false, err.Error()
			}
			d := drivers.Driver(driverName)
			return d != nil, fmt.Sprintf("%+v", drivers.Drivers)
		})
	})
	registered := e2eutil.Must(t, agent.Drivers).Driver(driverName)
	if registered.Source != "registration" || registered.NodeID != nodeID || !maps.Equal(registered.Topology, topology) ||
		registered.MaxVolumesPerNode != maxVolumes || !registered.ControllerPublish {
		t.Fatalf("/debug/drivers: %+v; want source registration, node ID %s, topology %v, %d volumes, controller publish", *registered, nodeID, topology, maxVolumes)
	}

	s.run("registered → CSINode entry, annotation, labels (agent)", func() {
		e.waitNodeDuties(driverName, nodeID, topology, maxVolumes)
	})
	s.record("driver started → CSINode entry (total)", time.Since(driverStarted))

	var sidecars []*e2eutil.Sidecar
	for _, name := range cluster.Sidecars {
		sidecars = append(sidecars, e2eutil.StartSidecar(t, e2eutil.SidecarOptions{
			Name: name, CSIAddress: driver.Socket(), Kubeconfig: suite.Cluster.AdminKubeconfig(), LogDir: e.logs,
		}))
	}
	for _, sc := range sidecars {
		t.Logf("%s flags: %q", sc.Name(), sc.Args()[2:])
	}

	// 3. Provisioning with topology.
	class := e.ns + "-xfs"
	if _, err := admin.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: class},
		Provisioner:          driverName,
		Parameters:           map[string]string{"csi.storage.k8s.io/fstype": "xfs"},
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingImmediate),
		AllowVolumeExpansion: ptr.To(true),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create StorageClass %s: %v", class, err)
	}
	t.Cleanup(func() {
		_ = admin.StorageV1().StorageClasses().Delete(context.Background(), class, metav1.DeleteOptions{})
	})
	claims := admin.CoreV1().PersistentVolumeClaims(e.ns)
	var pv *corev1.PersistentVolume
	s.run("claim provisioned (external-provisioner)", func() {
		if _, err := claims.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: e.ns},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(class),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: quantity("320Mi")}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create PVC data: %v", err)
		}
		e2eutil.Poll(t, 60*time.Second, "PVC data bound to a provisioned PV", func(ctx context.Context) (bool, string) {
			pvc := e.claim(ctx, "data")
			if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
				return false, describeClaimStatus(pvc)
			}
			var err error
			pv, err = admin.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
			return err == nil, fmt.Sprint(err)
		})
	})
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driverName || pv.Spec.CSI.FSType != "xfs" {
		t.Fatalf("PV %s: source %+v; want driver %s's, fsType xfs", pv.Name, pv.Spec.PersistentVolumeSource, driverName)
	}
	if want := e2eutil.NodeAffinity(csidriver.TopologyKey(driverName), nodeID); !equalAffinity(pv.Spec.NodeAffinity, want) {
		t.Fatalf("PV %s: node affinity %+v; want the driver's topology segment %s=%s", pv.Name, pv.Spec.NodeAffinity, csidriver.TopologyKey(driverName), nodeID)
	}
	waitWrittenBy(t, "create", "persistentvolumes", "", pv.Name, cluster.CSIProvisioner)
	handle := pv.Spec.CSI.VolumeHandle
	vol, ok := driver.Volume(t, handle)
	if !ok || vol.Name != pv.Name {
		t.Fatalf("driver's volume %s: %+v (found %v); want one named %s", handle, vol, ok, pv.Name)
	}
	uniqueName := e2eutil.CSIPlugin + "/" + driverName + "^" + handle

	// 4-5. Attach, stage, publish, VolumesReady.
	podCreated := time.Now()
	pod := suite.CreatePod(t, e2eutil.Pod(e.ns, e.node, "app", e2eutil.ClaimVolume("data", "data")))
	vaName := attachmentName(handle, driverName, e.node)
	s.run("attached (attach/detach controller, external-attacher)", func() {
		e2eutil.Poll(t, 90*time.Second, "VolumeAttachment "+vaName+" attached", func(ctx context.Context) (bool, string) {
			va, err := admin.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return va.Status.Attached, fmt.Sprintf("status %+v", va.Status)
		})
	})
	va, err := admin.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if va.Spec.Attacher != driverName || va.Spec.NodeName != e.node || ptr.Deref(va.Spec.Source.PersistentVolumeName, "") != pv.Name {
		t.Errorf("VolumeAttachment %s: spec %+v; want attacher %s, node %s, PV %s", vaName, va.Spec, driverName, e.node, pv.Name)
	}
	waitWrittenBy(t, "create", "volumeattachments", "", vaName, attachDetachController)
	waitWrittenBy(t, "patch", "volumeattachments", "status", vaName, cluster.CSIAttacher)
	// The driver serves only its own node ID: an attach under the node's
	// name would have failed with NotFound.
	if vol, _ := driver.Volume(t, handle); !slices.Equal(vol.AttachedNodes, []string{nodeID}) {
		t.Errorf("driver's attachments of %s: %v; want [%s], the node ID from the CSINode", handle, vol.AttachedNodes, nodeID)
	}

	staging := e2eutil.GlobalMount(e.root, e2eutil.CSIPlugin, driverName+"^"+handle)
	target := e2eutil.VolumeDir(e.root, string(pod.UID), e2eutil.CSIPlugin, pv.Name)
	s.run("staged and published (agent)", func() {
		e.waitMounted(60*time.Second, staging, target)
	})
	// With --root-dir=/var/lib/kubelet, what a driver DaemonSet mounts
	// (/var/lib/kubelet/plugins and /var/lib/kubelet/pods) covers every
	// path the agent handed the driver (and the driver mounted there).
	for path, under := range map[string]string{staging: "plugins", target: "pods"} {
		if !strings.HasPrefix(path, filepath.Join(e.root, under)+"/") {
			t.Errorf("%s is not under the root directory's %s/", path, under)
		}
	}
	s.run("VolumesReady condition True", func() {
		e.waitVolumesReady(pod)
	})
	s.record("pod created → VolumesReady (total)", time.Since(podCreated))
	xfsFromLoop(t, target)
	if err := os.WriteFile(filepath.Join(target, "hello"), []byte(e.ns), 0o644); err != nil {
		t.Fatalf("write through the published path: %v", err)
	}
	counts := driver.CallCounts(t)
	if counts["ControllerPublishVolume"] < 1 || counts["NodeStageVolume"] != 1 || counts["NodePublishVolume"] != 1 {
		t.Errorf("driver calls %v; want ControllerPublishVolume, and one NodeStageVolume and NodePublishVolume", counts)
	}

	// The agent restarts in the middle of it all: the cluster sees
	// nothing of it.
	s.run("agent restarted; nothing the cluster sees changed", func() {
		e.restartUnseen(agent, driver, pod, driverName, vaName, uniqueName)
	})

	// 6. Online expansion.
	before := mounttest.FSSize(t, target)
	if _, err := claims.Patch(ctx, "data", types.StrategicMergePatchType,
		[]byte(`{"spec":{"resources":{"requests":{"storage":"400Mi"}}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("grow PVC data: %v", err)
	}
	grown := quantity("400Mi")
	s.run("controller expansion (expand controller, external-resizer)", func() {
		e2eutil.Poll(t, 60*time.Second, "PV "+pv.Name+" grown to 400Mi", func(ctx context.Context) (bool, string) {
			got, err := admin.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			c := got.Spec.Capacity[corev1.ResourceStorage]
			return c.Cmp(grown) == 0, "capacity " + c.String()
		})
	})
	s.run("node expansion (agent): claim capacity 400Mi", func() {
		e2eutil.Poll(t, 60*time.Second, "PVC data's capacity 400Mi", func(ctx context.Context) (bool, string) {
			pvc := e.claim(ctx, "data")
			c := pvc.Status.Capacity[corev1.ResourceStorage]
			return c.Cmp(grown) == 0, describeClaimStatus(pvc)
		})
	})
	if now := mounttest.FSSize(t, target); now-before < 80*mib*85/100 || now > 400*mib {
		t.Errorf("filesystem at %s: %d bytes, was %d: not grown with the volume to 400 MiB", target, now, before)
	}
	// For a CSI volume the expand controller only says it leaves the claim
	// to the external resizer, which does the controller's part; the node's
	// part (the claim's capacity) is the agent's.
	suite.WaitEvent(t, e.ns, fields.Set{"involvedObject.name": "data", "reason": "ExternalExpanding"}, nil)
	waitWrittenBy(t, "patch", "persistentvolumes", "", pv.Name, cluster.CSIResizer)
	waitWrittenBy(t, "patch", "persistentvolumeclaims", "status", "data", suite.User)
	counts = driver.CallCounts(t)
	if counts["ControllerExpandVolume"] < 1 || counts["NodeExpandVolume"] != 1 {
		t.Errorf("driver calls %v; want ControllerExpandVolume, and one NodeExpandVolume", counts)
	}
	// What the kubelet's MarkFSResizeFinished leaves: no resize condition
	// (external-resizer leaves Resizing beside FileSystemResizePending) and
	// no storage entry in allocatedResourceStatuses. Not fatal: the rest
	// of the flow is worth running whatever this says.
	s.run("claim's resize state cleared", func() {
		if left := e.waitResizeStateCleared("data", 15*time.Second); len(left) > 0 {
			t.Errorf("PVC data still carries %v after the node expanded it (%s)", left, describeClaimStatus(e.claim(ctx, "data")))
		}
	})
	if data, err := os.ReadFile(filepath.Join(target, "hello")); err != nil || string(data) != e.ns {
		t.Errorf("data written before the expansion: %q, %v; want %q", data, err, e.ns)
	}

	// 7. The pod goes: unpublish, unstage, detach.
	if err := admin.CoreV1().Pods(e.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	s.run("unpublished and unstaged (agent)", func() {
		e.waitGone(60*time.Second, target, e2eutil.PodDir(e.root, string(pod.UID)), staging)
	})
	s.run("detached, VolumeAttachment deleted", func() {
		e2eutil.Poll(t, 90*time.Second, "VolumeAttachment "+vaName+" deleted", func(ctx context.Context) (bool, string) {
			va, err := admin.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, ""
			}
			if err != nil {
				return false, err.Error()
			}
			return false, fmt.Sprintf("deletion %v, finalizers %v, status %+v", va.DeletionTimestamp, va.Finalizers, va.Status)
		})
	})
	waitWrittenBy(t, "delete", "volumeattachments", "", vaName, attachDetachController)
	if n, err := admin.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{}); err != nil || slices.Contains(n.Status.VolumesInUse, corev1.UniqueVolumeName(uniqueName)) {
		t.Errorf("node %s: volumesInUse %v (%v) still lists %s", e.node, n.Status.VolumesInUse, err, uniqueName)
	}
	counts = driver.CallCounts(t)
	if counts["NodeUnpublishVolume"] != 1 || counts["NodeUnstageVolume"] != 1 || counts["ControllerUnpublishVolume"] < 1 {
		t.Errorf("driver calls %v; want one NodeUnpublishVolume and NodeUnstageVolume, and ControllerUnpublishVolume", counts)
	}
	if vol, _ := driver.Volume(t, handle); len(vol.AttachedNodes) > 0 || vol.LoopDevice != "" {
		t.Errorf("driver's volume %s after the detach: %+v; want no attachment, no loop device", handle, vol)
	}

	// 8. The claim goes: the provisioner deletes the volume.
	if err := claims.Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete PVC data: %v", err)
	}
	s.run("volume deleted (external-provisioner)", func() {
		e2eutil.Poll(t, 60*time.Second, "PV "+pv.Name+" deleted", func(ctx context.Context) (bool, string) {
			_, err := admin.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	})
	waitWrittenBy(t, "delete", "persistentvolumes", "", pv.Name, cluster.CSIProvisioner)
	if _, ok := driver.Volume(t, handle); ok || driver.CallCounts(t)["DeleteVolume"] < 1 {
		t.Errorf("driver still has volume %s (%v) or was not asked to delete it (calls %v)", handle, ok, driver.CallCounts(t))
	}

	// 9. The driver goes (its controller side first: the sidecars exit
	// when they lose it).
	for _, sc := range sidecars {
		if err := sc.Stop(); err != nil {
			t.Error(err)
		}
	}
	s.run("driver deregistered from the agent", func() {
		if err := driver.Process().Stop(20 * time.Second); err != nil {
			t.Fatalf("stopping the driver: %v", err)
		}
		e2eutil.Poll(t, 60*time.Second, "driver "+driverName+" gone from /debug/drivers", func(context.Context) (bool, string) {
			drivers, err := agent.Drivers()
			if err != nil {
				return false, err.Error()
			}
			return drivers.Driver(driverName) == nil, fmt.Sprintf("%+v", drivers.Drivers)
		})
	})
	s.run("node stops publishing the driver (agent)", func() {
		e.waitNodeDutiesGone(driverName)
	})
	e.noWarnings(pod)
}

// waitVolumesReady waits until the agent has set the pod's VolumesReady
// condition True.
func (e *env) waitVolumesReady(pod *corev1.Pod) {
	e.t.Helper()
	e2eutil.Poll(e.t, 60*time.Second, "pod "+pod.Name+"'s VolumesReady condition True", func(ctx context.Context) (bool, string) {
		p, err := suite.Admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == podstatus.ConditionType {
				return c.Status == corev1.ConditionTrue, fmt.Sprintf("%s: %s (%s)", c.Status, c.Reason, c.Message)
			}
		}
		return false, "no condition yet"
	})
}

// waitResizeStateCleared waits up to timeout until the claim carries no
// resize condition and no storage entry in allocatedResourceStatuses, and
// returns what it still carries then (nil once cleared).
func (e *env) waitResizeStateCleared(claim string, timeout time.Duration) []string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), timeout)
	defer cancel()
	for {
		left := leftResizeState(e.claim(e.t.Context(), claim))
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return left
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// noWarnings checks that the pod got no Warning event: a kubelet emits none
// in a flow like this one (waiting for the attachment is no failure).
func (e *env) noWarnings(pod *corev1.Pod) {
	e.t.Helper()
	evs, _, err := suite.FindEvents(e.t.Context(), e.ns, fields.Set{"involvedObject.name": pod.Name, "type": corev1.EventTypeWarning})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, ev := range evs {
		e.t.Errorf("Warning event on pod %s: %s (x%d, from %s): %s", pod.Name, ev.Reason, ev.Count, ev.Source.Component, ev.Message)
	}
}

// equalAffinity compares node affinities by their required terms.
func equalAffinity(a, b *corev1.VolumeNodeAffinity) bool {
	if a == nil || b == nil || a.Required == nil || b.Required == nil {
		return a == b
	}
	return slices.EqualFunc(a.Required.NodeSelectorTerms, b.Required.NodeSelectorTerms, func(x, y corev1.NodeSelectorTerm) bool {
		return slices.EqualFunc(x.MatchExpressions, y.MatchExpressions, func(p, q corev1.NodeSelectorRequirement) bool {
			return p.Key == q.Key && p.Operator == q.Operator && slices.Equal(p.Values, q.Values)
		}) && len(x.MatchFields) == 0 && len(y.MatchFields) == 0
	})
}
