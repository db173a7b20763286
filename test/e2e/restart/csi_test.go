package restart_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	csiplugin "github.com/volume-agent/volume-agent/operations/plugins/csi"
	"github.com/volume-agent/volume-agent/test/csidriver"
)

// csiDriver is the test CSI driver running as a process of one test.
type csiDriver struct {
	t        *testing.T
	name     string
	endpoint string
	stateDir string
	control  *csidriver.ControlClient
	proc     *proc
}

// startCSIDriver starts the test CSI driver for the env's node. Its loop
// devices are detached when the test ends, after the agent and the driver
// have stopped and the root is unmounted; so it must be called before the
// env's agent is created.
func (e *clusterEnv) startCSIDriver(name string, extra ...string) *csiDriver {
	e.t.Helper()
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		e.t.Skip("the test CSI driver needs mkfs.ext4")
	}
	// Unix socket paths are short: not under t.TempDir.
	sockDir, err := os.MkdirTemp("", "rcsi-")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { os.RemoveAll(sockDir) })
	stateDir := mounttest.Real(e.t.TempDir())
	// Cleanups run last-registered first: this one after the driver's.
	e.t.Cleanup(func() { detachLoopsUnder(e.t, stateDir) })
	d := &csiDriver{
		t: e.t, name: name, endpoint: "unix://" + filepath.Join(sockDir, "csi.sock"), stateDir: stateDir,
		control: csidriver.NewControlClient(filepath.Join(sockDir, "control.sock")),
	}
	args := append([]string{
		"--endpoint=" + d.endpoint, "--name=" + name, "--node-id=" + e.node, "--state-dir=" + stateDir,
		"--control-socket=" + filepath.Join(sockDir, "control.sock"), "--log-level=debug",
	}, extra...)
	if d.proc, err = startProc("test-csi-driver", filepath.Join(e.t.TempDir(), "csi-driver.log"), bins.driver, args...); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if err := d.proc.term(15 * time.Second); err != nil {
			e.t.Errorf("stopping the CSI driver: %v", err)
		}
		if e.t.Failed() {
			e.t.Logf("--- last lines of the CSI driver's log ---\n%s", tail(d.proc.logPath, 40))
		}
	})
	eventually(e.t, 20*time.Second, "the CSI driver's control socket", func() error {
		if d.proc.exited() {
			e.t.Fatalf("the CSI driver exited: %v\n%s", d.proc.err, tail(d.proc.logPath, 20))
		}
		_, err := d.control.CallCounts()
		return err
	})
	return d
}

