package restart_test

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/test/csidriver"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// startCSIDriver starts the test CSI driver for the env's node. Its loop
// devices are detached when the test ends, after the agent and the driver
// have stopped; so it must be called before the env's agent is created.
func (e *clusterEnv) startCSIDriver(name string, extra ...string) *e2eutil.CSIDriver {
	e.t.Helper()
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		e.t.Skip("the test CSI driver needs mkfs.ext4")
	}
	return e2eutil.StartCSIDriver(e.t, e2eutil.CSIDriverOptions{
		Binary: bins.CSIDriverBin, Name: name, NodeID: e.node,
		Args: append([]string{"--log-level=debug"}, extra...),
	})
}

// csiVolume returns what the driver knows of a volume, failing the test if
// it knows nothing.
func csiVolume(t *testing.T, d *e2eutil.CSIDriver, id string) csidriver.VolumeInfo {
	t.Helper()
	v, ok := d.Volume(t, id)
	if !ok {
		t.Fatalf("the driver has no volume %s", id)
	}
	return v
}

// csiObjects creates the CSIDriver object, a PV for handle pre-bound to the
// claim, and the claim, and waits until they are bound. It returns the PV's
// name.
func (e *clusterEnv) csiObjects(d *e2eutil.CSIDriver, attachRequired bool, handle, claim string) string {
	e.t.Helper()
	ctx := e.t.Context()
	e.cp.CreateCSIDriver(e.t, d.Name(), storagev1.CSIDriverSpec{
		AttachRequired:       &attachRequired,
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
	})
	pvName := e.ns + "-" + claim
	_, err := e.cp.Admin.CoreV1().PersistentVolumes().Create(ctx, e2eutil.PreBoundPV(pvName, "32Mi", storageClass, e.ns, claim,
		corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: d.Name(), VolumeHandle: handle, FSType: "ext4"}}),
		metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create PV: %v", err)
	}
	e.createClaim(claim, "32Mi")
	e.waitBound(claim, pvName)
	return pvName
}

// checkCSIReleased waits until nothing of the volume is left on the node:
// no mount under the root, no staging directory, no loop device, nothing
// staged or published in the driver's records.
func (e *clusterEnv) checkCSIReleased(d *e2eutil.CSIDriver, handle string) {
	e.t.Helper()
	staging := e2eutil.GlobalMount(e.root, e2eutil.CSIPlugin, d.Name()+"^"+handle)
	e2eutil.PollErr(e.t, time.Minute, "the CSI volume released", func() error {
		if ms := mounttest.MountsUnder(e.t, e.root); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mounttest.MountPoints(ms))
		}
		if mounttest.Exists(e.t, filepath.Dir(staging)) {
			return fmt.Errorf("%s still exists", filepath.Dir(staging))
		}
		v := csiVolume(e.t, d, handle)
		if v.LoopDevice != "" || v.StagingPath != "" || len(v.TargetPaths) > 0 {
			return fmt.Errorf("the driver still has it: %+v", v)
		}
		if loops := mounttest.LoopDevicesUnder(e.t, d.StateDir()); len(loops) > 0 {
			return fmt.Errorf("loop devices still attached: %v", loops)
		}
		return nil
	})
}

