package safefs

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// maxRetries bounds how often a directory that was emptied but could not
// be removed (something appeared in it meanwhile) is emptied again.
const maxRetries = 3

// RemoveAll removes dir and everything below it without ever following a
// symbolic link and without descending into another mount, with memory
// bounded by a constant. Everything that can be removed safely is removed;
// the first problem is returned. A missing dir is already removed.
func RemoveAll(ctx context.Context, dir string) error {
	// Most volume directories are empty by the time they are removed (a
	// tmpfs was just unmounted from them): try the one cheap syscall first.
	err := unix.Rmdir(dir)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		return &os.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	if err := RemoveContents(ctx, dir); err != nil {
		return err
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	return nil
}

// RemoveContents empties dir (see RemoveAll). dir itself must not be a
// symbolic link; a missing dir is empty.
func RemoveContents(ctx context.Context, dir string) error {
	w, err := openRoot(dir)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer w.close()
	r := remover{w: w}
	return r.run(ctx)
}

// RemoveAllAt removes the entry name of the directory open at parentFD
// and, if it is a directory, everything below it, with the guarantees of
// RemoveAll; path names the entry in errors. An entry that is a mount point
// is not removed (ErrMountPointInside). A missing entry is already removed.
func RemoveAllAt(ctx context.Context, parentFD int, name, path string) error {
	err := unix.Unlinkat(parentFD, name, unix.AT_REMOVEDIR)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.ENOTDIR):
		if err := unix.Unlinkat(parentFD, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "unlink", Path: path, Err: err}
		}
		return nil
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%w: %s", ErrMountPointInside, path)
	case !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST):
		return &os.PathError{Op: "rmdir", Path: path, Err: err}
	}
	parent, err := statAt(parentFD, "")
	if err != nil {
		return &os.PathError{Op: "statx", Path: path + "/..", Err: err}
	}
	fd, err := unix.Openat(parentFD, name, dirFlags, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		// Swapped for a link or a file since: remove that entry.
		if err := unix.Unlinkat(parentFD, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "unlink", Path: path, Err: err}
		}
		return nil
	case err != nil:
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	w, err := newWalker(fd, path)
	if err != nil {
		return err
	}
	defer w.close()
	if !onMountOf(w.rootStat, parent) {
		return fmt.Errorf("%w: %s", ErrMountPointInside, path)
	}
	r := remover{w: w}
	if err := r.run(ctx); err != nil {
		return err
	}
	if err := unix.Unlinkat(parentFD, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: path, Err: err}
	}
	return nil
}

// remover is one removal walk: depth first, each directory removed as the
// walk climbs out of it.
type remover struct {
	w     *walker
	first error
}

// keep records a problem: the first one is returned, and the directory
// it happened in is known not to be empty.
func (r *remover) keep(err error) {
	if r.first == nil {
		r.first = err
	}
	r.w.current().failed = true
}

func (r *remover) run(ctx context.Context) error {
	w := r.w
	for count := 1; ; count++ {
		if count%checkEvery == 0 {
			if err := ctx.Err(); err != nil {
				r.keep(fmt.Errorf("removing %s: %w", w.rootPath, err))
				return r.first
			}
		}
		e, ok, err := w.next()
		if err != nil {
			r.keep(&os.PathError{Op: "readdir", Path: w.dirPath(), Err: err})
			ok = false
		}
		if ok {
			r.remove(e)
			continue
		}
		if w.depth == 0 {
			return r.first
		}
		name, failed, err := w.ascend()
		if err != nil {
			// Without a way back up there is nothing safe left to do.
			r.keep(err)
			return r.first
		}
		if !failed {
			r.removeEmptied(name)
		}
	}
}

// remove removes one entry of the current directory, or descends into it
// when it is a directory that is not empty.
func (r *remover) remove(e entry) {
	fd := r.w.current().fd
	if e.typ != unix.DT_DIR && e.typ != unix.DT_UNKNOWN {
		if r.unlink(e.name) {
			r.removeDir(e.name)
		}
		return
	}
	err := unix.Unlinkat(fd, e.name, unix.AT_REMOVEDIR)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
	case errors.Is(err, unix.ENOTDIR):
		if r.unlink(e.name) {
			r.removeDir(e.name)
		}
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST):
		r.descend(e.name)
	default:
		r.busyOr(e.name, &os.PathError{Op: "rmdir", Path: r.w.pathOf(e.name), Err: err}, err)
	}
}

// unlink removes a non-directory; it reports whether name turned out to
// be a directory after all.
func (r *remover) unlink(name string) (isDir bool) {
	err := unix.Unlinkat(r.w.current().fd, name, 0)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return false
	case errors.Is(err, unix.EISDIR):
		return true
	}
	r.busyOr(name, &os.PathError{Op: "unlink", Path: r.w.pathOf(name), Err: err}, err)
	return false
}

// removeDir removes the directory name, descending into it if needed.
func (r *remover) removeDir(name string) {
	err := unix.Unlinkat(r.w.current().fd, name, unix.AT_REMOVEDIR)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST):
		r.descend(name)
	default:
		r.busyOr(name, &os.PathError{Op: "rmdir", Path: r.w.pathOf(name), Err: err}, err)
	}
}

// busyOr records err, as ErrMountPointInside when the entry is a mount
// point (EBUSY from unlink and rmdir).
func (r *remover) busyOr(name string, err error, errno error) {
	if errors.Is(errno, unix.EBUSY) {
		if st, serr := statAt(r.w.current().fd, name); serr == nil && !r.w.sameMount(st) {
			r.keep(fmt.Errorf("%w: %s", ErrMountPointInside, r.w.pathOf(name)))
			return
		}
	}
	r.keep(err)
}

// descend makes the non-empty directory name current.
func (r *remover) descend(name string) {
	w := r.w
	fd, st, err := w.openDir(name)
	switch {
	case err == nil:
		w.push(fd, st, name)
	case errors.Is(err, unix.ENOENT):
	case errors.Is(err, ErrMountPointInside):
		r.keep(fmt.Errorf("%w: %s", ErrMountPointInside, w.pathOf(name)))
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		// No longer a directory (swapped for a symbolic link or a file):
		// remove the entry itself, whatever it points to.
		if r.unlink(name) {
			r.keep(&os.PathError{Op: "open", Path: w.pathOf(name), Err: err})
		}
	default:
		r.keep(&os.PathError{Op: "open", Path: w.pathOf(name), Err: err})
	}
}

// removeEmptied removes a directory the walk just emptied. If entries
// appeared in it meanwhile it is emptied again, a bounded number of times.
func (r *remover) removeEmptied(name string) {
	w := r.w
	p := w.current()
	err := unix.Unlinkat(p.fd, name, unix.AT_REMOVEDIR)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST):
		if p.retryName != name {
			p.retryName, p.retries = name, 0
		}
		if p.retries < maxRetries {
			p.retries++
			r.descend(name)
			return
		}
	}
	r.busyOr(name, &os.PathError{Op: "rmdir", Path: w.pathOf(name), Err: err}, err)
}