// createVolume creates a volume through the driver's controller service,
// as an external provisioner would, and returns its handle.
func (d *csiDriver) createVolume(name string) string {
	d.t.Helper()
	conn, err := grpc.NewClient(d.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		d.t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(d.t.Context(), 30*time.Second)
	defer cancel()
	resp, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:          name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		d.t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

func (d *csiDriver) calls() map[string]int {
	d.t.Helper()
	c, err := d.control.CallCounts()
	if err != nil {
		d.t.Fatalf("driver call counts: %v", err)
	}
	return c
}

func (d *csiDriver) volume(id string) csidriver.VolumeInfo {
	d.t.Helper()
	vols, err := d.control.Volumes()
	if err != nil {
		d.t.Fatal(err)
	}
	for _, v := range vols {
		if v.ID == id {
			return v
		}
	}
	d.t.Fatalf("the driver has no volume %s", id)
	return csidriver.VolumeInfo{}
}

// csiObjects creates the CSIDriver object, a PV for handle pre-bound to the
// claim, and the claim, and waits until they are bound. It returns the PV's
// name.
func (e *clusterEnv) csiObjects(d *csiDriver, attachRequired bool, handle, claim string) string {
	e.t.Helper()
	ctx := e.t.Context()
	admin := e.cp.admin
	_, err := admin.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: d.name},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:       &attachRequired,
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create CSIDriver: %v", err)
	}
	pvName := e.ns + "-" + claim
	_, err = admin.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              storageClass,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: d.name, VolumeHandle: handle, FSType: "ext4",
			}},
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: e.ns, Name: claim},
		},
	}, metav1.CreateOptions{})
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
func (e *clusterEnv) checkCSIReleased(d *csiDriver, handle string) {
	e.t.Helper()
	staging := globalMount(e.root, csiPlugin, d.name+"^"+handle)
	eventually(e.t, time.Minute, "the CSI volume released", func() error {
		if ms := mounttest.MountsUnder(e.t, e.root); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mountPoints(ms))
		}
		if exists(e.t, filepath.Dir(staging)) {
			return fmt.Errorf("%s still exists", filepath.Dir(staging))
		}
		v := d.volume(handle)
		if v.LoopDevice != "" || v.StagingPath != "" || len(v.TargetPaths) > 0 {
			return fmt.Errorf("the driver still has it: %+v", v)
		}
		if loops := loopsUnder(e.t, d.stateDir); len(loops) > 0 {
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
			handle := d.createVolume("vol")
			e.csiObjects(d, tc.self, handle, "data")
			a := e.newAgent(append(agentArgs, "--csi-driver="+d.name+"="+d.endpoint)...)
			pod := e.createPod(e.pod("app", claimVolume("data", "data"), memoryVolume("mem")))
			a.start()
			a.waitSettled(2 * time.Minute)

			staging := globalMount(e.root, csiPlugin, d.name+"^"+handle)
			target := volumeDir(e.root, string(pod.UID), csiPlugin, e.ns+"-data")
			for _, p := range []string{staging, target} {
				if ms := mounttest.MountsAt(t, p); len(ms) != 1 || ms[0].FSType != "ext4" {
					t.Fatalf("%s: %+v, want one ext4 mount", p, ms)
				}
			}
			mounttest.WriteFile(t, filepath.Join(target, "data"), "csi data")
			vaName := csiplugin.AttachmentName(handle, d.name, e.node)
			vas := e.cp.admin.StorageV1().VolumeAttachments()
			if tc.self {
				va, err := vas.Get(t.Context(), vaName, metav1.GetOptions{})
				if err != nil || !va.Status.Attached || va.Spec.NodeName != e.node {
					t.Fatalf("VolumeAttachment %s: %+v, %v", vaName, va, err)
				}
				if v := d.volume(handle); len(v.AttachedNodes) != 1 {
					t.Fatalf("the driver's attachments: %v", v.AttachedNodes)
				}
			}

			a.stop()
			e.deletePod("app")
			if err := d.control.ResetCallCounts(); err != nil {
				t.Fatal(err)
			}
			a.start()
			e.checkCSIReleased(d, handle)
			a.waitSettled(time.Minute)
			calls := d.calls()
			if calls["NodeUnpublishVolume"] != 1 || calls["NodeUnstageVolume"] != 1 || calls["NodePublishVolume"] != 0 || calls["NodeStageVolume"] != 0 {
				t.Errorf("driver calls after the restart: %v", calls)
			}
			if tc.self {
				if calls["ControllerUnpublishVolume"] != 1 || calls["ControllerPublishVolume"] != 0 {
					t.Errorf("driver calls after the restart: %v", calls)
				}
				eventually(t, 30*time.Second, "VolumeAttachment "+vaName+" deleted", func() error {
					_, err := vas.Get(t.Context(), vaName, metav1.GetOptions{})
					if apierrors.IsNotFound(err) {
						return nil
					}
					return fmt.Errorf("still there (%v)", err)
				})
				if v := d.volume(handle); len(v.AttachedNodes) != 0 {
					t.Errorf("the driver's attachments: %v", v.AttachedNodes)
				}
			}
			if dirs := podDirs(t, e.root); len(dirs) != 0 {
				t.Errorf("pod directories left: %v", dirs)
			}
			wantOps := map[string]map[string]float64{
				"unmount_volume": {csiPlugin: 1, emptyDirPlugin: 1},
				"unmount_device": {csiPlugin: 1},
			}
			if tc.self {
				wantOps["detach_volume"] = map[string]float64{csiPlugin: 1}
			}
			a.checkOps("after the restart", wantOps)
			checkVolumeData(t, d, handle, "data", "csi data")

			// Nothing was left that a later start would find and not
			// account for.
			a.stop()
			a.start()
			a.waitSettled(time.Minute)
			if n, err := a.metric("volume_agent_reconstructed_pod_volumes_total"); err != nil || n != 0 {
				t.Errorf("a later start found %v pod volumes (%v)", n, err)
			}
			a.checkOps("after another restart", nil)
		})
	}
}

