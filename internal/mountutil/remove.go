package mountutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrMountPointInside is returned when removal finds a mount point inside the
// directory being removed: deleting across it would destroy data that
// belongs to something else.
var ErrMountPointInside = errors.New("mount point inside directory")

// RemoveAll removes dir and everything below it without ever following a
// symbolic link and without descending into another mount. Everything that
// can be removed safely is removed; the first problem is returned.
func RemoveAll(dir string) error {
	// Most volume directories are empty by the time they are removed (a
	// tmpfs was just unmounted from them): try the one cheap syscall first.
	err := unix.Rmdir(dir)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		return &os.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	if err := RemoveContents(dir); err != nil {
		return err
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	return nil
}

// RemoveContents empties dir (see RemoveAll). dir itself must not be a
// symbolic link.
func RemoveContents(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: dir, Err: err}
	}
	return removeChildren(fd, dir, st.Dev)
}

// RemoveAllAt removes the entry name of the directory open at parentFD and
// everything below it, with the guarantees of RemoveAll; path names the
// entry in errors. A missing entry is not an error.
func RemoveAllAt(parentFD int, name, path string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(parentFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(parentFD, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "unlink", Path: path, Err: err}
		}
		return nil
	}
	var parent unix.Stat_t
	if err := unix.Fstat(parentFD, &parent); err != nil {
		return &os.PathError{Op: "fstat", Path: filepath.Dir(path), Err: err}
	}
	if mountRoot, err := isMountRoot(parentFD, name, st.Dev, parent.Dev); err != nil {
		return err
	} else if mountRoot {
		return fmt.Errorf("%w: %s", ErrMountPointInside, path)
	}
	fd, err := unix.Openat(parentFD, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	err = removeChildren(fd, path, st.Dev)
	unix.Close(fd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(parentFD, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: path, Err: err}
	}
	return nil
}

func removeChildren(fd int, path string, dev uint64) error {
	names, err := readDirNames(fd)
	if err != nil {
		return &os.PathError{Op: "readdir", Path: path, Err: err}
	}
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for _, name := range names {
		child := filepath.Join(path, name)
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				keep(&os.PathError{Op: "stat", Path: child, Err: err})
			}
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := unix.Unlinkat(fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				keep(&os.PathError{Op: "unlink", Path: child, Err: err})
			}
			continue
		}
		if mountRoot, err := isMountRoot(fd, name, st.Dev, dev); err != nil {
			keep(err)
			continue
		} else if mountRoot {
			keep(fmt.Errorf("%w: %s", ErrMountPointInside, child))
			continue
		}
		cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			keep(&os.PathError{Op: "open", Path: child, Err: err})
			continue
		}
		err = removeChildren(cfd, child, dev)
		unix.Close(cfd)
		if err != nil {
			keep(err)
			continue
		}
		if err := unix.Unlinkat(fd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
			keep(&os.PathError{Op: "rmdir", Path: child, Err: err})
		}
	}
	return first
}

// isMountRoot tells whether the directory name under fd is the root of a
// mount: a different device, or (for a bind mount of the same filesystem)
// the kernel's mount-root attribute.
func isMountRoot(fd int, name string, childDev, parentDev uint64) (bool, error) {
	if childDev != parentDev {
		return true, nil
	}
	var stx unix.Statx_t
	if err := unix.Statx(fd, name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, 0, &stx); err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return false, nil
		}
		return false, &os.PathError{Op: "statx", Path: name, Err: err}
	}
	return stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
}

func readDirNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "")
	defer f.Close()
	return f.Readdirnames(-1)
}
