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
	"fmt"
	"os"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// provisionerRules are the permissions the provisioner needs, on top of
// what the agent already has: the caches (its own PVs by label,
// StorageClasses, its Node), creating and deleting PVs, reading and
// labelling by name a PV an earlier version made, and events.
var provisionerRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"persistentvolumes"}, Verbs: []string{"list", "watch", "create", "delete", "get", "patch"}},
	{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
}

// suite is what TestMain sets up for every test: the control plane, where
// the agent runs as the deploy/ ServiceAccount (e2eutil.Suite), and the
// provisioner's credentials.
var suite struct {
	e2eutil.Suite
	provKubeconfig string
	provUser       string
}

func TestMain(m *testing.M) {
	os.Exit(e2eutil.RunSuite(m, &suite.Suite, e2eutil.SuiteOptions{
		Name:  "localpv",
		Tools: []string{"losetup", "mkfs.ext4", "wipefs", "blkid", "mount"},
		Setup: setupProvisioner,
		Check: checkRBAC,
	}))
}

// setupProvisioner creates the provisioner's own ServiceAccount and role.
func setupProvisioner(ctx context.Context, s *e2eutil.Suite) error {
	const ns, name = "localpv-test", "local-provisioner"
	if _, err := s.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := s.Admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: provisionerRules}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := s.Admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	var err error
	if suite.provKubeconfig, err = s.Cluster.ServiceAccountKubeconfig(ctx, ns, name); err != nil {
		return err
	}
	suite.provUser = "system:serviceaccount:" + ns + ":" + name
	return s.WaitAllowed(ctx, ns, name, authorizationv1.ResourceAttributes{Verb: "watch", Resource: "persistentvolumes"})
}

// checkRBAC reads the provisioner's requests from the audit log: none may
// have been refused, no PV may have been listed or watched but its own by
// label (nor a claim or volume by the agents but by name), and on a full
// run every granted verb must have been used (a grant never exercised is
// superfluous or untested).
func checkRBAC() bool {
	events, err := suite.Cluster.AuditEvents()
	if err != nil {
		fmt.Fprintf(os.Stderr, "RBAC check: %v\n", err)
		return false
	}
	counts, refused := e2eutil.Requests(events, suite.provUser)
	ok := len(refused) == 0
	for _, e := range refused {
		fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %s %s was forbidden\n", e.Verb, e.RequestURI)
	}
	// The provisioner watches its own PVs by label, the agents what
	// their pods use by name: nothing grows with the cluster's PVs.
	for user, prefix := range map[string]string{suite.provUser: "localpv-test/", suite.User: "volume-agent/"} {
		if bad := e2eutil.UnscopedReads(events, user, prefix); len(bad) > 0 {
			fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %s listed or watched PVs or claims of the whole cluster: %v\n", user, bad)
			ok = false
		}
	}
	granted := e2eutil.Grants(provisionerRules)
	e2eutil.PrintRequests(suite.provUser, counts, granted)
	if !e2eutil.FullRun() {
		return ok
	}
	for _, g := range e2eutil.Unused(granted, counts) {
		fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %q is granted but was never used\n", g)
		ok = false
	}
	if ok {
		fmt.Fprintf(os.Stderr, "RBAC check: ok: %s\n", strings.Join(granted, ", "))
	}
	return ok
}
