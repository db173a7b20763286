package mountutil_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
)

func mkdir(t *testing.T, path string) string {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeErr tries to create a file in dir and returns the error.
func writeErr(dir string) error {
	return os.WriteFile(filepath.Join(dir, "probe"), []byte("x"), 0o644)
}

func TestMountTmpfs(t *testing.T) {
	mounttest.RequireRoot(t)
	page := int64(os.Getpagesize())
	tests := []struct {
		name string
		opts mountutil.TmpfsOptions
		// wantSize is the size statfs reports; 0 means the kernel default
		// (not checked beyond being larger than any limit used here).
		wantSize int64
	}{
		{"size and mode 0777", mountutil.TmpfsOptions{SizeBytes: 8 << 20, Mode: 0o777}, 8 << 20},
		{"mode 0750", mountutil.TmpfsOptions{SizeBytes: 1 << 20, Mode: 0o750}, 1 << 20},
		{"size rounded up to pages", mountutil.TmpfsOptions{SizeBytes: 1<<20 + 1, Mode: 0o700}, 1<<20 + page},
		{"no size is the kernel default", mountutil.TmpfsOptions{Mode: 0o755}, 0},
	}
	m := mountutil.New()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := mkdir(t, filepath.Join(mounttest.TempDir(t), "tmpfs"))
			if err := m.MountTmpfs(dir, tc.opts); err != nil {
				t.Fatal(err)
			}
			mi := mounttest.MountAt(t, dir)
			if mi.FSType != "tmpfs" {
				t.Errorf("fstype %q, want tmpfs", mi.FSType)
			}
			for _, o := range []string{"nosuid", "nodev", "rw"} {
				if !mi.HasOption(o) {
					t.Errorf("mount options %v lack %s", mi.Options, o)
				}
			}
			if mode, _ := mi.SuperOption("mode"); mode != strconv.FormatUint(uint64(tc.opts.Mode.Perm()), 8) {
				t.Errorf("mountinfo mode=%s, want %o", mode, tc.opts.Mode.Perm())
			}
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != tc.opts.Mode.Perm() {
				t.Errorf("root directory mode %o, want %o", fi.Mode().Perm(), tc.opts.Mode.Perm())
			}
			var st unix.Statfs_t
			if err := unix.Statfs(dir, &st); err != nil {
				t.Fatal(err)
			}
			if st.Type != unix.TMPFS_MAGIC {
				t.Errorf("statfs type %#x, want tmpfs", st.Type)
			}
			size := int64(st.Blocks) * st.Bsize
			if tc.wantSize != 0 && size != tc.wantSize {
				t.Errorf("statfs size %d, want %d", size, tc.wantSize)
			}
			if tc.wantSize == 0 && size <= 8<<20 {
				t.Errorf("statfs size %d: the kernel default should be half the RAM", size)
			}
			if tc.wantSize != 0 {
				if v, _ := mi.SuperOption("size"); v != strconv.FormatInt(tc.wantSize>>10, 10)+"k" {
					t.Errorf("mountinfo size=%s, want %dk", v, tc.wantSize>>10)
				}
			}
		})
	}
}

