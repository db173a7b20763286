// Package csi_test tests volume-agent's CSI support end to end: the real
// agent binary, the real test CSI driver binary (test/csidriver, run as a
// separate process so it can be killed and restarted), and a real etcd,
// kube-apiserver and kube-controller-manager (test/cluster), with real
// loop devices, filesystems and mounts under a temporary root per test.
//
// TestMain builds both binaries once (the agent with -race when the tests
// run with it), starts one control plane for the package and creates the
// RBAC objects rendered from deploy/ (the agent's ServiceAccount and
// ClusterRole) and from deploy/self-attach (its extra ClusterRole, bound to
// a second ServiceAccount so that only the self-attach test has it). Agents
// run as those ServiceAccounts, never as an administrator; after the tests
// TestMain checks the audit log: nothing an agent did was refused.
//
// There is no attach/detach controller, no external-attacher and no
// kubelet: tests play their parts (VolumeAttachments, ControllerPublish)
// with the administrator's client and the driver's gRPC API.
//
// Each test has its own Node, namespace, root directory, agent, driver
// processes and driver state directories; everything is stopped, unmounted
// and detached when it ends. The tests need root, loop devices and
// mkfs.ext4, and skip otherwise, in -short mode, with
// VOLUME_AGENT_SKIP_CLUSTER=1 or without the control-plane binaries.
package csi_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// selfAttachSA is the ServiceAccount that gets deploy/self-attach's extra
// ClusterRole (in the namespace of deploy/'s ServiceAccount).
const selfAttachSA = "volume-agent-self-attach"

// suite is what TestMain sets up for every test.
var suite struct {
	skip string // why every test skips; empty if the suite runs

	cluster   *cluster.Cluster
	admin     kubernetes.Interface
	agentBin  string
	driverBin string
	repoRoot  string

	// The agent's credentials: deploy/'s ServiceAccount, and the one with
	// deploy/self-attach's ClusterRole as well.
	kubeconfig, user                     string
	selfAttachKubeconfig, selfAttachUser string
	selfAttachRole                       *rbacv1.ClusterRole
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
		suite.skip = "the agent mounts and the driver attaches loop devices: run the tests as root"
	}
	if suite.skip == "" {
		suite.skip = missingTools()
	}
	if suite.skip == "" {
		if _, err := cluster.ToolsBin(); err != nil {
			suite.skip = fmt.Sprintf("control-plane binaries unavailable: %v", err)
		}
	}
	if suite.skip != "" {
		return m.Run()
	}

	dir, err := os.MkdirTemp("", "volume-agent-e2e-csi-")
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

// missingTools says what the test driver needs and this machine lacks.
func missingTools() string {
	for _, tool := range []string{"losetup", "blkid", "mkfs.ext4", "resize2fs", "e2fsck"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "the test CSI driver needs " + tool
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "no loop devices: " + err.Error()
	}
	return ""
}

func setup(ctx context.Context, dir string) error {
	start := time.Now()
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	suite.repoRoot = root
	suite.agentBin = os.Getenv("VOLUME_AGENT_BINARY")
	builds := [][]string{}
	if suite.agentBin == "" {
		suite.agentBin = filepath.Join(dir, "volume-agent")
		args := []string{"build", "-o", suite.agentBin}
		if raceEnabled {
			// A data race then makes the agent exit 66 (checked when each
			// test stops its agent).
			args = append(args, "-race")
		}
		builds = append(builds, append(args, "./cmd/volume-agent"))
	}
	suite.driverBin = filepath.Join(dir, "test-csi-driver")
	builds = append(builds, []string{"build", "-o", suite.driverBin, "./test/csidriver/cmd/test-csi-driver"})
	for _, args := range builds {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	base, err := renderKustomization(filepath.Join(root, "deploy"))
	if err != nil {
		return err
	}
	selfAttach, err := renderKustomization(filepath.Join(root, "deploy", "self-attach"))
	if err != nil {
		return err
	}
	if suite.cluster, err = cluster.Start(ctx, cluster.Options{ControllerManager: true, Dir: filepath.Join(dir, "cluster")}); err != nil {
		return fmt.Errorf("starting the control plane: %w", err)
	}
	suite.admin = suite.cluster.AdminClient()

	// deploy/ exactly as rendered (not the DaemonSet: the tests run the
	// agent as a process).
	var sa *corev1.ServiceAccount
	baseRoles := map[string]bool{}
	for _, o := range base {
		var err error
		switch o.GetKind() {
		case "Namespace":
			ns := &corev1.Namespace{}
			if err = fromUnstructured(o, ns); err == nil {
				_, err = suite.admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
			}
		case "ServiceAccount":
			sa = &corev1.ServiceAccount{}
			if err = fromUnstructured(o, sa); err == nil {
				_, err = suite.admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
			}
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			if err = fromUnstructured(o, r); err == nil {
				baseRoles[r.Name] = true
				_, err = suite.admin.RbacV1().ClusterRoles().Create(ctx, r, metav1.CreateOptions{})
			}
		case "ClusterRoleBinding":
			b := &rbacv1.ClusterRoleBinding{}
			if err = fromUnstructured(o, b); err == nil {
				_, err = suite.admin.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("creating %s %s from deploy/: %w", o.GetKind(), o.GetName(), err)
		}
	}
	if sa == nil || len(baseRoles) == 0 {
		return fmt.Errorf("deploy/ renders no ServiceAccount or no ClusterRole")
	}

	// deploy/self-attach: the same base plus a ClusterRole and its binding.
	// Its bindings are created for a second ServiceAccount, so that the
	// agents of the other tests have exactly deploy/'s grants.
	if _, err := suite.admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: selfAttachSA, Namespace: sa.Namespace},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, o := range selfAttach {
		var err error
		switch o.GetKind() {
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			if err = fromUnstructured(o, r); err == nil && !baseRoles[r.Name] {
				suite.selfAttachRole = r
				_, err = suite.admin.RbacV1().ClusterRoles().Create(ctx, r, metav1.CreateOptions{})
			}
		case "ClusterRoleBinding":
			b := &rbacv1.ClusterRoleBinding{}
			if err = fromUnstructured(o, b); err == nil {
				if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != sa.Name || b.Subjects[0].Namespace != sa.Namespace {
					return fmt.Errorf("deploy/self-attach: ClusterRoleBinding %s does not bind the agent's ServiceAccount: %+v", b.Name, b.Subjects)
				}
				b.Name += "-e2e-self-attach"
				b.Subjects[0].Name = selfAttachSA
				_, err = suite.admin.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("creating %s %s from deploy/self-attach: %w", o.GetKind(), o.GetName(), err)
		}
	}
	if suite.selfAttachRole == nil {
		return fmt.Errorf("deploy/self-attach renders no ClusterRole of its own")
	}

	if suite.kubeconfig, err = suite.cluster.ServiceAccountKubeconfig(ctx, sa.Namespace, sa.Name); err != nil {
		return err
	}
	if suite.selfAttachKubeconfig, err = suite.cluster.ServiceAccountKubeconfig(ctx, sa.Namespace, selfAttachSA); err != nil {
		return err
	}
	suite.user = "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	suite.selfAttachUser = "system:serviceaccount:" + sa.Namespace + ":" + selfAttachSA

	// The RBAC authorizer learns about new bindings through a watch: ask it
	// (as the administrator, so that no request of the agents is refused)
	// until it allows what the agents do.
	for _, check := range []struct {
		user string
		attr authorizationv1.ResourceAttributes
	}{
		{suite.user, authorizationv1.ResourceAttributes{Verb: "watch", Resource: "pods"}},
		{suite.selfAttachUser, authorizationv1.ResourceAttributes{Verb: "watch", Resource: "pods"}},
		{suite.selfAttachUser, authorizationv1.ResourceAttributes{Verb: "create", Group: "storage.k8s.io", Resource: "volumeattachments"}},
	} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			review, err := suite.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User:               check.user,
					Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"},
					ResourceAttributes: &check.attr,
				},
			}, metav1.CreateOptions{})
			if err == nil && review.Status.Allowed {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the bindings never took effect for %s %+v (review: %+v, error: %v)", check.user, check.attr, review, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	fmt.Fprintf(os.Stderr, "suite ready in %v (agent %s, race detector %v)\n", time.Since(start).Round(time.Millisecond), suite.agentBin, raceEnabled)
	return nil
}

