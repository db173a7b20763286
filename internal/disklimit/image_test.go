package disklimit

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"go.uber.org/zap/zaptest"
)

// WriteAsNobody writes MiBs of zeros to path as uid/gid 65534 (an
// unprivileged container user) and returns dd's report.
func writeAsNobody(t *testing.T, path string, mib int) (string, error) {
	t.Helper()
	cmd := exec.Command("dd", "if=/dev/zero", "of="+path, "bs=1M", "count="+itoa(mib), "conv=fsync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func itoa(n int) string { return strconv.Itoa(n) }

// An image of sizeLimit usable bytes offers at least that and less than
// one MiB more, whatever the size.
func TestMakeImageSize(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4")
	}
	for _, limit := range []int64{1 << 20, 16 << 20, 100 << 20, 1 << 30} {
		path := filepath.Join(t.TempDir(), "img")
		if err := MakeImage(context.Background(), path, limit); err != nil {
			t.Fatal(err)
		}
		avail, err := available(path)
		if err != nil {
			t.Fatal(err)
		}
		if avail < limit || avail >= limit+1<<20 {
			t.Errorf("limit %d: %d bytes available, want [limit, limit+1Mi)", limit, avail)
		}
	}
}

func TestImageEnforcesLimit(t *testing.T) {
	mounttest.RequireRoot(t)
	root := mounttest.TempDir(t)
	im := &Images{Dir: filepath.Join(root, "images"), Log: zaptest.NewLogger(t)}
	vol := filepath.Join(root, "vol")
	key := ImageKey("uid-1", "scratch")
	if err := im.SetUp(context.Background(), vol, key, 16<<20); err != nil {
		t.Fatal(err)
	}
	// Set up again: nothing changes.
	if err := im.SetUp(context.Background(), vol, key, 16<<20); err != nil {
		t.Fatal(err)
	}
	if ms := mounttest.MountsAt(t, vol); len(ms) != 1 || ms[0].FSType != "ext4" || !ms[0].HasOption("nodev") || !ms[0].HasOption("nosuid") {
		t.Fatalf("mounts at %s: %+v, want one nodev,nosuid ext4", vol, ms)
	}
	if mounttest.Exists(t, filepath.Join(vol, "lost+found")) {
		t.Error("lost+found in a new emptyDir")
	}
	for _, d := range []string{vol, root, filepath.Dir(root)} {
		if err := os.Chmod(d, 0o777); err != nil { // 65534 walks to vol
			t.Fatal(err)
		}
	}
	out, err := writeAsNobody(t, filepath.Join(vol, "f"), 17)
	if err == nil || !strings.Contains(out, "No space left on device") || !strings.Contains(out, "16+") {
		t.Errorf("writing 17 MiB into a 16Mi image: %v: %s; want the 17th MiB refused with ENOSPC", err, out)
	}
	bytes, inodes, ok, err := (&Enforcer{images: im}).Usage(vol)
	if err != nil || !ok || bytes < 16<<20 || bytes > 17<<20 || inodes < 1 {
		t.Errorf("Usage = %d, %d, %v, %v; want about 16Mi", bytes, inodes, ok, err)
	}
	// A filesystem mounted by someone else (a Memory emptyDir's tmpfs) is
	// not the enforcement's to measure.
	other := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", other, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(other, 0) })
	if _, _, ok, err := (&Enforcer{images: im}).Usage(other); ok || err != nil {
		t.Errorf("Usage of a tmpfs = %v, %v; want not the enforcement's", ok, err)
	}

	// Teardown: unmount, then Release: no loop device, no image.
	if err := syscall.Unmount(vol, 0); err != nil {
		t.Fatal(err)
	}
	if err := im.Release(key); err != nil {
		t.Fatal(err)
	}
	if mounttest.Exists(t, im.Path(key)) {
		t.Error("image left after Release")
	}
	if loops := mounttest.LoopDevicesUnder(t, root); len(loops) != 0 {
		t.Errorf("loop devices left: %v", loops)
	}
}

// What a crash leaves is cleaned up at start: an image nothing mounts, a
// half-made one and a loop device nothing mounts; a mounted image stays.
func TestImageSweep(t *testing.T) {
	mounttest.RequireRoot(t)
	root := mounttest.TempDir(t)
	im := &Images{Dir: filepath.Join(root, "images"), Log: zaptest.NewLogger(t)}
	ctx := context.Background()
	mounted := filepath.Join(root, "mounted")
	if err := im.SetUp(ctx, mounted, "mounted", 4<<20); err != nil {
		t.Fatal(err)
	}
	// An image with no mount (crash after mkfs, or after unmount).
	if _, err := im.ensureImage(ctx, "unmounted", 4<<20); err != nil {
		t.Fatal(err)
	}
	// A loop device with no mount (attached without autoclear, as
	// losetup does).
	if _, err := im.ensureImage(ctx, "looped", 4<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "-f", im.Path("looped")).CombinedOutput(); err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	if err := os.WriteFile(im.Path("half")+".tmp", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := im.Sweep(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(im.Dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != "mounted.img" {
		t.Errorf("images after Sweep: %v, want only mounted.img", names)
	}
	loops := mounttest.LoopDevicesUnder(t, root)
	if len(loops) != 1 {
		t.Errorf("loop devices after Sweep: %v, want the mounted one", loops)
	}
	if err := syscall.Unmount(mounted, 0); err != nil {
		t.Fatal(err)
	}
	if err := im.Sweep(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(im.Dir); len(entries) != 0 {
		t.Errorf("images after unmount and Sweep: %v", entries)
	}
	if loops := mounttest.LoopDevicesUnder(t, root); len(loops) != 0 {
		t.Errorf("loop devices after unmount and Sweep: %v", loops)
	}
}
