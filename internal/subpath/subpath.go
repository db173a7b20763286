// Package subpath prepares the sub-paths of volumes that containers mount
// (volumeMounts[].subPath and subPathExpr) so that a container runtime can
// bind them into a container without ever resolving a path inside a volume
// itself: everything inside a volume belongs to the pod, which may swap any
// component for a symbolic link at any moment (the kubelet's
// CVE-2017-1002101 and CVE-2021-25741).
//
// Prepare resolves the sub-path on descriptors, never leaving the volume
// (openat2 RESOLVE_BENEATH, or a walk with O_NOFOLLOW where the kernel has
// no openat2), creates missing directories as the kubelet does, bind-mounts
// the descriptor it ended on (/proc/self/fd/N) onto a target outside the
// volume, and checks that the target is the very inode it resolved. Remove
// and Sync undo it. It binds through the Mounter it is given (the agent's
// plugins.Mounter). The package knows nothing of pods: callers choose the
// targets (see volume.Paths.SubPathTarget).
package subpath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mountutil"
)

// Request is one sub-path to prepare.
type Request struct {
	// VolumeDir is the volume as set up for the pod. The path to it, and
	// the path to Target, are the agent's own and are trusted; nothing
	// below VolumeDir is.
	VolumeDir string
	// SubPath is relative to VolumeDir; Prepare validates it.
	SubPath string
	// Target becomes a bind mount of VolumeDir/SubPath: a directory for a
	// directory, an empty file for anything else. Its parent is created.
	Target string
	// ReadOnly makes the bind mount read-only.
	ReadOnly bool
	// NoCreate: a missing sub-path is an error; no directory is created in
	// the volume (whose content someone else keeps, e.g. a configMap's).
	NoCreate bool
}

// Mounter is what preparing sub-paths needs of the mount table: the agent
// passes its plugins.Mounter (*mountutil.Mounter).
type Mounter interface {
	// BindMount makes source visible at target, which must exist.
	BindMount(source, target string, o mountutil.BindOptions) error
	// IsMountPoint reports whether path is a mount point (asked only on
	// kernels before 5.8, which lack STATX_ATTR_MOUNT_ROOT).
	IsMountPoint(path string) (bool, error)
}

// Host prepares and removes sub-paths on this node, binding through
// Mounter: the operations' SubPaths.
type Host struct {
	Mounter Mounter
	// afterResolve, when set by a test, runs between resolving the
	// sub-path and mounting it: the moment an attacker would swap a
	// component.
	afterResolve func()
}

// Prepare makes r.Target a bind mount of r.VolumeDir/r.SubPath, creating
// missing directories of the sub-path with the mode of the volume's root.
// A target already bound to the same inode (with the asked read-only
// state) is kept; one bound to anything else is unmounted and bound again.
// It is idempotent and safe to repeat after a crash at any point.
func (h Host) Prepare(r Request) error {
	if h.Mounter == nil {
		return errors.New("preparing sub-paths needs a mounter: none was given")
	}
	sub, err := Validate(r.SubPath)
	if err != nil {
		return err
	}
	root, err := unix.Open(r.VolumeDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open volume", Path: r.VolumeDir, Err: err}
	}
	defer unix.Close(root)
	var rootSt unix.Stat_t
	if err := unix.Fstat(root, &rootSt); err != nil {
		return &os.PathError{Op: "fstat", Path: r.VolumeDir, Err: err}
	}
	var fd int
	if r.NoCreate {
		fd, err = openBeneath(root, sub)
		if errors.Is(err, unix.ENOENT) {
			err = fmt.Errorf("it does not exist, and no directory is created in this volume: %w", err)
		}
	} else {
		fd, err = openOrCreateDirs(root, sub, rootSt.Mode&0o7777)
	}
	if err != nil {
		return fmt.Errorf("resolving %q in the volume: %w", sub, err)
	}
	defer unix.Close(fd)
	var src unix.Stat_t
	if err := unix.Fstat(fd, &src); err != nil {
		return fmt.Errorf("fstat %q: %w", sub, err)
	}
	if h.afterResolve != nil {
		h.afterResolve()
	}
	isDir := src.Mode&unix.S_IFMT == unix.S_IFDIR

	if done, err := h.alreadyPrepared(r.Target, &src, r.ReadOnly); err != nil || done {
		return err
	}
	if err := makeTarget(r.Target, isDir); err != nil {
		return err
	}
	source := "/proc/self/fd/" + strconv.Itoa(fd)
	if err := h.Mounter.BindMount(source, r.Target, mountutil.BindOptions{ReadOnly: r.ReadOnly}); err != nil {
		_ = removeTarget(r.Target)
		return err
	}
	// The bind mount followed the descriptor's magic link, not a path: it
	// can only be the inode resolved above. Check it anyway, so that a
	// kernel or /proc surprise fails closed.
	if same, err := sameInode(r.Target, &src); err != nil || !same {
		_ = Remove(r.Target)
		if err == nil {
			err = errors.New("the mounted target is not the resolved sub-path")
		}
		return fmt.Errorf("verifying %s: %w", r.Target, err)
	}
	return nil
}

