package safefs

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// DiskUsage is what a walk of DiskUsage counted.
type DiskUsage struct {
	// Bytes are the blocks allocated to the tree (st_blocks × 512, as du
	// and the kubelet count): a sparse file costs what it holds, not its
	// length.
	Bytes int64
	// Inodes are the tree's files, directories and links, each inode once.
	Inodes int64
	// Entries are the directory entries looked at (what the budget paid).
	Entries int64
	// LinksOverflow: more inodes with several links than UsageOptions.MaxLinks
	// were met, so links beyond that were counted each time (an
	// overestimate, never an underestimate).
	LinksOverflow bool
}

// Budget paces walks: Take returns once n more entries may be looked at,
// or ctx's error. One Budget shared by every walk of the node bounds the
// entries per second they all look at together.
type Budget interface {
	Take(ctx context.Context, n int) error
}

// UsageOptions tune Usage.
type UsageOptions struct {
	// Budget paces the walk; nil: not paced.
	Budget Budget
	// MaxLinks bounds the inodes with several links remembered to count
	// each once; default DefaultMaxLinks.
	MaxLinks int
}

// DefaultMaxLinks bounds the hard-link set of one walk: 64 Ki inode numbers,
// about 2 MiB at most.
const DefaultMaxLinks = 1 << 16

// usageBatch is how many entries a walk asks its budget for at once.
const usageBatch = 64

// Usage measures the disk usage of dir and everything below it on dir's
// mount, on file descriptors as the other walks: directories are opened
// with O_NOFOLLOW and everything else is only statx'ed by name relative to
// its parent (a FIFO or device is never opened, a symbolic link is counted
// as itself and never followed), mounts inside the tree are neither
// counted nor entered, memory is bounded whatever the tree's shape, and an
// inode with several links inside the tree is counted once. Entries that
// vanish during the walk are skipped. When ctx ends (a deadline) it
// returns what it counted so far with ctx's error.
func Usage(ctx context.Context, dir string, opts UsageOptions) (DiskUsage, error) {
	if opts.MaxLinks <= 0 {
		opts.MaxLinks = DefaultMaxLinks
	}
	w, err := openRoot(dir)
	if err != nil {
		return DiskUsage{}, err
	}
	defer w.close()
	u := &usageWalk{w: w, opts: opts, seen: map[uint64]struct{}{}}
	u.count(w.rootStat)
	credit := 0
	for {
		if credit == 0 {
			if err := ctx.Err(); err != nil {
				return u.du, fmt.Errorf("measuring %s: %w", dir, err)
			}
			if opts.Budget != nil {
				if err := opts.Budget.Take(ctx, usageBatch); err != nil {
					return u.du, fmt.Errorf("measuring %s: %w", dir, err)
				}
			}
			credit = usageBatch
		}
		e, ok, err := w.next()
		if err != nil {
			return u.du, &os.PathError{Op: "readdir", Path: w.dirPath(), Err: err}
		}
		if !ok {
			if w.depth == 0 {
				return u.du, nil
			}
			if _, _, err := w.ascend(); err != nil {
				return u.du, err
			}
			continue
		}
		credit--
		u.du.Entries++
		if err := u.entry(e); err != nil {
			return u.du, err
		}
	}
}

type usageWalk struct {
	w    *walker
	opts UsageOptions
	du   DiskUsage
	seen map[uint64]struct{}
}

// count adds one inode, once however many of its links the walk meets.
func (u *usageWalk) count(st fileStat) {
	if !st.isDir() && st.nlink > 1 {
		if _, ok := u.seen[st.ino]; ok {
			return
		}
		if len(u.seen) < u.opts.MaxLinks {
			u.seen[st.ino] = struct{}{}
		} else {
			u.du.LinksOverflow = true
		}
	}
	u.du.Bytes += int64(st.blocks) * 512
	u.du.Inodes++
}

// entry counts one entry of the current directory and enters it if it is
// a directory on the same mount.
func (u *usageWalk) entry(e entry) error {
	w := u.w
	if e.typ == unix.DT_DIR {
		fd, st, err := w.openDir(e.name)
		switch {
		case err == nil:
			u.count(st)
			w.push(fd, st, e.name)
			return nil
		case errors.Is(err, unix.ENOENT), errors.Is(err, ErrMountPointInside):
			return nil
		case !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR):
			return &os.PathError{Op: "open", Path: w.pathOf(e.name), Err: err}
		}
		// No longer a directory: count what is there now.
	}
	st, err := statAt(w.current().fd, e.name)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "statx", Path: w.pathOf(e.name), Err: err}
	}
	if !w.sameMount(st) {
		return nil
	}
	if st.isDir() {
		if e.typ == unix.DT_DIR {
			return nil // it changed back and forth under the walk: skip it
		}
		e.typ = unix.DT_DIR
		return u.entry(e)
	}
	u.count(st)
	return nil
}
