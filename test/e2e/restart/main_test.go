// Package restart_test proves end to end, with the real volume-agent binary,
// that restarts, crashes and upgrades of the agent never unmount a volume a
// pod uses, never stack a second mount on one, never lose data, and always
// finish tearing down what pods no longer want (including what a crash left
// half done): kill -9 in the middle of mounting hundreds of volumes, SIGTERM
// and start again (an upgrade) with zero mount and unmount operations, pods
// removed while the agent is down, a manifest that never parses, an API
// server that is down when the agent starts, and CSI volumes whose pods went
// away while the agent was down or whose agent died between NodeUnpublish and
// NodeUnstage.
//
// TestMain builds cmd/volume-agent (with -race when the tests run with it, so
// a data race in the agent is found in its log) and the test CSI driver once.
// The standalone tests need root; the cluster tests also need the control
// plane binaries (test/tools/build.sh) and start one shared control plane on
// first use (and a private one for the API server outage), with the RBAC
// objects rendered from deploy/self-attach (the base ClusterRole plus the
// self-attach one) for the agents' ServiceAccount. Everything a test starts
// (processes, mounts, loop devices) is stopped, unmounted and detached when
// it ends, also on failure.
package restart_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
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

var bins struct {
	skip   string // why every test skips
	dir    string
	agent  string
	driver string
	root   string // the repository
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	switch {
	case testing.Short():
		bins.skip = "-short: the restart tests build and run the agent"
	case os.Geteuid() != 0:
		bins.skip = "the restart tests mount filesystems: run them as root"
	}
	if bins.skip != "" {
		return m.Run()
	}
	var err error
	if bins.root, err = cluster.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if bins.dir, err = os.MkdirTemp("", "volume-agent-restart-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(bins.dir)
	bins.agent = os.Getenv("VOLUME_AGENT_BINARY")
	var wg sync.WaitGroup
	var agentErr, driverErr error
	if bins.agent == "" {
		bins.agent = filepath.Join(bins.dir, "volume-agent")
		args := []string{"build", "-o", bins.agent}
		if raceEnabled {
			args = append(args, "-race")
		}
		wg.Add(1)
		go func() { defer wg.Done(); agentErr = goBuild(append(args, "./cmd/volume-agent")...) }()
	}
	bins.driver = filepath.Join(bins.dir, "test-csi-driver")
	wg.Add(1)
	go func() {
		defer wg.Done()
		driverErr = goBuild("build", "-o", bins.driver, "./test/csidriver/cmd/test-csi-driver")
	}()
	wg.Wait()
	for _, err := range []error{agentErr, driverErr} {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	code := m.Run()
	shared.stop(code != 0)
	return code
}

func goBuild(args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir = bins.root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %v: %v\n%s", args, err, out)
	}
	return nil
}

// requireRoot skips the test when the package cannot run.
func requireRoot(t *testing.T) {
	t.Helper()
	if bins.skip != "" {
		t.Skip(bins.skip)
	}
}

// controlPlane is a running etcd, kube-apiserver and
// kube-controller-manager with the deploy/ RBAC objects and a kubeconfig of
// the agents' ServiceAccount.
type controlPlane struct {
	c          *cluster.Cluster
	admin      kubernetes.Interface
	kubeconfig string
}

// sharedPlane is the control plane the cluster tests share, started on
// first use. The API server outage test has its own.
type sharedPlane struct {
	once sync.Once
	dir  string
	cp   *controlPlane
	err  error
}

var shared sharedPlane

// stop stops the control plane; its directory (logs, audit log) is kept
// when a test failed.
func (s *sharedPlane) stop(failed bool) {
	if s.cp != nil {
		s.cp.c.Stop()
	}
	if s.dir == "" {
		return
	}
	if failed {
		fmt.Fprintf(os.Stderr, "the shared control plane's logs are in %s\n", s.dir)
		return
	}
	os.RemoveAll(s.dir)
}

// clusterSkip says why the cluster tests cannot run, or "".
func clusterSkip() string {
	switch {
	case bins.skip != "":
		return bins.skip
	case os.Getenv("VOLUME_AGENT_SKIP_CLUSTER") == "1":
		return "VOLUME_AGENT_SKIP_CLUSTER=1: not starting a control plane"
	}
	if _, err := cluster.ToolsBin(); err != nil {
		return fmt.Sprintf("control-plane binaries unavailable: %v", err)
	}
	return ""
}

// sharedControlPlane starts the shared control plane on first use.
func sharedControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	if why := clusterSkip(); why != "" {
		t.Skip(why)
	}
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "volume-agent-restart-cluster-"); shared.err != nil {
			return
		}
		shared.cp, shared.err = startControlPlane(shared.dir)
	})
	if shared.err != nil {
		t.Fatalf("starting the shared control plane: %v", shared.err)
	}
	return shared.cp
}

