package csidriver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/volume-agent/volume-agent/csi/csiclient"
)

// nodeEnv is a started driver with clients and paths for one volume.
type nodeEnv struct {
	t       *testing.T
	dir     string
	d       *Driver
	conn    *grpc.ClientConn
	ctrl    csi.ControllerClient
	node    csi.NodeClient
	staging string
	target  string
}

// newNodeEnv starts a driver in a new test directory; a relative
// cfg.ControlSocket is taken relative to it.
func newNodeEnv(t *testing.T, cfg Config) *nodeEnv {
	requireLoopDevices(t)
	dir := newTestDir(t)
	if cfg.ControlSocket != "" && !filepath.IsAbs(cfg.ControlSocket) {
		cfg.ControlSocket = filepath.Join(dir, cfg.ControlSocket)
	}
	d, conn := startDriver(t, dir, cfg)
	e := &nodeEnv{t: t, dir: dir}
	e.attach(d, conn)
	e.staging = filepath.Join(dir, "staging")
	e.target = filepath.Join(dir, "pods", "pod-1", "volume")
	if err := os.Mkdir(e.staging, 0o750); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *nodeEnv) attach(d *Driver, conn *grpc.ClientConn) {
	e.d, e.conn, e.ctrl, e.node = d, conn, csi.NewControllerClient(conn), csi.NewNodeClient(conn)
}

func (e *nodeEnv) stage(id string, c *csi.VolumeCapability) error {
	_, err := e.node.NodeStageVolume(testCtx(e.t), &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: e.staging, VolumeCapability: c,
	})
	return err
}

func (e *nodeEnv) unstage(id string) error {
	_, err := e.node.NodeUnstageVolume(testCtx(e.t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: e.staging})
	return err
}

func (e *nodeEnv) publish(id, target string, c *csi.VolumeCapability, readOnly bool, volCtx map[string]string) error {
	staging := e.staging
	if e.d.cfg.DisableStaging {
		staging = ""
	}
	_, err := e.node.NodePublishVolume(testCtx(e.t), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c,
		Readonly: readOnly, VolumeContext: volCtx,
	})
	return err
}

