// Package safefs works on directory trees a tenant controls (a volume's
// contents) the way a hostile tree demands: every step is taken on a file
// descriptor relative to its parent (openat with O_NOFOLLOW, unlinkat,
// fchownat and fchmodat2 with AT_SYMLINK_NOFOLLOW), so swapping a
// directory for a symbolic link mid-walk leads nowhere; the walk never
// leaves the tree's own mount; and memory is bounded by a constant whatever
// the tree's depth or width: directories are read in batches into one
// buffer, at most maxOpenDirs directory descriptors are held, and a
// directory whose descriptor was closed to keep that bound is found again
// through ".." and its inode number.
//
// It owns three walks: removal (RemoveAll, RemoveContents), giving a tree
// a group (SetGroup, for a pod's fsGroup) and measuring it (DiskUsage).
package safefs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// maxOpenDirs bounds the directory descriptors one walk holds. Deeper
// than this, the shallowest are closed; climbing back finds them again
// through "..". The value trades descriptors for the cost of that search,
// paid once per level beyond it.
const maxOpenDirs = 32

// direntBufSize is the getdents batch: one buffer per walk, whatever the
// width of a directory.
const direntBufSize = 16 << 10

// checkEvery is how many entries a walk handles between two looks at its
// context.
const checkEvery = 256

var bufPool = sync.Pool{New: func() any { b := make([]byte, direntBufSize); return &b }}

// ErrMountPointInside is returned when a walk finds another mount inside
// the tree: removing or changing across it would touch data that belongs
// to something else.
var ErrMountPointInside = errors.New("mount point inside directory")

// errMoved: a directory the walk had to find again through ".." is not
// where it was. The tree changed under the walk; a retry starts afresh.
var errMoved = errors.New("the directory tree changed during the walk (a directory was moved)")

const (
	dirFlags  = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	statxMask = unix.STATX_TYPE | unix.STATX_MODE | unix.STATX_GID | unix.STATX_INO | unix.STATX_MNT_ID |
		unix.STATX_NLINK | unix.STATX_BLOCKS // for DiskUsage; the same call either way
)

// fileStat is what a walk needs to know of an entry.
type fileStat struct {
	dev, ino  uint64
	mntID     uint64
	hasMntID  bool
	mountRoot bool
	mode      uint32 // st_mode: type and permission bits
	gid       uint32
	nlink     uint32
	blocks    uint64 // 512-byte blocks allocated
}

func (s fileStat) isDir() bool     { return s.mode&unix.S_IFMT == unix.S_IFDIR }
func (s fileStat) isSymlink() bool { return s.mode&unix.S_IFMT == unix.S_IFLNK }

// statAt stats name relative to dirfd without following a final symbolic
// link ("" with AT_EMPTY_PATH: dirfd itself).
func statAt(dirfd int, name string) (fileStat, error) {
	flags := unix.AT_SYMLINK_NOFOLLOW | unix.AT_STATX_DONT_SYNC
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	var stx unix.Statx_t
	if err := unix.Statx(dirfd, name, flags, statxMask, &stx); err != nil {
		return fileStat{}, err
	}
	return statxToFileStat(&stx), nil
}

func statxToFileStat(stx *unix.Statx_t) fileStat {
	return fileStat{
		dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor), ino: stx.Ino,
		mntID: stx.Mnt_id, hasMntID: stx.Mask&unix.STATX_MNT_ID != 0,
		mountRoot: stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0,
		mode:      uint32(stx.Mode), gid: stx.Gid, nlink: stx.Nlink, blocks: stx.Blocks,
	}
}

// frame is one open directory of the walk.
type frame struct {
	fd  int
	ino uint64
	// name is the directory's name in its parent; "" when it was found
	// again through "..".
	name string
	// off is where reading resumes: the getdents cookie after the last
	// entry handed out.
	off int64
	// failed: something below could not be done, so it cannot be empty.
	failed bool
	// retryName and retries bound how often a child that was emptied but
	// could not be removed (entries appeared) is emptied again.
	retryName string
	retries   int
}

// walker is the bounded state of one walk: the root, a window of at most
// maxOpenDirs open directories below it, and one dirent buffer.
type walker struct {
	rootPath string
	root     frame
	rootStat fileStat
	// stack holds the open directories below root, deepest last.
	stack []frame
	// depth of the current directory; root is 0. depth > len(stack) means
	// the shallower ones were closed.
	depth int

	bufp       *[]byte
	buf        []byte
	pos, n     int
	loaded     bool // buf holds entries of the current directory
	positioned bool // the current directory's file offset is its off

	// handOff, if set, may take a directory the walk just opened (and
	// changed) to walk it elsewhere, owning its descriptor; false: this
	// walk enters it itself.
	handOff func(fd int, st fileStat) bool
}

