package policy_test

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
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// The real agent binary, with the token of its pod on node A and the
// local volume provisioner on, works under the policies: it writes pods'
// VolumesReady condition, creates its node's CSINode and sets the Node's
// attach/detach annotation, requests the service-account tokens of a
// tenant's pod and of its own pod (kube-api-access), creates a local PV
// for a disk in its discovery directory, and, once the PV's claim is released, cleans the
// disk, deletes the PV and creates it again. TestMain then checks in the
// audit log that none of its requests was refused.
func TestAgentWorksUnderPolicies(t *testing.T) {
	suite.Require(t)
	ctx := t.Context()
	// works-2... when the test runs again (-count).
	prefix := e2eutil.UniqueName("works")
	node, ns, class := prefix+"-a", prefix+"-tenant", prefix+"-local"
	suite.CreateNodeAndNamespace(t, node, ns, nil)
	// The agent's own pod, as the DaemonSet makes it: with the
	// kube-api-access volume the agent mounts for it, with a token of its
	// own service account bound to itself.
	sa := suite.ServiceAccount
	agentPod := suite.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "volume-agent-" + node, Namespace: sa.Namespace},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: sa.Name, Containers: []corev1.Container{{Name: "volume-agent", Image: "volume-agent"}}},
	})
	t.Cleanup(func() {
		_ = suite.Admin.CoreV1().Pods(sa.Namespace).Delete(context.Background(), agentPod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	kubeconfig, err := suite.Cluster.PodTokenKubeconfig(ctx, agentPod)
	if err != nil {
		t.Fatal(err)
	}

	suite.CreateStorageClass(t, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: class},
		Provisioner:       "kubernetes.io/no-provisioner",
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	})
	dir := mounttest.TempDir(t)
	disks := filepath.Join(dir, "disks")
	disk := filepath.Join(disks, "disk-1")
	if err := os.MkdirAll(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", disk, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "local-volumes.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, "storageClasses:\n  %s:\n    discoveryDir: %s\n", class, disks), 0o644); err != nil {
		t.Fatal(err)
	}
	// The class in the local volume policy's parameters, as an
	// administrator adds it with the class (deploy/local-volumes/policy-params.yaml),
	// in force before the agent starts: none of its requests may be refused.
	params, err := suite.Admin.CoreV1().ConfigMaps(sa.Namespace).Get(ctx, policyParams, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{".discoveryDir": disks, ".volumeMode": "Filesystem", ".accessModes": "ReadWriteOnce", ".labels": "", ".maxCapacity": "1Gi"} {
		params.Data[class+k] = v
	}
	if _, err := suite.Admin.CoreV1().ConfigMaps(sa.Namespace).Update(ctx, params, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		params, err := suite.Admin.CoreV1().ConfigMaps(sa.Namespace).Get(context.Background(), policyParams, metav1.GetOptions{})
		if err == nil {
			for k := range params.Data {
				if strings.HasPrefix(k, class+".") {
					delete(params.Data, k)
				}
			}
			_, err = suite.Admin.CoreV1().ConfigMaps(sa.Namespace).Update(context.Background(), params, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Errorf("removing class %s from %s: %v", class, policyParams, err)
		}
	})
	probe := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "works-probe", Labels: map[string]string{localpv.LabelNode: node},
			Annotations: map[string]string{localpv.AnnProvisionedBy: localpv.ProvisionerName(node)}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              class,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: filepath.Join(disks, "probe")}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: hostnameIn(corev1.NodeSelectorOpIn, node)}}}},
		},
	}
	probeClient := client(t, kubeconfig, "policy-test/agent-of-"+node)
	e2eutil.Poll(t, 60*time.Second, "class "+class+" in the local volume policy's parameters", func(ctx context.Context) (bool, string) {
		_, err := probeClient.CoreV1().PersistentVolumes().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, fmt.Sprint(err)
	})

	root := mounttest.TempDir(t)
	e2eutil.StartAgent(t, e2eutil.AgentOptions{
		Binary: suite.AgentBin, Kubeconfig: kubeconfig, Node: node, Root: filepath.Join(root, "agent"),
		Args: []string{"--shutdown-grace-period=10s", "--local-volumes-config=" + config},
	})

	// Pod conditions, and service-account tokens: a tenant pod's and the
	// agent's own.
	app := e2eutil.Pod(ns, node, "app", e2eutil.EmptyDirVolume("scratch", "", ""))
	app.Spec.AutomountServiceAccountToken = nil
	suite.CreatePod(t, app)
	for _, pod := range []*corev1.Pod{app, agentPod} {
		e2eutil.Poll(t, 60*time.Second, "pod "+pod.Name+"'s VolumesReady condition", func(ctx context.Context) (bool, string) {
			got, err := suite.Admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, c := range got.Status.Conditions {
				if c.Type == "volume-agent.io/VolumesReady" {
					return c.Status == corev1.ConditionTrue, fmt.Sprintf("%+v", c)
				}
			}
			return false, "no condition"
		})
	}

	// The node's CSI information: its CSINode, owned by the Node, and the
	// attach/detach controller's annotation, written under the
	// node-metadata and CSINode policies.
	e2eutil.Poll(t, 30*time.Second, "the node's CSINode and attach/detach annotation", func(ctx context.Context) (bool, string) {
		n, err := suite.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		cn, err := suite.Admin.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		owned := len(cn.OwnerReferences) == 1 && cn.OwnerReferences[0].UID == n.UID
		return owned && n.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"] == "true",
			fmt.Sprintf("owners %+v, annotations %v", cn.OwnerReferences, n.Annotations)
	})

	// Both tokens were issued to the agent, under the tokens policy.
	e2eutil.Poll(t, 30*time.Second, "the agent's token requests in the audit log", func(context.Context) (bool, string) {
		events, err := suite.Cluster.AuditEvents()
		if err != nil {
			return false, err.Error()
		}
		issued := map[string]bool{}
		for _, e := range events {
			if e.User.Username == suite.User && e.Stage == cluster.StageResponseComplete && e.ObjectRef != nil &&
				e.ObjectRef.Subresource == "token" && e.ResponseStatus != nil && e.ResponseStatus.Code == 201 {
				issued[e.ObjectRef.Namespace+"/"+e.ObjectRef.Name] = true
			}
		}
		return issued[ns+"/default"] && issued[sa.Namespace+"/"+sa.Name], fmt.Sprintf("tokens issued for %v", issued)
	})

	// The local PV, its release, cleanup, deletion and re-creation.
	pv := waitLocalPV(t, disk, "")
	t.Logf("the agent created PV %s (uid %s) with node affinity %v", pv.Name, pv.UID, pv.Spec.NodeAffinity.Required.NodeSelectorTerms)
	mounttest.WriteFile(t, filepath.Join(disk, "data"), "tenant data")
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(class),
			VolumeName:       pv.Name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	suite.WaitBound(t, ns, "claim", pv.Name)
	if err := suite.Admin.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "claim", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := waitLocalPV(t, disk, pv.UID)
	t.Logf("released, cleaned, deleted and created again as %s (uid %s)", again.Name, again.UID)
	if _, err := os.Stat(filepath.Join(disk, "data")); !os.IsNotExist(err) {
		t.Errorf("the released disk was not cleaned: %v", err)
	}
}

// waitLocalPV waits for an Available PV of path other than the one with
// UID old, and returns it.
func waitLocalPV(t *testing.T, path string, old types.UID) *corev1.PersistentVolume {
	t.Helper()
	var found *corev1.PersistentVolume
	e2eutil.Poll(t, 90*time.Second, "an Available PV of "+path, func(ctx context.Context) (bool, string) {
		list, err := suite.Admin.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for i := range list.Items {
			pv := &list.Items[i]
			if pv.Spec.Local == nil || pv.Spec.Local.Path != path {
				continue
			}
			seen = append(seen, fmt.Sprintf("%s %s %s", pv.Name, pv.UID, pv.Status.Phase))
			if pv.UID != old && pv.Status.Phase == corev1.VolumeAvailable {
				found = pv
				return true, ""
			}
		}
		return false, fmt.Sprint(seen)
	})
	return found
}
