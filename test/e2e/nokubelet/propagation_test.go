package nokubelet_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// A driver in a mount namespace of its own (as in a container) publishes
// into the agent's root directory; its mounts reach the agent and the pods
// only because the agent makes the root directory a shared mount. With
// --shared-root-dir=false on a node whose / is not shared (this machine),
// the driver's publish succeeds where nobody can see it: the agent notices
// that nothing is mounted at the target, keeps the pod waiting with the
// reason, and never reports the volume ready (its pod would have written to
// the node's disk). The flow test covers the shared case.
func TestDriverMountsNeedASharedRoot(t *testing.T) {
	e := newEnv(t, "private")
	if mounttest.MountsAt(t, e.root) != nil {
		t.Skip("skipping: the test's directory is a mount point already")
	}
	ctx := t.Context()
	driverName := e.ns + ".nokubelet.e2e.volume-agent.io"
	regDir := filepath.Join(e.sock, "registry")
	if err := os.Mkdir(regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	suite.CreateCSIDriver(t, driverName, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	agent := suite.StartAgent(t, e.node, e.root, "--shared-root-dir=false", "--plugin-registry-dir="+regDir)
	if ms := mounttest.MountsAt(t, e.root); len(ms) != 0 {
		t.Fatalf("with --shared-root-dir=false the agent mounted its root directory: %+v", ms)
	}
	driver := e2eutil.StartCSIDriver(t, e2eutil.CSIDriverOptions{
		Binary: suite.CSIDriverBin, Name: driverName, NodeID: e.node,
		Socket:            shortPath(t, filepath.Join(e.sock, "csi.sock")),
		ControlSocket:     filepath.Join(e.sock, "control.sock"),
		LogPath:           filepath.Join(e.logs, "driver.log"),
		Args:              []string{"--registration-dir=" + regDir, "--disable-staging"},
		OwnMountNamespace: true,
	})
	handle := driver.CreateVolume("private-vol", 64<<20, "ext4")
	pvName := e.ns + "-pv"
	pv := e2eutil.PreBoundPV(pvName, "64Mi", "", e.ns, "data", corev1.PersistentVolumeSource{
		CSI: &corev1.CSIPersistentVolumeSource{Driver: driverName, VolumeHandle: handle, FSType: "ext4"},
	})
	if _, err := suite.Admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = suite.Admin.CoreV1().PersistentVolumes().Delete(context.Background(), pvName, metav1.DeleteOptions{})
	})
	claim := e2eutil.PVC("data", pvName)
	claim.Namespace = e.ns
	claim.Spec.StorageClassName = ptr.To("")
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := suite.CreatePod(t, e2eutil.Pod(e.ns, e.node, "app", e2eutil.ClaimVolume("data", "data")))

	uniqueName := e2eutil.CSIPlugin + "/" + driverName + "^" + handle
	e2eutil.Poll(t, 60*time.Second, "the publish reported as not visible", func(context.Context) (bool, string) {
		ops, err := agent.Operations()
		if err != nil {
			return false, err.Error()
		}
		op, ok := ops.Find(uniqueName, "mount_volume")
		return ok && strings.Contains(op.LastError, "nothing is mounted there") && strings.Contains(op.LastError, "Bidirectional"),
			fmt.Sprintf("%+v", ops.Operations)
	})
	if n := driver.CallCounts(t)["NodePublishVolume"]; n < 1 {
		t.Errorf("the driver was never asked to publish (%d calls)", n)
	}
	p, err := suite.Admin.CoreV1().Pods(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == "volume-agent.io/VolumesReady" && c.Status == corev1.ConditionTrue {
			t.Errorf("the pod's volumes are reported ready: %+v", c)
		}
	}
	if ms := mounttest.MountsUnder(t, e2eutil.PodDir(e.root, string(pod.UID))); len(ms) != 0 {
		t.Errorf("mounts under the pod's directory in the agent's namespace: %+v", ms)
	}
}