// checkVolumeData mounts a released volume's backing file read-only and
// reads a file: unpublishing and unstaging deleted nothing.
func checkVolumeData(t *testing.T, d *csiDriver, handle, file, want string) {
	t.Helper()
	backing := d.volume(handle).BackingFile
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
	handle := d.createVolume("vol")
	e.csiObjects(d, false, handle, "data")
	a := e.newAgent("--csi-driver=" + d.name + "=" + d.endpoint)
	pod := e.createPod(e.pod("app", claimVolume("data", "data")))
	a.start()
	a.waitSettled(2 * time.Minute)
	staging := globalMount(e.root, csiPlugin, d.name+"^"+handle)
	target := volumeDir(e.root, string(pod.UID), csiPlugin, e.ns+"-data")
	if len(mounttest.MountsAt(t, staging)) != 1 || len(mounttest.MountsAt(t, target)) != 1 {
		t.Fatalf("mounts: %v", mountPoints(mounttest.MountsUnder(t, e.root)))
	}
	mounttest.WriteFile(t, filepath.Join(target, "data"), "csi data")

	if err := d.control.SetHang("NodeUnstageVolume", true); err != nil {
		t.Fatal(err)
	}
	e.deletePod("app")
	eventually(t, time.Minute, "NodeUnpublishVolume done and NodeUnstageVolume hanging", func() error {
		calls := d.calls()
		if calls["NodeUnpublishVolume"] < 1 || calls["NodeUnstageVolume"] < 1 {
			return fmt.Errorf("calls %v", calls)
		}
		if len(mounttest.MountsAt(t, target)) > 0 {
			return errors.New("the publish mount is still there")
		}
		return nil
	})
	a.kill9()
	if err := d.control.SetHang("NodeUnstageVolume", false); err != nil {
		t.Fatal(err)
	}
	// What the kubelet would leak.
	if ms := mounttest.MountsUnder(t, e.root); len(ms) != 1 || ms[0].MountPoint != staging {
		t.Fatalf("after the kill: mounts %v, want only the staging mount", mountPoints(ms))
	}
	if v := d.volume(handle); v.StagingPath == "" || v.LoopDevice == "" {
		t.Fatalf("after the kill the driver has %+v, want it staged", v)
	}
	if err := d.control.ResetCallCounts(); err != nil {
		t.Fatal(err)
	}

	a.start()
	e.checkCSIReleased(d, handle)
	a.waitSettled(time.Minute)
	calls := d.calls()
	if calls["NodeUnstageVolume"] != 1 || calls["NodeUnpublishVolume"] != 0 || calls["NodeStageVolume"] != 0 || calls["NodePublishVolume"] != 0 {
		t.Errorf("driver calls after the restart: %v", calls)
	}
	a.checkOps("after the restart", map[string]map[string]float64{"unmount_device": {csiPlugin: 1}})
	if dirs := podDirs(t, e.root); len(dirs) != 0 {
		t.Errorf("pod directories left: %v", dirs)
	}
	checkVolumeData(t, d, handle, "data", "csi data")
	if strings.Contains(tail(a.proc.logPath, 1000), "left on disk") {
		t.Errorf("the agent reported something it could not clean:\n%s", tail(a.proc.logPath, 40))
	}
}