func TestMountTmpfsNoSwapAndResize(t *testing.T) {
	mounttest.RequireRoot(t)
	m := mountutil.New()
	dir := mkdir(t, filepath.Join(mounttest.TempDir(t), "tmpfs"))
	if err := m.MountTmpfs(dir, mountutil.TmpfsOptions{SizeBytes: 1 << 20, Mode: 0o755, NoSwap: true}); err != nil {
		t.Fatal(err)
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	if mi := mounttest.MountAt(t, dir); !slices.Contains(mi.SuperOptions, "noswap") {
		t.Logf("kernel %s did not take noswap (needs 6.4+): super options %v", unix.ByteSliceToString(uts.Release[:]), mi.SuperOptions)
	}
	mounttest.WriteFile(t, filepath.Join(dir, "keep"), "data")
	if err := m.MountTmpfs(dir, mountutil.TmpfsOptions{SizeBytes: 4 << 20, Resize: true}); err != nil {
		t.Fatal(err)
	}
	if got := mounttest.FSSize(t, dir); got != 4<<20 {
		t.Errorf("size after resize %d, want %d", got, 4<<20)
	}
	if got := mounttest.ReadFile(t, filepath.Join(dir, "keep")); got != "data" {
		t.Errorf("resizing lost the content: %q", got)
	}
	if n := len(mounttest.MountsAt(t, dir)); n != 1 {
		t.Errorf("%d mounts at the directory after a resize, want 1", n)
	}
}

func TestMountTmpfsMissingTarget(t *testing.T) {
	mounttest.RequireRoot(t)
	missing := filepath.Join(mounttest.TempDir(t), "missing")
	err := mountutil.New().MountTmpfs(missing, mountutil.TmpfsOptions{Mode: 0o777})
	if !errors.Is(err, unix.ENOENT) {
		t.Fatalf("MountTmpfs on a missing directory: %v, want ENOENT", err)
	}
}

// bindFixture is a source directory holding a file and a tmpfs submount
// holding another file, and an empty target directory.
type bindFixture struct {
	src, sub, target string
}

func newBindFixture(t *testing.T) bindFixture {
	t.Helper()
	tmp := mounttest.TempDir(t)
	f := bindFixture{
		src:    mkdir(t, filepath.Join(tmp, "src")),
		sub:    mkdir(t, filepath.Join(tmp, "src", "sub")),
		target: mkdir(t, filepath.Join(tmp, "target")),
	}
	mounttest.WriteFile(t, filepath.Join(f.src, "top.txt"), "top")
	mounttest.MountTmpfs(t, f.sub)
	mounttest.WriteFile(t, filepath.Join(f.sub, "inner.txt"), "inner")
	return f
}

func TestBindMount(t *testing.T) {
	mounttest.RequireRoot(t)
	tests := []struct {
		name string
		opts mountutil.BindOptions
		// subVisible: the submount's content shows through the target.
		subVisible bool
	}{
		{"plain", mountutil.BindOptions{}, false},
		{"read-only", mountutil.BindOptions{ReadOnly: true}, false},
		{"recursive", mountutil.BindOptions{Recursive: true}, true},
		{"recursive read-only", mountutil.BindOptions{Recursive: true, ReadOnly: true}, true},
		{"noexec", mountutil.BindOptions{Flags: unix.MS_NOEXEC}, false},
		{"recursive read-only nosuid", mountutil.BindOptions{Recursive: true, ReadOnly: true, Flags: unix.MS_NOSUID}, true},
	}
	m := mountutil.New()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newBindFixture(t)
			if err := m.BindMount(f.src, f.target, tc.opts); err != nil {
				t.Fatal(err)
			}
			top := mounttest.MountAt(t, f.target)
			if got := mounttest.ReadFile(t, filepath.Join(f.target, "top.txt")); got != "top" {
				t.Errorf("top.txt through the bind mount: %q", got)
			}
			_, err := os.Stat(filepath.Join(f.target, "sub", "inner.txt"))
			if visible := err == nil; visible != tc.subVisible {
				t.Errorf("submount content visible through the bind mount: %v, want %v (%v)", visible, tc.subVisible, err)
			}

			if tc.opts.ReadOnly {
				if !top.HasOption("ro") {
					t.Errorf("mount options %v lack ro", top.Options)
				}
				if err := writeErr(f.target); !errors.Is(err, unix.EROFS) {
					t.Errorf("writing through a read-only bind mount: %v, want EROFS", err)
				}
				if err := os.Remove(filepath.Join(f.target, "top.txt")); !errors.Is(err, unix.EROFS) {
					t.Errorf("removing through a read-only bind mount: %v, want EROFS", err)
				}
			} else if err := writeErr(f.target); err != nil {
				t.Errorf("writing through a read-write bind mount: %v", err)
			}
			if tc.opts.ReadOnly && tc.subVisible {
				if err := writeErr(filepath.Join(f.target, "sub")); !errors.Is(err, unix.EROFS) {
					t.Errorf("writing into a submount of a recursive read-only bind mount: %v, want EROFS", err)
				}
				sub := mounttest.MountAt(t, filepath.Join(f.target, "sub"))
				if !sub.HasOption("ro") {
					t.Errorf("submount options %v lack ro", sub.Options)
				}
			}
			if tc.opts.Flags&unix.MS_NOEXEC != 0 && !top.HasOption("noexec") {
				t.Errorf("mount options %v lack noexec", top.Options)
			}
			if tc.opts.Flags&unix.MS_NOSUID != 0 && !top.HasOption("nosuid") {
				t.Errorf("mount options %v lack nosuid", top.Options)
			}
			// The source itself stays writable, submount included.
			if err := writeErr(f.src); err != nil {
				t.Errorf("source became unwritable: %v", err)
			}
			if err := writeErr(f.sub); err != nil {
				t.Errorf("source submount became unwritable: %v", err)
			}
		})
	}
}

