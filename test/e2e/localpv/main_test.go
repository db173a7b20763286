// Package localpv_test tests the local volume provisioner (package localpv)
// end to end: the provisioner runs in-process against a real etcd,
// kube-apiserver and kube-controller-manager (whose PV binder binds claims
// and releases volumes) from test/cluster, on real tmpfs and loop-device
// mounts; the real volume-agent binary mounts a provisioned volume into a
// pod.
//
// The provisioner runs as its own ServiceAccount bound to a ClusterRole
// with exactly the verbs it needs (provisionerRules); after the tests,
// TestMain reads the audit log and fails if any of its requests was
// refused or, on a full run, if a granted verb was never used. The agent
// runs as the deploy/ ServiceAccount.
//
// The tests need root (mounts, loop devices) and skip otherwise, in -short
// mode, with VOLUME_AGENT_SKIP_CLUSTER=1, or without the control-plane
// binaries.
package localpv_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/volume-agent/volume-agent/test/cluster"
)

// provisionerRules are the permissions the provisioner needs, on top of
// what the agent already has: the caches (PVs, StorageClasses, its Node),
// creating and deleting PVs, and events.
var provisionerRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"persistentvolumes"}, Verbs: []string{"list", "watch", "create", "delete"}},
	{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
}

var suite struct {
	skip string

	cluster *cluster.Cluster
	admin   kubernetes.Interface
	// agentBin and agentKubeconfig run the volume-agent binary as the
	// deploy/ ServiceAccount.
	agentBin        string
	agentKubeconfig string
	// provKubeconfig is the provisioner's ServiceAccount's.
	provKubeconfig string
	provUser       string
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	switch {
	case os.Getenv("VOLUME_AGENT_SKIP_CLUSTER") == "1":
		suite.skip = "VOLUME_AGENT_SKIP_CLUSTER=1: not starting a control plane"
	case testing.Short():
		suite.skip = "-short: not starting a control plane"
	case os.Geteuid() != 0:
		suite.skip = "the tests mount filesystems and attach loop devices: run them as root"
	}
	if suite.skip == "" {
		if _, err := cluster.ToolsBin(); err != nil {
			suite.skip = fmt.Sprintf("control-plane binaries unavailable: %v", err)
		}
	}
	if suite.skip == "" {
		for _, tool := range []string{"losetup", "mkfs.ext4", "wipefs", "blkid", "mount"} {
			if _, err := exec.LookPath(tool); err != nil {
				suite.skip = tool + " is not installed"
			}
		}
	}
	if suite.skip != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "volume-agent-e2e-localpv-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := 1
	defer func() {
		if code == 0 {
			os.RemoveAll(dir)
		} else {
			fmt.Fprintf(os.Stderr, "control plane logs and audit log kept in %s\n", dir)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := setup(ctx, dir); err != nil {
		fmt.Fprintf(os.Stderr, "setting up the suite: %v\n", err)
		if suite.cluster != nil {
			suite.cluster.Stop()
		}
		return 1
	}
	defer suite.cluster.Stop()
	code = m.Run()
	if code == 0 && !checkRBAC() {
		code = 1
	}
	return code
}

func setup(ctx context.Context, dir string) error {
	start := time.Now()
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	suite.agentBin = os.Getenv("VOLUME_AGENT_BINARY")
	if suite.agentBin == "" {
		suite.agentBin = filepath.Join(dir, "volume-agent")
		args := []string{"build", "-o", suite.agentBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/volume-agent")...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./cmd/volume-agent: %v\n%s", err, out)
		}
	}
	if suite.cluster, err = cluster.Start(ctx, cluster.Options{ControllerManager: true, Dir: filepath.Join(dir, "cluster")}); err != nil {
		return fmt.Errorf("starting the control plane: %w", err)
	}
	suite.admin = suite.cluster.AdminClient()

	// The agent's RBAC exactly as deploy/ renders it.
	agentSA, err := createDeployRBAC(ctx, filepath.Join(root, "deploy"))
	if err != nil {
		return err
	}
	if suite.agentKubeconfig, err = suite.cluster.ServiceAccountKubeconfig(ctx, agentSA.Namespace, agentSA.Name); err != nil {
		return err
	}

	// The provisioner's own ServiceAccount and role.
	const ns, name = "localpv-test", "local-provisioner"
	if _, err := suite.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := suite.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: provisionerRules}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := suite.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if suite.provKubeconfig, err = suite.cluster.ServiceAccountKubeconfig(ctx, ns, name); err != nil {
		return err
	}
	suite.provUser = "system:serviceaccount:" + ns + ":" + name

	// Both bindings reach the RBAC authorizer through a watch: wait until
	// it allows what each identity does first.
	for _, who := range []struct{ user, ns, resource string }{
		{suite.provUser, ns, "persistentvolumes"},
		{"system:serviceaccount:" + agentSA.Namespace + ":" + agentSA.Name, agentSA.Namespace, "pods"},
	} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			review, err := suite.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User:               who.user,
					Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + who.ns, "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "watch", Resource: who.resource},
				},
			}, metav1.CreateOptions{})
			if err == nil && review.Status.Allowed {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the ClusterRoleBinding of %s never took effect (%v)", who.user, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	fmt.Fprintf(os.Stderr, "suite ready in %v (race detector %v)\n", time.Since(start).Round(time.Millisecond), raceEnabled)
	return nil
}

