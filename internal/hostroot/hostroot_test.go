package hostroot_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/hostroot"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// hostTree is a node's file system below a temporary root: absolute and
// relative links, links that try to climb above the root, a loop.
func hostTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, "a", "b"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "a", "b", "file"), []byte("node"), 0o644))
	must(t, os.Symlink("/a", filepath.Join(root, "abs")))
	must(t, os.Symlink("b", filepath.Join(root, "a", "rel")))
	must(t, os.Symlink("../../../..", filepath.Join(root, "a", "up")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(root, "passwd")))
	must(t, os.Symlink("loop", filepath.Join(root, "loop")))
	return root
}

func TestResolve(t *testing.T) {
	root := hostTree(t)
	r := hostroot.New(root)
	for in, want := range map[string]string{
		"/abs/rel":       "/a/b",
		"/a/up/a/b":      "/a/b",
		"/abs/../abs/b":  "/a/b",
		"/a/up/../../..": "/",
		"/passwd":        "/etc/passwd", // the node's, not the agent's
		"/a/nothing/x":   "/a/nothing/x",
		"abs/rel":        "/a/b",
	} {
		got, err := r.Resolve(in)
		if err != nil || got != filepath.Join(root, want) {
			t.Errorf("Resolve(%s) = %q, %v; want %q", in, got, err, filepath.Join(root, want))
		}
	}
	if _, err := r.Resolve("/loop"); err == nil {
		t.Error("a link loop resolves")
	}
	for in, want := range map[string]string{
		"/abs/rel": "/a/rel", // the entry itself, link or not
		"/passwd":  "/passwd",
		"/":        "",
	} {
		got, err := r.ResolveParent(in)
		if err != nil || got != filepath.Join(root, want) {
			t.Errorf("ResolveParent(%s) = %q, %v; want %q", in, got, err, filepath.Join(root, want))
		}
	}
}

func TestOpenStaysInTheRoot(t *testing.T) {
	root := hostTree(t)
	r := hostroot.New(root)
	for _, p := range []string{"/abs/rel/file", "/a/up/a/b/file", "/a/up/abs/b/file"} {
		f, err := r.Open(p)
		if err != nil {
			t.Errorf("Open(%s): %v", p, err)
			continue
		}
		got, _ := os.Readlink(hostroot.FDPath(f))
		f.Close()
		if want := filepath.Join(root, "a", "b", "file"); got != want {
			t.Errorf("Open(%s) holds %s, want %s", p, got, want)
		}
	}
	if _, err := r.Open("/passwd"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(/passwd) = %v, want not found (the node has no /etc/passwd)", err)
	}
	if _, err := r.Open("/loop"); err == nil {
		t.Error("a link loop opens")
	}
}

func TestMkdirAllAndCreateFileStayInTheRoot(t *testing.T) {
	root := hostTree(t)
	r := hostroot.New(root)
	// /abs is a link to the node's /a: the directory is made there.
	f, err := r.MkdirAll("/abs/new/dir", 0o755)
	must(t, err)
	f.Close()
	if fi, err := os.Stat(filepath.Join(root, "a", "new", "dir")); err != nil || !fi.IsDir() {
		t.Errorf("not made below the root: %v", err)
	}
	must(t, r.CreateFile("/abs/b/created", 0o600))
	if fi, err := os.Lstat(filepath.Join(root, "a", "b", "created")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("file not made below the root: %v", err)
	}
	// Something already there is left alone, a link included.
	must(t, r.CreateFile("/passwd", 0o600))
	if fi, err := os.Lstat(filepath.Join(root, "passwd")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v", err)
	}
	// The parent must exist.
	if err := r.CreateFile("/nothing/file", 0o600); !errors.Is(err, unix.ENOENT) {
		t.Errorf("CreateFile without a parent = %v, want ENOENT", err)
	}
}