func (e *nodeEnv) unpublish(id, target string) error {
	_, err := e.node.NodeUnpublishVolume(testCtx(e.t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	return err
}

func (e *nodeEnv) expand(id, path string, bytes int64) (int64, error) {
	resp, err := e.node.NodeExpandVolume(testCtx(e.t), &csi.NodeExpandVolumeRequest{
		VolumeId: id, VolumePath: path, CapacityRange: &csi.CapacityRange{RequiredBytes: bytes},
	})
	return resp.GetCapacityBytes(), err
}

func (e *nodeEnv) controllerExpand(id string, bytes int64) {
	e.t.Helper()
	resp, err := e.ctrl.ControllerExpandVolume(testCtx(e.t), &csi.ControllerExpandVolumeRequest{
		VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: bytes},
	})
	mustOK(e.t, err)
	if resp.GetCapacityBytes() != bytes || !resp.GetNodeExpansionRequired() {
		e.t.Fatalf("ControllerExpandVolume = %v", resp)
	}
}

func (e *nodeEnv) stats(id, path string) *csi.NodeGetVolumeStatsResponse {
	e.t.Helper()
	resp, err := e.node.NodeGetVolumeStats(testCtx(e.t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: path})
	mustOK(e.t, err)
	return resp
}

func (e *nodeEnv) deleteVolume(id string) {
	e.t.Helper()
	_, err := e.ctrl.DeleteVolume(testCtx(e.t), &csi.DeleteVolumeRequest{VolumeId: id})
	mustOK(e.t, err)
}

func (e *nodeEnv) info(id string) VolumeInfo {
	e.t.Helper()
	info, ok := e.d.Volume(id)
	if !ok {
		e.t.Fatalf("volume %s unknown", id)
	}
	return info
}

func expectMounted(t *testing.T, path string, want bool) {
	t.Helper()
	got, err := isMounted(path)
	mustOK(t, err)
	if got != want {
		t.Fatalf("mounted(%s) = %v, want %v", path, got, want)
	}
}

func TestStagePublishIdempotent(t *testing.T) {
	e := newNodeEnv(t, Config{AttachRequired: true})
	id := createVolume(t, e.conn, "idem", 64<<20).GetVolumeId()

	// Not attached to this node yet.
	expectCode(t, e.stage(id, rwo), codes.FailedPrecondition)
	resp, err := e.ctrl.ControllerPublishVolume(testCtx(t), &csi.ControllerPublishVolumeRequest{
		VolumeId: id, NodeId: "node-1", VolumeCapability: rwo,
	})
	mustOK(t, err)
	if resp.GetPublishContext()[PublishContextAttachedTo] != "node-1" {
		t.Errorf("publish context = %v", resp.GetPublishContext())
	}

	for range 3 {
		mustOK(t, e.stage(id, rwo))
	}
	info := e.info(id)
	if info.LoopDevice == "" || info.StagingPath != e.staging {
		t.Fatalf("after staging: %+v", info)
	}
	if fs, _ := detectFS(info.LoopDevice); fs != "ext4" {
		t.Errorf("filesystem %q, want ext4", fs)
	}
	expectMounted(t, e.staging, true)
	// Staging elsewhere or differently is refused.
	expectCode(t, e.stage(id, blockCap()), codes.AlreadyExists)
	expectCode(t, e.stage(id, mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)), codes.AlreadyExists)

	for range 3 {
		mustOK(t, e.publish(id, e.target, rwo, false, nil))
	}
	expectMounted(t, e.target, true)
	data := []byte("hello from the pod")
	mustOK(t, os.WriteFile(filepath.Join(e.target, "file"), data, 0o644))
	// The same volume read-only at a second target sees the data but
	// cannot write.
	roTarget := filepath.Join(e.dir, "pods", "pod-2", "volume")
	mustOK(t, e.publish(id, roTarget, rwo, true, nil))
	if got, err := os.ReadFile(filepath.Join(roTarget, "file")); err != nil || !bytes.Equal(got, data) {
		t.Errorf("read through read-only target: %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(roTarget, "other"), data, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write to read-only target: %v, want EROFS", err)
	}
	expectCode(t, e.publish(id, roTarget, rwo, false, nil), codes.AlreadyExists)
	// Still published: cannot unstage or delete.
	expectCode(t, e.unstage(id), codes.FailedPrecondition)
	_, err = e.ctrl.DeleteVolume(testCtx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	expectCode(t, err, codes.FailedPrecondition)

	// Real statfs numbers for the 64 MiB filesystem.
	st := e.stats(id, e.target)
	if len(st.Usage) != 2 {
		t.Fatalf("stats = %v", st)
	}
	bytesUsage, inodes := st.Usage[0], st.Usage[1]
	if bytesUsage.Unit != csi.VolumeUsage_BYTES || bytesUsage.Total < 40<<20 || bytesUsage.Total > 64<<20 ||
		bytesUsage.Used <= 0 || bytesUsage.Available <= 0 || bytesUsage.Available > bytesUsage.Total {
		t.Errorf("byte usage = %v", bytesUsage)
	}
	if inodes.Unit != csi.VolumeUsage_INODES || inodes.Total <= 0 || inodes.Used <= 0 || inodes.Available <= 0 {
		t.Errorf("inode usage = %v", inodes)
	}
	_, err = e.node.NodeGetVolumeStats(testCtx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: e.dir})
	expectCode(t, err, codes.NotFound)

	for _, target := range []string{e.target, roTarget} {
		for range 3 {
			mustOK(t, e.unpublish(id, target))
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Errorf("target %s not removed: %v", target, err)
		}
	}
	for range 3 {
		mustOK(t, e.unstage(id))
	}
	expectMounted(t, e.staging, false)
	if info := e.info(id); info.LoopDevice != "" || info.StagingPath != "" || len(info.TargetPaths) != 0 {
		t.Errorf("after unstaging: %+v", info)
	}
	expectClean(t, e.dir)

	// Staging again finds the data: the filesystem is never made twice.
	mustOK(t, e.stage(id, rwo))
	if got, err := os.ReadFile(filepath.Join(e.staging, "file")); err != nil || !bytes.Equal(got, data) {
		t.Errorf("after re-staging: %q, %v", got, err)
	}
	mustOK(t, e.unstage(id))
	_, err = e.ctrl.ControllerUnpublishVolume(testCtx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})
	mustOK(t, err)
	e.deleteVolume(id)
	expectClean(t, e.dir)

	counts := e.d.CallCounts()
	if counts["NodeUnstageVolume"] != 5 || counts["NodeStageVolume"] != 7 {
		t.Errorf("call counts %v", counts)
	}
}

