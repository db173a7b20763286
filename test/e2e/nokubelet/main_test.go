// Package nokubelet_test walks the whole life of a volume of an
// attach-required CSI driver on a node with no kubelet, with every part of
// the cluster real except the node: etcd, kube-apiserver and
// kube-controller-manager with the attach/detach and expand controllers
// (test/cluster), the real external-provisioner, external-attacher and
// external-resizer (built by test/tools/build.sh from test/tools/csi, run
// with an administrator's kubeconfig: they are the cluster's, not what is
// tested), the test CSI driver (test/csidriver) registering through its
// kubelet-style registration socket, and the agent built with -race, run as
// deploy/'s ServiceAccount with real loop devices, xfs and mounts.
//
// What the kubelet does for the node besides mounting (the CSINode, the
// node's annotations and topology labels) the agent does, and the test
// checks it as the attacher and provisioner read it (waitNodeDuties).
//
// TestMain (e2eutil.RunSuite) builds the agent and the driver and starts
// the control plane; after the tests it checks the audit log: the API
// server refused nothing the agent asked, and the agent read claims,
// volumes and attachments only by name. The tests need root, loop devices,
// mkfs.xfs and xfs_growfs, and skip otherwise, in -short mode, with
// VOLUME_AGENT_SKIP_CLUSTER=1, or without the control-plane binaries or
// the sidecars.
package nokubelet_test

import (
	"os"
	"slices"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

var suite e2eutil.Suite

func TestMain(m *testing.M) {
	os.Exit(e2eutil.RunSuite(m, &suite, e2eutil.SuiteOptions{
		Name:      "nokubelet",
		Tools:     []string{"losetup", "blkid", "mkfs.xfs", "xfs_growfs"},
		CSIDriver: true,
		Sidecars:  true,
		ControlPlane: e2eutil.ControlPlaneOptions{
			Controllers: slices.Concat(cluster.DefaultControllers, []string{cluster.AttachDetachController, cluster.ExpanderController}),
			// The agent's claim status patches (node expansion).
			Allowed: []authorizationv1.ResourceAttributes{
				{Verb: "patch", Resource: "persistentvolumeclaims", Subresource: "status"},
			},
		},
		Check: suite.CheckNothingRefused,
	}))
}
