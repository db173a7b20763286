package mountutil_test

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
)

// mountElsewhere mounts a tmpfs at target from a new mount namespace whose
// mounts are copies of this one's, keeping their propagation (what a CSI
// driver's container with a Bidirectional mount of the directory does), and
// reports whether the mount reached this namespace.
func mountElsewhere(t *testing.T, target string) bool {
	t.Helper()
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("skipping: unshare (util-linux) is not installed")
	}
	out, err := exec.Command("unshare", "--mount", "--propagation", "unchanged",
		"mount", "-t", "tmpfs", "-o", "size=1m", "elsewhere", target).CombinedOutput()
	if err != nil {
		t.Fatalf("mounting from another mount namespace: %v: %s", err, out)
	}
	for _, m := range mounttest.MountsAt(t, target) {
		if m.Source == "elsewhere" {
			return true
		}
	}
	return false
}

func optional(t *testing.T, path string) string {
	t.Helper()
	ms, err := mountutil.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].Mountpoint == mounttest.Real(path) {
			return ms[i].Optional
		}
	}
	return ""
}

func TestMakeShared(t *testing.T) {
	mounttest.RequireRoot(t)

	t.Run("private directory is bound onto itself and shared", func(t *testing.T) {
		root := mkdir(t, filepath.Join(mounttest.TempDir(t), "root"))
		x := mkdir(t, filepath.Join(root, "x"))
		if mountElsewhere(t, mkdir(t, filepath.Join(root, "before"))) {
			t.Skip("skipping: the test directory is on a shared mount already")
		}
		got, err := mountutil.MakeShared(root)
		if err != nil || got != mountutil.MadeShared {
			t.Fatalf("MakeShared = %v, %v", got, err)
		}
		if n := len(mounttest.MountsAt(t, root)); n != 1 {
			t.Fatalf("%d mounts at the root, want its own bind", n)
		}
		if !strings.Contains(optional(t, root), "shared:") {
			t.Errorf("root's propagation %q is not shared", optional(t, root))
		}
		if !mountElsewhere(t, x) {
			t.Error("a mount made below the root in another namespace did not reach this one")
		}
		// Again: nothing more is mounted.
		got, err = mountutil.MakeShared(root)
		if err != nil || got != mountutil.AlreadyShared {
			t.Errorf("second MakeShared = %v, %v", got, err)
		}
		if n := len(mounttest.MountsAt(t, root)); n != 1 {
			t.Errorf("%d mounts at the root after the second call", n)
		}
	})

	t.Run("inside a shared mount nothing is mounted", func(t *testing.T) {
		parent := mkdir(t, filepath.Join(mounttest.TempDir(t), "parent"))
		if err := unix.Mount(parent, parent, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("", parent, "", unix.MS_SHARED, ""); err != nil {
			t.Fatal(err)
		}
		root := mkdir(t, filepath.Join(parent, "root"))
		got, err := mountutil.MakeShared(root)
		if err != nil || got != mountutil.AlreadyShared {
			t.Fatalf("MakeShared = %v, %v", got, err)
		}
		if ms := mounttest.MountsAt(t, root); len(ms) != 0 {
			t.Errorf("mounts at the root: %+v", ms)
		}
		if !mountElsewhere(t, mkdir(t, filepath.Join(root, "x"))) {
			t.Error("a mount from another namespace did not reach this one")
		}
	})

	t.Run("a private mount point is made shared in place", func(t *testing.T) {
		root := mkdir(t, filepath.Join(mounttest.TempDir(t), "root"))
		mounttest.MountTmpfs(t, root)
		got, err := mountutil.MakeShared(root)
		if err != nil || got != mountutil.MadeShared {
			t.Fatalf("MakeShared = %v, %v", got, err)
		}
		if n := len(mounttest.MountsAt(t, root)); n != 1 {
			t.Errorf("%d mounts at the root, want the tmpfs alone", n)
		}
		if !mountElsewhere(t, mkdir(t, filepath.Join(root, "x"))) {
			t.Error("a mount from another namespace did not reach this one")
		}
	})

	t.Run("mounts below a private directory are never hidden", func(t *testing.T) {
		root := mkdir(t, filepath.Join(mounttest.TempDir(t), "root"))
		vol := mkdir(t, filepath.Join(root, "pods", "p", "volumes", "v"))
		mounttest.MountTmpfs(t, vol)
		mounttest.WriteFile(t, filepath.Join(vol, "data"), "in use")
		_, err := mountutil.MakeShared(root)
		if !errors.Is(err, mountutil.ErrMountsBelow) {
			t.Fatalf("MakeShared = %v, want ErrMountsBelow", err)
		}
		if ms := mounttest.MountsAt(t, root); len(ms) != 0 {
			t.Errorf("mounted at the root anyway: %+v", ms)
		}
		if got := mounttest.ReadFile(t, filepath.Join(vol, "data")); got != "in use" {
			t.Errorf("volume reads %q", got)
		}
	})
}