func TestNodeErrors(t *testing.T) {
	e := newNodeEnv(t, Config{})
	id := createVolume(t, e.conn, "errors", 0).GetVolumeId()
	expectCode(t, e.stage("no-such-volume", rwo), codes.NotFound)
	expectCode(t, e.stage(id, nil), codes.InvalidArgument)
	expectCode(t, e.stage(id, mountCap("btrfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)), codes.InvalidArgument)
	// Publishing needs the volume staged first.
	expectCode(t, e.publish(id, e.target, rwo, false, nil), codes.FailedPrecondition)
	expectCode(t, e.unstage("no-such-volume"), codes.NotFound)
	// Unpublishing what is not there is fine.
	mustOK(t, e.unpublish(id, e.target))
	mustOK(t, e.unpublish("no-such-volume", e.target))
	mustOK(t, e.unstage(id))
	_, err := e.expand(id, e.staging, 0)
	expectCode(t, err, codes.NotFound)

	// A failed stage leaves no loop device behind.
	badFlags := mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	badFlags.GetMount().MountFlags = []string{"no-such-option"}
	expectCode(t, e.stage(id, badFlags), codes.Internal)
	if info := e.info(id); info.LoopDevice != "" || info.StagingPath != "" {
		t.Errorf("after a failed stage: %+v", info)
	}
	expectClean(t, e.dir)

	// A volume formatted as ext4 is not turned into xfs.
	mustOK(t, e.stage(id, rwo))
	mustOK(t, e.unstage(id))
	expectCode(t, e.stage(id, mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)), codes.FailedPrecondition)
	mustOK(t, e.unstage(id))

	// SINGLE_NODE_SINGLE_WRITER excludes a second publication.
	single := mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)
	mustOK(t, e.stage(id, single))
	mustOK(t, e.publish(id, e.target, single, false, nil))
	expectCode(t, e.publish(id, e.target+"2", single, false, nil), codes.FailedPrecondition)
	mustOK(t, e.unpublish(id, e.target))
	mustOK(t, e.unstage(id))
	e.deleteVolume(id)
	expectClean(t, e.dir)
}

func TestPublishOnlyMountAndBlock(t *testing.T) {
	e := newNodeEnv(t, Config{DisableStaging: true})
	caps, err := e.node.NodeGetCapabilities(testCtx(t), &csi.NodeGetCapabilitiesRequest{})
	mustOK(t, err)
	for _, c := range caps.GetCapabilities() {
		if c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME {
			t.Fatal("publish-only driver advertises staging")
		}
	}
	expectCode(t, e.stage("x", rwo), codes.Unimplemented)

	id := createVolume(t, e.conn, "publish-only", 32<<20).GetVolumeId()
	second := filepath.Join(e.dir, "pods", "pod-2", "volume")
	for range 2 {
		mustOK(t, e.publish(id, e.target, rwo, false, nil))
		mustOK(t, e.publish(id, second, rwo, false, nil))
	}
	mustOK(t, os.WriteFile(filepath.Join(e.target, "f"), []byte("x"), 0o644))
	if _, err := os.Stat(filepath.Join(second, "f")); err != nil {
		t.Errorf("both targets should show the same filesystem: %v", err)
	}
	mustOK(t, e.unpublish(id, e.target))
	if e.info(id).LoopDevice == "" {
		t.Error("loop device detached while still published")
	}
	mustOK(t, e.unpublish(id, second))
	mustOK(t, e.unpublish(id, second))
	if e.info(id).LoopDevice != "" {
		t.Error("loop device still attached after the last unpublish")
	}
	expectClean(t, e.dir)

	// Block: the target is a file with the device bind-mounted on it.
	blockTarget := filepath.Join(e.dir, "pods", "pod-3", "dev")
	for range 2 {
		mustOK(t, e.publish(id, blockTarget, blockCap(), false, nil))
	}
	var st unix.Stat_t
	mustOK(t, unix.Stat(blockTarget, &st))
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		t.Errorf("block target mode %o is not a block device", st.Mode)
	}
	stats := e.stats(id, blockTarget)
	if len(stats.Usage) != 1 || stats.Usage[0].Total != 32<<20 {
		t.Errorf("block stats = %v", stats)
	}
	e.controllerExpand(id, 48<<20)
	size, err := e.expand(id, blockTarget, 48<<20)
	mustOK(t, err)
	if size != 48<<20 {
		t.Errorf("NodeExpandVolume = %d, want %d", size, 48<<20)
	}
	mustOK(t, e.unpublish(id, blockTarget))
	mustOK(t, e.unpublish(id, blockTarget))
	if _, err := os.Stat(blockTarget); !os.IsNotExist(err) {
		t.Errorf("block target not removed: %v", err)
	}
	e.deleteVolume(id)
	expectClean(t, e.dir)
}

