// Package cluster_test tests volume-agent in cluster mode end to end: the
// real binary against a real etcd, kube-apiserver and kube-controller-manager
// (PV binder, ephemeral-volume controller, garbage collector...) from
// test/cluster, with real mounts under a temporary root directory per test.
//
// TestMain builds cmd/volume-agent once (with -race when the tests run with
// it), starts one control plane for the package and creates the RBAC objects
// rendered from deploy/ (Namespace, ServiceAccount, ClusterRole,
// ClusterRoleBinding). Every agent runs as that ServiceAccount, never as an
// administrator, so the suite proves that the ClusterRole suffices; after the
// tests, TestMain reads the audit log and checks that everything it grants
// was used and that nothing the agent did was refused (see checkRBAC).
//
// Each test has its own Node, namespace, root directory and agent process.
// The tests need root (the agent mounts) and skip otherwise, in -short mode,
// with VOLUME_AGENT_SKIP_CLUSTER=1, or without the control-plane binaries.
// Set VOLUME_AGENT_BINARY to test an agent built elsewhere. For debugging,
// VOLUME_AGENT_E2E_KEEP=1 keeps the control plane's directory (logs, audit
// log) even when the tests pass, and VOLUME_AGENT_E2E_LOG_DIR=DIR collects
// every agent's log.
package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
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

// suite is what TestMain sets up for every test.
var suite struct {
	skip string // why every test skips; empty if the suite runs

	cluster      *cluster.Cluster
	admin        kubernetes.Interface
	agentBin     string
	csiDriverBin string // test/csidriver/cmd/test-csi-driver
	kubeconfig   string // the agent's: the deploy/ ServiceAccount's token
	user         string // system:serviceaccount:<ns>:<name>
	role         *rbacv1.ClusterRole
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
		suite.skip = "the agent mounts filesystems: run the tests as root"
	}
	if suite.skip == "" {
		if _, err := cluster.ToolsBin(); err != nil {
			suite.skip = fmt.Sprintf("control-plane binaries unavailable: %v", err)
		}
	}
	if suite.skip != "" {
		return m.Run()
	}

	dir, err := os.MkdirTemp("", "volume-agent-e2e-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := 1
	defer func() {
		if code == 0 && os.Getenv("VOLUME_AGENT_E2E_KEEP") == "" {
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
	if code == 0 {
		if ok := checkRBAC(); !ok {
			code = 1
		}
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
			// Data races in the agent then make it exit 66 (checked when
			// each test stops its agent).
			args = append(args, "-race")
		}
		cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/volume-agent")...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./cmd/volume-agent: %v\n%s", err, out)
		}
	}

	suite.csiDriverBin = filepath.Join(dir, "test-csi-driver")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", suite.csiDriverBin, "./test/csidriver/cmd/test-csi-driver")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./test/csidriver/cmd/test-csi-driver: %v\n%s", err, out)
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
			suite.role = &rbacv1.ClusterRole{}
			if err = fromUnstructured(o, suite.role); err == nil {
				_, err = suite.admin.RbacV1().ClusterRoles().Create(ctx, suite.role, metav1.CreateOptions{})
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
	if sa == nil || suite.role == nil {
		return fmt.Errorf("deploy/ renders no ServiceAccount or no ClusterRole")
	}
	if suite.kubeconfig, err = suite.cluster.ServiceAccountKubeconfig(ctx, sa.Namespace, sa.Name); err != nil {
		return err
	}
	suite.user = "system:serviceaccount:" + sa.Namespace + ":" + sa.Name

	// The RBAC authorizer learns about the new binding through a watch: ask
	// it (as the administrator, so the agent's user has no request refused)
	// until it allows what the agent does first.
	deadline := time.Now().Add(30 * time.Second)
	for {
		review, err := suite.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               suite.user,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "watch", Resource: "pods"},
			},
		}, metav1.CreateOptions{})
		if err == nil && review.Status.Allowed {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the ClusterRoleBinding never took effect (review: %+v, error: %v)", review, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "suite ready in %v (agent %s, race detector %v)\n", time.Since(start).Round(time.Millisecond), suite.agentBin, raceEnabled)
	return nil
}

var recordOnce sync.Once

// recordInputs makes go test's result cache depend on what the binaries
// are built from. go test reuses a passing result while no file or
// environment variable the tests looked at has changed, but the sources are
// only read by `go build`, so a cached pass could hide a broken agent. This
// stats them (and opens a VOLUME_AGENT_BINARY) from within a test: only
// what happens after m.Run starts is recorded.
func recordInputs(t *testing.T) {
	recordOnce.Do(func() {
		if f, err := os.Open(suite.agentBin); err == nil {
			f.Close()
		}
		root, err := cluster.RepoRoot()
		if err == nil {
			err = statSources(root)
		}
		if err != nil {
			t.Logf("recording the sources for go test's cache: %v", err)
		}
	})
}

// statSources stats the module's Go sources, go.mod, go.sum and manifests.
func statSources(root string) error {
	return filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".mod", ".sum", ".yaml":
			_, err := os.Stat(path)
			return err
		}
		return nil
	})
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

// fullRun reports whether every test of the package was selected, which
// checkRBAC needs: a filtered run does not use every permission.
func fullRun() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}

