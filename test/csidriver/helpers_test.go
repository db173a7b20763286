package csidriver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

var (
	loopOnce   sync.Once
	loopReason string // why loop devices cannot be used; "" if they can
)

// requireLoopDevices skips the test unless it runs as root on a machine
// where loop devices, mount(2) and mkfs.ext4 work.
func requireLoopDevices(t *testing.T) {
	t.Helper()
	mounttest.RequireRoot(t) // for loop devices and mount(2)
	loopOnce.Do(func() {
		for _, tool := range []string{"losetup", "blkid", "mkfs.ext4", "resize2fs", "e2fsck", "dumpe2fs"} {
			if _, err := exec.LookPath(tool); err != nil {
				loopReason = tool + " is not installed"
				return
			}
		}
		if _, err := os.Stat("/dev/loop-control"); err != nil {
			loopReason = "no /dev/loop-control: " + err.Error()
			return
		}
		dir, err := os.MkdirTemp("", "csidrv-probe-")
		if err != nil {
			loopReason = err.Error()
			return
		}
		defer os.RemoveAll(dir)
		file := filepath.Join(dir, "probe.img")
		if err := createBackingFile(file, 1<<20); err != nil {
			loopReason = err.Error()
			return
		}
		dev, err := attachLoop(file)
		if err != nil {
			loopReason = "cannot attach a loop device: " + err.Error()
			return
		}
		if err := detachLoop(dev, file); err != nil {
			loopReason = "cannot detach a loop device: " + err.Error()
		}
	})
	if loopReason != "" {
		t.Skip("skipping: " + loopReason)
	}
}

func haveXFS() bool {
	for _, tool := range []string{"mkfs.xfs", "xfs_growfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			return false
		}
	}
	return true
}

// newTestDir returns a fresh directory with a short path (unix socket paths
// are limited to 108 bytes, t.TempDir's can be longer). At the end of the
// test everything the driver may have left in it is torn down: mounts
// unmounted, loop devices detached, files removed.
func newTestDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csidrv-")
	if err != nil {
		t.Fatal(err)
	}
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mounts, loops := leftovers(dir)
		for _, m := range mounts {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				t.Errorf("cleanup: unmount %s: %v", m, err)
			}
		}
		for dev, file := range loops {
			if err := detachLoop(dev, file); err != nil {
				t.Errorf("cleanup: detach %s: %v", dev, err)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return dir
}

// leftovers lists mounts under dir (deepest first) and loop devices whose
// backing file is under dir.
func leftovers(dir string) (mounts []string, loops map[string]string) {
	all, _ := listMounts()
	for _, m := range all {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			mounts = append(mounts, m.MountPoint)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	loops = map[string]string{}
	entries, _ := filepath.Glob("/sys/block/loop*")
	for _, e := range entries {
		dev := "/dev/" + filepath.Base(e)
		if f := loopBackingFile(dev); strings.HasPrefix(f, dir+"/") {
			loops[dev] = f
		}
	}
	return mounts, loops
}

// expectClean fails the test if anything under dir is still mounted or
// attached to a loop device. It cross-checks sysfs with `losetup -a`.
func expectClean(t *testing.T, dir string) {
	t.Helper()
	mounts, loops := leftovers(dir)
	if len(mounts) > 0 {
		t.Errorf("mounts left under %s: %v", dir, mounts)
	}
	if len(loops) > 0 {
		t.Errorf("loop devices left for files under %s: %v", dir, loops)
	}
	if out, err := exec.Command("losetup", "-a").CombinedOutput(); err == nil && strings.Contains(string(out), dir+"/") {
		t.Errorf("losetup -a still lists files under %s:\n%s", dir, out)
	}
}

// testLogger logs to the test at warn level, or everything with -v.
func testLogger(t *testing.T) *zap.Logger {
	level := zap.WarnLevel
	if testing.Verbose() {
		level = zap.DebugLevel
	}
	return zaptest.NewLogger(t, zaptest.Level(level))
}

// startDriver starts a driver with cfg, filling in the endpoint, state
// directory and logger from dir when unset, and connects to it. The driver
// is stopped at the end of the test.
func startDriver(t *testing.T, dir string, cfg Config) (*Driver, *grpc.ClientConn) {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "unix://" + filepath.Join(dir, "csi.sock")
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(dir, "state")
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "node-1"
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d, dial(t, d.Endpoint())
}

func dial(t *testing.T, endpoint string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func expectCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("got %v (%v), want %v", got, err, want)
	}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mountCap(fsType string, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	}
}

var rwo = mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func createVolume(t *testing.T, conn *grpc.ClientConn, name string, size int64) *csi.Volume {
	t.Helper()
	resp, err := csi.NewControllerClient(conn).CreateVolume(testCtx(t), &csi.CreateVolumeRequest{
		Name:               name,
		VolumeCapabilities: []*csi.VolumeCapability{rwo},
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
	})
	mustOK(t, err)
	return resp.GetVolume()
}

// waitScheduledExits waits until every exit crash-after scheduled has
// happened, so a test can check that no other exit is coming without
// sleeping.
func (d *Driver) waitScheduledExits() { d.faults.exits.Wait() }