func TestEphemeralVolume(t *testing.T) {
	e := newNodeEnv(t, Config{})
	id := "csi-0123456789abcdef0123456789abcdef"
	volCtx := map[string]string{EphemeralContextKey: "true", EphemeralSizeKey: "24Mi"}
	for range 2 {
		mustOK(t, e.publish(id, e.target, rwo, false, volCtx))
	}
	info := e.info(id)
	if !info.Ephemeral || info.CapacityBytes != 24<<20 || info.LoopDevice == "" {
		t.Fatalf("ephemeral volume: %+v", info)
	}
	mustOK(t, os.WriteFile(filepath.Join(e.target, "f"), []byte("x"), 0o644))
	// Ephemeral volumes are not controller volumes.
	list, err := e.ctrl.ListVolumes(testCtx(t), &csi.ListVolumesRequest{})
	mustOK(t, err)
	if len(list.GetEntries()) != 0 {
		t.Errorf("ListVolumes shows the ephemeral volume: %v", list)
	}
	for range 2 {
		mustOK(t, e.unpublish(id, e.target))
	}
	if _, ok := e.d.Volume(id); ok {
		t.Error("ephemeral volume still known after unpublish")
	}
	if _, err := os.Stat(info.BackingFile); !os.IsNotExist(err) {
		t.Errorf("backing file left: %v", err)
	}
	expectCode(t, e.publish(id, e.target, rwo, false, map[string]string{EphemeralContextKey: "true", EphemeralSizeKey: "lots"}), codes.InvalidArgument)
	expectClean(t, e.dir)
}

func TestExpandExt4(t *testing.T) {
	e := newNodeEnv(t, Config{})
	id := createVolume(t, e.conn, "grow-ext4", 64<<20).GetVolumeId()
	mustOK(t, e.stage(id, rwo))
	mustOK(t, e.publish(id, e.target, rwo, false, nil))
	before := e.stats(id, e.target).Usage[0].Total

	// Online: grows the device; the filesystem only if the kernel lets us.
	e.controllerExpand(id, 96<<20)
	size, err := e.expand(id, e.target, 96<<20)
	switch {
	case err == nil:
		if size != 96<<20 {
			t.Errorf("NodeExpandVolume = %d", size)
		}
		if after := e.stats(id, e.target).Usage[0].Total; after <= before {
			t.Errorf("filesystem did not grow: %d -> %d", before, after)
		}
		t.Log("online ext4 resize works here")
	default:
		expectCode(t, err, codes.FailedPrecondition)
		t.Logf("online ext4 resize refused as expected in this sandbox: %v", err)
		// Offline: unstage, stage again and the filesystem has grown.
		mustOK(t, e.unpublish(id, e.target))
		mustOK(t, e.unstage(id))
		mustOK(t, e.stage(id, rwo))
		mustOK(t, e.publish(id, e.target, rwo, false, nil))
		if after := e.stats(id, e.target).Usage[0].Total; after <= before {
			t.Errorf("filesystem did not grow offline: %d -> %d", before, after)
		}
		size, err = e.expand(id, e.target, 96<<20)
		mustOK(t, err)
		if size != 96<<20 {
			t.Errorf("NodeExpandVolume = %d", size)
		}
	}
	// Asking the node for more than the controller provided.
	_, err = e.expand(id, e.target, 1<<30)
	expectCode(t, err, codes.OutOfRange)
	mustOK(t, e.unpublish(id, e.target))
	mustOK(t, e.unstage(id))
	e.deleteVolume(id)
	expectClean(t, e.dir)
}