// alreadyPrepared reports whether target is a mount of the inode src with
// the asked read-only state. A mount of anything else stacked on target is
// unmounted so the caller can bind it again.
func (h Host) alreadyPrepared(target string, src *unix.Stat_t, readOnly bool) (bool, error) {
	mounted, err := h.isMountPoint(target)
	if err != nil || !mounted {
		return false, err
	}
	same, err := sameInode(target, src)
	if err != nil {
		return false, err
	}
	if same {
		var st unix.Statfs_t
		if err := unix.Statfs(target, &st); err != nil {
			return false, &os.PathError{Op: "statfs", Path: target, Err: err}
		}
		if (st.Flags&unix.ST_RDONLY != 0) == readOnly {
			return true, nil
		}
	}
	return false, unmountAll(target)
}

// sameInode reports whether path (not followed if a link) is the inode st.
func sameInode(path string, st *unix.Stat_t) (bool, error) {
	var got unix.Stat_t
	if err := unix.Lstat(path, &got); err != nil {
		return false, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	return got.Dev == st.Dev && got.Ino == st.Ino, nil
}

// isMountPoint reports whether path is the root of a mount, without
// following a link in its last component.
func (h Host) isMountPoint(path string) (bool, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
	}
	return h.Mounter.IsMountPoint(path) // kernels before 5.8
}

// makeTarget creates target as an empty directory (for a directory source)
// or an empty file, replacing an unmounted target of the other kind.
func makeTarget(target string, isDir bool) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	var st unix.Stat_t
	err := unix.Lstat(target, &st)
	switch {
	case errors.Is(err, unix.ENOENT):
	case err != nil:
		return &os.PathError{Op: "lstat", Path: target, Err: err}
	case isDir && st.Mode&unix.S_IFMT == unix.S_IFDIR, !isDir && st.Mode&unix.S_IFMT == unix.S_IFREG:
		return nil
	default:
		if err := removeTarget(target); err != nil {
			return err
		}
	}
	if isDir {
		if err := unix.Mkdir(target, 0o750); err != nil && !errors.Is(err, unix.EEXIST) {
			return &os.PathError{Op: "mkdir", Path: target, Err: err}
		}
		return nil
	}
	fd, err := unix.Open(target, unix.O_CREAT|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o640)
	if err != nil {
		return &os.PathError{Op: "create", Path: target, Err: err}
	}
	return unix.Close(fd)
}

// maxStacked bounds the mounts unmountAll peels off one target.
const maxStacked = 16

