package localpv

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/internal/hostroot"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
)

func TestSameDisk(t *testing.T) {
	for _, tc := range []struct {
		name              string
		recorded, current DiskIdentity
		same              bool
		why               string
	}{
		{"same filesystem, same device", DiskIdentity{Device: "7:3", FSUUID: "u1"}, DiskIdentity{Device: "7:3", FSUUID: "u1"}, true, ""},
		{"same filesystem, re-enumerated device", DiskIdentity{Device: "7:3", FSUUID: "u1"}, DiskIdentity{Device: "7:4", FSUUID: "u1"}, true, ""},
		{"another filesystem at the same device", DiskIdentity{Device: "7:3", FSUUID: "u1"}, DiskIdentity{Device: "7:3", FSUUID: "u2"}, false, "filesystem UUID is u2"},
		{"no filesystem UUID now", DiskIdentity{Device: "7:3", FSUUID: "u1"}, DiskIdentity{Device: "7:3"}, false, "filesystem UUID is none"},
		{"same serial, re-enumerated", DiskIdentity{Device: "8:16", Serial: "wwn-1"}, DiskIdentity{Device: "8:32", Serial: "wwn-1"}, true, ""},
		{"another serial at the same device", DiskIdentity{Device: "8:16", Serial: "wwn-1"}, DiskIdentity{Device: "8:16", Serial: "wwn-2"}, false, "serial is wwn-2"},
		{"serial and UUID both checked", DiskIdentity{FSUUID: "u1", Serial: "s"}, DiskIdentity{FSUUID: "u1", Serial: "t"}, false, "serial is t"},
		{"device number only, same", DiskIdentity{Device: "0:52"}, DiskIdentity{Device: "0:52"}, true, ""},
		{"device number only, another", DiskIdentity{Device: "0:52"}, DiskIdentity{Device: "0:61"}, false, "device number is 0:61"},
		// A filesystem the tenant made on a block device is no identity.
		{"block device with a new filesystem", DiskIdentity{Device: "8:16", Serial: "s"}, DiskIdentity{Device: "8:16", FSUUID: "new", Serial: "s"}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			same, why := sameDisk(tc.recorded, tc.current)
			if same != tc.same || !strings.Contains(why, tc.why) {
				t.Errorf("sameDisk(%v, %v) = %v, %q; want %v, %q", tc.recorded, tc.current, same, why, tc.same, tc.why)
			}
		})
	}
}

func TestIdentityAnnotations(t *testing.T) {
	id := DiskIdentity{Device: "7:3", FSUUID: "u", Serial: "loop:/x"}
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnProvisionedBy: "p"}}}
	id.annotate(pv.Annotations)
	if got := identityOf(pv); got != id {
		t.Errorf("read back %+v, wrote %+v", got, id)
	}
	partial := DiskIdentity{Device: "0:52"}
	pv = &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}}
	partial.annotate(pv.Annotations)
	if len(pv.Annotations) != 1 || identityOf(pv) != partial {
		t.Errorf("annotations %v", pv.Annotations)
	}
	if !identityOf(&v1.PersistentVolume{}).IsZero() {
		t.Error("a PV without annotations has an identity")
	}
}

// serial reads what sysfs says about a device: the WWID before the serial,
// the disk's for a partition, a device-mapper UUID, a loop device's
// backing file.
func TestSerialFromSysfs(t *testing.T) {
	sys := t.TempDir()
	write := func(path, content string) {
		t.Helper()
		mounttest.WriteFile(t, filepath.Join(sys, path), content)
	}
	// Devices as sysfs links them: /sys/dev/block/M:m -> ../../devices/...
	devices := filepath.Join(sys, "devices")
	link := func(num, target string) {
		t.Helper()
		must(t, os.MkdirAll(filepath.Join(sys, "dev", "block"), 0o755))
		must(t, os.MkdirAll(filepath.Join(devices, target), 0o755))
		must(t, os.Symlink(filepath.Join(devices, target), filepath.Join(sys, "dev", "block", num)))
	}
	link("8:0", "sda")
	write("devices/sda/device/wwid", "naa.5000c500a1b2c3d4\n")
	write("devices/sda/device/serial", "ZA1234\n")
	link("8:1", "sda/sda1")
	write("devices/sda/sda1/partition", "1\n")
	link("259:0", "nvme0n1")
	write("devices/nvme0n1/wwid", "eui.0025388b91b2f3a1\n")
	link("252:0", "vda")
	write("devices/vda/serial", "virtio-serial-1\n")
	link("7:3", "loop3")
	write("devices/loop3/loop/backing_file", "/var/disks/a.img\n")
	link("253:0", "dm-0")
	write("devices/dm-0/dm/uuid", "LVM-abc\n")
	link("8:16", "sdb") // no identity at all

	h := &hostIdentifier{sys: sys}
	for num, want := range map[[2]uint32]string{
		{8, 0}: "naa.5000c500a1b2c3d4", {8, 1}: "naa.5000c500a1b2c3d4-part1", {259, 0}: "eui.0025388b91b2f3a1",
		{252, 0}: "virtio-serial-1", {7, 3}: "loop:/var/disks/a.img", {253, 0}: "dm:LVM-abc", {8, 16}: "", {9, 9}: "",
	} {
		if got := h.serial(num[0], num[1]); got != want {
			t.Errorf("serial of %d:%d = %q, want %q", num[0], num[1], got, want)
		}
	}
}

