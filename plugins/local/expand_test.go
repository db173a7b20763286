package local_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/volume"
)

const mib = 1 << 20

// growableLoop attaches a new sparse file of size bytes to a loop device
// and returns the device and the file. The device is detached (after
// unmounting whatever is mounted from it) when the test ends.
func growableLoop(t *testing.T, size int64) (dev, backing string) {
	t.Helper()
	backing = filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", backing).CombinedOutput()
	if err != nil {
		t.Skipf("skipping: cannot attach a loop device (losetup -f --show: %v: %s)", err, strings.TrimSpace(string(out)))
	}
	dev = strings.TrimSpace(string(out))
	t.Cleanup(func() { mounttest.DetachLoop(t, dev) })
	return dev, backing
}

// growLoop grows the backing file and makes the loop device see it, as a
// storage backend growing a disk would.
func growLoop(t *testing.T, dev, backing string, size int64) {
	t.Helper()
	if err := os.Truncate(backing, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "-c", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup -c %s: %v: %s", dev, err, out)
	}
}

// fsBytes is the size statfs reports for the filesystem mounted at path.
func fsBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatalf("statfs %s: %v", path, err)
	}
	return int64(st.Blocks) * st.Bsize
}

// checkGrown checks that a filesystem of before bytes on a device of
// oldDevice bytes grew with its device to size bytes: by at least 85% of
// what the device gained (metadata takes the rest: ext4 gains about 93%,
// xfs all of it), and to no more than the device.
func checkGrown(t *testing.T, path string, before, oldDevice, size int64) {
	t.Helper()
	got := fsBytes(t, path)
	t.Logf("filesystem at %s: %d bytes before, %d bytes now (device %d -> %d bytes)", path, before, got, oldDevice, size)
	if got-before < (size-oldDevice)*85/100 || got > size {
		t.Errorf("filesystem grew from %d to %d bytes, want it to gain about the device's %d bytes", before, got, size-oldDevice)
	}
}

func quantity(bytes int64) *resource.Quantity {
	return resource.NewQuantity(bytes, resource.BinarySI)
}

func (f *fixture) expand(s *volume.Spec, newSize int64) (*resource.Quantity, error) {
	return f.plugin.Expand(context.Background(), &plugins.ExpandRequest{
		VolumeName: volume.SharedName(local.Name, s.PV.Name), Spec: s, DevicePath: s.PV.Spec.Local.Path,
		DeviceMountPath: f.globalPath(s), NewSize: *quantity(newSize), Log: zap.NewNop(),
	})
}

// Offline expansion: the device grew while nothing was mounted; MountDevice
// with a desired size grows the ext4 filesystem before mounting it, keeps the
// data, and reports the size.
func TestMountDeviceGrowsExt4Offline(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	requireTool(t, "resize2fs")
	f := newFixture(t)
	dev, backing := growableLoop(t, 64*mib)
	s := spec("pv-offline", dev, false)
	if err := f.mountDevice(s); err != nil {
		t.Fatalf("first MountDevice (format): %v", err)
	}
	global := f.globalPath(s)
	mounttest.WriteFile(t, filepath.Join(global, "data.txt"), "kept")
	before := fsBytes(t, global)
	if err := f.unmountDevice(s); err != nil {
		t.Fatal(err)
	}

	growLoop(t, dev, backing, 128*mib)
	req := f.deviceRequest(s)
	req.DesiredSize = quantity(128 * mib)
	if err := f.plugin.MountDevice(context.Background(), req); err != nil {
		t.Fatalf("MountDevice with a desired size: %v", err)
	}
	if req.Resized == nil || req.Resized.Cmp(*quantity(128 * mib)) != 0 {
		t.Errorf("Resized = %v, want 128Mi", req.Resized)
	}
	if got := mounttest.MountAt(t, global); got.FSType != "ext4" {
		t.Errorf("mounted %s, want ext4", got.FSType)
	}
	checkGrown(t, global, before, 64*mib, 128*mib)
	if got := mounttest.ReadFile(t, filepath.Join(global, "data.txt")); got != "kept" {
		t.Errorf("data after growing: %q, want %q", got, "kept")
	}

	// The device mount is idempotent: asked again while mounted, it does
	// nothing (and grows nothing).
	again := f.deviceRequest(s)
	again.DesiredSize = quantity(128 * mib)
	if err := f.plugin.MountDevice(context.Background(), again); err != nil || again.Resized != nil {
		t.Errorf("MountDevice on a mounted device = %v, Resized %v: want nil, nil", err, again.Resized)
	}
}

