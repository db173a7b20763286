package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// automounted returns pod with the ServiceAccount admission plugin's
// kube-api-access volume (automount left to the default).
func automounted(pod *corev1.Pod) *corev1.Pod {
	pod.Spec.AutomountServiceAccountToken = nil
	return pod
}

// kubeAPIAccess returns the name of the volume the ServiceAccount admission
// plugin added to the created pod.
func kubeAPIAccess(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	for _, v := range pod.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access-") && v.Projected != nil {
			return v.Name
		}
	}
	t.Fatalf("pod %s has no kube-api-access volume: %+v", pod.Name, pod.Spec.Volumes)
	return ""
}

func (e *env) createConfigMap(name string, data map[string]string, immutable bool) {
	e.t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Data: data}
	if immutable {
		cm.Immutable = ptr.To(true)
	}
	if _, err := suite.Admin.CoreV1().ConfigMaps(e.ns).Create(e.t.Context(), cm, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create ConfigMap %s: %v", name, err)
	}
}

func (e *env) createSecret(name string, data map[string]string) {
	e.t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, StringData: data}
	if _, err := suite.Admin.CoreV1().Secrets(e.ns).Create(e.t.Context(), s, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create Secret %s: %v", name, err)
	}
}

// waitFiles waits until the files under dir have the contents ("" means
// absent).
func (e *env) waitFiles(dir string, want map[string]string) {
	e.t.Helper()
	e2eutil.PollErr(e.t, 60*time.Second, fmt.Sprintf("files of %s: %v", filepath.Base(dir), want), func() error {
		for name, content := range want {
			data, err := os.ReadFile(filepath.Join(dir, name))
			if content == "" {
				if !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("%s still there (%v)", name, err)
				}
				continue
			}
			if err != nil {
				return err
			}
			if string(data) != content {
				return fmt.Errorf("%s = %q, want %q", name, data, content)
			}
		}
		return nil
	})
}

// A pod with the default service account gets its kube-api-access volume:
// a token that authenticates as that service account, bound to that pod;
// the cluster's CA from the kube-root-ca.crt ConfigMap; the namespace.
func TestKubeAPIAccess(t *testing.T) {
	e := newEnv(t, "kubeapiaccess")
	e.start()
	pod := e.createPod(automounted(e.pod("app")))
	vol := kubeAPIAccess(t, pod)
	e.waitCondition("app", corev1.ConditionTrue, "VolumesMounted")
	dir := e.volumePath(pod.UID, e2eutil.ProjectedPlugin, vol)
	if !mounted(t, dir) {
		t.Fatalf("%s is not a mount: projected volumes live on their own tmpfs", dir)
	}

	token, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	review, err := suite.Admin.AuthenticationV1().TokenReviews().Create(t.Context(), &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: string(token)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := review.Status
	if !st.Authenticated || st.User.Username != "system:serviceaccount:"+e.ns+":default" {
		t.Fatalf("TokenReview: %+v", st)
	}
	if got := st.User.Extra["authentication.kubernetes.io/pod-name"]; len(got) != 1 || got[0] != "app" {
		t.Errorf("token bound to pod %v, want app", got)
	}
	if got := st.User.Extra["authentication.kubernetes.io/pod-uid"]; len(got) != 1 || got[0] != string(pod.UID) {
		t.Errorf("token bound to pod UID %v, want %s", got, pod.UID)
	}

	rootCA, err := suite.Admin.CoreV1().ConfigMaps(e.ns).Get(t.Context(), "kube-root-ca.crt", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.waitFiles(dir, map[string]string{"ca.crt": rootCA.Data["ca.crt"], "namespace": e.ns})
	if st, err := os.Stat(filepath.Join(dir, "token")); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("token file: %v, %v; want mode 0644 (defaultMode, no fsGroup or user)", st.Mode(), err)
	}

	// The debug endpoint shows when the token expires and is refreshed,
	// never the token.
	doc, err := e.agent.APIVolumes()
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, tk := range doc.Tokens {
		if tk.PodUID == string(pod.UID) {
			found = true
			if until := time.Until(tk.Expires); until < 50*time.Minute || until > 61*time.Minute {
				t.Errorf("token expires in %v, want about 1 h (3607 s)", until)
			}
			if tk.RefreshAt.After(tk.Expires.Add(-700*time.Second)) || tk.RefreshAt.Before(tk.Expires.Add(-740*time.Second)) {
				t.Errorf("refresh at %v, expiry %v: want 80%% of the lifetime (721 s before expiry, less up to 10 s of jitter)", tk.RefreshAt, tk.Expires)
			}
		}
	}
	if !found {
		t.Errorf("no token for the pod on /debug/api-volumes: %+v", doc.Tokens)
	}
	raw, err := e.agent.GetRaw("/debug/api-volumes")
	if err != nil || strings.Contains(raw, string(token)) || strings.Contains(raw, strings.SplitN(string(token), ".", 2)[0]) {
		t.Errorf("/debug/api-volumes shows the token (or its header): %v", err)
	}

	// One TokenRequest for the pod.
	e2eutil.PollErr(t, 30*time.Second, "the agent's TokenRequest in the audit log", func() error {
		n, err := countTokenRequests(e.ns, suite.User)
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("%d TokenRequests in namespace %s, want 1", n, e.ns)
		}
		return nil
	})

	e.deletePod("app", 0)
	e.waitTornDown(pod.UID)
}

