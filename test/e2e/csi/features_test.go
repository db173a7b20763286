package csi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

const tokensKey = "csi.storage.k8s.io/serviceAccount.tokens"

// publishedTokens is what a NodePublishVolume request carried under
// csi.storage.k8s.io/serviceAccount.tokens, by audience.
type publishedToken struct {
	Token               string      `json:"token"`
	ExpirationTimestamp metav1.Time `json:"expirationTimestamp"`
}

func tokensOf(t *testing.T, req *csi.NodePublishVolumeRequest) map[string]publishedToken {
	t.Helper()
	raw, ok := req.GetVolumeContext()[tokensKey]
	if !ok {
		t.Fatalf("NodePublishVolume without %s in its volume context (keys %v, secrets %v)",
			tokensKey, slices.Sorted(maps.Keys(req.GetVolumeContext())), slices.Sorted(maps.Keys(req.GetSecrets())))
	}
	var out map[string]publishedToken
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		t.Fatalf("%s is not the kubelet's JSON: %v", tokensKey, err)
	}
	return out
}

// reviewToken checks with a TokenReview, as an administrator, that token
// is a valid token of the pod's service account for audience ("" for the
// API server's own), bound to the pod on the test's node.
func (e *env) reviewToken(token, audience string, pod *corev1.Pod) {
	e.t.Helper()
	spec := authenticationv1.TokenReviewSpec{Token: token}
	if audience != "" {
		spec.Audiences = []string{audience}
	}
	tr, err := suite.Admin.AuthenticationV1().TokenReviews().Create(e.t.Context(), &authenticationv1.TokenReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("TokenReview: %v", err)
	}
	st := tr.Status
	user := "system:serviceaccount:" + e.ns + ":" + pod.Spec.ServiceAccountName
	extra := func(k string) string {
		if v := st.User.Extra[k]; len(v) == 1 {
			return v[0]
		}
		return ""
	}
	if !st.Authenticated || st.User.Username != user || extra("authentication.kubernetes.io/pod-name") != pod.Name ||
		extra("authentication.kubernetes.io/pod-uid") != string(pod.UID) || extra("authentication.kubernetes.io/node-name") != e.node ||
		(audience != "" && !slices.Contains(st.Audiences, audience)) {
		e.t.Errorf("TokenReview of the %q token: %+v; want %s bound to pod %s (%s) on node %s, audience %q", audience, st, user, pod.Name, pod.UID, e.node, audience)
	}
}