// A blank device is formatted at its full size: nothing to grow, nothing
// reported (the online path then finds nothing to do).
func TestMountDeviceBlankWithDesiredSize(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	f := newFixture(t)
	dev, _ := growableLoop(t, 64*mib)
	s := spec("pv-blank", dev, false)
	req := f.deviceRequest(s)
	req.DesiredSize = quantity(64 * mib)
	if err := f.plugin.MountDevice(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if req.Resized != nil {
		t.Errorf("Resized = %v for a freshly formatted device, want nil", req.Resized)
	}
	if got := mounttest.DiskFormat(t, dev); got != "ext4" {
		t.Errorf("device formatted %q, want ext4", got)
	}
	if size, err := f.expand(s, 64*mib); err != nil || size == nil || size.Cmp(*quantity(64 * mib)) != 0 {
		t.Errorf("Expand of a filesystem that already fills the device = %v, %v; want 64Mi, nil", size, err)
	}
}

// The device must have the space: a desired size beyond it is a clear error
// and nothing is mounted or changed.
func TestDeviceSmallerThanRequested(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	f := newFixture(t)
	dev, _ := growableLoop(t, 64*mib)
	s := spec("pv-small", dev, false)
	if err := f.mountDevice(s); err != nil {
		t.Fatal(err)
	}
	before := fsBytes(t, f.globalPath(s))

	// Online.
	_, err := f.expand(s, 128*mib)
	checkTooSmall(t, "Expand", err, dev)
	if got := fsBytes(t, f.globalPath(s)); got != before {
		t.Errorf("filesystem changed from %d to %d bytes", before, got)
	}

	// Offline.
	if err := f.unmountDevice(s); err != nil {
		t.Fatal(err)
	}
	req := f.deviceRequest(s)
	req.DesiredSize = quantity(128 * mib)
	err = f.plugin.MountDevice(context.Background(), req)
	checkTooSmall(t, "MountDevice", err, dev)
	if req.Resized != nil {
		t.Errorf("Resized = %v after a failure", req.Resized)
	}
	if ms := mounttest.MountsAt(t, f.globalPath(s)); len(ms) != 0 {
		t.Errorf("something is mounted at the global path after the failure: %+v", ms)
	}
}

func checkTooSmall(t *testing.T, what string, err error, dev string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s with a size beyond the device succeeded", what)
	}
	t.Logf("%s: %v", what, err)
	for _, s := range []string{dev, "67108864 bytes", "128Mi", "grow the device first"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s error %q does not contain %q", what, err, s)
		}
	}
	if volume.IsUncertain(err) {
		t.Errorf("%s error is uncertain; the device was never touched", what)
	}
}

// Online ext4: resize2fs on the mounted filesystem. Kernels (or sandboxes)
// without CAP_SYS_RESOURCE refuse with "Permission denied"; the test finds
// out by trying and skips then.
func TestExpandExt4Online(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	requireTool(t, "resize2fs")
	f := newFixture(t)
	dev, backing := growableLoop(t, 64*mib)
	s := spec("pv-online", dev, false)
	if err := f.mountDevice(s); err != nil {
		t.Fatal(err)
	}
	global := f.globalPath(s)
	before := fsBytes(t, global)
	growLoop(t, dev, backing, 128*mib)
	size, err := f.expand(s, 128*mib)
	if err != nil && strings.Contains(err.Error(), "Permission denied") {
		t.Skipf("skipping: this kernel refuses to grow a mounted ext4 filesystem (resize2fs needs CAP_SYS_RESOURCE): %v", err)
	}
	if err != nil {
		t.Fatalf("Expand: %v", err)
	}
	if size == nil || size.Cmp(*quantity(128 * mib)) != 0 {
		t.Errorf("Expand returned %v, want 128Mi", size)
	}
	checkGrown(t, global, before, 64*mib, 128*mib)
}

// XFS grows only online (xfs_growfs on the mount point): MountDevice with a
// desired size leaves it alone, Expand grows it. mkfs.xfs wants 300 MiB.
func TestExpandXFSOnline(t *testing.T) {
	requireTool(t, "mkfs.xfs")
	requireTool(t, "xfs_growfs")
	f := newFixture(t)
	dev, backing := growableLoop(t, 320*mib)
	s := spec("pv-xfs", dev, false, fsType("xfs"))
	if err := f.mountDevice(s); err != nil {
		t.Fatal(err)
	}
	global := f.globalPath(s)
	before := fsBytes(t, global)
	if err := f.unmountDevice(s); err != nil {
		t.Fatal(err)
	}
	growLoop(t, dev, backing, 400*mib)

	req := f.deviceRequest(s)
	req.DesiredSize = quantity(400 * mib)
	if err := f.plugin.MountDevice(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if req.Resized != nil {
		t.Errorf("Resized = %v: xfs cannot be grown offline, want nil", req.Resized)
	}
	if got := fsBytes(t, global); got != before {
		t.Errorf("xfs changed from %d to %d bytes when mounted", before, got)
	}

	size, err := f.expand(s, 400*mib)
	if err != nil {
		t.Fatalf("Expand: %v", err)
	}
	if size == nil || size.Cmp(*quantity(400 * mib)) != 0 {
		t.Errorf("Expand returned %v, want 400Mi", size)
	}
	checkGrown(t, global, before, 320*mib, 400*mib)
	if got := mounttest.MountAt(t, global); got.FSType != "xfs" {
		t.Errorf("mounted %s, want xfs", got.FSType)
	}
}

// A directory has nothing of its own to grow.
func TestExpandDirectoryNotSupported(t *testing.T) {
	f := newFixture(t)
	s := spec("pv-dir", f.hostDir(t), false)
	_, err := f.plugin.Expand(context.Background(), &plugins.ExpandRequest{
		VolumeName: volume.SharedName(local.Name, s.PV.Name), Spec: s, VolumePath: "/somewhere", NewSize: *quantity(mib), Log: zap.NewNop(),
	})
	if !errors.Is(err, plugins.ErrExpansionNotSupported) || !strings.Contains(err.Error(), "pv-dir") {
		t.Errorf("Expand of a directory = %v, want ErrExpansionNotSupported naming the PV", err)
	}
}