// countTokenRequests counts the tokens user was issued in namespace. (With
// the node's identity a pod's first request may be refused until the Node
// authorizer's graph has the pod; refusals are not tokens.)
func countTokenRequests(namespace, user string) (int, error) {
	events, err := suite.Cluster.AuditEvents()
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	for _, ev := range events {
		if ev.User.Username == user && ev.Verb == "create" && ev.ObjectRef != nil && ev.ObjectRef.Resource == "serviceaccounts" &&
			ev.ObjectRef.Subresource == "token" && ev.ObjectRef.Namespace == namespace &&
			ev.ResponseStatus != nil && ev.ResponseStatus.Code < 300 {
			seen[ev.AuditID] = true
		}
	}
	return len(seen), nil
}

// ConfigMaps and Secrets reach the pod's files when they change; optional
// and missing objects; a Secret created after the pod; immutable objects;
// watches only of what pods reference, released when the pods go.
func TestConfigMapAndSecretVolumes(t *testing.T) {
	e := newEnv(t, "apiobjects")
	e.createConfigMap("app-config", map[string]string{"app.conf": "greeting=hello", "old": "x"}, false)
	e.createConfigMap("frozen", map[string]string{"v": "1"}, true)
	e.createSecret("app-secret", map[string]string{"password": "hunter2"})
	e.createSecret("unreferenced", map[string]string{"k": "v"})
	e.start()
	app := e.createPod(e.pod("app",
		corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}}}},
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "app-secret"}}},
		corev1.Volume{Name: "frozen", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "frozen"}}}},
		corev1.Volume{Name: "maybe", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: ptr.To(true)}}},
		corev1.Volume{Name: "all", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}, Items: []corev1.KeyToPath{{Key: "app.conf", Path: "conf/app.conf"}}}},
			{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "app-secret"}}},
		}}}},
	))
	late := e.createPod(e.pod("late", corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "late-secret"}}}))
	e.waitCondition("app", corev1.ConditionTrue, "VolumesMounted")

	config := e.volumePath(app.UID, e2eutil.ConfigMapPlugin, "config")
	creds := e.volumePath(app.UID, e2eutil.SecretPlugin, "creds")
	all := e.volumePath(app.UID, e2eutil.ProjectedPlugin, "all")
	e.waitFiles(config, map[string]string{"app.conf": "greeting=hello", "old": "x"})
	e.waitFiles(creds, map[string]string{"password": "hunter2"})
	e.waitFiles(all, map[string]string{"conf/app.conf": "greeting=hello", "password": "hunter2"})
	e.waitFiles(e.volumePath(app.UID, e2eutil.ConfigMapPlugin, "frozen"), map[string]string{"v": "1"})
	if entries, err := os.ReadDir(e.volumePath(app.UID, e2eutil.ConfigMapPlugin, "maybe")); err != nil || len(entries) != 2 {
		t.Errorf("optional missing configMap: %d entries (%v), want only ..data and its directory", len(entries), err)
	}

	// The missing, not optional Secret: reported on the pod, not ready.
	e.waitEvent("late", "FailedMount", nil, `secret "late-secret" not found`)
	e.waitCondition("late", corev1.ConditionFalse, "MountFailed")

	// Updates reach every volume built from the object.
	cms, secrets := suite.Admin.CoreV1().ConfigMaps(e.ns), suite.Admin.CoreV1().Secrets(e.ns)
	if _, err := cms.Update(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app-config", Namespace: e.ns}, Data: map[string]string{"app.conf": "greeting=bonjour"}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Update(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-secret", Namespace: e.ns}, StringData: map[string]string{"password": "correct horse"}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFiles(config, map[string]string{"app.conf": "greeting=bonjour", "old": ""})
	e.waitFiles(creds, map[string]string{"password": "correct horse"})
	e.waitFiles(all, map[string]string{"conf/app.conf": "greeting=bonjour", "password": "correct horse"})

	// The late Secret appears: the pod becomes ready.
	e.createSecret("late-secret", map[string]string{"k": "v"})
	e.waitCondition("late", corev1.ConditionTrue, "VolumesMounted")
	e.waitFiles(e.volumePath(late.UID, e2eutil.SecretPlugin, "creds"), map[string]string{"k": "v"})

	// What is watched: the referenced objects, each once, the immutable
	// one no longer; never the unreferenced Secret.
	doc, err := e.agent.APIVolumes()
	if err != nil {
		t.Fatal(err)
	}
	watched := map[string]bool{}
	for _, w := range doc.Watches {
		if w.Key.Namespace != e.ns {
			continue
		}
		key := w.Resource + "/" + w.Key.Name
		if watched[key] {
			t.Errorf("%s watched twice", key)
		}
		watched[key] = true
		if w.Key.Name == "frozen" && !w.Immutable {
			t.Errorf("the immutable ConfigMap is still watched: %+v", w)
		}
	}
	for _, want := range []string{"configmaps/app-config", "configmaps/frozen", "configmaps/absent", "secrets/app-secret", "secrets/late-secret"} {
		if !watched[want] {
			t.Errorf("%s not watched: %v", want, watched)
		}
	}
	if watched["secrets/unreferenced"] {
		t.Error("a Secret no pod references is watched")
	}

	// The pods go: their watches stop.
	e.deletePod("app", 0)
	e.deletePod("late", 0)
	e.waitTornDown(app.UID)
	e.waitTornDown(late.UID)
	e2eutil.PollErr(t, 30*time.Second, "no watches of the namespace's objects", func() error {
		doc, err := e.agent.APIVolumes()
		if err != nil {
			return err
		}
		for _, w := range doc.Watches {
			if w.Key.Namespace == e.ns {
				return fmt.Errorf("still watching %s %s", w.Resource, w.Key.Name)
			}
		}
		return nil
	})
	checkNoBroadReads(t, suite.User)
}