// noSecretIn fails the test if any regular file under dir holds secret.
func noSecretIn(t *testing.T, dir, secret string) {
	t.Helper()
	err := filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || !info.Mode().IsRegular() || info.Size() > 64<<20 {
			return nil
		}
		data, err := os.ReadFile(path)
		if err == nil && strings.Contains(string(data), secret) {
			t.Errorf("%s holds a service-account token", path)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// A CSIDriver with tokenRequests and requiresRepublish: NodePublishVolume
// carries, in its volume context, one token per audience (the CSIDriver's
// and the API server's own) of the pod's service account, bound to the pod
// (a TokenReview says so), with the lifetime asked for. The agent requests
// them as its ServiceAccount, with the grants of deploy/. The republish a
// minute later passes the same tokens (they are cached until 80 % of their
// life), and after a restart of the agent, whose cache is then empty, the
// next NodePublishVolume carries new ones. No token is in the agent's logs
// or under its root directory.
func TestTokenRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "tokens")
	d := e.newDriver("drv", driverOptions{proxy: true})
	audience := "vault." + e.ns
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{
		AttachRequired: ptr.To(false), RequiresRepublish: ptr.To(true),
		TokenRequests: []storagev1.TokenRequest{{Audience: audience, ExpirationSeconds: ptr.To[int64](600)}, {Audience: ""}},
	})
	if _, err := suite.Admin.CoreV1().ServiceAccounts(e.ns).Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app-sa"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v := e.claimPV(d, "data")
	a := e.startAgent(agentOptions{args: []string{d.flag()}})

	p := e.pod("app", e2eutil.ClaimVolume("data", v.claim))
	p.Spec.ServiceAccountName = "app-sa"
	pod := e.createPod(p)
	target := e.publishPath(pod.UID, v.pv)
	e.waitMounted(target)
	published := time.Now()
	first := tokensOf(t, d.proxy.publishRequests(v.handle)[0])
	if len(first) != 2 {
		t.Fatalf("tokens for audiences %v, want %q and \"\"", slices.Sorted(maps.Keys(first)), audience)
	}
	for aud, ttl := range map[string]time.Duration{audience: 600 * time.Second, "": time.Hour} {
		tok := first[aud]
		if exp := tok.ExpirationTimestamp.Time; exp.Before(published.Add(ttl-time.Minute)) || exp.After(published.Add(ttl+time.Minute)) {
			t.Errorf("the %q token expires at %s, want about %s after %s", aud, exp, ttl, published.Format(time.RFC3339))
		}
		e.reviewToken(tok.Token, aud, pod)
	}

	// What the agent says: the driver's policy on /debug/drivers, the
	// tokens' lifetimes (never the tokens) on /debug/api-volumes.
	drivers := e2eutil.Must(t, a.Drivers)
	found := false
	for _, drv := range drivers.Drivers {
		if drv.Name == d.name {
			found = true
			if pol := drv.Policy; !pol.CSIDriverObject || pol.AttachRequired || !pol.RequiresRepublish ||
				!slices.Equal(pol.TokenAudiences, []string{audience, ""}) || !drv.SingleNodeMultiWriter {
				t.Errorf("/debug/drivers: %+v; want the CSIDriver's policy (no attach, republish, audiences %q and \"\") and SINGLE_NODE_MULTI_WRITER", drv, audience)
			}
		}
	}
	if !found {
		t.Errorf("/debug/drivers does not list %s", d.name)
	}
	var audiences []string
	for _, tok := range e2eutil.Must(t, a.APIVolumes).Tokens {
		if tok.PodUID == string(pod.UID) && tok.ServiceAccount == "app-sa" {
			audiences = append(audiences, tok.Audience)
		}
	}
	if slices.Sort(audiences); !slices.Equal(audiences, []string{"", audience}) {
		t.Errorf("/debug/api-volumes lists tokens of the pod for audiences %q, want \"\" and %q", audiences, audience)
	}

	// requiresRepublish: a minute later, the same (cached) tokens.
	e2eutil.Poll(t, 100*time.Second, "a republish", func(context.Context) (bool, string) {
		n := len(d.proxy.publishRequests(v.handle))
		return n >= 2, fmt.Sprintf("%d NodePublishVolume calls", n)
	})
	if again := tokensOf(t, d.proxy.publishRequests(v.handle)[1]); again[audience].Token != first[audience].Token {
		t.Errorf("the republish a minute later carried a new token; tokens are cached until 80 %% of their life")
	}

	// A restarted agent has no tokens cached: its republish (at once: a
	// requiresRepublish volume may be stale after a restart) brings new ones.
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	before := len(d.proxy.publishRequests(v.handle))
	a.Start()
	e2eutil.Poll(t, 60*time.Second, "a republish with new tokens after the restart", func(context.Context) (bool, string) {
		reqs := d.proxy.publishRequests(v.handle)
		if len(reqs) <= before {
			return false, fmt.Sprintf("%d NodePublishVolume calls", len(reqs))
		}
		return tokensOf(t, reqs[len(reqs)-1])[audience].Token != first[audience].Token, "the same token again"
	})
	reqs := d.proxy.publishRequests(v.handle)
	latest := tokensOf(t, reqs[len(reqs)-1])
	e.reviewToken(latest[audience].Token, audience, pod)

	for _, tok := range []publishedToken{first[audience], first[""], latest[audience]} {
		noSecretIn(t, e.logs, tok.Token)
		noSecretIn(t, e.root, tok.Token)
	}
	e.deletePod("app")
	e.waitGone(target, e.podDir(pod.UID))
}

