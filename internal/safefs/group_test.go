package safefs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/safefs"
)

// SetGroup skips a mount far below the open directories and changes
// everything else.
func TestSetGroupMountPointBelowTheOpenDirectories(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	dir := filepath.Join(tmp, "vol")
	deep := nest(t, dir, 80)
	mnt := filepath.Join(deep, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	mounttest.MountTmpfs(t, mnt)
	if err := os.Chmod(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	mounttest.WriteFile(t, filepath.Join(mnt, "theirs"), "x")
	other := nest(t, filepath.Join(dir, "other"), 80)

	if err := safefs.SetGroup(context.Background(), dir, safefs.Group{GID: 4242, FileBits: 0o660, DirBits: 0o2770}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, deep, filepath.Join(deep, "f"), other, filepath.Join(other, "f")} {
		if gid := gidOf(t, p); gid != 4242 {
			t.Errorf("%s: gid %d, want 4242", p, gid)
		}
	}
	for _, p := range []string{mnt, filepath.Join(mnt, "theirs")} {
		if gid := gidOf(t, p); gid == 4242 {
			t.Errorf("%s on another mount was changed", p)
		}
	}
	if fi, _ := os.Stat(mnt); fi.Mode().Perm() != 0o700 {
		t.Errorf("mode of the mount's root changed to %v", fi.Mode())
	}
}

func gidOf(t *testing.T, p string) uint32 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Gid
}

// Applying an fsGroup to the same tree is bounded the same way.
func TestSetGroupDeepTreeMemory(t *testing.T) {
	mounttest.RequireRoot(t) // for clear_refs and chown
	dir := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := deepTree(t, dir, 1600)
	kib := peakGrowth(t, "chgrp", dir)
	t.Logf("applying a group to 1600 levels of 255-character names: peak resident memory grew by %d KiB", kib)
	if kib > maxGrowthKiB {
		t.Errorf("peak memory grew by %d KiB, more than %d KiB", kib, maxGrowthKiB)
	}
	// The deepest level got the group too.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1600; i++ {
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil || st.Gid != 4242 {
		t.Errorf("deepest directory: gid %d, %v", st.Gid, err)
	}
}

// The group walk makes no allocation per file: its system calls take the
// names from the dirent buffer (sysat.go). A tree of 20 directories of 200
// files allocates per directory only, in both walks.
func TestSetGroupAllocatesPerDirectoryOnly(t *testing.T) {
	mounttest.RequireRoot(t) // to change groups
	dir := filepath.Join(mounttest.TempDir(t), "vol")
	for i := range 20 {
		d := filepath.Join(dir, fmt.Sprintf("d%d", i))
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		for j := range 200 {
			mounttest.WriteFile(t, filepath.Join(d, fmt.Sprintf("f%d", j)), "")
		}
	}
	for _, tc := range []struct {
		name string
		set  func(context.Context, string, safefs.Group) error
	}{{"parallel", safefs.SetGroup}, {"sequential", safefs.SetGroupSequential}} {
		t.Run(tc.name, func(t *testing.T) {
			i := 0
			allocs := testing.AllocsPerRun(5, func() {
				i++ // every walk changes every entry
				if err := tc.set(context.Background(), dir, safefs.Group{GID: 4000 + i%2, FileBits: 0o660, DirBits: 0o2770}); err != nil {
					t.Fatal(err)
				}
			})
			if max := 20.0 * 20; allocs > max {
				t.Errorf("%.0f allocations for 4,000 files in 20 directories, want at most %.0f (20 a directory)", allocs, max)
			}
		})
	}
}