// checkNoBroadReads fails if user ever listed or watched Secrets,
// ConfigMaps, claims, volumes or attachments without selecting one object
// by name (e2eutil.UnscopedReads).
func checkNoBroadReads(t *testing.T, user string) {
	t.Helper()
	events, err := suite.Cluster.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	if bad := e2eutil.UnscopedReads(events, user, "volume-agent/"); len(bad) > 0 {
		t.Errorf("%s listed or watched objects of the cluster without a name selector: %v", user, bad)
	}
}

// With --node-kubeconfig the agent reads secrets and configMaps and
// requests tokens as the node (system:node:<name>): the Node authorizer
// allows exactly what the node's pods reference, as for the kubelet. This
// also proves, on the API server, what the node identity can and cannot
// do, and what the default ServiceAccount can (everything).
func TestNodeCredentials(t *testing.T) {
	e := newEnv(t, nodeCredsTest)
	e.createSecret("app-secret", map[string]string{"password": "hunter2"})
	e.createSecret("other-secret", map[string]string{"k": "v"})
	e.createConfigMap("other-config", map[string]string{"k": "v"}, false)
	nodeKubeconfig := suite.Cluster.NodeKubeconfig(e.node)
	pv, _ := e.createLocalPV("data", "data")
	e.createClaim("data")
	e.waitBound("data", pv.Name)
	e.start("--node-kubeconfig=" + nodeKubeconfig)
	pod := e.createPod(automounted(e.pod("app",
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "app-secret"}}},
		e2eutil.ClaimVolume("data", "data"))))
	e.waitCondition("app", corev1.ConditionTrue, "VolumesMounted")
	e.waitFiles(e.volumePath(pod.UID, e2eutil.SecretPlugin, "creds"), map[string]string{"password": "hunter2"})
	e.waitMounted(e.volumePath(pod.UID, e2eutil.LocalPlugin, pv.Name))
	token, err := os.ReadFile(filepath.Join(e.volumePath(pod.UID, e2eutil.ProjectedPlugin, kubeAPIAccess(t, pod)), "token"))
	if err != nil || len(token) == 0 {
		t.Fatalf("token: %v", err)
	}
	nodeUser := "system:node:" + e.node
	e2eutil.PollErr(t, 30*time.Second, "the node's TokenRequest in the audit log", func() error {
		n, err := countTokenRequests(e.ns, nodeUser)
		if err != nil || n != 1 {
			return fmt.Errorf("%d TokenRequests by %s (%v)", n, nodeUser, err)
		}
		return nil
	})
	checkNoBroadReads(t, nodeUser)
	// The node's CSINode and its Node's attach/detach annotation are
	// written as the node too (the Node authorizer and NodeRestriction
	// allow a node its own, as for the kubelet).
	e2eutil.PollErr(t, 30*time.Second, "the node's CSINode, created as the node", func() error {
		events, err := suite.Cluster.AuditEvents()
		if err != nil {
			return err
		}
		for _, ev := range events {
			if ev.User.Username == nodeUser && ev.Verb == "create" && ev.ObjectRef != nil && ev.ObjectRef.Resource == "csinodes" &&
				ev.ObjectRef.Name == e.node && ev.ResponseStatus != nil && ev.ResponseStatus.Code == 201 {
				return nil
			}
		}
		return fmt.Errorf("no CSINode %s created by %s", e.node, nodeUser)
	})
	// The agent's own identity made none of these requests, so
	// deploy/node-credentials, whose ClusterRole has no grant for them,
	// suffices.
	events, err := suite.Cluster.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	claimWatches := 0
	for _, ev := range events {
		if ev.User.Username == suite.User && ev.UserAgent == "volume-agent/"+e.node && ev.ObjectRef != nil &&
			(ev.ObjectRef.Resource == "secrets" || ev.ObjectRef.Resource == "configmaps" || ev.ObjectRef.Subresource == "token" ||
				ev.ObjectRef.Resource == "csinodes" || (ev.ObjectRef.Resource == "nodes" && ev.Verb != "list" && ev.Verb != "watch" && ev.ObjectRef.Subresource == "")) {
			t.Errorf("with --node-kubeconfig the agent still used its own credentials: %s %s", ev.Verb, ev.RequestURI)
		}
		// The Node authorizer lets a node only GET claims and volumes
		// (checked below): the agent watches them, one by one, with its
		// own credentials.
		if ev.UserAgent == "volume-agent/"+e.node && ev.ObjectRef != nil && ev.Verb == "watch" &&
			ev.ObjectRef.Resource == "persistentvolumeclaims" && ev.ObjectRef.Namespace == e.ns {
			if ev.User.Username != suite.User {
				t.Errorf("claim watched as %s, want the agent's ServiceAccount: %s", ev.User.Username, ev.RequestURI)
			}
			claimWatches++
		}
	}
	if claimWatches == 0 {
		t.Errorf("no watch of the pod's claim by the agent in the audit log")
	}

	// What the node identity may do, asked of the real API server.
	node := clientFor(t, nodeKubeconfig)
	ctx := t.Context()
	secrets := node.CoreV1().Secrets(e.ns)
	name := func(n string) metav1.ListOptions { return metav1.ListOptions{FieldSelector: "metadata.name=" + n} }
	otherNode := e.createPod(automounted(e2eutil.Pod(e.ns, "elsewhere-node", "elsewhere")))
	checks := []struct {
		what    string
		allowed bool
		call    func() error
	}{
		{"get a secret its pod uses", true, func() error { _, err := secrets.Get(ctx, "app-secret", metav1.GetOptions{}); return err }},
		{"list+watch a secret its pod uses, by name", true, func() error { _, err := secrets.List(ctx, name("app-secret")); return err }},
		{"get a secret no pod of the node uses", false, func() error { _, err := secrets.Get(ctx, "other-secret", metav1.GetOptions{}); return err }},
		{"list that secret by name", false, func() error { _, err := secrets.List(ctx, name("other-secret")); return err }},
		{"list the namespace's secrets", false, func() error { _, err := secrets.List(ctx, metav1.ListOptions{}); return err }},
		{"list every secret of the cluster", false, func() error {
			_, err := node.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"get a configMap no pod of the node uses", false, func() error {
			_, err := node.CoreV1().ConfigMaps(e.ns).Get(ctx, "other-config", metav1.GetOptions{})
			return err
		}},
		{"request a token for its pod", true, func() error { return requestToken(ctx, node, e.ns, pod.Name, pod.UID) }},
		// Claims and volumes: get only (the graph authorizer's
		// authorizeGet), so the agent cannot watch them as the node.
		{"get the claim its pod uses", true, func() error {
			_, err := node.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "data", metav1.GetOptions{})
			return err
		}},
		{"list+watch the claim its pod uses, by name", false, func() error {
			_, err := node.CoreV1().PersistentVolumeClaims(e.ns).List(ctx, name("data"))
			return err
		}},
		{"watch the claim its pod uses, by name", false, func() error {
			w, err := node.CoreV1().PersistentVolumeClaims(e.ns).Watch(ctx, name("data"))
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"get the volume of its pod's claim", true, func() error {
			_, err := node.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
			return err
		}},
		{"list+watch the volume of its pod's claim, by name", false, func() error {
			_, err := node.CoreV1().PersistentVolumes().List(ctx, name(pv.Name))
			return err
		}},
		{"request a token for a pod on another node", false, func() error { return requestToken(ctx, node, e.ns, otherNode.Name, otherNode.UID) }},
		{"request a token bound to no pod", false, func() error { return requestToken(ctx, node, e.ns, "", "") }},
	}
	for _, c := range checks {
		err := c.call()
		switch {
		case c.allowed && err != nil:
			t.Errorf("the node may %s, but: %v", c.what, err)
		case !c.allowed && !apierrors.IsForbidden(err):
			t.Errorf("the node must not %s: got %v, want Forbidden", c.what, err)
		}
	}

	if err := suite.Admin.CoreV1().Pods(e.ns).Delete(ctx, otherNode.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Error(err)
	}

	// The default deployment's ServiceAccount, by contrast, may read every
	// Secret of the cluster: RBAC cannot say "what the node's pods use".
	sa := clientFor(t, suite.Kubeconfig)
	if _, err := sa.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the default ClusterRole was expected to allow listing secrets (documented trade-off): %v", err)
	}
	e.deletePod("app", 0)
	e.waitTornDown(pod.UID)
}

// nodeCredsTest is TestNodeCredentials' env name: its node gets
// credentials of its own when the suite starts.
const nodeCredsTest = "nodecreds"

// requestToken asks for a token of the default ServiceAccount bound to
// the pod (to none if podName is empty).
func requestToken(ctx context.Context, c kubernetes.Interface, ns, podName string, uid types.UID) error {
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
	if podName != "" {
		tr.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: podName, UID: uid}
	}
	_, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "default", tr, metav1.CreateOptions{})
	return err
}

// clientFor is a client with a kubeconfig's credentials.
func clientFor(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
