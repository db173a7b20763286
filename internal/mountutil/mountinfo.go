package mountutil

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// The mount table. The kernel separates the fields of a mountinfo line with
// single spaces and escapes only space, tab, newline and backslash in paths,
// so a path may hold any other byte, other white space included (\r, \v,
// \f, U+00A0...). k8s.io/mount-utils splits lines on every kind of white
// space and so misreads such a line (FuzzMountInfoPath found it);
// github.com/moby/sys/mountinfo splits on spaces only and decodes the
// escapes.

// mountInfoPath is the table read; tests replace it.
var mountInfoPath = "/proc/self/mountinfo"

// Mount is one line of the mount table, paths decoded.
type Mount = mountinfo.Info

// ReadMountInfo returns the agent's mount table in the kernel's order
// (a mount after the mounts it covers).
func ReadMountInfo() ([]*Mount, error) {
	f, err := os.Open(mountInfoPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return mountinfo.GetMountsFromReader(f, nil)
}

// mountRefs lists the other mount points of the mount (or bind mount of a
// directory) at path: the mounts with the same filesystem and root.
func mountRefs(path string) ([]string, error) {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	mounts, err := ReadMountInfo()
	if err != nil {
		return nil, err
	}
	var self *Mount
	root := ""
	// The last mount at or above path is the one it is on.
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if rel, ok := within(path, m.Mountpoint); ok {
			self, root = m, filepath.Join(m.Root, rel)
			break
		}
	}
	if self == nil {
		return nil, &os.PathError{Op: "find mount", Path: path, Err: os.ErrNotExist}
	}
	var refs []string
	for _, m := range mounts {
		if m.ID != self.ID && m.Root == root && m.Major == self.Major && m.Minor == self.Minor {
			refs = append(refs, m.Mountpoint)
		}
	}
	return refs, nil
}

// within reports whether path is dir or below it, and the rest of path.
func within(path, dir string) (string, bool) {
	if path == dir {
		return "/", true
	}
	prefix := strings.TrimSuffix(dir, "/") + "/"
	if rest, ok := strings.CutPrefix(path, prefix); ok {
		return "/" + rest, true
	}
	return "", false
}