// attachAt attaches file to the loop device dev (which must be free).
func attachAt(t *testing.T, dev, file string) {
	t.Helper()
	if out, err := exec.Command("losetup", dev, file).CombinedOutput(); err != nil {
		// Another process on the machine took the device in between.
		t.Skipf("skipping: cannot attach %s to %s again (%v: %s)", file, dev, err, strings.TrimSpace(string(out)))
	}
}

func backingFile(t *testing.T, dev string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--noheadings", "--output", "BACK-FILE", dev).Output()
	if err != nil {
		t.Fatalf("losetup %s: %v", dev, err)
	}
	return strings.TrimSpace(string(out))
}

func detach(t *testing.T, devs ...string) {
	t.Helper()
	for _, dev := range devs {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Fatalf("losetup -d %s: %v: %s", dev, err, out)
		}
	}
}

// The disks re-enumerate: two loop devices are detached and their images
// attached again in swapped order, so that the path of a Block PV made
// from image A leads to image B. Its owed cleanup is refused with a
// DiskMismatchError naming both identities, and B is untouched; with A
// back (at another device number) the cleanup goes ahead.
func TestCleanRefusesAnotherBlockDevice(t *testing.T) {
	mounttest.RequireRoot(t)
	if _, err := exec.LookPath("wipefs"); err != nil {
		t.Skip("wipefs is not installed")
	}
	root := mounttest.TempDir(t)
	devA, devB := mounttest.LoopDevice(t, 32<<20), mounttest.LoopDevice(t, 32<<20)
	fileA, fileB := backingFile(t, devA), backingFile(t, devB)
	mounttest.Mkfs(t, "ext4", devA)
	mounttest.Mkfs(t, "ext4", devB)
	uuidB := blkidUUID(t, devB)
	disks := filepath.Join(root, "disks")
	must(t, os.MkdirAll(disks, 0o755))
	// The node links the device by its kernel name, as an administrator
	// who did not use /dev/disk/by-id would.
	must(t, os.Symlink(devA, filepath.Join(disks, "d0")))
	c := &cleaner{root: hostroot.New("/"), mounter: mountutil.New(), identifier: newHostIdentifier("/")}
	ctx := context.Background()
	recorded, err := c.identifier.identify(ctx, filepath.Join(disks, "d0"), true)
	must(t, err)
	if recorded.Serial != "loop:"+fileA || recorded.Device == "" || recorded.FSUUID != "" {
		t.Fatalf("identity of image A: %+v", recorded)
	}
	tg := target{PV: "pv-a", UID: "u", Class: "raw", Path: filepath.Join(disks, "d0"), Block: true, Identity: recorded}
	class := &Class{Name: "raw", Timeout: time.Minute, Cleanup: BlockCleanup{Method: CleanupWipefs}}

	detach(t, devA, devB)
	attachAt(t, devA, fileB)
	attachAt(t, devB, fileA)

	result, err := c.clean(ctx, tg, class)
	var mismatch *DiskMismatchError
	if !errors.As(err, &mismatch) || result != identityMismatch {
		t.Fatalf("clean after the swap: %q, %v", result, err)
	}
	for _, want := range []string{"loop:" + fileB, "loop:" + fileA, "not cleaning"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if got := blkidUUID(t, devA); got != uuidB {
		t.Fatalf("image B (now at %s) was wiped: its filesystem UUID is %q, was %s", devA, got, uuidB)
	}

	// Image A at the PV's path again, at another device number.
	must(t, os.Remove(filepath.Join(disks, "d0")))
	must(t, os.Symlink(devB, filepath.Join(disks, "d0")))
	if result, err := c.clean(ctx, tg, class); err != nil || result != identityMatch {
		t.Fatalf("clean of image A back at %s: %q, %v", devB, result, err)
	}
	if fs := mounttest.DiskFormat(t, devB); fs != "" {
		t.Fatalf("image A still has %s", fs)
	}
	if got := blkidUUID(t, devA); got != uuidB {
		t.Fatalf("image B was wiped: its filesystem UUID is %q, was %s", got, uuidB)
	}
}

// The same for a filesystem PV: the administrator mounts disks by device
// name, the devices re-enumerate, and the PV's mount point now holds
// another filesystem. Its files are kept; with the right filesystem
// mounted there again (from another device) the cleanup goes ahead.
func TestCleanRefusesAnotherFilesystem(t *testing.T) {
	mounttest.RequireRoot(t)
	if _, err := exec.LookPath("blkid"); err != nil {
		t.Skip("blkid is not installed")
	}
	root := mounttest.TempDir(t)
	devA, devB := mounttest.LoopDevice(t, 32<<20), mounttest.LoopDevice(t, 32<<20)
	fileA, fileB := backingFile(t, devA), backingFile(t, devB)
	mounttest.Mkfs(t, "ext4", devA)
	mounttest.Mkfs(t, "ext4", devB)
	disk := filepath.Join(root, "disks", "d0")
	must(t, os.MkdirAll(disk, 0o755))
	mounttest.MountDevice(t, devA, disk, "ext4")
	c := &cleaner{root: hostroot.New("/"), mounter: mountutil.New(), identifier: newHostIdentifier("/")}
	ctx := context.Background()
	recorded, err := c.identifier.identify(ctx, disk, false)
	must(t, err)
	uuidA := blkidUUID(t, devA)
	if recorded.FSUUID != uuidA || recorded.Device == "" || recorded.Serial != "" {
		t.Fatalf("identity of A's filesystem: %+v (blkid says UUID %s)", recorded, uuidA)
	}
	tg := target{PV: "pv-a", UID: "u", Class: "fs", Path: disk, Identity: recorded}
	class := &Class{Name: "fs", Timeout: time.Minute}

	must(t, mounttest.UnmountUnder(disk))
	detach(t, devA, devB)
	attachAt(t, devA, fileB)
	attachAt(t, devB, fileA)
	mounttest.MountDevice(t, devA, disk, "ext4") // now image B
	mounttest.WriteFile(t, filepath.Join(disk, "b-data"), "B's data")

	result, err := c.clean(ctx, tg, class)
	var mismatch *DiskMismatchError
	if !errors.As(err, &mismatch) || result != identityMismatch || !strings.Contains(err.Error(), uuidA) {
		t.Fatalf("clean after the swap: %q, %v", result, err)
	}
	if mounttest.ReadFile(t, filepath.Join(disk, "b-data")) != "B's data" {
		t.Fatal("image B's files were removed")
	}

	must(t, mounttest.UnmountUnder(disk))
	mounttest.MountDevice(t, devB, disk, "ext4") // image A, another device number
	mounttest.WriteFile(t, filepath.Join(disk, "a-data"), "A's data")
	if result, err := c.clean(ctx, tg, class); err != nil || result != identityMatch {
		t.Fatalf("clean of A back from %s: %q, %v", devB, result, err)
	}
	if names, _ := readDirNames(disk); len(names) != 0 {
		t.Fatalf("left %v", names)
	}
	must(t, mounttest.UnmountUnder(disk))

	// A tmpfs has no UUID: its device number is all there is, and the
	// kernel gives a freed one to the next tmpfs, so it identifies nothing
	// across remounts (docs/local-volumes.md says so).
	must(t, unix.Mount("tmpfs", disk, "tmpfs", 0, "size=1m"))
	if id, err := c.identifier.identify(ctx, disk, false); err != nil || id.FSUUID != "" || !strings.HasPrefix(id.Device, "0:") {
		t.Fatalf("identity of a tmpfs: %+v, %v", id, err)
	}
	must(t, mounttest.UnmountUnder(disk))
}

func blkidUUID(t *testing.T, dev string) string {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-s", "UUID", "-o", "value", dev).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return ""
	}
	if err != nil {
		t.Fatalf("blkid %s: %v", dev, err)
	}
	return strings.TrimSpace(string(out))
}