// A pod with a CSI volume (staged, published, ext4 on a loop device) is
// deleted while the agent is down. After its start the agent unpublishes
// and unstages the volume from the state files it wrote before mounting
// (the pod, its claim and PV are of no help), the loop device is released,
// and in self-attach mode the VolumeAttachment the agent created is
// deleted after unstaging (with ControllerUnpublishVolume).
func TestCSIPodDeletedWhileDown(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	cp := sharedControlPlane(t)
	for _, tc := range []struct {
		name string
		self bool
	}{
		{"no attach", false},
		{"self-attach", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := "csi-deleted"
			if tc.self {
				ns += "-self"
			}
			e := newClusterEnv(t, cp, ns)
			var driverArgs, agentArgs []string
			if tc.self {
				driverArgs, agentArgs = []string{"--attach-required"}, []string{"--attach-mode=self"}
			}
			d := e.startCSIDriver(e.ns+".csi.example.com", driverArgs...)
			handle := d.CreateVolume("vol", 32<<20, "ext4")
			e.csiObjects(d, tc.self, handle, "data")
			a := e.newAgent(append(agentArgs, "--csi-driver="+d.Name()+"="+d.Endpoint())...)
			pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", "data"), e2eutil.MemoryVolume("mem")))
			a.Start()
			a.waitSettled(2 * time.Minute)

			staging := e2eutil.GlobalMount(e.root, e2eutil.CSIPlugin, d.Name()+"^"+handle)
			target := e2eutil.VolumeDir(e.root, string(pod.UID), e2eutil.CSIPlugin, e.ns+"-data")
			for _, p := range []string{staging, target} {
				if ms := mounttest.MountsAt(t, p); len(ms) != 1 || ms[0].FSType != "ext4" {
					t.Fatalf("%s: %+v, want one ext4 mount", p, ms)
				}
			}
			mounttest.WriteFile(t, filepath.Join(target, "data"), "csi data")
			vaName := csiplugin.AttachmentName(handle, d.Name(), e.node)
			vas := e.cp.Admin.StorageV1().VolumeAttachments()
			if tc.self {
				va, err := vas.Get(t.Context(), vaName, metav1.GetOptions{})
				if err != nil || !va.Status.Attached || va.Spec.NodeName != e.node {
					t.Fatalf("VolumeAttachment %s: %+v, %v", vaName, va, err)
				}
				if v := csiVolume(t, d, handle); len(v.AttachedNodes) != 1 {
					t.Fatalf("the driver's attachments: %v", v.AttachedNodes)
				}
			}

			a.stop()
			e.deletePod("app")
			if err := d.Control.ResetCallCounts(); err != nil {
				t.Fatal(err)
			}
			a.Start()
			e.checkCSIReleased(d, handle)
			a.waitSettled(time.Minute)
			calls := d.CallCounts(t)
			if calls["NodeUnpublishVolume"] != 1 || calls["NodeUnstageVolume"] != 1 || calls["NodePublishVolume"] != 0 || calls["NodeStageVolume"] != 0 {
				t.Errorf("driver calls after the restart: %v", calls)
			}
			if tc.self {
				if calls["ControllerUnpublishVolume"] != 1 || calls["ControllerPublishVolume"] != 0 {
					t.Errorf("driver calls after the restart: %v", calls)
				}
				e2eutil.PollErr(t, 30*time.Second, "VolumeAttachment "+vaName+" deleted", func() error {
					_, err := vas.Get(t.Context(), vaName, metav1.GetOptions{})
					if apierrors.IsNotFound(err) {
						return nil
					}
					return fmt.Errorf("still there (%v)", err)
				})
				if v := csiVolume(t, d, handle); len(v.AttachedNodes) != 0 {
					t.Errorf("the driver's attachments: %v", v.AttachedNodes)
				}
			}
			if dirs := podDirs(t, e.root); len(dirs) != 0 {
				t.Errorf("pod directories left: %v", dirs)
			}
			wantOps := map[string]map[string]float64{
				"unmount_volume": {e2eutil.CSIPlugin: 1, e2eutil.EmptyDirPlugin: 1},
				"unmount_device": {e2eutil.CSIPlugin: 1},
			}
			if tc.self {
				wantOps["detach_volume"] = map[string]float64{e2eutil.CSIPlugin: 1}
			}
			a.checkOps("after the restart", wantOps)
			checkVolumeData(t, d, handle, "data", "csi data")

			// Nothing was left that a later start would find and not
			// account for.
			a.stop()
			a.Start()
			a.waitSettled(time.Minute)
			if n, err := a.Metric("volume_agent_reconstructed_pod_volumes_total"); err != nil || n != 0 {
				t.Errorf("a later start found %v pod volumes (%v)", n, err)
			}
			a.checkOps("after another restart", nil)
		})
	}
}

