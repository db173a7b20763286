package policy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/status/claimstatus"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// The policies' names, as deploy/ spells them.
const (
	podStatusPolicy   = "volume-agent-pod-status"
	nodeStatusPolicy  = "volume-agent-node-status"
	claimStatusPolicy = "volume-agent-claim-status"
	tokensPolicy      = "volume-agent-tokens"
	localPVPolicy     = "volume-agent-local-volumes"
	attachPolicy      = "volume-agent-self-attach"
	eventsPolicy      = "volume-agent-events"
	nodeMetaPolicy    = "volume-agent-node-metadata"
	csiNodePolicy     = "volume-agent-csinode"

	provisionedBy = "pv.kubernetes.io/provisioned-by"
	holdFinalizer = "test.volume-agent.io/hold"
)

// attempt is one request made as the agent of the test's node A.
type attempt struct {
	name string
	// refusedBy is the policy that must refuse the request, with a message
	// containing msg; empty if the request must succeed.
	refusedBy, msg string
	// do makes the request as client c, a dry run if dry is set.
	do func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error)
	// effect, if set, tells from the object an administrator's dry run of
	// the same request returns that the request would have changed what
	// the policy protects: the refusal is not vacuous.
	effect func(runtime.Object) bool
}

// fixture is what TestAgentIsConfinedToItsNode works on: two nodes, a
// tenant pod on each, the agent's pod on each, and the agent of node A's
// client.
type fixture struct {
	prefix               string
	nodeA, nodeB, ns     string
	podA, podB           *corev1.Pod
	agentPodA, agentPodB *corev1.Pod
	agentA, admin        kubernetes.Interface
	unbound              kubernetes.Interface
}

func client(t *testing.T, kubeconfig, userAgent string) kubernetes.Interface {
	t.Helper()
	cfg, err := kubeclient.LoadConfig(kubeclient.Options{Kubeconfig: kubeconfig, UserAgent: userAgent, QPS: 100, Burst: 200})
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newFixture makes the fixture's nodes, namespace and pods, named after
// prefix; <prefix>-2... when the test runs again (-count).
func newFixture(t *testing.T, prefix string) *fixture {
	t.Helper()
	prefix = e2eutil.UniqueName(prefix)
	f := &fixture{prefix: prefix, nodeA: prefix + "-a", nodeB: prefix + "-b", ns: prefix + "-tenant", admin: suite.Admin}
	suite.CreateNodeAndNamespace(t, f.nodeA, f.ns, nil)
	suite.CreateNode(t, f.nodeB, nil)
	f.podA = suite.CreatePod(t, tenantPod(f.ns, "tenant-a", f.nodeA))
	f.podB = suite.CreatePod(t, tenantPod(f.ns, "tenant-b", f.nodeB))
	var kubeconfigA string
	f.agentPodA, kubeconfigA = suite.AgentPod(t, f.nodeA)
	f.agentPodB, _ = suite.AgentPod(t, f.nodeB)
	f.agentA = client(t, kubeconfigA, "policy-test/agent-of-"+f.nodeA)
	f.unbound = client(t, suite.Kubeconfig, "policy-test/unbound")
	return f
}

// tenantPod is a pod with a finalizer of the test's, which the agent must
// not be able to take away.
func tenantPod(ns, name, node string) *corev1.Pod {
	pod := e2eutil.Pod(ns, node, name)
	pod.Finalizers = []string{holdFinalizer}
	return pod
}

// name is the name of a cluster-scoped object (PV, VolumeAttachment) of
// the fixture's.
func (f *fixture) name(s string) string { return f.prefix + "-" + s }

// releasePods removes the tests' finalizers so that the namespace's pods
// can go.
func (f *fixture) releasePods(t *testing.T) {
	for _, p := range []*corev1.Pod{f.podA, f.podB} {
		_, err := f.admin.CoreV1().Pods(p.Namespace).Patch(context.Background(), p.Name, types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		if err != nil {
			t.Errorf("release pod %s: %v", p.Name, err)
		}
	}
}

// podStatus patches the status of pod ns/name.
func podStatus(ns, name string, pt types.PatchType, body string) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return c.CoreV1().Pods(ns).Patch(ctx, name, pt, []byte(body), metav1.PatchOptions{DryRun: dry}, "status")
	}
}

func nodeStatus(name string, pt types.PatchType, body string) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return c.CoreV1().Nodes().Patch(ctx, name, pt, []byte(body), metav1.PatchOptions{DryRun: dry}, "status")
	}
}

func patchNode(name string, pt types.PatchType, body string) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return c.CoreV1().Nodes().Patch(ctx, name, pt, []byte(body), metav1.PatchOptions{DryRun: dry})
	}
}

// csiNode is the CSINode of node, owned by owner (a Node's name and UID).
func csiNode(node, owner string, ownerUID types.UID) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: node, OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: owner, UID: ownerUID}}},
		Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{}},
	}
}

func createCSINode(n *storagev1.CSINode) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return c.StorageV1().CSINodes().Create(ctx, n.DeepCopy(), metav1.CreateOptions{DryRun: dry})
	}
}

// updateCSINode reads a CSINode as the administrator, changes it and writes
// it back (the agent updates CSINodes; it does not patch them).
func updateCSINode(name string, change func(*storagev1.CSINode)) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		n, err := suite.Admin.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		change(n)
		return c.StorageV1().CSINodes().Update(ctx, n, metav1.UpdateOptions{DryRun: dry})
	}
}

func deleteCSINode(name string) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return nil, c.StorageV1().CSINodes().Delete(ctx, name, metav1.DeleteOptions{DryRun: dry})
	}
}

func claimStatus(ns, name string, pt types.PatchType, body string) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return c.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, name, pt, []byte(body), metav1.PatchOptions{DryRun: dry}, "status")
	}
}

func createPV(pv *corev1.PersistentVolume) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return c.CoreV1().PersistentVolumes().Create(ctx, pv.DeepCopy(), metav1.CreateOptions{DryRun: dry})
	}
}

func patchPV(name, body string) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return c.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{DryRun: dry})
	}
}

func deletePV(name string) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return nil, c.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{DryRun: dry})
	}
}

func createVA(va *storagev1.VolumeAttachment) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return c.StorageV1().VolumeAttachments().Create(ctx, va.DeepCopy(), metav1.CreateOptions{DryRun: dry})
	}
}

func attachedStatus(name string) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return c.StorageV1().VolumeAttachments().Patch(ctx, name, types.MergePatchType, []byte(`{"status":{"attached":true}}`),
			metav1.PatchOptions{DryRun: dry}, "status")
	}
}

