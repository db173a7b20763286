package localpv

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/blockpin"
	"github.com/volume-agent/volume-agent/internal/hostroot"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/safefs"
)

func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "clean.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRunCommand(t *testing.T) {
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "env")
	ok := script(t, `echo "$LOCAL_PV_BLKDEVICE $1" > `+out+"\n")
	if err := runCommand(ctx, []string{ok, "arg"}, []string{EnvDevice + "=/dev/x"}); err != nil {
		t.Fatal(err)
	}
	if got := mounttest.ReadFile(t, out); got != "/dev/x arg\n" {
		t.Errorf("the command saw %q", got)
	}

	fail := script(t, "echo first line\necho 'no such device' >&2\nexit 3\n")
	err := runCommand(ctx, []string{fail}, nil)
	if err == nil || !strings.Contains(err.Error(), "exited with status 3: first line\nno such device") {
		t.Errorf("error %v", err)
	}

	// Output is bounded.
	chatty := script(t, "i=0; while [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done; exit 1\n")
	err = runCommand(ctx, []string{chatty}, nil)
	if err == nil || len(err.Error()) > maxOutput+200 || !strings.HasSuffix(err.Error(), "line 1999") {
		t.Errorf("error of %d bytes: ...%s", len(err.Error()), err.Error()[max(0, len(err.Error())-40):])
	}

	// A timeout kills the whole process group, children included.
	pidFile := filepath.Join(t.TempDir(), "pid")
	slow := script(t, "sleep 60 &\necho $! > "+pidFile+"\nwait\n")
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = runCommand(tctx, []string{slow}, nil)
	if err == nil || !strings.Contains(err.Error(), "was stopped") {
		t.Errorf("error %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v", took)
	}
	pid := strings.TrimSpace(mounttest.ReadFile(t, pidFile))
	deadline := time.Now().Add(5 * time.Second)
	for {
		data, err := os.ReadFile("/proc/" + pid + "/stat")
		// Gone, or a zombie waiting for init.
		if err != nil || strings.Contains(string(data), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cleaner's child %s outlived the timeout", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := runCommand(ctx, []string{"/nonexistent/cleaner"}, nil); err == nil {
		t.Error("a missing program succeeds")
	}
}

func TestCleanDir(t *testing.T) {
	mounttest.RequireRoot(t)
	root := mounttest.TempDir(t)
	disk := filepath.Join(root, "mnt", "disk")
	must(t, os.MkdirAll(disk, 0o755))
	c := &cleaner{root: hostroot.New(root), mounter: mountutil.New(), identifier: newHostIdentifier(root)}
	class := &Class{Name: "c", Timeout: time.Minute}
	tg := target{PV: "pv", UID: "u", Class: "c", Path: "/mnt/disk"}

	// A plain directory (the disk was unmounted) is never emptied.
	mounttest.WriteFile(t, filepath.Join(disk, "root-disk-file"), "x")
	if _, err := c.clean(context.Background(), tg, class); err == nil || !strings.Contains(err.Error(), "no longer a mount point") {
		t.Fatalf("error %v", err)
	}
	if _, err := os.Stat(filepath.Join(disk, "root-disk-file")); err != nil {
		t.Fatal("a file below an unmounted disk was removed")
	}
	must(t, os.Remove(filepath.Join(disk, "root-disk-file")))

	must(t, unix.Mount("tmpfs", disk, "tmpfs", 0, "size=4m"))
	outside := filepath.Join(root, "outside")
	mounttest.WriteFile(t, filepath.Join(outside, "keep"), "keep")
	mounttest.WriteFile(t, filepath.Join(disk, "a", "b", "c"), "data")
	mounttest.WriteFile(t, filepath.Join(disk, ".hidden"), "data")
	must(t, os.Symlink(outside, filepath.Join(disk, "link")))
	must(t, os.Symlink(filepath.Join(outside, "keep"), filepath.Join(disk, "a", "filelink")))
	if _, err := c.clean(context.Background(), tg, class); err != nil {
		t.Fatal(err)
	}
	if names, _ := readDirNames(disk); len(names) != 0 {
		t.Fatalf("left %v", names)
	}
	if mounttest.ReadFile(t, filepath.Join(outside, "keep")) != "keep" {
		t.Fatal("a symlink was followed")
	}

	// Another mount inside is not crossed: an error, its content kept.
	inner := filepath.Join(disk, "inner")
	must(t, os.Mkdir(inner, 0o755))
	must(t, unix.Mount("tmpfs", inner, "tmpfs", 0, "size=1m"))
	mounttest.WriteFile(t, filepath.Join(inner, "other"), "other")
	mounttest.WriteFile(t, filepath.Join(disk, "mine"), "mine")
	_, err := c.clean(context.Background(), tg, class)
	if !errors.Is(err, safefs.ErrMountPointInside) {
		t.Fatalf("error %v", err)
	}
	if mounttest.ReadFile(t, filepath.Join(inner, "other")) != "other" {
		t.Fatal("crossed into another mount")
	}
	if _, err := os.Stat(filepath.Join(disk, "mine")); err == nil {
		t.Fatal("what could be removed was not")
	}
}