// A driver without SINGLE_NODE_MULTI_WRITER (which refuses the access modes
// that come with it) gets SINGLE_NODE_WRITER for a ReadWriteOnce volume;
// one with it gets SINGLE_NODE_MULTI_WRITER, as the kubelet maps them, in
// NodeStageVolume and NodePublishVolume alike.
func TestAccessModeByCapability(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "access-mode")
	withCap := e.newDriver("snmw", driverOptions{proxy: true})
	without := e.newDriver("snw", driverOptions{proxy: true}, "--disable-single-node-multi-writer")
	var vols []corev1.Volume
	want := map[*csiDriver]csi.VolumeCapability_AccessMode_Mode{
		withCap: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
		without: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	}
	claims := map[*csiDriver]csiVolume{}
	var flags []string
	for d := range want {
		suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
		name := strings.SplitN(d.name, ".", 2)[0]
		claims[d] = e.claimPV(d, name)
		vols = append(vols, e2eutil.ClaimVolume(name, name))
		flags = append(flags, d.flag())
	}
	e.startAgent(agentOptions{args: flags})
	pod := e.createPod(e.pod("app", vols...))
	for d, v := range claims {
		e.waitMounted(e.stagingPath(v), e.publishPath(pod.UID, v.pv))
		stages, publishes := d.proxy.stageRequests(v.handle), d.proxy.publishRequests(v.handle)
		if len(stages) != 1 || len(publishes) != 1 {
			t.Fatalf("driver %s: %d NodeStageVolume and %d NodePublishVolume calls, want 1 each", d.name, len(stages), len(publishes))
		}
		for what, c := range map[string]*csi.VolumeCapability{"NodeStageVolume": stages[0].GetVolumeCapability(), "NodePublishVolume": publishes[0].GetVolumeCapability()} {
			if got := c.GetAccessMode().GetMode(); got != want[d] {
				t.Errorf("driver %s: %s access mode %v, want %v", d.name, what, got, want[d])
			}
		}
	}
	e.deletePod("app")
	for d, v := range claims {
		e.waitGone(e.publishPath(pod.UID, v.pv), e.stagingPath(v))
		d.waitNoLoopDevices()
	}
}

