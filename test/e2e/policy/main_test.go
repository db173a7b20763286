// Package policy_test proves on a real kube-apiserver that the agent's own
// identity can write only what belongs to its node: the RBAC objects and
// the ValidatingAdmissionPolicies that deploy/local-volumes and
// deploy/self-attach render are created as `kubectl apply -k` would, the
// agent acts with a service-account token bound to its pod on node A (the
// token the kubelet projects into the DaemonSet's pod), and the tests check
// that it may patch its own pods' and node's status, create, label and delete its
// local PersistentVolumes and VolumeAttachments, and is refused for node
// B's pod, node, PersistentVolume and VolumeAttachment, for a token of
// its own service account, and for writes beyond its own fields (owner
// references, finalizers, labels and annotations through a status
// subresource, status fields not its own, local PVs outside their class's
// parameters). The real agent binary then runs under the same policies
// (pod condition, local PersistentVolumes), and after the tests TestMain
// checks in the audit log that nothing the agent itself did was refused.
//
// The tests need root (the agent mounts) and skip otherwise, in -short
// mode, with VOLUME_AGENT_SKIP_CLUSTER=1, or without the control-plane
// binaries.
package policy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

var suite e2eutil.Suite

func TestMain(m *testing.M) {
	os.Exit(e2eutil.RunSuite(m, &suite, e2eutil.SuiteOptions{
		Name:  "policy",
		Tools: []string{"mount"},
		ControlPlane: e2eutil.ControlPlaneOptions{
			Kustomization:     "deploy/local-volumes",
			AdmissionPolicies: true,
		},
		Setup: setup,
		Check: checkAgentRequests,
		// The control plane's logs say why a policy refused something.
		KeepDir: os.Getenv("VOLUME_AGENT_E2E_KEEP") != "",
	}))
}

// setup adds deploy/self-attach (its RBAC and its policy) and the local
// volume policy's parameters, the ConfigMap deploy/local-volumes renders
// (the control plane creates no ConfigMaps).
func setup(ctx context.Context, s *e2eutil.Suite) error {
	if err := s.ApplyKustomization(ctx, "deploy/self-attach", true); err != nil {
		return err
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	objs, err := e2eutil.RenderKustomization(filepath.Join(root, "deploy/local-volumes"))
	if err != nil {
		return err
	}
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || o.GetName() != policyParams {
			continue
		}
		cm := &corev1.ConfigMap{}
		if err := e2eutil.FromUnstructured(o, cm); err != nil {
			return err
		}
		_, err := s.Admin.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{})
		return err
	}
	return fmt.Errorf("deploy/local-volumes renders no ConfigMap %s", policyParams)
}

// policyParams is the ConfigMap of the local volume policy's parameters.
const policyParams = "volume-agent-local-volumes-policy"

// checkAgentRequests reads the requests the agent binary made (its user
// agent is volume-agent/<node>) from the audit log: under the policies, none
// may have been refused. The tests' own requests as the agent's identity,
// refused on purpose, have another user agent.
func checkAgentRequests() bool {
	events, err := suite.Cluster.AuditEvents()
	if err != nil {
		fmt.Fprintf(os.Stderr, "policy check: %v\n", err)
		return false
	}
	ok, seen := true, 0
	for _, e := range events {
		if e.Stage != cluster.StageResponseComplete || e.User.Username != suite.User || !strings.HasPrefix(e.UserAgent, "volume-agent/") {
			continue
		}
		seen++
		if e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
			fmt.Fprintf(os.Stderr, "policy check: FAIL: the agent's %s %s was refused\n", e.Verb, e.RequestURI)
			ok = false
		}
	}
	if ok {
		fmt.Fprintf(os.Stderr, "policy check: ok: none of the agent's %d requests was refused\n", seen)
	}
	return ok
}