func TestCleanBlockDevice(t *testing.T) {
	mounttest.RequireRoot(t)
	if _, err := exec.LookPath("wipefs"); err != nil {
		t.Skip("wipefs is not installed")
	}
	root := mounttest.TempDir(t)
	dev := mounttest.LoopDevice(t, 32<<20)
	disks := filepath.Join(root, "disks")
	must(t, os.MkdirAll(disks, 0o755))
	// The node links the device by its absolute path; the host root here
	// has the same /dev as the agent.
	must(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
	var st unix.Stat_t
	must(t, unix.Stat(dev, &st))
	must(t, unix.Mknod(filepath.Join(root, "dev", "disk0"), unix.S_IFBLK|0o600, int(st.Rdev)))
	must(t, os.Symlink("/dev/disk0", filepath.Join(disks, "d0")))
	c := &cleaner{root: hostroot.New(root), mounter: mountutil.New(), identifier: newHostIdentifier(root)}
	tg := target{PV: "pv", UID: "u", Class: "raw", Path: "/disks/d0", Block: true}
	ctx := context.Background()

	for _, method := range []string{CleanupWipefs, CleanupZero, CleanupBlkdiscard} {
		t.Run(method, func(t *testing.T) {
			if method == CleanupBlkdiscard {
				if _, err := exec.LookPath("blkdiscard"); err != nil {
					t.Skip("blkdiscard is not installed")
				}
			}
			mounttest.Mkfs(t, "ext4", dev)
			class := &Class{Name: "raw", Timeout: time.Minute, Cleanup: BlockCleanup{Method: method, ZeroMiB: 2}}
			if _, err := c.clean(ctx, tg, class); err != nil {
				t.Fatal(err)
			}
			if fs := mounttest.DiskFormat(t, dev); fs != "" {
				t.Fatalf("still %s after %s", fs, method)
			}
		})
	}

	t.Run("command", func(t *testing.T) {
		mounttest.Mkfs(t, "ext4", dev)
		seen := filepath.Join(t.TempDir(), "seen")
		cmd := script(t, `echo "$LOCAL_PV_BLKDEVICE $LOCAL_PV_NAME $LOCAL_PV_PATH $LOCAL_PV_STORAGE_CLASS" > `+seen+"\nwipefs -a \"$LOCAL_PV_BLKDEVICE\" >/dev/null\n")
		class := &Class{Name: "raw", Timeout: time.Minute, Cleanup: BlockCleanup{Method: CleanupCommand, Command: []string{cmd}}}
		if _, err := c.clean(ctx, tg, class); err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(root, "dev", "disk0") + " pv /disks/d0 raw\n"
		if got := mounttest.ReadFile(t, seen); got != want {
			t.Fatalf("the command saw %q, want %q", got, want)
		}
		if fs := mounttest.DiskFormat(t, dev); fs != "" {
			t.Fatalf("still %s", fs)
		}
	})

	t.Run("zero writes zeros", func(t *testing.T) {
		f, err := os.OpenFile(dev, os.O_WRONLY, 0)
		must(t, err)
		_, err = f.Write(bytes.Repeat([]byte{0xff}, 3<<20))
		must(t, err)
		must(t, f.Close())
		class := &Class{Name: "raw", Timeout: time.Minute, Cleanup: BlockCleanup{Method: CleanupZero, ZeroMiB: 2}}
		_, err = c.clean(ctx, tg, class)
		must(t, err)
		data := make([]byte, 3<<20)
		f, err = os.Open(dev)
		must(t, err)
		_, err = f.ReadAt(data, 0)
		f.Close()
		must(t, err)
		if !bytes.Equal(data[:2<<20], make([]byte, 2<<20)) {
			t.Fatal("the first 2 MiB are not zero")
		}
		if data[2<<20] != 0xff {
			t.Fatal("zeroed more than asked")
		}
	})

	t.Run("mounted device refused", func(t *testing.T) {
		mounttest.Mkfs(t, "ext4", dev)
		mnt := filepath.Join(root, "mnt")
		must(t, os.MkdirAll(mnt, 0o755))
		mounttest.MountDevice(t, dev, mnt, "ext4")
		for _, method := range []string{CleanupWipefs, CleanupZero} {
			class := &Class{Name: "raw", Timeout: time.Minute, Cleanup: BlockCleanup{Method: method, ZeroMiB: 1}}
			_, err := c.clean(ctx, tg, class)
			if err == nil || !strings.Contains(err.Error(), "is in use: it is mounted or held") {
				t.Fatalf("%s: %v", method, err)
			}
		}
		if fs := mounttest.DiskFormat(t, dev); fs != "ext4" {
			t.Fatalf("a mounted device was wiped: %q", fs)
		}
		must(t, mounttest.UnmountUnder(mnt))
	})

	t.Run("not a device any more", func(t *testing.T) {
		must(t, os.Remove(filepath.Join(disks, "d0")))
		mounttest.WriteFile(t, filepath.Join(disks, "d0"), "")
		class := &Class{Name: "raw", Timeout: time.Minute, Cleanup: BlockCleanup{Method: CleanupWipefs}}
		if _, err := c.clean(ctx, tg, class); err == nil || !strings.Contains(err.Error(), "is not a block device") {
			t.Fatalf("%v", err)
		}
	})
}

// A Block PV's device mapped for a pod as the agent maps raw block volumes
// (bind-mounted onto an access point and pinned by a read-only loop device)
// is in use: the mount table does not show the device, the bind mount of
// its node and the pin do. Unpinned and unmounted, it is free.
func TestBlockDeviceUsersMappedByAgent(t *testing.T) {
	mounttest.RequireRoot(t)
	dev := mounttest.LoopDevice(t, 8<<20)
	dir := mounttest.TempDir(t)
	if users, err := blockDeviceUsers(dev); err != nil || users != "" {
		t.Fatalf("blockDeviceUsers of an unused device = %q, %v", users, err)
	}
	ap := filepath.Join(dir, "access-point")
	if err := os.WriteFile(ap, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev, ap, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	pins := &blockpin.Loops{}
	if err := pins.Pin(ap); err != nil {
		t.Fatal(err)
	}
	if users, err := blockDeviceUsers(dev); err != nil || !strings.Contains(users, ap) {
		t.Errorf("blockDeviceUsers of a mapped, pinned device = %q, %v; want it to name %s", users, err, ap)
	}
	if err := pins.Unpin(ap); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(ap, 0); err != nil {
		t.Fatal(err)
	}
	if users, err := blockDeviceUsers(dev); err != nil || users != "" {
		t.Errorf("blockDeviceUsers after unpinning and unmounting = %q, %v", users, err)
	}
}
