package pathcall

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// tree makes, under root, the paths the cases name: directories (one with
// a subdirectory), a file, a symlink to a directory, and a directory
// whose path is longer than the stack buffer.
func tree(t *testing.T, root string) (long string) {
	t.Helper()
	long = filepath.Join(root, strings.Repeat("l", 200), strings.Repeat("m", 100))
	for _, d := range []string{"empty", "parent/child", long} {
		if err := os.MkdirAll(filepath.Join(root, strings.TrimPrefix(d, root)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("parent", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	return long
}

var names = []string{"empty", "empty/", "parent", "parent/child", "file", "link", "link/", "missing", "file/x", "bad\x00name", ""}

// paths are the cases' paths under root (the empty name: the empty path).
func paths(root, long string) []string {
	out := []string{long, long + "/missing", strings.Repeat("/", bufLen+10) + root, ""}
	for _, n := range names[:len(names)-1] {
		out = append(out, root+"/"+n)
	}
	return out
}

// Each call answers what unix's does, on the same kind of path: the
// oracle runs on a twin tree, as rmdir changes it.
func TestLikeUnix(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	longA, longB := tree(t, a), tree(t, b)
	pa, pb := paths(a, longA), paths(b, longB)
	for i := range pa {
		dir, nlink, err := Links(pa[i])
		var st unix.Stat_t
		werr := unix.Lstat(pb[i], &st)
		wdir, wnlink := werr == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR, uint64(0)
		if werr == nil {
			wnlink = uint64(st.Nlink)
		}
		if dir != wdir || nlink != wnlink || !sameErr(err, werr) {
			t.Errorf("Links(%q) = %v, %d, %v; lstat says %v, %d, %v", pa[i], dir, nlink, err, wdir, wnlink, werr)
		}
		if err, werr := Unmount(pa[i], 0), unix.Unmount(pb[i], 0); !sameErr(err, werr) {
			t.Errorf("Unmount(%q) = %v, unix says %v", pa[i], err, werr)
		}
		// The path itself (there, or below a missing or a file), then a
		// new sibling, made in both trees alike (the empty path has none:
		// both trees share the working directory).
		for _, suffix := range []string{"", ".new"} {
			if suffix != "" && pa[i] == "" {
				continue
			}
			if err, werr := Mkdir(pa[i]+suffix, 0o750), unix.Mkdir(pb[i]+suffix, 0o750); !sameErr(err, werr) {
				t.Errorf("Mkdir(%q) = %v, unix says %v", pa[i]+suffix, err, werr)
			}
		}
	}
	for i := range pa { // last: it removes what it can
		if err, werr := Rmdir(pa[i]), unix.Rmdir(pb[i]); !sameErr(err, werr) {
			t.Errorf("Rmdir(%q) = %v, unix says %v", pa[i], err, werr)
		}
		_, errA := os.Lstat(pa[i])
		_, errB := os.Lstat(pb[i])
		if (errA == nil) != (errB == nil) {
			t.Errorf("after Rmdir(%q) it exists: %v, after unix's: %v", pa[i], errA == nil, errB == nil)
		}
	}
}

// A real mount goes, and a second unmount finds none.
func TestUnmountsAMount(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
		t.Skipf("cannot mount here: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := Unmount(dir, 0); err != nil {
		t.Fatalf("Unmount of a tmpfs: %v", err)
	}
	if err := Unmount(dir, 0); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("a second Unmount: %v, want EINVAL", err)
	}
}

func sameErr(a, b error) bool {
	var ea, eb unix.Errno
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return errors.As(a, &ea) && errors.As(b, &eb) && ea == eb
}

// The calls allocate nothing for a path of the usual length.
func TestNoAllocations(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	below := filepath.Join(missing, "below")
	if n := testing.AllocsPerRun(100, func() {
		_, _, _ = Links(dir)
		_ = Rmdir(missing)
		_ = Unmount(missing, 0)
		_ = Mkdir(below, 0o750)
	}); n != 0 {
		t.Errorf("%v allocations", n)
	}
}
