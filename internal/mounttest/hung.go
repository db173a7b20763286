package mounttest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// autofsIocCatatonic is AUTOFS_IOC_CATATONIC: the mount stops waiting for
// its daemon and fails every lookup.
const autofsIocCatatonic = 0x9362

// HungDir returns a directory where looking up any name (stat, open...)
// blocks, the way it does on a hung disk or a dead network filesystem,
// until the test ends. It is an autofs mount whose daemon never answers:
// a kernel filesystem, nothing faked. At cleanup the mount is told to give
// up (every blocked lookup fails with ENOENT) and is unmounted.
func HungDir(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	dir := filepath.Join(TempDir(t), "hung")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	// autofs does not block the daemon's process group: a process of its
	// own stands for the daemon.
	daemon := exec.Command("sleep", "infinity")
	daemon.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("fd=%d,pgrp=%d,minproto=5,maxproto=5,indirect", w.Fd(), daemon.Process.Pid)
	if err := unix.Mount("volume-agent-test-hung", dir, "autofs", 0, opts); err != nil {
		_ = daemon.Process.Kill()
		_ = daemon.Wait()
		t.Skipf("skipping: cannot mount autofs to stand for a hung disk: %v", err)
	}
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(root), autofsIocCatatonic, 0)
		if errno != 0 {
			t.Errorf("autofs catatonic: %v", errno)
		}
		unix.Close(root)
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
		w.Close()
		r.Close()
		_ = daemon.Process.Kill()
		_ = daemon.Wait()
	})
	return dir
}