// A read-only bind of a source that is itself mounted nosuid,nodev (tmpfs
// as the agent mounts it) must repeat the locked flags or the kernel
// refuses the remount.
func TestBindMountReadOnlyOfLockedSource(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	src := mkdir(t, filepath.Join(tmp, "src"))
	target := mkdir(t, filepath.Join(tmp, "target"))
	m := mountutil.New()
	if err := m.MountTmpfs(src, mountutil.TmpfsOptions{SizeBytes: 1 << 20, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if err := m.BindMount(src, target, mountutil.BindOptions{ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	if err := writeErr(target); !errors.Is(err, unix.EROFS) {
		t.Errorf("write: %v, want EROFS", err)
	}
	if err := writeErr(src); err != nil {
		t.Errorf("source: %v", err)
	}
}

func TestBindMountFile(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	src := filepath.Join(tmp, "src.txt")
	target := filepath.Join(tmp, "target.txt")
	mounttest.WriteFile(t, src, "hello")
	mounttest.WriteFile(t, target, "")
	m := mountutil.New()
	if err := m.BindMount(src, target, mountutil.BindOptions{ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	if got := mounttest.ReadFile(t, target); got != "hello" {
		t.Errorf("target content %q", got)
	}
	if err := os.WriteFile(target, []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("writing a read-only bind-mounted file: %v, want EROFS", err)
	}
	if ok, err := m.IsMountPoint(target); err != nil || !ok {
		t.Errorf("IsMountPoint(bind-mounted file) = %v, %v", ok, err)
	}
}

func TestBindMountMissingSource(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	target := mkdir(t, filepath.Join(tmp, "target"))
	err := mountutil.New().BindMount(filepath.Join(tmp, "missing"), target, mountutil.BindOptions{ReadOnly: true})
	if !errors.Is(err, unix.ENOENT) {
		t.Errorf("bind of a missing source: %v, want ENOENT", err)
	}
	if ms := mounttest.MountsAt(t, target); len(ms) != 0 {
		t.Errorf("mounts left at target: %+v", ms)
	}
}

func TestUnmountNotMounted(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	plain := mkdir(t, filepath.Join(tmp, "plain"))
	file := filepath.Join(tmp, "file")
	mounttest.WriteFile(t, file, "x")
	m := mountutil.New()
	for _, path := range []string{plain, file, filepath.Join(tmp, "missing"), filepath.Join(tmp, "missing", "deeper")} {
		if err := m.Unmount(path); err != nil {
			t.Errorf("Unmount(%s) = %v, want nil", path, err)
		}
		if err := m.UnmountAll(path); err != nil {
			t.Errorf("UnmountAll(%s) = %v, want nil", path, err)
		}
	}
	if _, err := os.Stat(plain); err != nil {
		t.Errorf("unmounting a plain directory touched it: %v", err)
	}
}

func TestUnmount(t *testing.T) {
	mounttest.RequireRoot(t)
	dir := mkdir(t, filepath.Join(mounttest.TempDir(t), "d"))
	m := mountutil.New()
	if err := m.MountTmpfs(dir, mountutil.TmpfsOptions{SizeBytes: 1 << 20, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(dir); err != nil {
		t.Fatal(err)
	}
	if ms := mounttest.MountsAt(t, dir); len(ms) != 0 {
		t.Errorf("still mounted: %+v", ms)
	}
	if err := m.Unmount(dir); err != nil {
		t.Errorf("second Unmount: %v", err)
	}
}

func TestUnmountAllPeelsStackedMounts(t *testing.T) {
	mounttest.RequireRoot(t)
	for _, n := range []int{1, 2, 5} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			tmp := mounttest.TempDir(t)
			dir := mkdir(t, filepath.Join(tmp, "d"))
			src := mkdir(t, filepath.Join(tmp, "src"))
			m := mountutil.New()
			for i := range n {
				var err error
				if i%2 == 0 {
					err = m.MountTmpfs(dir, mountutil.TmpfsOptions{SizeBytes: 1 << 20, Mode: 0o755})
				} else {
					err = m.BindMount(src, dir, mountutil.BindOptions{})
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := len(mounttest.MountsAt(t, dir)); got != n {
				t.Fatalf("%d mounts stacked, want %d", got, n)
			}
			if err := m.UnmountAll(dir); err != nil {
				t.Fatal(err)
			}
			if ms := mounttest.MountsAt(t, dir); len(ms) != 0 {
				t.Errorf("mounts left: %+v", ms)
			}
			if ok, err := m.IsMountPoint(dir); err != nil || ok {
				t.Errorf("IsMountPoint after UnmountAll = %v, %v", ok, err)
			}
		})
	}
}

func TestIsMountPoint(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	m := mountutil.New()
	src := mkdir(t, filepath.Join(tmp, "src"))
	mkdir(t, filepath.Join(src, "child"))
	bind := mkdir(t, filepath.Join(tmp, "bind"))
	if err := m.BindMount(src, bind, mountutil.BindOptions{}); err != nil {
		t.Fatal(err)
	}
	// A bind mount of a subdirectory onto a sibling of the same
	// filesystem: same device, so only the mount table tells.
	selfParent := mkdir(t, filepath.Join(tmp, "self"))
	selfChild := mkdir(t, filepath.Join(selfParent, "child"))
	if err := m.BindMount(selfChild, selfChild, mountutil.BindOptions{}); err != nil {
		t.Fatal(err)
	}
	tmpfs := mkdir(t, filepath.Join(tmp, "tmpfs"))
	if err := m.MountTmpfs(tmpfs, mountutil.TmpfsOptions{SizeBytes: 1 << 20, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(tmp, "file")
	mounttest.WriteFile(t, file, "")

	tests := []struct {
		path string
		want bool
	}{
		{bind, true},
		{selfChild, true},
		{tmpfs, true},
		{filepath.Join(bind, "child"), false},
		{src, false},
		{selfParent, false},
		{file, false},
		{filepath.Join(tmp, "missing"), false},
	}
	for _, tc := range tests {
		got, err := m.IsMountPoint(tc.path)
		if err != nil || got != tc.want {
			t.Errorf("IsMountPoint(%s) = %v, %v; want %v", tc.path, got, err, tc.want)
		}
	}
}

func TestEnsureDir(t *testing.T) {
	tmp := t.TempDir()
	old := unix.Umask(0o022)
	defer unix.Umask(old)
	existing := mkdir(t, filepath.Join(tmp, "existing"))
	tests := []struct {
		name        string
		path        string
		mode        os.FileMode
		wantCreated bool
		wantMode    os.FileMode
	}{
		{"new", filepath.Join(tmp, "new"), 0o750, true, 0o750},
		{"new with missing parents", filepath.Join(tmp, "a", "b", "c"), 0o700, true, 0o700},
		{"existing keeps its mode", existing, 0o700, false, 0o755},
		{"umask applies", filepath.Join(tmp, "umask"), 0o777, true, 0o755},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			created, err := mountutil.EnsureDir(tc.path, tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			if created != tc.wantCreated {
				t.Errorf("created = %v, want %v", created, tc.wantCreated)
			}
			fi, err := os.Stat(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if !fi.IsDir() || fi.Mode().Perm() != tc.wantMode {
				t.Errorf("mode %v, want directory %o", fi.Mode(), tc.wantMode)
			}
			created, err = mountutil.EnsureDir(tc.path, tc.mode)
			if err != nil || created {
				t.Errorf("second EnsureDir = %v, %v; want false, nil", created, err)
			}
		})
	}
}

// EnsureDir on a mount point reports it as existing, never as created:
// callers skip the mount-point check for created directories.
func TestEnsureDirOnMountPoint(t *testing.T) {
	mounttest.RequireRoot(t)
	dir := mkdir(t, filepath.Join(mounttest.TempDir(t), "d"))
	mounttest.MountTmpfs(t, dir)
	created, err := mountutil.EnsureDir(dir, 0o750)
	if err != nil || created {
		t.Errorf("EnsureDir(mount point) = %v, %v; want false, nil", created, err)
	}
}

func TestRemoveEmptyDirs(t *testing.T) {
	tmp := t.TempDir()
	stop := mkdir(t, filepath.Join(tmp, "stop"))
	leaf := mkdir(t, filepath.Join(stop, "a", "b", "c"))
	mounttest.WriteFile(t, filepath.Join(stop, "a", "keep"), "x")
	mountutil.RemoveEmptyDirs(leaf, stop)
	if _, err := os.Stat(filepath.Join(stop, "a", "b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("empty parent a/b not removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(stop, "a", "keep")); err != nil {
		t.Errorf("non-empty parent touched: %v", err)
	}
	// A sibling directory (what keeps most volume directories' parents
	// in a teardown storm) keeps the parent too.
	sibling := mkdir(t, filepath.Join(stop, "s", "sibling"))
	mountutil.RemoveEmptyDirs(mkdir(t, filepath.Join(stop, "s", "gone")), stop)
	if _, err := os.Stat(sibling); err != nil {
		t.Errorf("sibling directory touched: %v", err)
	}
	if _, err := os.Stat(filepath.Join(stop, "s", "gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("empty directory next to a sibling not removed: %v", err)
	}
	mountutil.RemoveEmptyDirs(sibling, stop)
	if _, err := os.Stat(filepath.Join(stop, "s")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("parent left once its last directory went: %v", err)
	}
	mountutil.RemoveEmptyDirs(mkdir(t, filepath.Join(stop, "x", "y")), stop)
	if _, err := os.Stat(stop); err != nil {
		t.Errorf("stop directory removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(stop, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("x not removed: %v", err)
	}
}

// A recursive bind brings the source's submounts along; the kernel refuses
// to unmount it while they are there (EBUSY), so UnmountAll alone cannot
// undo it, UnmountTree can. With shared propagation (systemd makes / rshared)
// unmounting the copies must not unmount the source's own submount.
func TestUnmountTree(t *testing.T) {
	mounttest.RequireRoot(t)
	for _, shared := range []bool{false, true} {
		name := "private"
		if shared {
			name = "shared"
		}
		t.Run(name, func(t *testing.T) {
			tmp := mounttest.TempDir(t)
			base := mkdir(t, filepath.Join(tmp, "base"))
			target := mkdir(t, filepath.Join(tmp, "target"))
			if shared {
				if err := unix.Mount(base, base, "", unix.MS_BIND, ""); err != nil {
					t.Fatal(err)
				}
				if err := unix.Mount("", base, "", unix.MS_SHARED, ""); err != nil {
					t.Fatal(err)
				}
			}
			src := mkdir(t, filepath.Join(base, "src"))
			sub := mkdir(t, filepath.Join(src, "sub"))
			mounttest.MountTmpfs(t, sub)
			mounttest.WriteFile(t, filepath.Join(sub, "data.txt"), "data")
			m := mountutil.New()
			if err := m.BindMount(src, target, mountutil.BindOptions{Recursive: true, ReadOnly: true}); err != nil {
				t.Fatal(err)
			}
			if err := m.UnmountAll(target); !errors.Is(err, unix.EBUSY) {
				t.Errorf("UnmountAll of a recursive bind with a submount = %v, want EBUSY", err)
			}
			if err := m.UnmountTree(target); err != nil {
				t.Fatal(err)
			}
			if ms := mounttest.MountsUnder(t, target); len(ms) != 0 {
				t.Errorf("mounts left under target: %+v", ms)
			}
			if ms := mounttest.MountsAt(t, sub); len(ms) != 1 {
				t.Errorf("the source's submount was affected: %+v", ms)
			}
			if got := mounttest.ReadFile(t, filepath.Join(sub, "data.txt")); got != "data" {
				t.Errorf("source submount data %q", got)
			}
			if err := m.UnmountTree(target); err != nil {
				t.Errorf("UnmountTree of an unmounted directory: %v", err)
			}
		})
	}
}

// A mount kept busy by an open file is reported, not detached.
func TestUnmountTreeBusy(t *testing.T) {
	mounttest.RequireRoot(t)
	dir := mkdir(t, filepath.Join(mounttest.TempDir(t), "d"))
	m := mountutil.New()
	if err := m.MountTmpfs(dir, mountutil.TmpfsOptions{SizeBytes: 1 << 20, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "open.txt"))
	if err != nil {
		t.Fatal(err)
	}
	err = m.UnmountTree(dir)
	if !errors.Is(err, unix.EBUSY) {
		t.Errorf("UnmountTree with an open file = %v, want EBUSY", err)
	}
	f.Close()
	if err := m.UnmountTree(dir); err != nil {
		t.Errorf("UnmountTree once closed: %v", err)
	}
}

// MountRefs finds the other mount points of a mount and of a bind mount of
// a directory in it, also when the paths hold characters mountinfo
// escapes (a space) or that other parsers split on (\r, U+00A0).
func TestMountRefs(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	m := mountutil.New()
	for _, name := range []string{"plain", "with space", "with\rreturn", "nbsp\u00a0here"} {
		t.Run(name, func(t *testing.T) {
			dir := mkdir(t, filepath.Join(tmp, name))
			global := mkdir(t, filepath.Join(dir, "globalmount"))
			mounttest.MountTmpfs(t, global)
			sub := mkdir(t, filepath.Join(global, "sub"))
			podA := mkdir(t, filepath.Join(dir, "pod a"))
			podB := mkdir(t, filepath.Join(dir, "pod-b"))
			if err := m.BindMount(global, podA, mountutil.BindOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := m.BindMount(sub, podB, mountutil.BindOptions{}); err != nil {
				t.Fatal(err)
			}
			refs, err := m.MountRefs(global)
			if err != nil || len(refs) != 1 || refs[0] != podA {
				t.Errorf("MountRefs(%q) = %q, %v; want [%q]", global, refs, err, podA)
			}
			refs, err = m.MountRefs(sub)
			if err != nil || len(refs) != 1 || refs[0] != podB {
				t.Errorf("MountRefs(%q) = %q, %v; want [%q]", sub, refs, err, podB)
			}
			for _, p := range []string{podB, podA, global} {
				if err := m.UnmountAll(p); err != nil {
					t.Fatal(err)
				}
			}
			if refs, err := m.MountRefs(global); err != nil || len(refs) != 0 {
				t.Errorf("MountRefs of an unmounted directory = %q, %v", refs, err)
			}
		})
	}
}

// Volumes of one pod are set up concurrently and race to create the same
// missing parents: every one must succeed, and each leaf be reported
// created exactly once.
func TestEnsureDirConcurrentSiblings(t *testing.T) {
	base := filepath.Join(t.TempDir(), "pods", "uid", "volumes", "plugin")
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	created := make([]bool, n)
	for i := range n {
		wg.Go(func() {
			created[i], errs[i] = mountutil.EnsureDir(filepath.Join(base, fmt.Sprint("v", i)), 0o750)
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || !created[i] {
			t.Errorf("volume %d: created %v, err %v; want true, nil", i, created[i], errs[i])
		}
	}
}

// A file where a parent directory should be is an error naming it, not a
// loop or a panic.
func TestEnsureDirFileInTheWay(t *testing.T) {
	tmp := t.TempDir()
	if err := os.WriteFile(filepath.Join(tmp, "pod"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := mountutil.EnsureDir(filepath.Join(tmp, "pod", "volumes", "v"), 0o750)
	if !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("err = %v, want ENOTDIR", err)
	}
}

// Sibling volumes torn down at once climb the same directories: a climb
// that finds one gone under it stops, and the one that removed it goes on.
// Whatever the interleaving, nothing empty is left, as with one climb per
// volume after the other, and a directory another volume still holds is
// kept.
func TestRemoveEmptyDirsConcurrentSiblings(t *testing.T) {
	for _, tc := range []struct {
		name string
		keep bool // a volume of another plugin stays
	}{{"all go", false}, {"one stays", true}} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 200 {
				stop := mkdir(t, filepath.Join(t.TempDir(), "pods"))
				plugin := filepath.Join(stop, "uid", "volumes", "plugin")
				var vols []string
				for i := range 4 {
					vols = append(vols, mkdir(t, filepath.Join(plugin, fmt.Sprint("v", i))))
				}
				kept := filepath.Join(stop, "uid", "volumes", "other", "v")
				if tc.keep {
					mkdir(t, kept)
				}
				var wg sync.WaitGroup
				for _, v := range vols {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := unix.Rmdir(v); err != nil {
							t.Error(err)
						}
						mountutil.RemoveEmptyDirs(plugin, stop)
					}()
				}
				wg.Wait()
				if _, err := os.Lstat(plugin); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("round %d: the plugin's directory is left: %v", round, err)
				}
				_, err := os.Lstat(filepath.Join(stop, "uid"))
				if gone := errors.Is(err, os.ErrNotExist); gone == tc.keep {
					t.Fatalf("round %d: pod directory removed: %v, want %v (%v)", round, gone, !tc.keep, err)
				}
				if _, err := os.Lstat(stop); err != nil {
					t.Fatalf("round %d: stop directory: %v", round, err)
				}
			}
		})
	}
}