// entry is one directory entry.
type entry struct {
	name string
	ino  uint64
	typ  uint8
}

// openRoot opens dir (never through a symbolic link) as the root of a
// walk. The walker owns the descriptor.
func openRoot(dir string) (*walker, error) {
	fd, err := unix.Open(dir, dirFlags, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return newWalker(fd, dir)
}

// newWalker makes the open directory fd, named dir in messages, the root
// of a walk; the walker owns the descriptor.
func newWalker(fd int, dir string) (*walker, error) {
	st, err := statAt(fd, "")
	if err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "statx", Path: dir, Err: err}
	}
	return walkerAt(fd, st, dir), nil
}

// walkerAt makes the open directory fd, whose stat is st, the root of a
// walk; dir names it in messages ("": found when needed through /proc).
// The walker owns the descriptor.
func walkerAt(fd int, st fileStat, dir string) *walker {
	bufp := bufPool.Get().(*[]byte)
	return &walker{
		rootPath: dir, root: frame{fd: fd, ino: st.ino}, rootStat: st,
		stack: make([]frame, 0, maxOpenDirs), bufp: bufp, buf: *bufp, positioned: true,
	}
}

// close releases every descriptor and the buffer.
func (w *walker) close() {
	for _, f := range w.stack {
		unix.Close(f.fd)
	}
	w.stack = nil
	if w.root.fd >= 0 {
		unix.Close(w.root.fd)
	}
	bufPool.Put(w.bufp)
}

func (w *walker) current() *frame {
	if len(w.stack) == 0 {
		return &w.root
	}
	return &w.stack[len(w.stack)-1]
}

// sameMount reports whether st is on the root's mount: never a mount root
// below the root, same device, and (where the kernel says) the same mount.
func (w *walker) sameMount(st fileStat) bool { return onMountOf(st, w.rootStat) }

// onMountOf reports whether st is on the mount of dir without being the
// root of a mount itself.
func onMountOf(st, dir fileStat) bool {
	if st.dev != dir.dev || st.mountRoot {
		return false
	}
	return !st.hasMntID || !dir.hasMntID || st.mntID == dir.mntID
}

// next returns the current directory's next entry ("." and ".." left
// out); ok is false at its end.
func (w *walker) next() (e entry, ok bool, err error) {
	r, ok, err := w.nextRaw()
	if !ok {
		return entry{}, ok, err
	}
	return entry{name: r.String(), ino: r.ino, typ: r.typ}, true, nil
}

// rawEntry is a directory entry whose name is still in the walker's
// buffer: valid until the walker reads again (next, push, ascend).
type rawEntry struct {
	cname []byte // the name and its NUL terminator
	ino   uint64
	typ   uint8
}

func (r rawEntry) String() string { return string(r.cname[:len(r.cname)-1]) }