func TestExpandXFSOnline(t *testing.T) {
	if !haveXFS() {
		t.Skip("skipping: mkfs.xfs/xfs_growfs not installed (Debian package xfsprogs)")
	}
	e := newNodeEnv(t, Config{})
	xfs := mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	id := createVolume(t, e.conn, "grow-xfs", 320<<20).GetVolumeId()
	mustOK(t, e.stage(id, xfs))
	mustOK(t, e.publish(id, e.target, xfs, false, nil))
	if fs, _ := detectFS(e.info(id).LoopDevice); fs != "xfs" {
		t.Fatalf("filesystem %q, want xfs", fs)
	}
	before := e.stats(id, e.target).Usage[0].Total
	e.controllerExpand(id, 400<<20)
	size, err := e.expand(id, e.target, 400<<20)
	mustOK(t, err)
	if size != 400<<20 {
		t.Errorf("NodeExpandVolume = %d", size)
	}
	if after := e.stats(id, e.target).Usage[0].Total; after < before+60<<20 {
		t.Errorf("xfs did not grow online: %d -> %d", before, after)
	}
	mustOK(t, e.unpublish(id, e.target))
	mustOK(t, e.unstage(id))
	e.deleteVolume(id)
	expectClean(t, e.dir)
}

// TestRestart stops a driver with a volume staged and published and starts a
// new one on the same state directory: it must know the volume, treat
// repeated calls as done, and clean up fully.
func TestRestart(t *testing.T) {
	e := newNodeEnv(t, Config{AttachRequired: true})
	id := createVolume(t, e.conn, "restart", 0).GetVolumeId()
	_, err := e.ctrl.ControllerPublishVolume(testCtx(t), &csi.ControllerPublishVolumeRequest{
		VolumeId: id, NodeId: "node-1", VolumeCapability: rwo,
	})
	mustOK(t, err)
	mustOK(t, e.stage(id, rwo))
	mustOK(t, e.publish(id, e.target, rwo, false, nil))
	mustOK(t, os.WriteFile(filepath.Join(e.target, "f"), []byte("kept"), 0o644))
	before := e.info(id)

	e.d.Stop()
	// Stopping leaves the volume in place.
	expectMounted(t, e.staging, true)
	expectMounted(t, e.target, true)

	d2, conn2 := startDriver(t, e.dir, Config{AttachRequired: true})
	e.attach(d2, conn2)
	after := e.info(id)
	if after.LoopDevice != before.LoopDevice || after.StagingPath != before.StagingPath ||
		len(after.TargetPaths) != 1 || len(after.AttachedNodes) != 1 {
		t.Fatalf("state after restart %+v, before %+v", after, before)
	}
	mustOK(t, e.stage(id, rwo))
	mustOK(t, e.publish(id, e.target, rwo, false, nil))
	if got, err := os.ReadFile(filepath.Join(e.target, "f")); err != nil || string(got) != "kept" {
		t.Errorf("data after restart: %q, %v", got, err)
	}
	// Only one mount each: the repeated calls did nothing.
	for _, p := range []string{e.staging, e.target} {
		if ms, _ := mountsAt(p); len(ms) != 1 {
			t.Errorf("%d mounts at %s", len(ms), p)
		}
	}
	mustOK(t, e.unpublish(id, e.target))
	mustOK(t, e.unstage(id))
	_, err = e.ctrl.ControllerUnpublishVolume(testCtx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})
	mustOK(t, err)
	e.deleteVolume(id)
	expectClean(t, e.dir)
}

// TestRestartAfterLostLoopDevice simulates a reboot: the loop device and the
// mounts are gone but the state file says the volume is staged. Staging
// again must redo the work.
func TestRestartAfterLostLoopDevice(t *testing.T) {
	e := newNodeEnv(t, Config{})
	id := createVolume(t, e.conn, "reboot", 0).GetVolumeId()
	mustOK(t, e.stage(id, rwo))
	info := e.info(id)
	e.d.Stop()
	mustOK(t, unmountAll(e.staging))
	mustOK(t, detachLoop(info.LoopDevice, info.BackingFile))

	d2, conn2 := startDriver(t, e.dir, Config{})
	e.attach(d2, conn2)
	if dev := e.info(id).LoopDevice; dev != "" {
		t.Errorf("restarted driver still believes in loop device %s", dev)
	}
	mustOK(t, e.stage(id, rwo))
	expectMounted(t, e.staging, true)
	mustOK(t, e.unstage(id))
	e.deleteVolume(id)
	expectClean(t, e.dir)
}