// A Block volume mapped into a pod is in use although nothing mounts it
// and an exclusive open succeeds: its device node is bind-mounted at the
// pod's access point, or a loop device pins it. Either refuses the
// cleanup.
func TestCleanRefusesMappedBlockDevice(t *testing.T) {
	mounttest.RequireRoot(t)
	if _, err := exec.LookPath("wipefs"); err != nil {
		t.Skip("wipefs is not installed")
	}
	root := mounttest.TempDir(t)
	dev := mounttest.LoopDevice(t, 32<<20)
	mounttest.Mkfs(t, "ext4", dev)
	disks := filepath.Join(root, "disks")
	must(t, os.MkdirAll(disks, 0o755))
	must(t, os.Symlink(dev, filepath.Join(disks, "d0")))
	c := &cleaner{root: hostroot.New("/"), mounter: mountutil.New(), identifier: newHostIdentifier("/")}
	ctx := context.Background()
	tg := target{PV: "pv", UID: "u", Class: "raw", Path: filepath.Join(disks, "d0"), Block: true}
	class := &Class{Name: "raw", Timeout: time.Minute, Cleanup: BlockCleanup{Method: CleanupWipefs}}

	access := filepath.Join(root, "pods", "uid", "volumeDevices", "vol")
	mounttest.WriteFile(t, access, "")
	must(t, unix.Mount(dev, access, "", unix.MS_BIND, ""))
	t.Cleanup(func() { _ = unix.Unmount(access, unix.MNT_DETACH) })
	_, err := c.clean(ctx, tg, class)
	if err == nil || !strings.Contains(err.Error(), "its device node is bind-mounted at "+access) {
		t.Fatalf("clean of a mapped device: %v", err)
	}

	must(t, unix.Unmount(access, 0))

	// A loop device on the device node: a pin (the kubelet's, on its
	// global map path) or anyone's losetup.
	out, err := exec.Command("losetup", "-r", "-f", "--show", dev).CombinedOutput()
	if err != nil {
		t.Skipf("skipping the pin: losetup: %v: %s", err, out)
	}
	pin := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", pin).Run() })
	_, err = c.clean(ctx, tg, class)
	if err == nil || !strings.Contains(err.Error(), "loop device "+pin+" is backed by it") {
		t.Fatalf("clean of a pinned device: %v", err)
	}
	if fs := mounttest.DiskFormat(t, dev); fs != "ext4" {
		t.Fatalf("a device in use was wiped: %q", fs)
	}
	must(t, exec.Command("losetup", "-d", pin).Run())
	if _, err := c.clean(ctx, tg, class); err != nil {
		t.Fatalf("clean once nothing uses it: %v", err)
	}
}

