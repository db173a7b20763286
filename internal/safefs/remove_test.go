package safefs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/safefs"
)

func removeAll(dir string) error { return safefs.RemoveAll(context.Background(), dir) }

func removeContents(dir string) error { return safefs.RemoveContents(context.Background(), dir) }

func mkdir(t *testing.T, path string) string {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// outside is a directory next to the one being removed, with content that
// must survive whatever is done to the removed one.
func outside(t *testing.T, tmp string) string {
	t.Helper()
	dir := mkdir(t, filepath.Join(tmp, "outside"))
	mounttest.WriteFile(t, filepath.Join(dir, "precious.txt"), "precious")
	mounttest.WriteFile(t, filepath.Join(dir, "sub", "deep.txt"), "deep")
	return dir
}

func checkOutside(t *testing.T, dir string) {
	t.Helper()
	for _, f := range []string{"precious.txt", "sub/deep.txt"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s outside the removed directory is gone: %v", f, err)
		}
	}
}

// tree fills dir with nested directories, files, a FIFO and symbolic links
// to the outside directory and file.
func tree(t *testing.T, dir, out string) {
	t.Helper()
	mounttest.WriteFile(t, filepath.Join(dir, "a.txt"), "a")
	mounttest.WriteFile(t, filepath.Join(dir, "x", "y", "z", "deep.txt"), "deep")
	mounttest.WriteFile(t, filepath.Join(dir, ".hidden"), "h")
	mkdir(t, filepath.Join(dir, "empty"))
	if err := unix.Mkfifo(filepath.Join(dir, "x", "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"link-dir":           out,
		"x/y/link-file":      filepath.Join(out, "precious.txt"),
		"x/link-sub":         filepath.Join(out, "sub"),
		"relative-link":      "../outside",
		"dangling":           filepath.Join(out, "nothing"),
		"x/y/z/link-to-self": ".",
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	// Unwritable directories do not stop root.
	if os.Geteuid() == 0 {
		if err := os.Chmod(filepath.Join(dir, "x", "y"), 0o500); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRemoveAll(t *testing.T) {
	tmp := t.TempDir()
	out := outside(t, tmp)
	dir := mkdir(t, filepath.Join(tmp, "victim"))
	tree(t, dir, out)
	if err := removeAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory still there: %v", err)
	}
	checkOutside(t, out)
}

func TestRemoveAllMissingAndEmpty(t *testing.T) {
	tmp := t.TempDir()
	if err := removeAll(filepath.Join(tmp, "missing")); err != nil {
		t.Errorf("RemoveAll(missing) = %v", err)
	}
	if err := removeContents(filepath.Join(tmp, "missing")); err != nil {
		t.Errorf("RemoveContents(missing) = %v", err)
	}
	empty := mkdir(t, filepath.Join(tmp, "empty"))
	if err := removeAll(empty); err != nil {
		t.Errorf("RemoveAll(empty) = %v", err)
	}
	if _, err := os.Lstat(empty); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("empty directory still there: %v", err)
	}
}

func TestRemoveContents(t *testing.T) {
	tmp := t.TempDir()
	out := outside(t, tmp)
	dir := mkdir(t, filepath.Join(tmp, "victim"))
	tree(t, dir, out)
	if err := removeContents(dir); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("directory itself must stay: %v", err)
	}
	if len(entries) != 0 {
		t.Errorf("entries left: %v", entries)
	}
	checkOutside(t, out)
}

// The directory to remove is itself a symbolic link: nothing it points to
// may be touched.
func TestRemoveThroughSymlinkRefused(t *testing.T) {
	tmp := t.TempDir()
	out := outside(t, tmp)
	link := filepath.Join(tmp, "link")
	if err := os.Symlink(out, link); err != nil {
		t.Fatal(err)
	}
	if err := removeContents(link); err == nil {
		t.Error("RemoveContents(symlink) succeeded")
	}
	if err := removeAll(link); err == nil {
		t.Error("RemoveAll(symlink) succeeded")
	}
	checkOutside(t, out)
}

func TestRemoveRefusesMountPointInside(t *testing.T) {
	mounttest.RequireRoot(t)
	tests := []struct {
		name string
		// mount mounts something at target.
		mount func(t *testing.T, target, tmp string)
	}{
		{"tmpfs", func(t *testing.T, target, _ string) { mounttest.MountTmpfs(t, target) }},
		{"bind mount of the same filesystem", func(t *testing.T, target, tmp string) {
			src := mkdir(t, filepath.Join(tmp, "bind-src"))
			if err := mountutil.New().BindMount(src, target, mountutil.BindOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory bind-mounted onto itself", func(t *testing.T, target, _ string) {
			if err := mountutil.New().BindMount(target, target, mountutil.BindOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		for _, remove := range []struct {
			name string
			fn   func(string) error
		}{{"RemoveAll", removeAll}, {"RemoveContents", removeContents}} {
			t.Run(tc.name+"/"+remove.name, func(t *testing.T) {
				tmp := mounttest.TempDir(t)
				out := outside(t, tmp)
				dir := mkdir(t, filepath.Join(tmp, "victim"))
				tree(t, dir, out)
				mnt := mkdir(t, filepath.Join(dir, "nested", "mnt"))
				tc.mount(t, mnt, tmp)
				mounttest.WriteFile(t, filepath.Join(mnt, "mounted-data.txt"), "data")
				mounttest.WriteFile(t, filepath.Join(mnt, "d", "more.txt"), "more")

				err := remove.fn(dir)
				if !errors.Is(err, safefs.ErrMountPointInside) {
					t.Fatalf("%s = %v, want ErrMountPointInside", remove.name, err)
				}
				if err != nil && !strings.Contains(err.Error(), mnt) {
					t.Errorf("error %q does not name the mount point %s", err, mnt)
				}
				for _, f := range []string{"mounted-data.txt", "d/more.txt"} {
					if _, err := os.Stat(filepath.Join(mnt, f)); err != nil {
						t.Errorf("data on the mount inside was deleted: %v", err)
					}
				}
				if ms := mounttest.MountsAt(t, mnt); len(ms) != 1 {
					t.Errorf("the mount inside changed: %+v", ms)
				}
				checkOutside(t, out)
				// Everything else is gone: only the path to the mount point
				// remains.
				if got := remaining(t, dir, mnt); len(got) != 2 || got[0] != "nested" || got[1] != "nested/mnt" {
					t.Errorf("left behind: %v, want only nested and nested/mnt", got)
				}
			})
		}
	}
}

// remaining lists the paths under dir, relative, not descending into stop.
func remaining(t *testing.T, dir, stop string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		out = append(out, rel)
		if path == stop {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// A file bind-mounted inside cannot be unlinked: removal fails and the
// file's source keeps its content.
func TestRemoveFileMountPointInside(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	src := filepath.Join(tmp, "src.txt")
	mounttest.WriteFile(t, src, "precious")
	dir := mkdir(t, filepath.Join(tmp, "victim"))
	target := filepath.Join(dir, "sub", "file")
	mounttest.WriteFile(t, target, "")
	mounttest.WriteFile(t, filepath.Join(dir, "other"), "x")
	if err := mountutil.New().BindMount(src, target, mountutil.BindOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := removeAll(dir); err == nil {
		t.Fatal("RemoveAll succeeded with a file mount point inside")
	}
	if got := mounttest.ReadFile(t, src); got != "precious" {
		t.Errorf("source file content %q", got)
	}
	if got := mounttest.ReadFile(t, target); got != "precious" {
		t.Errorf("mounted file content %q", got)
	}
	if _, err := os.Lstat(filepath.Join(dir, "other")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sibling not removed: %v", err)
	}
}

// RemoveAll of a directory that is itself a mount point must not empty the
// mounted filesystem: callers unmount first, and a mount still there is
// someone's data.
func TestRemoveAllOfMountPoint(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	dir := mkdir(t, filepath.Join(tmp, "mnt"))
	mounttest.MountTmpfs(t, dir)
	mounttest.WriteFile(t, filepath.Join(dir, "data.txt"), "data")
	if err := removeAll(dir); err == nil {
		t.Error("RemoveAll of a mount point succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "data.txt")); err != nil {
		t.Errorf("data on the mount was deleted: %v", err)
	}
}

// RemoveAllAt removes one entry of an open directory, whatever it is,
// with RemoveAll's guarantees: a link is removed, not followed; a tree is
// removed without leaving it; a mount point (the entry or inside it) is
// left with its data.
func TestRemoveAllAt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		root    bool
		make    func(t *testing.T, entry, out string)
		wantErr error
		gone    bool
		// data, below the entry, is on a mount and must stay.
		data string
	}{
		{"missing", false, func(*testing.T, string, string) {}, nil, true, ""},
		{"file", false, func(t *testing.T, entry, _ string) { mounttest.WriteFile(t, entry, "x") }, nil, true, ""},
		{"link to a directory outside", false, func(t *testing.T, entry, out string) {
			if err := os.Symlink(out, entry); err != nil {
				t.Fatal(err)
			}
		}, nil, true, ""},
		{"empty directory", false, func(t *testing.T, entry, _ string) { mkdir(t, entry) }, nil, true, ""},
		{"tree", false, func(t *testing.T, entry, out string) { tree(t, mkdir(t, entry), out) }, nil, true, ""},
		{"mount point", true, func(t *testing.T, entry, _ string) {
			mounttest.MountTmpfs(t, mkdir(t, entry))
			mounttest.WriteFile(t, filepath.Join(entry, "data.txt"), "data")
		}, safefs.ErrMountPointInside, false, "data.txt"},
		{"mount point inside", true, func(t *testing.T, entry, _ string) {
			mounttest.MountTmpfs(t, mkdir(t, filepath.Join(entry, "sub")))
			mounttest.WriteFile(t, filepath.Join(entry, "sub", "data.txt"), "data")
		}, safefs.ErrMountPointInside, false, "sub/data.txt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root {
				mounttest.RequireRoot(t)
			}
			tmp := mounttest.TempDir(t)
			out := outside(t, tmp)
			parent := mkdir(t, filepath.Join(tmp, "parent"))
			entry := filepath.Join(parent, "entry")
			tc.make(t, entry, out)
			dfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(dfd)
			err = safefs.RemoveAllAt(context.Background(), dfd, "entry", entry)
			if (tc.wantErr == nil && err != nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("RemoveAllAt = %v, want %v", err, tc.wantErr)
			}
			_, err = os.Lstat(entry)
			if gone := errors.Is(err, os.ErrNotExist); gone != tc.gone {
				t.Errorf("entry gone: %v, want %v", gone, tc.gone)
			}
			if tc.data != "" {
				if _, err := os.Stat(filepath.Join(entry, tc.data)); err != nil {
					t.Errorf("data on the mount was deleted: %v", err)
				}
			}
			checkOutside(t, out)
		})
	}
}
