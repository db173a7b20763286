package safefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Group is what SetGroup gives a tree.
type Group struct {
	// GID becomes the group of every entry (symbolic links included: their
	// own group, never their target's).
	GID int
	// FileBits are permission bits (unix, e.g. 0o660) added to everything
	// but directories and symbolic links; DirBits (e.g. 0o2770, setgid so
	// new files inherit the group) are added to directories.
	FileBits, DirBits uint32
	// SkipIfRootMatches: when the root already has GID and DirBits, nothing
	// below it is looked at (the OnRootMismatch policy).
	SkipIfRootMatches bool
}

const permBits = 0o7777

// SetGroup gives dir and everything below it the group and bits of g, on
// file descriptors: a directory is opened (O_NOFOLLOW) before it is changed
// or entered, everything else is changed by name relative to its parent's
// descriptor with AT_SYMLINK_NOFOLLOW, so a symbolic link swapped in
// mid-walk is never followed out of the tree. Other mounts inside the tree
// are left alone. Entries that vanish during the walk are skipped.
//
// It walks with a few workers at once (see parallel.go); SetGroupSequential
// is the same walk one directory at a time, the reference it agrees with.
func SetGroup(ctx context.Context, dir string, g Group) error {
	w, done, err := startGroup(dir, g)
	if done || err != nil {
		return err
	}
	return setGroupParallel(ctx, w, g, groupWorkers())
}

// SetGroupSequential is SetGroup one directory at a time: the simple walk
// the parallel one must agree with (an oracle test compares them).
func SetGroupSequential(ctx context.Context, dir string, g Group) error {
	w, done, err := startGroup(dir, g)
	if done || err != nil {
		return err
	}
	defer w.close()
	return walkGroup(ctx, w, g)
}

// startGroup opens the root and gives it the group; done means nothing
// below it is to be looked at (OnRootMismatch with a right root).
func startGroup(dir string, g Group) (w *walker, done bool, err error) {
	w, err = openRoot(dir)
	if err != nil {
		return nil, false, err
	}
	root := w.rootStat
	if g.SkipIfRootMatches && int(root.gid) == g.GID && root.mode&g.DirBits == g.DirBits {
		w.close()
		return nil, true, nil
	}
	if err := fixFD(w.root.fd, root, g, g.DirBits); err != nil {
		w.close()
		return nil, false, &os.PathError{Op: "chgrp", Path: dir, Err: err}
	}
	return w, false, nil
}

// walkGroup gives everything below w's root (already changed) the group.
func walkGroup(ctx context.Context, w *walker, g Group) error {
	for count := 1; ; count++ {
		if count%checkEvery == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("applying group %d to %s: %w", g.GID, w.rootName(), err)
			}
		}
		e, ok, err := w.nextRaw()
		if err != nil {
			return &os.PathError{Op: "readdir", Path: w.dirPath(), Err: err}
		}
		if !ok {
			if w.depth == 0 {
				return nil
			}
			if _, _, err := w.ascend(); err != nil {
				return err
			}
			continue
		}
		if err := setGroupEntry(w, e, g); err != nil {
			return err
		}
	}
}

// setGroupEntry changes one entry of the current directory and enters it
// if it is a directory on the same mount. It makes no copy of the name of
// anything but a directory: the system calls take it from the walker's
// buffer.
func setGroupEntry(w *walker, e rawEntry, g Group) error {
	if e.typ == unix.DT_DIR {
		name := e.String()
		fd, st, err := w.openDir(name)
		switch {
		case err == nil:
			if err := fixFD(fd, st, g, g.DirBits); err != nil {
				unix.Close(fd)
				return &os.PathError{Op: "chgrp", Path: w.pathOf(name), Err: err}
			}
			if w.handOff != nil && w.handOff(fd, st) {
				return nil // another worker walks it
			}
			w.push(fd, st, name)
			return nil
		case errors.Is(err, unix.ENOENT), errors.Is(err, ErrMountPointInside):
			return nil
		case !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR):
			return &os.PathError{Op: "open", Path: w.pathOf(name), Err: err}
		}
		// No longer a directory: change what is there now, by name.
	}
	fd := w.current().fd
	st, err := statAtC(fd, e.cname)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "statx", Path: w.pathOf(e.String()), Err: err}
	}
	if !w.sameMount(st) {
		return nil
	}
	if st.isDir() {
		// A directory now (or the filesystem gives no types): take the
		// directory path, which opens it without following links.
		if e.typ == unix.DT_DIR {
			return nil // it changed back and forth under the walk: skip it
		}
		e.typ = unix.DT_DIR
		return setGroupEntry(w, e, g)
	}
	if int(st.gid) != g.GID {
		err := fchownatC(fd, e.cname, g.GID)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "chgrp", Path: w.pathOf(e.String()), Err: err}
		}
	}
	if st.isSymlink() {
		return nil // a link's mode means nothing
	}
	want := st.mode&permBits | g.FileBits
	if want == st.mode&permBits {
		return nil
	}
	err = fchmodat2C(fd, e.cname, want)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		err = chmodNoFollow(fd, e.String(), want)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "chmod", Path: w.pathOf(e.String()), Err: err}
	}
	return nil
}

// fixFD gives the open file fd the group and adds bits to its mode.
func fixFD(fd int, st fileStat, g Group, bits uint32) error {
	if int(st.gid) != g.GID {
		if err := unix.Fchown(fd, -1, g.GID); err != nil {
			return err
		}
	}
	if want := st.mode&permBits | bits; want != st.mode&permBits {
		// chown may have cleared setuid/setgid; want restores them.
		return unix.Fchmod(fd, want)
	}
	return nil
}

// chmodNoFollow changes the mode of name relative to dirfd unless it is a
// symbolic link: fchmodat2 with AT_SYMLINK_NOFOLLOW where the kernel has
// it (Linux 6.6), else through an O_PATH descriptor of exactly that entry.
func chmodNoFollow(dirfd int, name string, mode uint32) error {
	err := unix.Fchmodat(dirfd, name, mode, unix.AT_SYMLINK_NOFOLLOW)
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	// Either no fchmodat2, or the entry became a symbolic link.
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	// The magic link resolves to the inode fd holds, not to a path.
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode)
}
