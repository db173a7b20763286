// Package hostroot resolves the node's paths (hostPath volumes, local
// PersistentVolumes, local volume discovery directories) where the agent
// sees the node's root filesystem: "/" on the host, --host-root (e.g.
// /host) in a container. Every symbolic link is resolved the way the node
// would resolve it — an absolute target starts again at the host root, ".."
// never climbs above it — so a link such as /var/run -> /run never leads
// into the agent's own container. Opening and creating is done on file
// descriptors (filepath-securejoin's pathrs-lite: openat2 RESOLVE_IN_ROOT
// where the kernel has it), so a link swapped in between two steps cannot
// lead out either; Open's handle is then used through FDPath.
package hostroot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	securejoin "github.com/cyphar/filepath-securejoin"
	pathrs "github.com/cyphar/filepath-securejoin/pathrs-lite"
	"golang.org/x/sys/unix"
)

// Root is where the node's root filesystem is visible to the agent.
type Root struct{ dir string }

// New returns the root at dir ("" means "/").
func New(dir string) Root {
	if dir == "" {
		dir = "/"
	}
	return Root{dir: filepath.Clean(dir)}
}

// Dir is the root's directory.
func (r Root) Dir() string { return r.dir }

// Open opens the node's path p, resolving every symbolic link within the
// root, and returns an O_PATH handle: it can be stat'ed (f.Stat), used as the
// source of a bind mount (FDPath) or as the directory of *at calls, but
// never reads or writes, so opening a FIFO or a device has no effect.
func (r Root) Open(p string) (*os.File, error) {
	f, err := pathrs.OpenInRoot(r.dir, p)
	if err != nil {
		return nil, r.wrap("open", p, err)
	}
	return f, nil
}

// MkdirAll creates the node's directory p and its missing parents with
// mode, within the root, and returns an O_PATH handle of it. An existing
// directory (or a link resolving to one within the root) is fine.
func (r Root) MkdirAll(p string, mode os.FileMode) (*os.File, error) {
	root, err := os.OpenFile(r.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	f, err := pathrs.MkdirAllHandle(root, p, mode)
	if err != nil {
		return nil, r.wrap("mkdir", p, err)
	}
	return f, nil
}

// CreateFile creates the node's regular file p (empty, with mode) unless
// something is there already; its parent must exist. It never creates
// through a symbolic link at p: what is there is left as it is.
func (r Root) CreateFile(p string, mode os.FileMode) error {
	parent, err := r.Open(filepath.Dir(p))
	if err != nil {
		return err
	}
	defer parent.Close()
	fd, err := unix.Openat(int(parent.Fd()), filepath.Base(p), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return r.wrap("create", p, err)
	}
	return unix.Close(fd)
}

// Resolve returns where the node's path p, every symbolic link resolved
// within the root, is visible to the agent (missing components are
// joined as they are). It is for paths handed to other programs (mkfs,
// mount(8), e2fsck) or listed: between Resolve and their use the tree may
// change, so use Open where a descriptor will do.
func (r Root) Resolve(p string) (string, error) {
	return securejoin.SecureJoin(r.dir, p)
}

// ResolveParent is Resolve for p's parent with p's last element joined
// as it is: for looking at an entry itself (lstat), link or not.
func (r Root) ResolveParent(p string) (string, error) {
	p = filepath.Clean("/" + p)
	if p == "/" {
		return r.dir, nil
	}
	parent, err := r.Resolve(filepath.Dir(p))
	if err != nil {
		return "", err
	}
	return filepath.Join(parent, filepath.Base(p)), nil
}

// wrap names the node's path (not the agent's view of it) in an error, as
// users wrote it.
func (r Root) wrap(op, p string, err error) error {
	// The resolver's errors nest path errors (its own, then the
	// syscall's), each repeating the path: the errno alone says why.
	var errno unix.Errno
	if errors.As(err, &errno) {
		err = errno
	} else {
		for pe := (*os.PathError)(nil); errors.As(err, &pe); {
			err = pe.Err
		}
	}
	if r.dir == "/" {
		return &os.PathError{Op: op, Path: p, Err: err}
	}
	return &os.PathError{Op: op, Path: p, Err: fmt.Errorf("%w (below host root %s)", err, r.dir)}
}

// FDPath is a path naming exactly the file f holds, whatever happens to
// its name meanwhile: the source for mount(2) of a file opened with Open.
func FDPath(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }
