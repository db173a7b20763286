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
// TestMain (e2eutil.RunSuite) builds the agent (with -race when the tests
// run with it) and the test CSI driver, starts one control plane and creates the RBAC objects
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
	"fmt"
	"os"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// storageClass is the class of every PV and claim: no provisioner, and
// allowVolumeExpansion, so that the tests can raise a claim's request as a
// user would.
const storageClass = "expandable"

// suite is what TestMain sets up for every test.
var suite e2eutil.Suite

func TestMain(m *testing.M) {
	os.Exit(e2eutil.RunSuite(m, &suite, e2eutil.SuiteOptions{
		Name:      "expansion",
		Tools:     []string{"losetup"},
		CSIDriver: true,
		// The agent's claim status patches.
		ControlPlane: e2eutil.ControlPlaneOptions{Allowed: []authorizationv1.ResourceAttributes{
			{Verb: "patch", Resource: "persistentvolumeclaims", Subresource: "status"},
		}},
		Setup: createStorageClass,
		Check: suite.CheckNothingRefused,
	}))
}

// createStorageClass creates the tests' class: static binding (no
// provisioner), and claims may grow.
func createStorageClass(ctx context.Context, s *e2eutil.Suite) error {
	if _, err := s.Admin.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: storageClass},
		Provisioner:          "kubernetes.io/no-provisioner",
		AllowVolumeExpansion: ptr.To(true),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingImmediate),
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating StorageClass %s: %w", storageClass, err)
	}
	return nil
}