// checkVolumeData mounts a released volume's backing file read-only and
// reads a file: unpublishing and unstaging deleted nothing.
func checkVolumeData(t *testing.T, d *e2eutil.CSIDriver, handle, file, want string) {
	t.Helper()
	backing := csiVolume(t, d, handle).BackingFile
	dir := mkdirAll(t, filepath.Join(t.TempDir(), "probe"))
	if out, err := exec.Command("mount", "-o", "loop,ro", backing, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v: %s", backing, err, out)
	}
	defer func() {
		if out, err := exec.Command("umount", "-d", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	}()
	if got := mounttest.ReadFile(t, filepath.Join(dir, file)); got != want {
		t.Errorf("%s on the volume: %q, want %q", file, got, want)
	}
}

// The kubelet's known leak: killed after NodeUnpublishVolume and before (or
// during) NodeUnstageVolume, it forgets the staged volume. The agent is
// killed with SIGKILL while NodeUnstageVolume hangs in the driver; the
// staging mount is then left with no pod using it. After its start, the
// agent finds the staging mount from its state file and unstages it.
func TestCSIKillBetweenUnpublishAndUnstage(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	cp := sharedControlPlane(t)
	e := newClusterEnv(t, cp, "csi-unstage")
	d := e.startCSIDriver(e.ns + ".csi.example.com")
	handle := d.CreateVolume("vol", 32<<20, "ext4")
	e.csiObjects(d, false, handle, "data")
	a := e.newAgent("--csi-driver=" + d.Name() + "=" + d.Endpoint())
	pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", "data")))
	a.Start()
	a.waitSettled(2 * time.Minute)
	staging := e2eutil.GlobalMount(e.root, e2eutil.CSIPlugin, d.Name()+"^"+handle)
	target := e2eutil.VolumeDir(e.root, string(pod.UID), e2eutil.CSIPlugin, e.ns+"-data")
	if len(mounttest.MountsAt(t, staging)) != 1 || len(mounttest.MountsAt(t, target)) != 1 {
		t.Fatalf("mounts: %v", mounttest.MountPoints(mounttest.MountsUnder(t, e.root)))
	}
	mounttest.WriteFile(t, filepath.Join(target, "data"), "csi data")

	if err := d.Control.SetHang("NodeUnstageVolume", true); err != nil {
		t.Fatal(err)
	}
	e.deletePod("app")
	e2eutil.PollErr(t, time.Minute, "NodeUnpublishVolume done and NodeUnstageVolume hanging", func() error {
		calls := d.CallCounts(t)
		if calls["NodeUnpublishVolume"] < 1 || calls["NodeUnstageVolume"] < 1 {
			return fmt.Errorf("calls %v", calls)
		}
		if len(mounttest.MountsAt(t, target)) > 0 {
			return errors.New("the publish mount is still there")
		}
		if n, err := d.Control.HungCalls("NodeUnstageVolume"); err != nil || n == 0 {
			return fmt.Errorf("NodeUnstageVolume not hanging yet (%v)", err)
		}
		return nil
	})
	a.Kill()
	// The hung call ends with the agent's connection; releasing the hang
	// before the driver has seen that would let the unstage complete.
	e2eutil.PollErr(t, time.Minute, "the hung NodeUnstageVolume to end with the agent", func() error {
		n, err := d.Control.HungCalls("NodeUnstageVolume")
		if err == nil && n > 0 {
			err = fmt.Errorf("%d calls still hung", n)
		}
		return err
	})
	if err := d.Control.SetHang("NodeUnstageVolume", false); err != nil {
		t.Fatal(err)
	}
	// What the kubelet would leak.
	if ms := mounttest.MountsUnder(t, e.root); len(ms) != 1 || ms[0].MountPoint != staging {
		t.Fatalf("after the kill: mounts %v, want only the staging mount", mounttest.MountPoints(ms))
	}
	if v := csiVolume(t, d, handle); v.StagingPath == "" || v.LoopDevice == "" {
		t.Fatalf("after the kill the driver has %+v, want it staged", v)
	}
	if err := d.Control.ResetCallCounts(); err != nil {
		t.Fatal(err)
	}

	a.Start()
	e.checkCSIReleased(d, handle)
	a.waitSettled(time.Minute)
	calls := d.CallCounts(t)
	if calls["NodeUnstageVolume"] != 1 || calls["NodeUnpublishVolume"] != 0 || calls["NodeStageVolume"] != 0 || calls["NodePublishVolume"] != 0 {
		t.Errorf("driver calls after the restart: %v", calls)
	}
	a.checkOps("after the restart", map[string]map[string]float64{"unmount_device": {e2eutil.CSIPlugin: 1}})
	if dirs := podDirs(t, e.root); len(dirs) != 0 {
		t.Errorf("pod directories left: %v", dirs)
	}
	checkVolumeData(t, d, handle, "data", "csi data")
	if strings.Contains(a.Process().Tail(1000), "left on disk") {
		t.Errorf("the agent reported something it could not clean:\n%s", a.Process().Tail(40))
	}
}