// nextRaw is next without the copy of the name.
func (w *walker) nextRaw() (e rawEntry, ok bool, err error) {
	cur := w.current()
	for {
		if !w.loaded {
			if !w.positioned {
				if _, err := unix.Seek(cur.fd, cur.off, io.SeekStart); err != nil {
					return rawEntry{}, false, err
				}
				w.positioned = true
			}
			n, err := getdents(cur.fd, w.buf)
			if err != nil {
				return rawEntry{}, false, err
			}
			if n == 0 {
				return rawEntry{}, false, nil
			}
			w.pos, w.n, w.loaded = 0, n, true
		}
		if w.pos >= w.n {
			w.loaded = false
			continue
		}
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
		rec := w.buf[w.pos:w.n]
		if len(rec) < 19 {
			return rawEntry{}, false, fmt.Errorf("short directory entry")
		}
		reclen := int(binary.NativeEndian.Uint16(rec[16:18]))
		if reclen < 19 || reclen > len(rec) {
			return rawEntry{}, false, fmt.Errorf("bad directory entry length %d", reclen)
		}
		w.pos += reclen
		cur.off = int64(binary.NativeEndian.Uint64(rec[8:16]))
		name := rec[19:reclen]
		i := indexByte(name, 0)
		if i < 0 {
			return rawEntry{}, false, fmt.Errorf("directory entry name without its terminator")
		}
		if i == 0 || (name[0] == '.' && (i == 1 || (i == 2 && name[1] == '.'))) {
			continue
		}
		return rawEntry{cname: name[:i+1], ino: binary.NativeEndian.Uint64(rec[0:8]), typ: rec[18]}, true, nil
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

func getdents(fd int, buf []byte) (int, error) {
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		return n, err
	}
}

// openDir opens the directory name of the current directory, never
// through a symbolic link, and checks it is on the root's mount: a mount
// point gives ErrMountPointInside (the descriptor closed).
func (w *walker) openDir(name string) (int, fileStat, error) {
	fd, err := unix.Openat(w.current().fd, name, dirFlags, 0)
	if err != nil {
		return -1, fileStat{}, err
	}
	st, err := statAt(fd, "")
	if err != nil {
		unix.Close(fd)
		return -1, fileStat{}, err
	}
	if !w.sameMount(st) {
		unix.Close(fd)
		return -1, st, ErrMountPointInside
	}
	return fd, st, nil
}

// push makes the directory fd (named name in the current one) current.
func (w *walker) push(fd int, st fileStat, name string) {
	if len(w.stack) == maxOpenDirs {
		unix.Close(w.stack[0].fd)
		copy(w.stack, w.stack[1:])
		w.stack = w.stack[:len(w.stack)-1]
	}
	w.stack = append(w.stack, frame{fd: fd, ino: st.ino, name: name})
	w.depth++
	w.loaded, w.positioned = false, true
}

// ascend closes the current directory (depth > 0) and makes its parent
// current again, reading on after it. It returns the closed directory's
// name in the parent and whether anything failed below it.
func (w *walker) ascend() (name string, failed bool, err error) {
	c := w.stack[len(w.stack)-1]
	w.loaded, w.positioned = false, false
	if len(w.stack) > 1 || w.depth == 1 {
		unix.Close(c.fd)
		w.stack = w.stack[:len(w.stack)-1]
		w.depth--
		p := w.current()
		p.failed = p.failed || c.failed
		name := c.name
		if name == "" {
			// Found again through "..", directly below the root: its
			// name is the root's entry with its inode number.
			var err error
			if name, _, err = w.find(p.fd, c.ino); err != nil {
				return "", false, &os.PathError{Op: "readdir", Path: w.rootName(), Err: err}
			}
		}
		return name, c.failed, nil
	}
	// The parent's descriptor was closed to keep the bound: find it again
	// through "..", check it is still inside the tree (the root's mount,
	// and not the root itself, which is held open), and find where the
	// child is in it by inode number.
	pfd, err := unix.Openat(c.fd, "..", dirFlags, 0)
	if err != nil {
		return "", false, &os.PathError{Op: "open", Path: w.dirPath() + "/..", Err: err}
	}
	st, err := statAt(pfd, "")
	if err != nil || !w.sameMount(st) || st.ino == w.root.ino {
		unix.Close(pfd)
		if err == nil {
			err = errMoved
		}
		return "", false, &os.PathError{Op: "open", Path: w.dirPath() + "/..", Err: err}
	}
	name, off, err := w.find(pfd, c.ino)
	if err != nil {
		unix.Close(pfd)
		return "", false, &os.PathError{Op: "readdir", Path: w.dirPath() + "/..", Err: err}
	}
	unix.Close(c.fd)
	w.stack[0] = frame{fd: pfd, ino: st.ino, off: off, failed: c.failed}
	w.depth--
	return name, c.failed, nil
}

// find looks for the entry with inode ino in the directory fd and returns
// its name and the offset after it.
func (w *walker) find(fd int, ino uint64) (string, int64, error) {
	if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
		return "", 0, err
	}
	for {
		n, err := getdents(fd, w.buf)
		if err != nil {
			return "", 0, err
		}
		if n == 0 {
			return "", 0, errMoved
		}
		for pos := 0; pos+19 <= n; {
			rec := w.buf[pos:n]
			reclen := int(binary.NativeEndian.Uint16(rec[16:18]))
			if reclen < 19 || reclen > len(rec) {
				return "", 0, fmt.Errorf("bad directory entry length %d", reclen)
			}
			pos += reclen
			if binary.NativeEndian.Uint64(rec[0:8]) != ino {
				continue
			}
			name := rec[19:reclen]
			if i := indexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			return string(name), int64(binary.NativeEndian.Uint64(rec[8:16])), nil
		}
	}
}

// dirPath names the current directory for messages. Only errors need it,
// so it may cost a readlink.
func (w *walker) dirPath() string {
	if w.depth == len(w.stack) {
		parts := make([]string, 0, len(w.stack)+1)
		parts = append(parts, w.rootName())
		for _, f := range w.stack {
			if f.name == "" {
				parts = nil
				break
			}
			parts = append(parts, f.name)
		}
		if parts != nil {
			return filepath.Join(parts...)
		}
	}
	return fdPath(w.current().fd, w.rootName()+"/…")
}

// rootName names the walk's root for messages.
func (w *walker) rootName() string {
	if w.rootPath != "" {
		return w.rootPath
	}
	return fdPath(w.root.fd, "(a directory of the tree)")
}

// fdPath is where the kernel says the directory fd is, or else.
func fdPath(fd int, otherwise string) string {
	if p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err == nil && strings.HasPrefix(p, "/") {
		return p
	}
	return otherwise
}

// pathOf names an entry of the current directory for messages.
func (w *walker) pathOf(name string) string { return w.dirPath() + "/" + name }
