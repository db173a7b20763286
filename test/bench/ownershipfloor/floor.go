// Package ownershipfloor is the kernel floor of giving a tree a group: the
// least work any walker must do on it, timed without the walk. The tree is
// listed first (untimed: every directory's path below the root and its
// entries' names); then N threads, one per CPU, take directories in turn,
// open each relative to the root's descriptor and, for every entry, statx it
// relative to that descriptor and call fchownat and fchmodat only where the
// group or bits are wrong, with no allocation per entry. It checks no mount,
// follows no safety rule beyond AT_SYMLINK_NOFOLLOW and reads no directory:
// it is what the machine allows, for the bench to compare walkers with
// (test/bench -scenario ownership), not a walker. Directories are opened by
// their path below the root, so it is a floor only for shallow (wide) trees.
// With readDirs, each thread also reads every directory it opens (getdents,
// 64 KiB at a time) and throws the entries away: the floor for a walker
// that must list the tree as it goes, as every real one must.
package ownershipfloor

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Tree is a listed tree.
type Tree struct {
	root string
	dirs []dir
}

type dir struct {
	rel   []byte   // path below the root, NUL-terminated ("." for the root)
	names [][]byte // entries, NUL-terminated
}

// List lists the tree below root.
func List(root string) (*Tree, error) {
	t := &Tree{root: root}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return err
		}
		dd := dir{rel: cstr(rel)}
		for _, e := range ents {
			if !e.IsDir() {
				dd.names = append(dd.names, cstr(e.Name()))
			}
		}
		t.dirs = append(t.dirs, dd)
		return nil
	})
	return t, err
}

func cstr(s string) []byte { return append([]byte(s), 0) }

// Run gives the listed tree gid, adding fileBits to everything but
// directories and symbolic links and dirBits to directories, on threads
// threads (0: GOMAXPROCS), reading every directory too if readDirs.
func (t *Tree) Run(gid int, fileBits, dirBits uint32, threads int, readDirs bool) error {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	root, err := unix.Open(t.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	var next atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var buf []byte
			if readDirs {
				buf = make([]byte, 64<<10)
			}
			for {
				i := int(next.Add(1)) - 1
				if i >= len(t.dirs) {
					return
				}
				if err := t.dirs[i].run(root, gid, fileBits, dirBits, buf); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

func (d *dir) run(root, gid int, fileBits, dirBits uint32, buf []byte) error {
	fd, err := openat(root, d.rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for buf != nil {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
	}
	var stx unix.Statx_t
	if err := statx(fd, empty, unix.AT_EMPTY_PATH, &stx); err != nil {
		return err
	}
	if int(stx.Gid) != gid {
		if err := unix.Fchown(fd, -1, gid); err != nil {
			return err
		}
	}
	if want := uint32(stx.Mode)&0o7777 | dirBits; want != uint32(stx.Mode)&0o7777 {
		if err := unix.Fchmod(fd, want); err != nil {
			return err
		}
	}
	for _, name := range d.names {
		if err := statx(fd, name, unix.AT_SYMLINK_NOFOLLOW, &stx); err != nil {
			return err
		}
		if int(stx.Gid) != gid {
			if err := fchownat(fd, name, gid); err != nil {
				return err
			}
		}
		if stx.Mode&unix.S_IFMT == unix.S_IFLNK {
			continue
		}
		if want := uint32(stx.Mode)&0o7777 | fileBits; want != uint32(stx.Mode)&0o7777 {
			if err := fchmodat2(fd, name, want); err != nil {
				return err
			}
		}
	}
	return nil
}

var empty = []byte{0}

// The system calls on NUL-terminated names, without the copy the unix
// package makes of a string.

func openat(dirfd int, name []byte, flags int) (int, error) {
	fd, _, e := unix.Syscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(&name[0])), uintptr(flags), 0, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

func statx(dirfd int, name []byte, flags int, stx *unix.Statx_t) error {
	const mask = unix.STATX_TYPE | unix.STATX_MODE | unix.STATX_GID
	_, _, e := unix.Syscall6(unix.SYS_STATX, uintptr(dirfd), uintptr(unsafe.Pointer(&name[0])), uintptr(flags|unix.AT_STATX_DONT_SYNC), mask, uintptr(unsafe.Pointer(stx)), 0)
	if e != 0 {
		return e
	}
	return nil
}

func fchownat(dirfd int, name []byte, gid int) error {
	_, _, e := unix.Syscall6(unix.SYS_FCHOWNAT, uintptr(dirfd), uintptr(unsafe.Pointer(&name[0])), ^uintptr(0), uintptr(gid), unix.AT_SYMLINK_NOFOLLOW, 0)
	if e != 0 {
		return e
	}
	return nil
}

func fchmodat2(dirfd int, name []byte, mode uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_FCHMODAT2, uintptr(dirfd), uintptr(unsafe.Pointer(&name[0])), uintptr(mode), unix.AT_SYMLINK_NOFOLLOW, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
