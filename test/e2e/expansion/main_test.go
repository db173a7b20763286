// Package expansion_test tests node-side volume expansion end to end: the
// real agent binary, run as the deploy/ ServiceAccount against a real etcd,
// kube-apiserver and kube-controller-manager (test/cluster), growing real
// filesystems on loop devices: local block PVs (ext4 offline before a pod
// gets the volume, xfs online) and CSI volumes of the test driver
// (test/csidriver, NodeExpandVolume), including the driver's failures.
//
// There is no external-resizer: each test plays it with administrator
// patches, the way it does its part (PV spec.capacity, then the claim's
// status.allocatedResources, allocatedResourceStatuses[storage] =
// NodeResizePending and the FileSystemResizePending condition), and then
// checks what the agent did: the filesystem (statfs), the claim's status,
// the events, /debug/asw and the driver's call counts.
//
// TestMain builds the agent (with -race when the tests run with it) and the
// test CSI driver, starts one control plane and creates the RBAC objects
// rendered from deploy/ and a StorageClass that allows expansion. Each test
// has its own Node, namespace, root directory, agent, loop devices and,
// for CSI, driver process; all are stopped, unmounted and detached when the
// test ends. After the tests, TestMain checks in the audit log that the API
// server refused nothing the agents asked.
//
// The tests need root (loop devices, mounts) and skip otherwise, in -short
// mode, with VOLUME_AGENT_SKIP_CLUSTER=1, or without the control-plane
// binaries. Set VOLUME_AGENT_BINARY to test an agent built elsewhere.
package expansion_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/volume-agent/volume-agent/test/cluster"
)

// storageClass is the class of every PV and claim: no provisioner, and
// allowVolumeExpansion, so that the tests can raise a claim's request as a
// user would.
const storageClass = "expandable"

// suite is what TestMain sets up for every test.
var suite struct {
	skip string // why every test skips; empty if the suite runs

	cluster    *cluster.Cluster
	admin      kubernetes.Interface
	agentBin   string
	driverBin  string
	kubeconfig string // the agent's: the deploy/ ServiceAccount's token
	user       string // system:serviceaccount:<ns>:<name>
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
		suite.skip = "the agent mounts filesystems and the tests attach loop devices: run the tests as root"
	}
	if suite.skip == "" {
		if _, err := exec.LookPath("losetup"); err != nil {
			suite.skip = "losetup is not installed"
		} else if _, err := cluster.ToolsBin(); err != nil {
			suite.skip = fmt.Sprintf("control-plane binaries unavailable: %v", err)
		}
	}
	if suite.skip != "" {
		return m.Run()
	}

	dir, err := os.MkdirTemp("", "volume-agent-e2e-expansion-")
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
	if code == 0 && !checkNothingRefused() {
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
	builds := [][]string{{"-o", filepath.Join(dir, "test-csi-driver"), "./test/csidriver/cmd/test-csi-driver"}}
	if suite.agentBin == "" {
		suite.agentBin = filepath.Join(dir, "volume-agent")
		args := []string{"-o", suite.agentBin}
		if raceEnabled {
			// A data race then makes the agent exit 66 (checked when each
			// test stops its agent).
			args = append(args, "-race")
		}
		builds = append(builds, append(args, "./cmd/volume-agent"))
	}
	suite.driverBin = filepath.Join(dir, "test-csi-driver")
	for _, b := range builds {
		cmd := exec.CommandContext(ctx, "go", append([]string{"build"}, b...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %v: %v\n%s", b, err, out)
		}
	}

	objs, err := renderDeploy(filepath.Join(root, "deploy"))
	if err != nil {
		return err
	}
	if suite.cluster, err = cluster.Start(ctx, cluster.Options{ControllerManager: true, Dir: filepath.Join(dir, "cluster")}); err != nil {
		return fmt.Errorf("starting the control plane: %w", err)
	}
	suite.admin = suite.cluster.AdminClient()

	// The RBAC objects exactly as deploy/ renders them (not the DaemonSet:
	// the tests run the agent as a process).
	var sa *corev1.ServiceAccount
	for _, o := range objs {
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
	if sa == nil {
		return fmt.Errorf("deploy/ renders no ServiceAccount")
	}
	if suite.kubeconfig, err = suite.cluster.ServiceAccountKubeconfig(ctx, sa.Namespace, sa.Name); err != nil {
		return err
	}
	suite.user = "system:serviceaccount:" + sa.Namespace + ":" + sa.Name

	// Static binding (no provisioner), and claims may grow.
	if _, err := suite.admin.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: storageClass},
		Provisioner:          "kubernetes.io/no-provisioner",
		AllowVolumeExpansion: ptr.To(true),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingImmediate),
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating StorageClass %s: %w", storageClass, err)
	}

	// The RBAC authorizer learns about the new binding through a watch: ask
	// it (as the administrator, so the agent's user has no request refused)
	// until it allows the agent's claim status patches.
	deadline := time.Now().Add(30 * time.Second)
	for {
		review, err := suite.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               suite.user,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "patch", Resource: "persistentvolumeclaims", Subresource: "status"},
			},
		}, metav1.CreateOptions{})
		if err == nil && review.Status.Allowed {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the ClusterRoleBinding never allowed patching persistentvolumeclaims/status (review: %+v, error: %v)", review, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "suite ready in %v (agent %s, race detector %v)\n", time.Since(start).Round(time.Millisecond), suite.agentBin, raceEnabled)
	return nil
}

// renderDeploy builds deploy/ with kustomize, as `kubectl apply -k` would.
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

// checkNothingRefused reads every request the agents' ServiceAccount made
// and fails if the API server refused any (403): the claim status patches
// are new in the ClusterRole. (Whether every grant is used is the cluster
// suite's business; these tests use only some.)
func checkNothingRefused() bool {
	evs, err := suite.cluster.AuditEvents()
	if err != nil {
		fmt.Fprintf(os.Stderr, "RBAC check: %v\n", err)
		return false
	}
	used := map[string]int{}
	ok := true
	for _, e := range evs {
		if e.User.Username != suite.user || e.Stage != cluster.StageResponseComplete {
			continue
		}
		key := e.Verb + " " + e.RequestURI
		if e.ObjectRef != nil {
			key = e.Verb + " " + e.ObjectRef.Resource
			if e.ObjectRef.Subresource != "" {
				key += "/" + e.ObjectRef.Subresource
			}
		}
		used[key]++
		if e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
			fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %s %s by %s was forbidden\n", e.Verb, e.RequestURI, e.UserAgent)
			ok = false
		}
	}
	keys := make([]string, 0, len(used))
	for k := range used {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(os.Stderr, "RBAC check: requests of %s by (verb, resource):\n", suite.user)
	for _, k := range keys {
		fmt.Fprintf(os.Stderr, "  %-45s %6d\n", k, used[k])
	}
	if ok {
		fmt.Fprintln(os.Stderr, "RBAC check: ok: no request refused")
	}
	return ok
}