// createDeployRBAC creates the Namespace, ServiceAccount, ClusterRole and
// binding that deploy/ renders (not the DaemonSet: the tests run the agent
// as a process) and returns the ServiceAccount.
func createDeployRBAC(ctx context.Context, dir string) (*corev1.ServiceAccount, error) {
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var sa *corev1.ServiceAccount
	for _, r := range resMap.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			return nil, err
		}
		conv := func(into any) error {
			return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)
		}
		switch u.GetKind() {
		case "Namespace":
			o := &corev1.Namespace{}
			if err = conv(o); err == nil {
				_, err = suite.admin.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
			}
		case "ServiceAccount":
			sa = &corev1.ServiceAccount{}
			if err = conv(sa); err == nil {
				_, err = suite.admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
			}
		case "ClusterRole":
			o := &rbacv1.ClusterRole{}
			if err = conv(o); err == nil {
				_, err = suite.admin.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
			}
		case "ClusterRoleBinding":
			o := &rbacv1.ClusterRoleBinding{}
			if err = conv(o); err == nil {
				_, err = suite.admin.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
			}
		}
		if err != nil {
			return nil, fmt.Errorf("creating %s %s from deploy/: %w", u.GetKind(), u.GetName(), err)
		}
	}
	if sa == nil {
		return nil, fmt.Errorf("deploy/ renders no ServiceAccount")
	}
	return sa, nil
}

// checkRBAC reads the provisioner's requests from the audit log: none may
// have been refused, and on a full run every granted verb must have been
// used (a grant never exercised is superfluous or untested).
func checkRBAC() bool {
	events, err := suite.cluster.AuditEvents()
	if err != nil {
		fmt.Fprintf(os.Stderr, "RBAC check: %v\n", err)
		return false
	}
	used := map[string]int{}
	ok := true
	for _, e := range events {
		if e.User.Username != suite.provUser || e.Stage != cluster.StageResponseComplete || e.ObjectRef == nil {
			continue
		}
		key := e.Verb + " " + e.ObjectRef.Resource
		used[key]++
		// Informers list through a watch (sendInitialEvents=true: a
		// watch-list) where the server supports it; the list grant is
		// still needed on servers that do not.
		if e.Verb == "watch" && strings.Contains(e.RequestURI, "sendInitialEvents=true") {
			used["list "+e.ObjectRef.Resource]++
		}
		if e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
			fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %s %s was forbidden\n", e.Verb, e.RequestURI)
			ok = false
		}
	}
	var granted []string
	for _, r := range provisionerRules {
		for _, res := range r.Resources {
			for _, v := range r.Verbs {
				granted = append(granted, v+" "+res)
			}
		}
	}
	keys := make([]string, 0, len(used))
	for k := range used {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(os.Stderr, "RBAC check: requests of %s:\n", suite.provUser)
	for _, k := range keys {
		mark := ""
		if !slices.Contains(granted, k) {
			mark = "   (not granted)"
		}
		fmt.Fprintf(os.Stderr, "  %-35s %6d%s\n", k, used[k], mark)
	}
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return ok
		}
	}
	for _, g := range granted {
		if used[g] == 0 {
			fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %q is granted but was never used\n", g)
			ok = false
		}
	}
	if ok {
		fmt.Fprintf(os.Stderr, "RBAC check: ok: %s\n", strings.Join(granted, ", "))
	}
	return ok
}
