// Package csi_test tests volume-agent's CSI support end to end: the real
// agent binary, the real test CSI driver binary (test/csidriver, run as a
// separate process so it can be killed and restarted), and a real etcd,
// kube-apiserver and kube-controller-manager (test/cluster), with real
// loop devices, filesystems and mounts under a temporary root per test.
//
// TestMain (e2eutil.RunSuite) builds both binaries once (the agent with
// -race when the tests run with it), starts one control plane for the
// package and creates the RBAC objects rendered from deploy/ (the agent's
// ServiceAccount and ClusterRole) and from deploy/self-attach (its extra ClusterRole, bound to
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
	"fmt"
	"os"
	"path/filepath"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// selfAttachSA is the ServiceAccount that gets deploy/self-attach's extra
// ClusterRole (in the namespace of deploy/'s ServiceAccount).
const selfAttachSA = "volume-agent-self-attach"

// suite is what TestMain sets up for every test: the control plane with
// deploy/'s ServiceAccount (e2eutil.Suite), and the credentials of the one
// with deploy/self-attach's ClusterRole as well.
var suite struct {
	e2eutil.Suite
	selfAttachKubeconfig, selfAttachUser string
	selfAttachRole                       *rbacv1.ClusterRole
}

func TestMain(m *testing.M) {
	os.Exit(e2eutil.RunSuite(m, &suite.Suite, e2eutil.SuiteOptions{
		Name:      "csi",
		Tools:     []string{"losetup", "blkid", "mkfs.ext4", "resize2fs", "e2fsck"},
		CSIDriver: true,
		Setup:     setupSelfAttach,
		Check:     checkRBAC,
	}))
}

// setupSelfAttach creates deploy/self-attach: the same base plus a
// ClusterRole and its binding. Its bindings are created for a second
// ServiceAccount, so that the agents of the other tests have exactly
// deploy/'s grants.
func setupSelfAttach(ctx context.Context, s *e2eutil.Suite) error {
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	selfAttach, err := e2eutil.RenderKustomization(filepath.Join(root, "deploy", "self-attach"))
	if err != nil {
		return err
	}
	sa := s.ServiceAccount
	baseRoles := map[string]bool{}
	for _, r := range s.ClusterRoles {
		baseRoles[r.Name] = true
	}
	if _, err := s.Admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: selfAttachSA, Namespace: sa.Namespace},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, o := range selfAttach {
		var err error
		switch o.GetKind() {
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			if err = e2eutil.FromUnstructured(o, r); err == nil && !baseRoles[r.Name] {
				suite.selfAttachRole = r
				_, err = s.Admin.RbacV1().ClusterRoles().Create(ctx, r, metav1.CreateOptions{})
			}
		case "ClusterRoleBinding":
			b := &rbacv1.ClusterRoleBinding{}
			if err = e2eutil.FromUnstructured(o, b); err == nil {
				if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != sa.Name || b.Subjects[0].Namespace != sa.Namespace {
					return fmt.Errorf("deploy/self-attach: ClusterRoleBinding %s does not bind the agent's ServiceAccount: %+v", b.Name, b.Subjects)
				}
				b.Name += "-e2e-self-attach"
				b.Subjects[0].Name = selfAttachSA
				_, err = s.Admin.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("creating %s %s from deploy/self-attach: %w", o.GetKind(), o.GetName(), err)
		}
	}
	if suite.selfAttachRole == nil {
		return fmt.Errorf("deploy/self-attach renders no ClusterRole of its own")
	}
	if suite.selfAttachKubeconfig, err = s.Cluster.ServiceAccountKubeconfig(ctx, sa.Namespace, selfAttachSA); err != nil {
		return err
	}
	suite.selfAttachUser = "system:serviceaccount:" + sa.Namespace + ":" + selfAttachSA
	return s.WaitAllowed(ctx, sa.Namespace, selfAttachSA,
		authorizationv1.ResourceAttributes{Verb: "watch", Resource: "pods"},
		authorizationv1.ResourceAttributes{Verb: "create", Group: "storage.k8s.io", Resource: "volumeattachments"})
}

// checkRBAC reads every request the agents made. None may have been
// refused, and on a full run the self-attach agent must have used every
// verb deploy/self-attach adds (it is the only test of them). The summary
// says which of the agents' requests read secrets.
func checkRBAC() bool {
	events, err := suite.Cluster.AuditEvents()
	if err != nil {
		fmt.Fprintf(os.Stderr, "RBAC check: %v\n", err)
		return false
	}
	ok := true
	used := map[string]map[string]int{}
	for _, user := range []string{suite.User, suite.selfAttachUser} {
		counts, refused := e2eutil.Requests(events, user)
		for _, e := range refused {
			fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %s %s by %s (%s) was forbidden\n", e.Verb, e.RequestURI, e.User.Username, e.UserAgent)
			ok = false
		}
		e2eutil.PrintRequests(user, counts, nil)
		used[user] = counts
		if bad := e2eutil.UnscopedReads(events, user, "volume-agent/"); len(bad) > 0 {
			fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %s listed or watched objects of the cluster without a name selector: %v\n", user, bad)
			ok = false
		}
	}
	if e2eutil.FullRun() {
		for _, g := range e2eutil.Unused(e2eutil.Grants(suite.selfAttachRole.Rules), used[suite.selfAttachUser]) {
			fmt.Fprintf(os.Stderr, "RBAC check: FAIL: deploy/self-attach grants %q, which the self-attach agent never used\n", g)
			ok = false
		}
		// Attachments are watched one by one, by name (UnscopedReads
		// below): the cluster suite leaves this grant to this one.
		if used[suite.User]["watch volumeattachments.storage.k8s.io"] == 0 {
			fmt.Fprintln(os.Stderr, "RBAC check: FAIL: no agent watched a VolumeAttachment (the attach tests should have)")
			ok = false
		}
		// The node's volumesInUse, for attach-required volumes: the
		// cluster suite leaves this grant to this one too.
		if used[suite.User]["patch nodes/status"] == 0 {
			fmt.Fprintln(os.Stderr, "RBAC check: FAIL: no agent reported the node's volumesInUse (the attach tests should have)")
			ok = false
		}
		if used[suite.User]["get secrets"] == 0 {
			fmt.Fprintln(os.Stderr, "RBAC check: FAIL: no agent read a secret (TestNodeStageSecret should have)")
			ok = false
		}
	}
	if ok {
		fmt.Fprintln(os.Stderr, "RBAC check: ok: no request refused")
	}
	return ok
}