// privateControlPlane starts a control plane for one test, stopped when it
// ends.
func privateControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	if why := clusterSkip(); why != "" {
		t.Skip(why)
	}
	dir := t.TempDir()
	cp, err := startControlPlane(dir)
	if err != nil {
		t.Fatalf("starting a control plane: %v", err)
	}
	t.Cleanup(cp.c.Stop)
	return cp
}

func startControlPlane(dir string) (*controlPlane, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	objs, err := renderDeploy(filepath.Join(bins.root, "deploy", "self-attach"))
	if err != nil {
		return nil, err
	}
	c, err := cluster.Start(ctx, cluster.Options{ControllerManager: true, Dir: dir})
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{c: c, admin: c.AdminClient()}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	var sa *corev1.ServiceAccount
	for _, o := range objs {
		var err error
		switch o.GetKind() {
		case "Namespace":
			ns := &corev1.Namespace{}
			if err = fromUnstructured(o, ns); err == nil {
				_, err = cp.admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
			}
		case "ServiceAccount":
			sa = &corev1.ServiceAccount{}
			if err = fromUnstructured(o, sa); err == nil {
				_, err = cp.admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
			}
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			if err = fromUnstructured(o, r); err == nil {
				_, err = cp.admin.RbacV1().ClusterRoles().Create(ctx, r, metav1.CreateOptions{})
			}
		case "ClusterRoleBinding":
			b := &rbacv1.ClusterRoleBinding{}
			if err = fromUnstructured(o, b); err == nil {
				_, err = cp.admin.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{})
			}
		}
		if err != nil {
			return nil, fmt.Errorf("creating %s %s from deploy/self-attach: %w", o.GetKind(), o.GetName(), err)
		}
	}
	if sa == nil {
		return nil, fmt.Errorf("deploy/self-attach renders no ServiceAccount")
	}
	if cp.kubeconfig, err = c.ServiceAccountKubeconfig(ctx, sa.Namespace, sa.Name); err != nil {
		return nil, err
	}
	// The RBAC authorizer learns about bindings through a watch: wait until
	// it allows the last thing the agent may need (deleting a
	// VolumeAttachment, granted by the self-attach binding).
	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	for _, attrs := range []authorizationv1.ResourceAttributes{
		{Verb: "watch", Resource: "pods"},
		{Verb: "delete", Group: "storage.k8s.io", Resource: "volumeattachments"},
	} {
		for {
			review, err := cp.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"},
					ResourceAttributes: &attrs,
				},
			}, metav1.CreateOptions{})
			if err == nil && review.Status.Allowed {
				break
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("the RBAC bindings never took effect for %s %s (%v)", attrs.Verb, attrs.Resource, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	ok = true
	fmt.Fprintf(os.Stderr, "control plane in %s ready in %v\n", dir, time.Since(start).Round(time.Millisecond))
	return cp, nil
}

// renderDeploy builds a deploy/ directory with kustomize, as
// `kubectl apply -k` would.
func renderDeploy(dir string) ([]*unstructured.Unstructured, error) {
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