// checkRBAC reads every request the agents' ServiceAccount made during the
// suite. No request may have been refused (403), and every (verb, resource)
// the ClusterRole grants must have been used at least once: a grant the
// suite never exercises is either superfluous or untested.
//
// One kind of 403 is not the ClusterRole's fault: a kube-apiserver that has
// just started serves requests before its RBAC caches are filled and before
// it reports ready, and refuses them (the controller manager's too). Those
// received while TestAPIServerOutage waited for the restarted API server to
// become ready are listed, not counted as failures.
func checkRBAC() bool {
	events, err := readAudit()
	if err != nil {
		fmt.Fprintf(os.Stderr, "RBAC check: %v\n", err)
		return false
	}
	used := map[string]int{}
	ok := true
	forgiven := 0
	for _, e := range events {
		if e.User.Username != suite.user || e.Stage != cluster.StageResponseComplete {
			continue
		}
		key := e.Verb + " " + e.RequestURI
		if e.ObjectRef != nil {
			key = e.Verb + " " + groupResource(e.ObjectRef.APIGroup, e.ObjectRef.Resource, e.ObjectRef.Subresource)
		}
		used[key]++
		// A watch with sendInitialEvents=true is a watch-list: client-go's
		// informers (WatchListClient, on by default since 1.35) start with
		// it instead of a LIST, and fall back to LIST (which the grant is
		// for) on servers without it. On this server it does the list's job.
		if e.Verb == "watch" && e.ObjectRef != nil && strings.Contains(e.RequestURI, "sendInitialEvents=true") {
			used["list "+groupResource(e.ObjectRef.APIGroup, e.ObjectRef.Resource, e.ObjectRef.Subresource)+" (as watch-list)"]++
		}
		if e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
			if apiServerStarting(e.RequestReceivedTimestamp) {
				fmt.Fprintf(os.Stderr, "RBAC check: ignored: %s %s by %s was forbidden by an API server still starting (%s)\n",
					e.Verb, e.RequestURI, e.UserAgent, e.RequestReceivedTimestamp.Format(time.RFC3339Nano))
				forgiven++
				continue
			}
			fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %s %s by %s was forbidden: %s\n", e.Verb, e.RequestURI, e.UserAgent, e.ResponseStatus.Message)
			ok = false
		}
	}
	var granted []string
	for _, rule := range suite.role.Rules {
		for _, g := range rule.APIGroups {
			for _, r := range rule.Resources {
				res, sub, _ := strings.Cut(r, "/")
				for _, v := range rule.Verbs {
					granted = append(granted, v+" "+groupResource(g, res, sub))
				}
			}
		}
	}
	sort.Strings(granted)
	var usedKeys []string
	for k := range used {
		usedKeys = append(usedKeys, k)
	}
	sort.Strings(usedKeys)
	fmt.Fprintf(os.Stderr, "RBAC check: requests of %s by (verb, resource):\n", suite.user)
	for _, k := range usedKeys {
		mark := ""
		if !slices.Contains(granted, strings.TrimSuffix(k, " (as watch-list)")) {
			mark = "   (not granted)"
		}
		fmt.Fprintf(os.Stderr, "  %-55s %6d%s\n", k, used[k], mark)
	}
	if !fullRun() {
		fmt.Fprintln(os.Stderr, "RBAC check: only some tests ran: not checking that every grant was used")
		return ok
	}
	for _, g := range granted {
		if used[g] == 0 && used[g+" (as watch-list)"] == 0 {
			fmt.Fprintf(os.Stderr, "RBAC check: FAIL: the ClusterRole grants %q, which no agent used\n", g)
			ok = false
		}
	}
	if ok {
		fmt.Fprintf(os.Stderr, "RBAC check: ok: all %d grants used, no request refused (%d by a starting API server ignored)\n", len(granted), forgiven)
	}
	return ok
}

// auditEvent is what checkRBAC reads of an audit.k8s.io/v1 Event: the
// harness's AuditEvent without its timestamps.
type auditEvent struct {
	cluster.AuditEvent
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
	ResponseStatus           *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"responseStatus"`
}

// readAudit reads the API server's audit log (audit.log in the cluster's
// directory).
func readAudit() ([]auditEvent, error) {
	data, err := os.ReadFile(filepath.Join(suite.cluster.Dir(), "audit.log"))
	if err != nil {
		return nil, err
	}
	var out []auditEvent
	for line := range bytes.Lines(data) {
		if !bytes.HasSuffix(line, []byte("\n")) {
			break // still being written
		}
		var e auditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, fmt.Errorf("audit.log: %w", err)
		}
		out = append(out, e)
	}
	return out, nil
}

// apiServerRestarts are the periods from a StopAPIServer until the
// restarted API server was ready.
var apiServerRestarts struct {
	sync.Mutex
	periods [][2]time.Time
}

func recordRestart(stopped, ready time.Time) {
	apiServerRestarts.Lock()
	defer apiServerRestarts.Unlock()
	apiServerRestarts.periods = append(apiServerRestarts.periods, [2]time.Time{stopped, ready})
}

func apiServerStarting(t time.Time) bool {
	apiServerRestarts.Lock()
	defer apiServerRestarts.Unlock()
	for _, p := range apiServerRestarts.periods {
		if !t.Before(p[0]) && !t.After(p[1]) {
			return true
		}
	}
	return false
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