func deleteVA(name string) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return nil, c.StorageV1().VolumeAttachments().Delete(ctx, name, metav1.DeleteOptions{DryRun: dry})
	}
}

func token(ns, sa string, bound *authenticationv1.BoundObjectReference, audiences ...string) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		return c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: bound, Audiences: audiences},
		}, metav1.CreateOptions{DryRun: dry})
	}
}

// createEvent reports an event about pod tenant-a as the agent of node,
// its metadata changed by changes.
func createEvent(ns, name, node string, changes ...func(*metav1.ObjectMeta)) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		now := metav1.Now()
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: ns},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "tenant-a", APIVersion: "v1"},
			Reason:         "FailedMount", Message: "test", Type: corev1.EventTypeWarning,
			Source:         corev1.EventSource{Component: "volume-agent", Host: node},
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}
		for _, change := range changes {
			change(&ev.ObjectMeta)
		}
		return c.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{DryRun: dry})
	}
}

func boundTo(kind string, obj metav1.Object) *authenticationv1.BoundObjectReference {
	return &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: kind, Name: obj.GetName(), UID: obj.GetUID()}
}

// localPV is a local PV of class local-ssd (as deploy/local-volumes
// configures it) of the provisioner of annotatedNode (none if empty),
// labelled as that provisioner labels its PVs, with one node-affinity term
// per element of terms.
func localPV(name, annotatedNode string, terms ...[]corev1.NodeSelectorRequirement) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              "local-ssd",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/disks/ssd/" + name}},
		},
	}
	if annotatedNode != "" {
		pv.Annotations = map[string]string{provisionedBy: "volume-agent.io/" + annotatedNode}
		pv.Labels = map[string]string{localpv.LabelNode: localpv.NodeLabelValue(annotatedNode)}
	}
	if len(terms) > 0 {
		sel := &corev1.NodeSelector{}
		for _, t := range terms {
			sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, corev1.NodeSelectorTerm{MatchExpressions: t})
		}
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: sel}
	}
	return pv
}

// ownPV is a local PV of node as its provisioner makes it, changed by
// change.
func ownPV(name, node string, change func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	pv := localPV(name, node, hostnameIn(corev1.NodeSelectorOpIn, node))
	change(pv)
	return pv
}

// claimReporter is the agent's claim status writer (status/claimstatus),
// sending its patches as client c.
type claimReporter struct {
	c   kubernetes.Interface
	dry []string
}

func (r claimReporter) PatchPVCStatus(ctx context.Context, ns, name string, pt types.PatchType, patch []byte) (*corev1.PersistentVolumeClaim, error) {
	return r.c.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, name, pt, patch, metav1.PatchOptions{DryRun: r.dry}, "status")
}

// expansion makes one of the agent's claim status writes (step) to claim
// ns/name, computed from the claim as the administrator reads it, exactly
// as the agent sends them.
func expansion(ns, name string, step func(context.Context, *claimstatus.Reporter, *corev1.PersistentVolumeClaim) error) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	return func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
		current := func(ns, name string) (*corev1.PersistentVolumeClaim, error) {
			return suite.Admin.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		}
		pvc, err := current(ns, name)
		if err != nil {
			return nil, err
		}
		return nil, step(ctx, claimstatus.New(claimReporter{c, dry}, current), pvc)
	}
}

// volumesReady patches pod ns/name's VolumesReady condition as
// status/podstatus does: a strategic merge patch with the pod's UID as a
// precondition.
func volumesReady(ns, name string, uid types.UID) func(context.Context, kubernetes.Interface, []string) (runtime.Object, error) {
	now := metav1.Now()
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": uid},
		"status": map[string]any{"conditions": []corev1.PodCondition{{
			Type: podstatus.ConditionType, Status: corev1.ConditionFalse, Reason: "MountFailed", Message: "volume data: test",
			LastProbeTime: now, LastTransitionTime: now,
		}}},
	})
	if err != nil {
		panic(err)
	}
	return podStatus(ns, name, types.StrategicMergePatchType, string(patch))
}

const ghostOwner = `"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"00000000-0000-0000-0000-000000000000"}]`

func hostnameIn(op corev1.NodeSelectorOperator, nodes ...string) []corev1.NodeSelectorRequirement {
	return []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: op, Values: nodes}}
}

func volumeAttachment(name, node string) *storagev1.VolumeAttachment {
	pv := name + "-pv"
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: "csi.example.com",
			NodeName: node,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
		},
	}
}

// waitPolicies waits until each policy refuses a dry run of a request it
// must refuse: the API server's admission plugin learns about policies
// and bindings through a watch.
func waitPolicies(t *testing.T, c kubernetes.Interface, attempts []attempt) {
	t.Helper()
	waiting := map[string]attempt{}
	for _, a := range attempts {
		if _, ok := waiting[a.refusedBy]; a.refusedBy != "" && !ok {
			waiting[a.refusedBy] = a
		}
	}
	for policy, a := range waiting {
		last := "no answer"
		e2eutil.Poll(t, 60*time.Second, "policy "+policy+" in force", func(ctx context.Context) (bool, string) {
			_, err := a.do(ctx, c, []string{metav1.DryRunAll})
			if ctx.Err() == nil {
				last = fmt.Sprintf("%s: %v", a.name, err)
			}
			return refusedBy(err, policy), last
		})
	}
}

func refusedBy(err error, policy string) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
}

// run makes each attempt as c for real, in order, and checks the outcome;
// a refused attempt is then made by the administrator as a dry run, which
// must succeed (and have its effect): the API server would have accepted
// the request from anyone the policies do not match.
func run(t *testing.T, c kubernetes.Interface, attempts []attempt) {
	t.Helper()
	ctx := t.Context()
	for _, a := range attempts {
		_, err := a.do(ctx, c, nil)
		switch {
		case a.refusedBy == "" && err != nil:
			t.Errorf("%s: refused: %v", a.name, err)
			continue
		case a.refusedBy == "":
			t.Logf("%s: allowed", a.name)
			continue
		case !refusedBy(err, a.refusedBy):
			t.Errorf("%s: got %v, want a refusal by ValidatingAdmissionPolicy %s", a.name, err, a.refusedBy)
			continue
		case !strings.Contains(err.Error(), a.msg):
			t.Errorf("%s: refusal %q does not say %q", a.name, err, a.msg)
		}
		t.Logf("%s: refused: %v", a.name, err)
		obj, err := a.do(ctx, suite.Admin, []string{metav1.DryRunAll})
		if err != nil {
			t.Errorf("%s: the administrator's dry run of the same request failed too, so the refusal proves nothing: %v", a.name, err)
			continue
		}
		if a.effect != nil && !a.effect(obj) {
			t.Errorf("%s: the administrator's dry run did not change what the policy protects: %+v", a.name, obj)
		}
	}
}