// A filesystem volume still bind-mounted into a pod (its teardown not
// finished) is in use.
func TestCleanRefusesDirectoryInUse(t *testing.T) {
	mounttest.RequireRoot(t)
	root := mounttest.TempDir(t)
	disk := filepath.Join(root, "disks", "d0")
	must(t, os.MkdirAll(disk, 0o755))
	must(t, unix.Mount("tmpfs", disk, "tmpfs", 0, "size=1m"))
	mounttest.WriteFile(t, filepath.Join(disk, "sub", "data"), "in use")
	pod := filepath.Join(root, "pods", "uid", "volumes", "vol")
	must(t, os.MkdirAll(pod, 0o755))
	must(t, unix.Mount(filepath.Join(disk, "sub"), pod, "", unix.MS_BIND, ""))
	c := &cleaner{root: hostroot.New("/"), mounter: mountutil.New(), identifier: newHostIdentifier("/")}
	tg := target{PV: "pv", UID: "u", Class: "fs", Path: disk}
	class := &Class{Name: "fs", Timeout: time.Minute}
	if _, err := c.clean(context.Background(), tg, class); err == nil || !strings.Contains(err.Error(), "also mounted at "+pod) {
		t.Fatalf("clean of a directory in use: %v", err)
	}
	if mounttest.ReadFile(t, filepath.Join(pod, "data")) != "in use" {
		t.Fatal("data in use was removed")
	}
	must(t, unix.Unmount(pod, 0))
	if _, err := c.clean(context.Background(), tg, class); err != nil {
		t.Fatal(err)
	}
}