// A PV with a nodeExpandSecretRef, grown while a pod uses it: while the
// secret does not exist the node expansion fails naming it (an event on the
// claim; the driver is never asked), and once it exists NodeExpandVolume
// carries its data. The claim then says the expansion is done, with every
// resize condition gone, the controller's Resizing included.
func TestNodeExpandSecret(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"mkfs.xfs", "xfs_growfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s is not installed", tool)
		}
	}
	e := newEnv(t, "expand-secret")
	d := e.newDriver("drv", driverOptions{proxy: true})
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	ctx := t.Context()
	// Claims grow only in a class that allows it.
	class := e.ns + "-expandable"
	if _, err := suite.Admin.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: "kubernetes.io/no-provisioner", AllowVolumeExpansion: ptr.To(true),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = suite.Admin.StorageV1().StorageClasses().Delete(context.Background(), class, metav1.DeleteOptions{})
	})
	// xfs grows online (the sandbox refuses online ext4 growth); mkfs.xfs
	// wants 300 MiB.
	handle := d.CreateVolume(e.ns+"-data", 320<<20, "xfs")
	const secret = "expand-creds"
	pv := e2eutil.PreBoundPV(e.pvName("data"), "320Mi", class, e.ns, "data", corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
		Driver: d.name, VolumeHandle: handle, FSType: "xfs",
		NodeExpandSecretRef: &corev1.SecretReference{Namespace: e.ns, Name: secret},
	}})
	if _, err := suite.Admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(class),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("320Mi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	suite.WaitBound(t, e.ns, "data", pv.Name)
	e.startAgent(agentOptions{args: []string{d.flag()}})
	pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", "data")))
	target := e.publishPath(pod.UID, pv.Name)
	e.waitMounted(target)

	if _, err := csi.NewControllerClient(d.Conn).ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: handle, CapacityRange: &csi.CapacityRange{RequiredBytes: 400 << 20}, VolumeCapability: e2eutil.MountCapability("xfs"),
	}); err != nil {
		t.Fatalf("ControllerExpandVolume: %v", err)
	}
	playResizerKeepingResizing(t, e.ns, "data", pv.Name, "400Mi")
	suite.WaitEvent(t, e.ns, fields.Set{"involvedObject.kind": "PersistentVolumeClaim", "involvedObject.name": "data", "reason": "VolumeResizeFailed"},
		nil, "reading secret "+e.ns+"/"+secret)
	if n := len(d.proxy.expandRequests(handle)); n != 0 {
		t.Errorf("%d NodeExpandVolume calls without the secret, want none", n)
	}

	data := map[string]string{"key": "expand-" + e.ns}
	if _, err := suite.Admin.CoreV1().Secrets(e.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret}, StringData: data}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e2eutil.Poll(t, 90*time.Second, "the claim expanded to 400Mi, every resize condition gone", func(ctx context.Context) (bool, string) {
		pvc, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var conds []string
		for _, c := range pvc.Status.Conditions {
			conds = append(conds, string(c.Type)+"="+string(c.Status))
		}
		size := pvc.Status.Capacity[corev1.ResourceStorage]
		return size.Cmp(resource.MustParse("400Mi")) == 0 && len(conds) == 0 && pvc.Status.AllocatedResourceStatuses == nil,
			fmt.Sprintf("capacity %s, conditions %v, allocatedResourceStatuses %v", size.String(), conds, pvc.Status.AllocatedResourceStatuses)
	})
	expands := d.proxy.expandRequests(handle)
	if len(expands) == 0 || !maps.Equal(expands[len(expands)-1].GetSecrets(), data) {
		var got []map[string]string
		for _, x := range expands {
			got = append(got, x.GetSecrets())
		}
		t.Errorf("NodeExpandVolume secrets %v; want the last call with %v", got, data)
	}
	e.deletePod("app")
	e.waitGone(target, e.podDir(pod.UID))
	d.waitNoLoopDevices()
}

// playResizerKeepingResizing plays the user and the external-resizer as
// e2eutil's PlayResizer does, except that the claim keeps the resizer's
// Resizing condition when it becomes NodeResizePending, as the real flow
// showed: the node's last patch must remove it.
func playResizerKeepingResizing(t *testing.T, ns, claim, pv, size string) {
	t.Helper()
	ctx := t.Context()
	pvcs := suite.Admin.CoreV1().PersistentVolumeClaims(ns)
	now := time.Now().UTC().Format(time.RFC3339)
	patches := []struct {
		what, patch string
		status      bool
	}{
		{"raise the request", fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, size), false},
		{"mark ControllerResizeInProgress", fmt.Sprintf(`{"status":{"allocatedResources":{"storage":%q},"allocatedResourceStatuses":{"storage":"ControllerResizeInProgress"},`+
			`"conditions":[{"type":"Resizing","status":"True","lastTransitionTime":%q}]}}`, size, now), true},
	}
	for _, p := range patches {
		var sub []string
		if p.status {
			sub = []string{"status"}
		}
		if _, err := pvcs.Patch(ctx, claim, types.StrategicMergePatchType, []byte(p.patch), metav1.PatchOptions{}, sub...); err != nil {
			t.Fatalf("%s of PVC %s: %v", p.what, claim, err)
		}
	}
	suite.PatchPVCapacity(t, pv, size)
	node := fmt.Sprintf(`{"status":{"allocatedResourceStatuses":{"storage":"NodeResizePending"},`+
		`"conditions":[{"type":"FileSystemResizePending","status":"True","lastTransitionTime":%q}]}}`, now)
	if _, err := pvcs.Patch(ctx, claim, types.StrategicMergePatchType, []byte(node), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("mark PVC %s NodeResizePending: %v", claim, err)
	}
}