// The agent of node A, with the token the kubelet would project into its
// pod, may write its own node's pods' VolumesReady condition, its node's
// volumesInUse, claims' status, its own local PVs and VolumeAttachments
// and tokens for pods; everything of node B, and everything beyond its own
// fields, is refused by the deploy/ admission policies (their names and
// reasons in the refusal), although RBAC grants the verb and an
// administrator's identical request is accepted.
func TestAgentIsConfinedToItsNode(t *testing.T) {
	suite.Require(t)
	ctx := t.Context()
	f := newFixture(t, "confined")
	t.Cleanup(func() { f.releasePods(t) })
	a, b := f.nodeA, f.nodeB

	// A claim, with the finalizer the pvc-protection controller adds.
	claim := e2eutil.PVC("claim", "")
	claim.Namespace = f.ns
	if _, err := f.admin.CoreV1().PersistentVolumeClaims(f.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e2eutil.Poll(t, 60*time.Second, "the claim's pvc-protection finalizer", func(ctx context.Context) (bool, string) {
		c, err := f.admin.CoreV1().PersistentVolumeClaims(f.ns).Get(ctx, "claim", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(c.Finalizers) > 0, fmt.Sprint(c.Finalizers)
	})
	// Node B's local PV and VolumeAttachment, an administrator's PV, and a
	// PV node A's provisioner made before PVs were labelled, bound.
	aOld := localPV(f.name("a-old"), a, hostnameIn(corev1.NodeSelectorOpIn, a))
	aOld.Spec.ClaimRef = &corev1.ObjectReference{Namespace: f.ns, Name: "old-claim"}
	aOld.Labels = nil
	for _, pv := range []*corev1.PersistentVolume{
		localPV(f.name("b-local"), b, hostnameIn(corev1.NodeSelectorOpIn, b)),
		aOld,
		{ObjectMeta: metav1.ObjectMeta{Name: f.name("admins")}, Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/data"}},
		}},
	} {
		if _, err := f.admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.admin.StorageV1().VolumeAttachments().Create(ctx, volumeAttachment(f.name("b-attachment"), b), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := createEvent(f.ns, "by-b", b)(ctx, f.admin, nil); err != nil {
		t.Fatal(err)
	}
	uidA, uidB := nodeUID(t, a), nodeUID(t, b)
	if _, err := f.admin.StorageV1().CSINodes().Create(ctx, csiNode(b, b, uidB), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	const ready = `{"status":{"conditions":[{"type":"volume-agent.io/VolumesReady","status":"True","reason":"Test"}]}}`
	podLabelled := func(o runtime.Object) bool { return o.(*corev1.Pod).Labels["role"] == "db" }
	podReleased := func(o runtime.Object) bool { return len(o.(*corev1.Pod).Finalizers) == 0 }
	attempts := []attempt{
		// Pods.
		{name: "own node's pod: its VolumesReady condition", do: podStatus(f.ns, "tenant-a", types.StrategicMergePatchType, ready)},
		{name: "other node's pod: its VolumesReady condition", refusedBy: podStatusPolicy, msg: `is bound to "` + b + `"`,
			do: podStatus(f.ns, "tenant-b", types.StrategicMergePatchType, ready)},
		{name: "own node's pod: the Ready condition", refusedBy: podStatusPolicy, msg: "VolumesReady",
			do: podStatus(f.ns, "tenant-a", types.StrategicMergePatchType, `{"status":{"conditions":[{"type":"Ready","status":"True"}]}}`)},
		{name: "own node's pod: its phase", refusedBy: podStatusPolicy, msg: "VolumesReady",
			do: podStatus(f.ns, "tenant-a", types.MergePatchType, `{"status":{"phase":"Failed"}}`)},
		{name: "own node's pod: its IP", refusedBy: podStatusPolicy, msg: "VolumesReady",
			do: podStatus(f.ns, "tenant-a", types.MergePatchType, `{"status":{"podIP":"10.9.9.9","podIPs":[{"ip":"10.9.9.9"}]}}`)},
		{name: "own node's pod: a label, through status", refusedBy: podStatusPolicy, msg: "labels", effect: podLabelled,
			do: podStatus(f.ns, "tenant-a", types.MergePatchType, `{"metadata":{"labels":{"role":"db"}}}`)},
		{name: "own node's pod: its finalizer, through status", refusedBy: podStatusPolicy, msg: "metadata.finalizers", effect: podReleased,
			do: podStatus(f.ns, "tenant-a", types.MergePatchType, `{"metadata":{"finalizers":null}}`)},
		{name: "own node's pod: its VolumesReady condition, as status/podstatus sends it", do: volumesReady(f.ns, "tenant-a", f.podA.UID)},
		{name: "own node's pod: an annotation, through status", refusedBy: podStatusPolicy, msg: "metadata.annotations",
			effect: func(o runtime.Object) bool { return o.(*corev1.Pod).Annotations["example.com/x"] == "y" },
			do:     podStatus(f.ns, "tenant-a", types.MergePatchType, `{"metadata":{"annotations":{"example.com/x":"y"}}}`)},
		{name: "own node's pod: a finalizer added, through status", refusedBy: podStatusPolicy, msg: "metadata.finalizers",
			effect: func(o runtime.Object) bool { return len(o.(*corev1.Pod).Finalizers) == 2 },
			do:     podStatus(f.ns, "tenant-a", types.MergePatchType, `{"metadata":{"finalizers":["`+holdFinalizer+`","example.com/keep"]}}`)},
		{name: "own node's pod: a status field the policy never named (observedGeneration)", refusedBy: podStatusPolicy, msg: "status.observedGeneration",
			effect: func(o runtime.Object) bool { return o.(*corev1.Pod).Status.ObservedGeneration == 1 },
			do:     podStatus(f.ns, "tenant-a", types.MergePatchType, `{"status":{"observedGeneration":1}}`)},
		// The pod status strategy itself drops owner references sent
		// through pods/status: accepted, and nothing changes (checked
		// below).
		{name: "own node's pod: an owner reference, through status (the API server drops it)",
			do: podStatus(f.ns, "tenant-a", types.MergePatchType, `{"metadata":{`+ghostOwner+`}}`)},

		// Nodes.
		{name: "own node: volumesInUse", do: nodeStatus(a, types.MergePatchType, `{"status":{"volumesInUse":["kubernetes.io/csi/csi.example.com^vol-1"]}}`)},
		{name: "other node: volumesInUse", refusedBy: nodeStatusPolicy, msg: "not of node " + b,
			do: nodeStatus(b, types.MergePatchType, `{"status":{"volumesInUse":["kubernetes.io/csi/csi.example.com^vol-1"]}}`)},
		{name: "own node: a label, through status", refusedBy: nodeStatusPolicy, msg: "labels",
			effect: func(o runtime.Object) bool {
				_, ok := o.(*corev1.Node).Labels["node-role.kubernetes.io/control-plane"]
				return ok
			},
			do: nodeStatus(a, types.MergePatchType, `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`)},
		{name: "own node: its hostname label, through status", refusedBy: nodeStatusPolicy, msg: "labels",
			effect: func(o runtime.Object) bool { return o.(*corev1.Node).Labels[corev1.LabelHostname] == b },
			do:     nodeStatus(a, types.MergePatchType, `{"metadata":{"labels":{"kubernetes.io/hostname":"`+b+`"}}}`)},
		{name: "own node: no volumes in use, as status/nodestatus sends it", do: nodeStatus(a, types.MergePatchType, `{"status":{"volumesInUse":[]}}`)},
		{name: "own node: an owner that does not exist, through status (the garbage collector would delete the node)", refusedBy: nodeStatusPolicy,
			msg:    "metadata.ownerReferences",
			effect: func(o runtime.Object) bool { return len(o.(*corev1.Node).OwnerReferences) == 1 },
			do:     nodeStatus(a, types.MergePatchType, `{"metadata":{`+ghostOwner+`}}`)},
		{name: "own node: a finalizer, through status", refusedBy: nodeStatusPolicy, msg: "metadata.finalizers",
			effect: func(o runtime.Object) bool { return len(o.(*corev1.Node).Finalizers) == 1 },
			do:     nodeStatus(a, types.MergePatchType, `{"metadata":{"finalizers":["example.com/keep"]}}`)},
		{name: "own node: an annotation, through status", refusedBy: nodeStatusPolicy, msg: "metadata.annotations",
			effect: func(o runtime.Object) bool { return o.(*corev1.Node).Annotations["example.com/x"] == "y" },
			do:     nodeStatus(a, types.MergePatchType, `{"metadata":{"annotations":{"example.com/x":"y"}}}`)},
		{name: "own node: a status field no policy named before (images, which the scheduler scores)", refusedBy: nodeStatusPolicy, msg: "status.images",
			effect: func(o runtime.Object) bool { return len(o.(*corev1.Node).Status.Images) == 1 },
			do:     nodeStatus(a, types.MergePatchType, `{"status":{"images":[{"names":["registry.example.com/app:1"],"sizeBytes":1}]}}`)},
		{name: "own node: the Ready condition", refusedBy: nodeStatusPolicy, msg: "volumesInUse",
			do: nodeStatus(a, types.StrategicMergePatchType, `{"status":{"conditions":[{"type":"Ready","status":"True"}]}}`)},
		{name: "own node: volumesAttached", refusedBy: nodeStatusPolicy, msg: "volumesInUse",
			do: nodeStatus(a, types.MergePatchType, `{"status":{"volumesAttached":[{"name":"kubernetes.io/csi/csi.example.com^vol-1","devicePath":""}]}}`)},
		{name: "own node: capacity", refusedBy: nodeStatusPolicy, msg: "volumesInUse",
			do: nodeStatus(a, types.MergePatchType, `{"status":{"capacity":{"cpu":"64"}}}`)},

		// Nodes' metadata: the kubelet's CSI annotations and topology
		// labels, nothing else.
		{name: "own node: the CSI node ID annotation",
			do: patchNode(a, types.MergePatchType, `{"metadata":{"annotations":{"csi.volume.kubernetes.io/nodeid":"{\"x.csi\":\"id-1\"}"}}}`)},
		{name: "own node: the controller-managed-attach-detach annotation",
			do: patchNode(a, types.MergePatchType, `{"metadata":{"annotations":{"volumes.kubernetes.io/controller-managed-attach-detach":"true"}}}`)},
		{name: "own node: a driver's topology label", do: patchNode(a, types.MergePatchType, `{"metadata":{"labels":{"topology.x.csi/rack":"r1"}}}`)},
		{name: "own node: the zone label", do: patchNode(a, types.MergePatchType, `{"metadata":{"labels":{"topology.kubernetes.io/zone":"z1"}}}`)},
		{name: "other node: the CSI node ID annotation", refusedBy: nodeMetaPolicy, msg: "not node " + b,
			do: patchNode(b, types.MergePatchType, `{"metadata":{"annotations":{"csi.volume.kubernetes.io/nodeid":"{\"x.csi\":\"id-1\"}"}}}`)},
		{name: "own node: another annotation", refusedBy: nodeMetaPolicy, msg: "annotations",
			do: patchNode(a, types.MergePatchType, `{"metadata":{"annotations":{"example.com/owner":"me"}}}`)},
		{name: "own node: its hostname label", refusedBy: nodeMetaPolicy, msg: "change or remove",
			effect: func(o runtime.Object) bool { return o.(*corev1.Node).Labels[corev1.LabelHostname] == b },
			do:     patchNode(a, types.MergePatchType, `{"metadata":{"labels":{"kubernetes.io/hostname":"`+b+`"}}}`)},
		{name: "own node: a topology label it set, changed", refusedBy: nodeMetaPolicy, msg: "change or remove",
			do: patchNode(a, types.MergePatchType, `{"metadata":{"labels":{"topology.x.csi/rack":"r2"}}}`)},
		{name: "own node: the control-plane role label", refusedBy: nodeMetaPolicy, msg: "outside the kubernetes.io",
			effect: func(o runtime.Object) bool {
				_, ok := o.(*corev1.Node).Labels["node-role.kubernetes.io/control-plane"]
				return ok
			},
			do: patchNode(a, types.MergePatchType, `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`)},
		{name: "own node: a node-restriction label", refusedBy: nodeMetaPolicy, msg: "outside the kubernetes.io",
			do: patchNode(a, types.MergePatchType, `{"metadata":{"labels":{"node-restriction.kubernetes.io/secure":"true"}}}`)},
		{name: "own node: its taints", refusedBy: nodeMetaPolicy, msg: "spec",
			do: patchNode(a, types.MergePatchType, `{"spec":{"taints":[{"key":"k","value":"v","effect":"NoSchedule"}]}}`)},
		{name: "own node: unschedulable", refusedBy: nodeMetaPolicy, msg: "spec",
			do: patchNode(a, types.MergePatchType, `{"spec":{"unschedulable":true}}`)},
		{name: "own node: a finalizer", refusedBy: nodeMetaPolicy, msg: "metadata.finalizers",
			effect: func(o runtime.Object) bool { return len(o.(*corev1.Node).Finalizers) == 1 },
			do:     patchNode(a, types.MergePatchType, `{"metadata":{"finalizers":["example.com/keep"]}}`)},
		{name: "own node: an owner that does not exist (the garbage collector would delete the node)", refusedBy: nodeMetaPolicy, msg: "metadata.ownerReferences",
			effect: func(o runtime.Object) bool { return len(o.(*corev1.Node).OwnerReferences) == 1 },
			do:     patchNode(a, types.MergePatchType, `{"metadata":{`+ghostOwner+`}}`)},

		// CSINodes: its own node's only, owned by its Node.
		{name: "other node: a CSINode", refusedBy: csiNodePolicy, msg: "not " + b, do: createCSINode(csiNode(b+"-x", a, uidA))},
		{name: "own node: a CSINode owned by the other node", refusedBy: csiNodePolicy, msg: "owned by its Node",
			do: createCSINode(csiNode(a, b, uidB))},
		{name: "own node: a CSINode with a label", refusedBy: csiNodePolicy, msg: "labels",
			do: createCSINode(func() *storagev1.CSINode {
				n := csiNode(a, a, uidA)
				n.Labels = map[string]string{"k": "v"}
				return n
			}())},
		{name: "own node: its CSINode", do: createCSINode(csiNode(a, a, uidA))},
		{name: "own node: a driver entry in its CSINode",
			do: updateCSINode(a, func(n *storagev1.CSINode) {
				n.Spec.Drivers = []storagev1.CSINodeDriver{{Name: "x.csi", NodeID: "id-1", TopologyKeys: []string{"topology.x.csi/rack"}}}
			})},
		{name: "own node: its CSINode's owner", refusedBy: csiNodePolicy, msg: "owned by its Node",
			do: updateCSINode(a, func(n *storagev1.CSINode) { n.OwnerReferences = nil })},
		{name: "own node: its CSINode's finalizers", refusedBy: csiNodePolicy, msg: "finalizers",
			do: updateCSINode(a, func(n *storagev1.CSINode) { n.Finalizers = []string{"example.com/keep"} })},
		{name: "other node: its CSINode's drivers", refusedBy: csiNodePolicy, msg: "not " + b,
			do: updateCSINode(b, func(n *storagev1.CSINode) {
				n.Spec.Drivers = []storagev1.CSINodeDriver{{Name: "x.csi", NodeID: "stolen"}}
			})},
		{name: "other node: deleting its CSINode", refusedBy: csiNodePolicy, msg: "not " + b, do: deleteCSINode(b)},
		{name: "own node: deleting its CSINode", do: deleteCSINode(a)},

		// Claims: any claim's capacity and conditions (which claims the
		// node's pods use is beyond CEL), never its finalizers or phase.
		{name: "a claim: capacity", do: claimStatus(f.ns, "claim", types.MergePatchType, `{"status":{"capacity":{"storage":"1Gi"}}}`)},
		{name: "a claim: its pvc-protection finalizer, through status", refusedBy: claimStatusPolicy, msg: "finalizers",
			effect: func(o runtime.Object) bool { return len(o.(*corev1.PersistentVolumeClaim).Finalizers) == 0 },
			do:     claimStatus(f.ns, "claim", types.MergePatchType, `{"metadata":{"finalizers":null}}`)},
		{name: "a claim: its phase", refusedBy: claimStatusPolicy, msg: "status.phase",
			do: claimStatus(f.ns, "claim", types.MergePatchType, `{"status":{"phase":"Lost"}}`)},
		{name: "a claim: expansion in progress, as status/claimstatus sends it",
			do: expansion(f.ns, "claim", func(ctx context.Context, r *claimstatus.Reporter, pvc *corev1.PersistentVolumeClaim) error {
				return r.ResizeInProgress(ctx, pvc)
			})},
		{name: "a claim: expansion failed, as status/claimstatus sends it",
			do: expansion(f.ns, "claim", func(ctx context.Context, r *claimstatus.Reporter, pvc *corev1.PersistentVolumeClaim) error {
				return r.ResizeFailed(ctx, pvc, fmt.Errorf("resize2fs: test"))
			})},
		{name: "a claim: expansion infeasible, as status/claimstatus sends it",
			do: expansion(f.ns, "claim", func(ctx context.Context, r *claimstatus.Reporter, pvc *corev1.PersistentVolumeClaim) error {
				return r.ResizeFailed(ctx, pvc, fmt.Errorf("test: %w", plugins.ErrExpansionInfeasible))
			})},
		{name: "a claim: expansion finished, as status/claimstatus sends it",
			do: expansion(f.ns, "claim", func(ctx context.Context, r *claimstatus.Reporter, pvc *corev1.PersistentVolumeClaim) error {
				return r.ResizeFinished(ctx, pvc, resource.MustParse("2Gi"))
			})},
		{name: "a claim: an owner that does not exist, through status (the garbage collector would delete the claim and its volume)",
			refusedBy: claimStatusPolicy, msg: "metadata.ownerReferences",
			effect: func(o runtime.Object) bool { return len(o.(*corev1.PersistentVolumeClaim).OwnerReferences) == 1 },
			do:     claimStatus(f.ns, "claim", types.MergePatchType, `{"metadata":{`+ghostOwner+`}}`)},
		{name: "a claim: a label, through status", refusedBy: claimStatusPolicy, msg: "metadata.labels",
			effect: func(o runtime.Object) bool { return o.(*corev1.PersistentVolumeClaim).Labels["tier"] == "gold" },
			do:     claimStatus(f.ns, "claim", types.MergePatchType, `{"metadata":{"labels":{"tier":"gold"}}}`)},
		{name: "a claim: an annotation, through status", refusedBy: claimStatusPolicy, msg: "metadata.annotations",
			effect: func(o runtime.Object) bool {
				return o.(*corev1.PersistentVolumeClaim).Annotations["example.com/x"] == "y"
			},
			do: claimStatus(f.ns, "claim", types.MergePatchType, `{"metadata":{"annotations":{"example.com/x":"y"}}}`)},
		{name: "a claim: a finalizer added, through status", refusedBy: claimStatusPolicy, msg: "metadata.finalizers",
			effect: func(o runtime.Object) bool { return len(o.(*corev1.PersistentVolumeClaim).Finalizers) == 2 },
			do:     claimStatus(f.ns, "claim", types.MergePatchType, `{"metadata":{"finalizers":["kubernetes.io/pvc-protection","example.com/keep"]}}`)},
		{name: "a claim: its allocated resources (the resize controller's)", refusedBy: claimStatusPolicy, msg: "status.allocatedResources",
			do: claimStatus(f.ns, "claim", types.MergePatchType, `{"status":{"allocatedResources":{"storage":"5Gi"}}}`)},
		{name: "a claim: the controller's resize status", refusedBy: claimStatusPolicy, msg: "allocatedResourceStatuses",
			do: claimStatus(f.ns, "claim", types.MergePatchType, `{"status":{"allocatedResourceStatuses":{"storage":"ControllerResizeInProgress"}}}`)},
		{name: "a claim: the Resizing condition started", refusedBy: claimStatusPolicy, msg: "NodeResizeError condition",
			do: claimStatus(f.ns, "claim", types.StrategicMergePatchType, `{"status":{"conditions":[{"type":"Resizing","status":"True"}]}}`)},

		// Local PersistentVolumes.
		{name: "own node: a local PV", do: createPV(localPV(f.name("a-local"), a, hostnameIn(corev1.NodeSelectorOpIn, a)))},
		{name: "own node: deleting its local PV", do: deletePV(f.name("a-local"))},
		{name: "other node: a local PV", refusedBy: localPVPolicy, msg: "volume-agent.io/" + b,
			do: createPV(localPV(f.name("b-local-2"), b, hostnameIn(corev1.NodeSelectorOpIn, b)))},
		{name: "own annotation, other node's affinity", refusedBy: localPVPolicy, msg: "In [" + a + "]",
			do: createPV(localPV(f.name("x-affinity-b"), a, hostnameIn(corev1.NodeSelectorOpIn, b)))},
		{name: "own affinity, other node's annotation", refusedBy: localPVPolicy, msg: "volume-agent.io/" + b,
			do: createPV(localPV(f.name("x-annotation-b"), b, hostnameIn(corev1.NodeSelectorOpIn, a)))},
		{name: "own affinity, no annotation", refusedBy: localPVPolicy, msg: "provisioned-by",
			do: createPV(localPV(f.name("x-no-annotation"), "", hostnameIn(corev1.NodeSelectorOpIn, a)))},
		{name: "affinity to both nodes in one term", refusedBy: localPVPolicy, msg: "In [" + a + "]",
			do: createPV(localPV(f.name("x-both"), a, hostnameIn(corev1.NodeSelectorOpIn, a, b)))},
		{name: "a second term for the other node", refusedBy: localPVPolicy, msg: "In [" + a + "]",
			do: createPV(localPV(f.name("x-two-terms"), a, hostnameIn(corev1.NodeSelectorOpIn, a), hostnameIn(corev1.NodeSelectorOpIn, b)))},
		{name: "every node but another", refusedBy: localPVPolicy, msg: "In [" + a + "]",
			do: createPV(localPV(f.name("x-notin"), a, hostnameIn(corev1.NodeSelectorOpNotIn, b)))},
		{name: "affinity to a zone only", refusedBy: localPVPolicy, msg: "In [" + a + "]",
			do: createPV(localPV(f.name("x-zone"), a, []corev1.NodeSelectorRequirement{{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{"z"}}}))},
		{name: "a hostPath PV pinned to its node", refusedBy: localPVPolicy, msg: "not one",
			do: createPV(func() *corev1.PersistentVolume {
				pv := localPV(f.name("x-hostpath"), a, hostnameIn(corev1.NodeSelectorOpIn, a))
				pv.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}
				return pv
			}())},
		{name: "a local PV bound in advance to a claim", refusedBy: localPVPolicy, msg: "claim",
			do: createPV(func() *corev1.PersistentVolume {
				pv := localPV(f.name("x-prebound"), a, hostnameIn(corev1.NodeSelectorOpIn, a))
				pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: f.ns, Name: "claim"}
				return pv
			}())},
		{name: "own node: a local PV of a class not configured", refusedBy: localPVPolicy, msg: "storage classes in ConfigMap",
			do: createPV(ownPV("x-class", a, func(pv *corev1.PersistentVolume) { pv.Spec.StorageClassName = "gold" }))},
		{name: "own node: a local PV outside the class's discovery directory", refusedBy: localPVPolicy, msg: "discovery directory",
			do: createPV(ownPV("x-path", a, func(pv *corev1.PersistentVolume) { pv.Spec.Local.Path = "/etc" }))},
		{name: "own node: a local PV of the discovery directory itself", refusedBy: localPVPolicy, msg: "discovery directory",
			do: createPV(ownPV("x-dir", a, func(pv *corev1.PersistentVolume) { pv.Spec.Local.Path = "/mnt/disks/ssd" }))},
		{name: "own node: a local PV of a subdirectory of an entry", refusedBy: localPVPolicy, msg: "discovery directory",
			do: createPV(ownPV("x-nested", a, func(pv *corev1.PersistentVolume) { pv.Spec.Local.Path = "/mnt/disks/ssd/disk-1/data" }))},
		{name: "own node: a local PV of a directory whose name starts like the discovery directory's", refusedBy: localPVPolicy, msg: "discovery directory",
			do: createPV(ownPV("x-sibling", a, func(pv *corev1.PersistentVolume) { pv.Spec.Local.Path = "/mnt/disks/ssd-other" }))},
		{name: "own node: a local PV larger than the class's maximum", refusedBy: localPVPolicy, msg: "at most 16Ti",
			do: createPV(ownPV("x-huge", a, func(pv *corev1.PersistentVolume) {
				pv.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse("1Pi")
			}))},
		{name: "own node: a local PV ReadWriteMany", refusedBy: localPVPolicy, msg: "access modes among ReadWriteOnce",
			do: createPV(ownPV("x-rwx", a, func(pv *corev1.PersistentVolume) {
				pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
			}))},
		{name: "own node: a Block local PV of a Filesystem class", refusedBy: localPVPolicy, msg: "volume mode Filesystem",
			do: createPV(ownPV("x-block", a, func(pv *corev1.PersistentVolume) { pv.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock) }))},
		{name: "own node: a local PV with an fsType the class has not", refusedBy: localPVPolicy, msg: "fsType",
			do: createPV(ownPV("x-fstype", a, func(pv *corev1.PersistentVolume) { pv.Spec.Local.FSType = ptr.To("xfs") }))},
		{name: "own node: a local PV with a label of its own", refusedBy: localPVPolicy, msg: "class's labels",
			do: createPV(ownPV("x-label", a, func(pv *corev1.PersistentVolume) { pv.Labels["tier"] = "gold" }))},
		{name: "own node: a local PV labelled for the other node", refusedBy: localPVPolicy, msg: "must label",
			do: createPV(ownPV("x-label-b", a, func(pv *corev1.PersistentVolume) { pv.Labels[localpv.LabelNode] = b }))},
		{name: "own node: a local PV with another annotation", refusedBy: localPVPolicy, msg: "as its provisioner makes them",
			do: createPV(ownPV("x-annotation", a, func(pv *corev1.PersistentVolume) { pv.Annotations["example.com/x"] = "y" }))},
		{name: "own node: a local PV with an owner", refusedBy: localPVPolicy, msg: "as its provisioner makes them",
			do: createPV(ownPV("x-owner", a, func(pv *corev1.PersistentVolume) {
				pv.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: a, UID: uidA}}
			}))},
		{name: "own node: a local PV with a finalizer", refusedBy: localPVPolicy, msg: "as its provisioner makes them",
			do: createPV(ownPV("x-finalizer", a, func(pv *corev1.PersistentVolume) { pv.Finalizers = []string{"example.com/keep"} }))},
		{name: "own node: a local PV whose affinity also requires a zone", refusedBy: localPVPolicy, msg: "one node-affinity term",
			do: createPV(ownPV("x-zone-too", a, func(pv *corev1.PersistentVolume) {
				term := &pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0]
				term.MatchExpressions = append(term.MatchExpressions, corev1.NodeSelectorRequirement{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{"z"}})
			}))},
		{name: "own node: a local PV with a mount option", do: createPV(ownPV(f.name("a-mount-options"), a, func(pv *corev1.PersistentVolume) {
			pv.Spec.MountOptions = []string{"noatime"}
		}))},
		{name: "own node: deleting that PV", do: deletePV(f.name("a-mount-options"))},
		{name: "own node's local PV: an owner", refusedBy: localPVPolicy, msg: "metadata.ownerReferences",
			effect: func(o runtime.Object) bool { return len(o.(*corev1.PersistentVolume).OwnerReferences) == 1 },
			do:     patchPV(f.name("a-old"), `{"metadata":{`+ghostOwner+`}}`)},
		{name: "other node: deleting its local PV", refusedBy: localPVPolicy, msg: "volume-agent.io/" + b, do: deletePV(f.name("b-local"))},
		{name: "own node's earlier local PV: its node label", do: patchPV(f.name("a-old"), `{"metadata":{"labels":{"`+localpv.LabelNode+`":"`+a+`"}}}`)},
		{name: "own node's local PV: another node's label", refusedBy: localPVPolicy, msg: "only " + localpv.LabelNode + "=" + a,
			do: patchPV(f.name("a-old"), `{"metadata":{"labels":{"`+localpv.LabelNode+`":"`+b+`"}}}`)},
		{name: "own node's local PV: another label", refusedBy: localPVPolicy, msg: "change only the label",
			do: patchPV(f.name("a-old"), `{"metadata":{"labels":{"tier":"gold"}}}`)},
		{name: "own node's local PV: its claimRef", refusedBy: localPVPolicy, msg: "change only the label",
			effect: func(o runtime.Object) bool { return o.(*corev1.PersistentVolume).Spec.ClaimRef.Name == "thief" },
			do:     patchPV(f.name("a-old"), `{"spec":{"claimRef":{"namespace":"`+f.ns+`","name":"thief","uid":null,"resourceVersion":null}}}`)},
		{name: "own node's local PV: its annotation", refusedBy: localPVPolicy, msg: "change only the label",
			do: patchPV(f.name("a-old"), `{"metadata":{"annotations":{"`+provisionedBy+`":"someone"}}}`)},
		{name: "other node's local PV: its node label", refusedBy: localPVPolicy, msg: "volume-agent.io/" + b,
			do: patchPV(f.name("b-local"), `{"metadata":{"labels":{"`+localpv.LabelNode+`":"`+b+`"}}}`)},
		{name: "an administrator's PV: a label", refusedBy: localPVPolicy, msg: "not one",
			do: patchPV(f.name("admins"), `{"metadata":{"labels":{"`+localpv.LabelNode+`":"`+a+`"}}}`)},
		{name: "deleting an administrator's PV", refusedBy: localPVPolicy, msg: "not one", do: deletePV(f.name("admins"))},

		// VolumeAttachments (deploy/self-attach).
		{name: "own node: a VolumeAttachment", do: createVA(volumeAttachment(f.name("a-attachment"), a))},
		{name: "own node: its attachment status", do: attachedStatus(f.name("a-attachment"))},
		{name: "own node: deleting its VolumeAttachment", do: deleteVA(f.name("a-attachment"))},
		{name: "own node: a VolumeAttachment with a finalizer", refusedBy: attachPolicy, msg: "no owner references or finalizers",
			do: createVA(func() *storagev1.VolumeAttachment {
				va := volumeAttachment(f.name("a-attachment-kept"), a)
				va.Finalizers = []string{"example.com/keep"}
				return va
			}())},
		{name: "own node: a VolumeAttachment with an owner", refusedBy: attachPolicy, msg: "no owner references or finalizers",
			do: createVA(func() *storagev1.VolumeAttachment {
				va := volumeAttachment(f.name("a-attachment-owned"), a)
				va.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: f.podA.Name, UID: f.podA.UID}}
				return va
			}())},
		{name: "other node: a VolumeAttachment", refusedBy: attachPolicy, msg: "is for node " + b, do: createVA(volumeAttachment(f.name("b-attachment-2"), b))},
		{name: "other node: its attachment status", refusedBy: attachPolicy, msg: "is for node " + b, do: attachedStatus(f.name("b-attachment"))},
		{name: "other node: deleting its VolumeAttachment", refusedBy: attachPolicy, msg: "is for node " + b, do: deleteVA(f.name("b-attachment"))},

		// Events.
		{name: "an event from its node", do: createEvent(f.ns, "from-a", a)},
		{name: "an event that says it comes from the other node", refusedBy: eventsPolicy, msg: `this one is from "` + b + `"`,
			do: createEvent(f.ns, "from-b", b)},
		{name: "an event of its node with a finalizer", refusedBy: eventsPolicy, msg: "no owner references and no finalizers",
			do: createEvent(f.ns, "from-a-kept", a, func(m *metav1.ObjectMeta) { m.Finalizers = []string{"example.com/keep"} })},
		{name: "an event of its node with an owner", refusedBy: eventsPolicy, msg: "no owner references and no finalizers",
			do: createEvent(f.ns, "from-a-owned", a, func(m *metav1.ObjectMeta) {
				m.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: f.podA.Name, UID: f.podA.UID}}
			})},
		{name: "the other node's event, rewritten", refusedBy: eventsPolicy, msg: `this one is from "` + b + `"`,
			do: func(ctx context.Context, c kubernetes.Interface, dry []string) (runtime.Object, error) {
				return c.CoreV1().Events(f.ns).Patch(ctx, "by-b", types.MergePatchType, []byte(`{"source":{"host":"`+a+`"},"count":5}`), metav1.PatchOptions{DryRun: dry})
			}},

		// Tokens.
		{name: "a token of a pod's account, bound to the pod", do: token(f.ns, "default", boundTo("Pod", f.podA))},
		{name: "a token of a pod's account for a CSI driver's audience (tokenRequests), bound to the pod",
			do: token(f.ns, "default", boundTo("Pod", f.podA), "vault.example.com")},
		{name: "a token of its own account, bound to its own pod (its kube-api-access volume)",
			do: token(suite.ServiceAccount.Namespace, suite.ServiceAccount.Name, boundTo("Pod", f.agentPodA))},
		{name: "a token of its own account, bound to the other node's agent pod", refusedBy: tokensPolicy, msg: "only bound to its own pod",
			do: token(suite.ServiceAccount.Namespace, suite.ServiceAccount.Name, boundTo("Pod", f.agentPodB))},
		{name: "an unbound token of a pod's account", refusedBy: tokensPolicy, msg: "bound to a pod",
			do: token(f.ns, "default", nil)},
		{name: "a token of a pod's account, bound to a node", refusedBy: tokensPolicy, msg: "bound to a pod",
			do: token(f.ns, "default", boundTo("Node", &metav1.ObjectMeta{Name: b, UID: nodeUID(t, b)}))},
	}
	waitPolicies(t, f.agentA, attempts)
	run(t, f.agentA, attempts)

	// What the agent wrote is there, and nothing it was refused.
	pod, err := f.admin.CoreV1().Pods(f.ns).Get(ctx, "tenant-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase == corev1.PodFailed || pod.Labels["role"] != "" || len(pod.Finalizers) != 1 || len(pod.OwnerReferences) != 0 ||
		len(pod.Annotations) != 0 || pod.Status.ObservedGeneration == 1 {
		t.Errorf("pod tenant-a after the refusals: phase %s, labels %v, annotations %v, finalizers %v, owners %v, observed generation %d",
			pod.Status.Phase, pod.Labels, pod.Annotations, pod.Finalizers, pod.OwnerReferences, pod.Status.ObservedGeneration)
	}
	claim, err = f.admin.CoreV1().PersistentVolumeClaims(f.ns).Get(ctx, "claim", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claim.OwnerReferences) != 0 || len(claim.Labels) != 0 || len(claim.Finalizers) != 1 || claim.Status.Phase == corev1.ClaimLost ||
		claim.Status.Capacity.Storage().String() != "2Gi" || len(claim.Status.AllocatedResourceStatuses) != 0 || len(claim.Status.Conditions) != 0 {
		t.Errorf("claim after the agent's expansion writes and the refusals: owners %v, labels %v, finalizers %v, status %+v",
			claim.OwnerReferences, claim.Labels, claim.Finalizers, claim.Status)
	}
	node, err := f.admin.CoreV1().Nodes().Get(ctx, a, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(node.OwnerReferences) != 0 || len(node.Finalizers) != 0 || len(node.Status.Images) != 0 {
		t.Errorf("node %s after the refusals: owners %v, finalizers %v, images %v", a, node.OwnerReferences, node.Finalizers, node.Status.Images)
	}
	if _, err := f.admin.CoreV1().PersistentVolumes().Get(ctx, f.name("b-local"), metav1.GetOptions{}); err != nil {
		t.Errorf("node B's PV: %v", err)
	}
}

func nodeUID(t *testing.T, name string) types.UID {
	t.Helper()
	n, err := suite.Admin.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.UID
}

// A token of the agent's service account that is not bound to a pod (a
// TokenRequest without a bound object, as a long-lived Secret token would
// be) names no node: every write the policies cover is refused, even for
// what a pod-bound token of node A may do.
func TestUnboundTokenIsRefused(t *testing.T) {
	suite.Require(t)
	f := newFixture(t, "unbound")
	t.Cleanup(func() { f.releasePods(t) })
	a := f.nodeA
	const msg = "names no node"
	attempts := []attempt{
		{name: "own node's pod: its VolumesReady condition", refusedBy: podStatusPolicy, msg: msg,
			do: podStatus(f.ns, "tenant-a", types.StrategicMergePatchType, `{"status":{"conditions":[{"type":"volume-agent.io/VolumesReady","status":"True"}]}}`)},
		{name: "own node: volumesInUse", refusedBy: nodeStatusPolicy, msg: msg,
			do: nodeStatus(a, types.MergePatchType, `{"status":{"volumesInUse":["kubernetes.io/csi/csi.example.com^vol-1"]}}`)},
		{name: "own node: a local PV", refusedBy: localPVPolicy, msg: msg,
			do: createPV(localPV(f.name("unbound-local"), a, hostnameIn(corev1.NodeSelectorOpIn, a)))},
		{name: "own node: a VolumeAttachment", refusedBy: attachPolicy, msg: msg, do: createVA(volumeAttachment(f.name("unbound-attachment"), a))},
		{name: "a token of a pod's account, bound to the pod", refusedBy: tokensPolicy, msg: msg, do: token(f.ns, "default", boundTo("Pod", f.podA))},
	}
	waitPolicies(t, f.unbound, attempts)
	run(t, f.unbound, attempts)
}

// The policies match the agent's service account only: another identity
// with the same RBAC grant (here the administrator, for real, not a dry
// run) writes node B's objects as before.
func TestOtherIdentitiesUnaffected(t *testing.T) {
	suite.Require(t)
	f := newFixture(t, "others")
	t.Cleanup(func() { f.releasePods(t) })
	run(t, f.admin, []attempt{
		{name: "other node's pod: its VolumesReady condition",
			do: podStatus(f.ns, "tenant-b", types.StrategicMergePatchType, `{"status":{"conditions":[{"type":"volume-agent.io/VolumesReady","status":"True"}]}}`)},
		{name: "a PV pinned to node B", do: createPV(localPV(f.name("others-b"), f.nodeB, hostnameIn(corev1.NodeSelectorOpIn, f.nodeB)))},
	})
}