// With VolumeCondition the driver advertises capability 4 and reports the
// volume's condition as field 2 of NodeGetVolumeStatsResponse, healthy until
// the control API says otherwise; without it, neither.
func TestVolumeCondition(t *testing.T) {
	for _, withCondition := range []bool{true, false} {
		t.Run(fmt.Sprintf("VolumeCondition=%v", withCondition), func(t *testing.T) {
			e := newNodeEnv(t, Config{VolumeCondition: withCondition, ControlSocket: "control.sock"})
			control := NewControlClient(e.d.cfg.ControlSocket)
			id := createVolume(t, e.conn, "cond", 32<<20).GetVolumeId()
			mustOK(t, e.stage(id, rwo))
			mustOK(t, e.publish(id, e.target, rwo, false, nil))
			t.Cleanup(func() {
				mustOK(t, e.unpublish(id, e.target))
				mustOK(t, e.unstage(id))
				e.deleteVolume(id)
			})

			caps, err := e.node.NodeGetCapabilities(testCtx(t), &csi.NodeGetCapabilitiesRequest{})
			mustOK(t, err)
			advertised := false
			for _, c := range caps.GetCapabilities() {
				advertised = advertised || c.GetRpc().GetType() == csiclient.NodeVolumeCondition
			}
			if advertised != withCondition {
				t.Errorf("capability 4 advertised: %v, want %v", advertised, withCondition)
			}

			condition := func() *csiclient.VolumeCondition {
				t.Helper()
				resp := e.stats(id, e.target)
				if len(resp.GetUsage()) != 2 {
					t.Errorf("usage %v: the condition must not replace it", resp.GetUsage())
				}
				c, err := csiclient.StatsVolumeCondition(resp)
				mustOK(t, err)
				return c
			}
			steps := []struct {
				abnormal bool
				message  string
				want     *csiclient.VolumeCondition
			}{
				{want: &csiclient.VolumeCondition{Message: "volume is healthy"}},
				{abnormal: true, message: "I/O errors on the loop device", want: &csiclient.VolumeCondition{Abnormal: true, Message: "I/O errors on the loop device"}},
				{want: &csiclient.VolumeCondition{Message: "volume is healthy"}},
			}
			for i, s := range steps {
				if i > 0 {
					mustOK(t, control.SetVolumeCondition(id, s.abnormal, s.message))
				}
				got := condition()
				if !withCondition {
					if got != nil {
						t.Errorf("step %d: condition %+v from a driver without VOLUME_CONDITION", i, got)
					}
					continue
				}
				if got == nil || *got != *s.want {
					t.Errorf("step %d: condition %+v, want %+v", i, got, s.want)
				}
			}
			if err := control.SetVolumeCondition("", true, "x"); err == nil {
				t.Error("control API accepted a condition without a volume ID")
			}
		})
	}
}

// Without SINGLE_NODE_MULTI_WRITER the driver does not advertise it (node or
// controller) and refuses the single-node modes that replace
// SINGLE_NODE_WRITER, so a CO that sends them anyway is caught.
func TestWithoutSingleNodeMultiWriter(t *testing.T) {
	e := newNodeEnv(t, Config{DisableSingleNodeMultiWriter: true, AttachRequired: true})
	nc, err := e.node.NodeGetCapabilities(testCtx(t), &csi.NodeGetCapabilitiesRequest{})
	mustOK(t, err)
	for _, c := range nc.GetCapabilities() {
		if c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER {
			t.Errorf("node capabilities list SINGLE_NODE_MULTI_WRITER")
		}
	}
	cc, err := e.ctrl.ControllerGetCapabilities(testCtx(t), &csi.ControllerGetCapabilitiesRequest{})
	mustOK(t, err)
	for _, c := range cc.GetCapabilities() {
		if c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER {
			t.Errorf("controller capabilities list SINGLE_NODE_MULTI_WRITER")
		}
	}
	id := createVolume(t, e.conn, "snw", 0).GetVolumeId()
	for _, mode := range []csi.VolumeCapability_AccessMode_Mode{csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER} {
		_, err := e.ctrl.ControllerPublishVolume(testCtx(t), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: e.d.NodeID(), VolumeCapability: mountCap("", mode)})
		expectCode(t, err, codes.InvalidArgument)
		expectCode(t, e.stage(id, mountCap("", mode)), codes.InvalidArgument)
	}
	_, err = e.ctrl.ControllerPublishVolume(testCtx(t), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: e.d.NodeID(), VolumeCapability: rwo})
	mustOK(t, err)
	mustOK(t, e.stage(id, rwo))
	mustOK(t, e.publish(id, e.target, rwo, false, nil))
	mustOK(t, e.unpublish(id, e.target))
	mustOK(t, e.unstage(id))
	_, err = e.ctrl.ControllerUnpublishVolume(testCtx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: e.d.NodeID()})
	mustOK(t, err)
	e.deleteVolume(id)
	expectClean(t, e.dir)
}