// unmountAll unmounts every mount stacked on target, never following a
// link in its last component.
func unmountAll(target string) error {
	for range maxStacked {
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default:
			return &os.PathError{Op: "unmount", Path: target, Err: err}
		}
	}
	return fmt.Errorf("%s is still a mount point after %d unmounts", target, maxStacked)
}

// Remove unmounts target and removes it. It removes only what Prepare makes
// — an empty directory, an empty file — or a link; anything else is left in
// place and reported. A missing target is already removed.
func Remove(target string) error {
	if err := unmountAll(target); err != nil {
		return err
	}
	return removeTarget(target)
}

func removeTarget(target string) error {
	var st unix.Stat_t
	err := unix.Lstat(target, &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return &os.PathError{Op: "lstat", Path: target, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := unix.Rmdir(target); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "rmdir", Path: target, Err: err}
		}
		return nil
	case unix.S_IFREG:
		if st.Size != 0 {
			return fmt.Errorf("%s is a file with content, not an unmounted sub-path target: left in place", target)
		}
	case unix.S_IFLNK:
	default:
		return fmt.Errorf("%s is not a sub-path target (mode %#o): left in place", target, st.Mode)
	}
	if err := unix.Unlink(target); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "unlink", Path: target, Err: err}
	}
	return nil
}

// Mount is one prepared sub-path in a volume's directory of targets, laid
// out as <dir>/<Container>/<Index> like the kubelet's volume-subpaths.
type Mount struct {
	Container string
	Index     int
	// MountPath is where the container mounts it, for messages.
	MountPath string
	SubPath   string
	ReadOnly  bool
	NoCreate  bool
}

// Target is where m is mounted below dir.
func (m Mount) Target(dir string) string {
	return filepath.Join(dir, m.Container, strconv.Itoa(m.Index))
}

// MountError is a failure to prepare one Mount.
type MountError struct {
	Mount Mount
	Err   error
}

func (e *MountError) Error() string {
	return fmt.Sprintf("failed to prepare subPath %q for the volumeMount at %s of container %q: %v", e.Mount.SubPath, e.Mount.MountPath, e.Mount.Container, e.Err)
}

func (e *MountError) Unwrap() error { return e.Err }

// Sync makes dir hold exactly the targets of want, bound into volumeDir:
// each wanted one prepared (or kept), every other one removed. It prepares
// all it can and returns every failure (MountErrors, joined).
func (h Host) Sync(volumeDir, dir string, want []Mount) error {
	var errs []error
	keep := map[string]bool{}
	for _, m := range want {
		target := m.Target(dir)
		keep[target] = true
		if err := h.Prepare(Request{VolumeDir: volumeDir, SubPath: m.SubPath, Target: target, ReadOnly: m.ReadOnly, NoCreate: m.NoCreate}); err != nil {
			errs = append(errs, &MountError{Mount: m, Err: err})
		}
	}
	if err := removeExcept(dir, keep); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Clean is the package's Clean.
func (Host) Clean(dir string) error { return Clean(dir) }

// Clean removes every target in dir, then dir itself once empty. Nothing
// left behind means the volume can be torn down; an error means a target
// is still mounted (or not one of ours) and the volume must stay.
func Clean(dir string) error {
	if err := removeExcept(dir, nil); err != nil {
		return err
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	return nil
}

// removeExcept removes the targets <dir>/<container>/<index> not in keep,
// and container directories left empty.
func removeExcept(dir string, keep map[string]bool) error {
	containers, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range containers {
		cdir := filepath.Join(dir, c.Name())
		if !c.IsDir() {
			errs = append(errs, Remove(cdir))
			continue
		}
		entries, err := os.ReadDir(cdir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			target := filepath.Join(cdir, e.Name())
			if !keep[target] {
				errs = append(errs, Remove(target))
			}
		}
		if err := unix.Rmdir(cdir); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTEMPTY) {
			errs = append(errs, &os.PathError{Op: "rmdir", Path: cdir, Err: err})
		}
	}
	return errors.Join(errs...)
}