// renderKustomization builds a kustomization, as `kubectl apply -k` would.
func renderKustomization(dir string) ([]*unstructured.Unstructured, error) {
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range resMap.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, err
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(data); err != nil {
			return nil, err
		}
		out = append(out, obj)
	}
	return out, nil
}

func fromUnstructured(u *unstructured.Unstructured, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true)
}

// fullRun reports whether every test of the package was selected.
func fullRun() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}

// checkRBAC reads every request the agents made. None may have been
// refused, and on a full run the self-attach agent must have used every
// verb deploy/self-attach adds (it is the only test of them). The summary
// says which of the agents' requests read secrets.
func checkRBAC() bool {
	events, err := suite.cluster.AuditEvents()
	if err != nil {
		fmt.Fprintf(os.Stderr, "RBAC check: %v\n", err)
		return false
	}
	ok := true
	used := map[string]map[string]int{suite.user: {}, suite.selfAttachUser: {}}
	for _, e := range events {
		byUser, ours := used[e.User.Username]
		if !ours || e.Stage != cluster.StageResponseComplete {
			continue
		}
		key := e.Verb + " " + e.RequestURI
		if e.ObjectRef != nil {
			key = e.Verb + " " + groupResource(e.ObjectRef.APIGroup, e.ObjectRef.Resource, e.ObjectRef.Subresource)
		}
		byUser[key]++
		if e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
			fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %s %s by %s (%s) was forbidden\n", e.Verb, e.RequestURI, e.User.Username, e.UserAgent)
			ok = false
		}
	}
	for _, user := range []string{suite.user, suite.selfAttachUser} {
		var keys []string
		for k := range used[user] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(os.Stderr, "RBAC check: requests of %s by (verb, resource):\n", user)
		for _, k := range keys {
			fmt.Fprintf(os.Stderr, "  %-50s %6d\n", k, used[user][k])
		}
	}
	if fullRun() {
		for _, rule := range suite.selfAttachRole.Rules {
			for _, g := range rule.APIGroups {
				for _, r := range rule.Resources {
					res, sub, _ := strings.Cut(r, "/")
					for _, v := range rule.Verbs {
						if k := v + " " + groupResource(g, res, sub); used[suite.selfAttachUser][k] == 0 {
							fmt.Fprintf(os.Stderr, "RBAC check: FAIL: deploy/self-attach grants %q, which the self-attach agent never used\n", k)
							ok = false
						}
					}
				}
			}
		}
		if used[suite.user]["get secrets"] == 0 {
			fmt.Fprintln(os.Stderr, "RBAC check: FAIL: no agent read a secret (TestNodeStageSecret should have)")
			ok = false
		}
	}
	if ok {
		fmt.Fprintln(os.Stderr, "RBAC check: ok: no request refused")
	}
	return ok
}

func groupResource(group, resource, sub string) string {
	s := resource
	if group != "" {
		s += "." + group
	}
	if sub != "" {
		s += "/" + sub
	}
	return s
}
