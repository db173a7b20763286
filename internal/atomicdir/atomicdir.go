// Package atomicdir owns the content of the API volumes (configMap, secret,
// downwardAPI, projected): it makes a directory hold exactly a set of files
// and replaces that set atomically, in the kubelet's layout, so that
// applications watching these volumes keep working:
//
//	<dir>/..data          -> ..2026_11_22_10_00_00.123   (the only thing swapped)
//	<dir>/..2026_11_22_10_00_00.123/<key>   the files
//	<dir>/<top>           -> ..data/<top>   one link per first path element
//
// An update writes a new timestamped directory and swaps ..data with one
// rename(2): a reader sees the complete old set or the complete new set,
// never a mix. Links for new names are made before the swap (they dangle
// until it, which reads as "no such file", as in the old set), links of
// removed names are removed after it (they dangle from it on, as in the new
// set). A crash at any step leaves the old or the new set; the next Write
// finishes the links and removes what the crash left behind.
//
// Everything is done relative to a descriptor of the directory with
// O_NOFOLLOW: nothing read back from disk is trusted or followed.
package atomicdir

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/safefs"
)

// File is one file of a payload.
type File struct {
	Data []byte
	// Mode holds the permission bits (0-0777).
	Mode os.FileMode
	// UID, when set, owns the file (the kubelet's FsUser, for token files).
	UID *int64
}

// Payload maps relative paths to files.
type Payload map[string]File

// Step names the steps of an update, for crash injection in tests.
type Step int

const (
	StepCreateDir   Step = iota // the new timestamped directory exists
	StepWriteFiles              // the files are written
	StepPermissions             // fsGroup applied
	StepLinkNew                 // links for new top-level names made
	StepLinkTmp                 // ..data_tmp points at the new directory
	StepSwap                    // ..data points at the new directory
	StepRemoveLinks             // links of removed names gone
	StepRemoveOld               // the old directory gone
	numSteps
)

// Steps lists every step in order.
func Steps() []Step {
	out := make([]Step, numSteps)
	for i := range out {
		out[i] = Step(i)
	}
	return out
}

func (s Step) String() string {
	return [...]string{"create-dir", "write-files", "permissions", "link-new", "link-tmp", "swap", "remove-links", "remove-old"}[s]
}

// Options configure Write.
type Options struct {
	// FSGroup, when set, owns everything written (group) and gets read
	// access: files |= 0440, directories |= 02550, as the kubelet does for
	// these (read-only) volumes. The directory itself is included.
	FSGroup *int64
	// Now names the new directory; default time.Now.
	Now func() time.Time
	// AfterStep, when set, is called after each step; an error stops Write
	// there without any cleanup, as a crash would (tests only).
	AfterStep func(Step) error
}

const (
	dataLink    = "..data"
	dataTmpLink = "..data_tmp"
	// MaxPathLength and MaxElementLength bound item paths, as in the API.
	MaxPathLength    = 4096
	MaxElementLength = 255
	dirMode          = 0o755
)

// ValidatePath checks a payload path: relative, not empty, no ".."
// element, no element longer than 255 bytes, at most 4096 bytes, and a
// first element (once cleaned) that does not start with ".." (those names
// are the writer's own).
func ValidatePath(p string) error {
	switch {
	case p == "":
		return errors.New("path is empty")
	case len(p) > MaxPathLength:
		return fmt.Errorf("path is longer than %d bytes", MaxPathLength)
	case path.IsAbs(p):
		return fmt.Errorf("path %q is absolute", p)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("path %q contains a NUL byte", p)
	}
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return fmt.Errorf("path %q contains '..'", p)
		}
		if len(e) > MaxElementLength {
			return fmt.Errorf("path %q has an element longer than %d bytes", p, MaxElementLength)
		}
	}
	clean := path.Clean(p)
	if clean == "." {
		return fmt.Errorf("path %q names the volume itself", p)
	}
	// Checked on the clean path: "./..data" is "..data" (FuzzWrite found
	// it).
	if strings.HasPrefix(clean, "..") {
		return fmt.Errorf("path %q starts with '..'", p)
	}
	return nil
}

// normalize validates every path and returns the payload keyed by clean
// paths, refusing two names for one file and a file that is also a
// directory of another.
func normalize(payload Payload) (Payload, error) {
	out := make(Payload, len(payload))
	for p, f := range payload {
		if err := ValidatePath(p); err != nil {
			return nil, err
		}
		if f.Mode&^os.ModePerm != 0 {
			return nil, fmt.Errorf("path %q: mode %#o has bits beyond 0777", p, f.Mode)
		}
		c := path.Clean(p)
		if _, dup := out[c]; dup {
			return nil, fmt.Errorf("paths conflict: %q is given twice", c)
		}
		out[c] = f
	}
	for c := range out {
		for d := path.Dir(c); d != "."; d = path.Dir(d) {
			if _, ok := out[d]; ok {
				return nil, fmt.Errorf("paths conflict: %q is a file and a directory of %q", d, c)
			}
		}
	}
	return out, nil
}

func topLevel(p string) string {
	if i := strings.IndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return p
}

// isTimestampDir tells the writer's data directories from anything else.
func isTimestampDir(name string) bool {
	return strings.HasPrefix(name, "..") && name != dataLink && name != dataTmpLink && !strings.Contains(name, "/") && len(name) > 2
}

// Write makes dir (an existing directory) hold exactly payload and reports
// whether it had to write anything: an unchanged payload (same paths, bytes,
// modes and owners) costs reads only.
func Write(dir string, payload Payload, o Options) (changed bool, err error) {
	files, err := normalize(payload)
	if err != nil {
		return false, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	w := &writer{dir: dir, dfd: dfd, files: files, opts: o}
	return w.write()
}

type writer struct {
	dir   string
	dfd   int
	files Payload
	opts  Options
}

func (w *writer) step(s Step) error {
	if w.opts.AfterStep == nil {
		return nil
	}
	if err := w.opts.AfterStep(s); err != nil {
		return &crash{step: s, err: err}
	}
	return nil
}

// crash is an injected stop: no cleanup must run after it.
type crash struct {
	step Step
	err  error
}

func (c *crash) Error() string { return fmt.Sprintf("stopped after %s: %v", c.step, c.err) }
func (c *crash) Unwrap() error { return c.err }

func (w *writer) write() (bool, error) {
	current, err := w.currentDir()
	if err != nil {
		return false, err
	}
	if err := w.removeDebris(current); err != nil {
		return false, err
	}
	same := false
	if current != "" {
		if same, err = w.sameContent(current); err != nil {
			return false, err
		}
	}
	if same {
		// A crash after the swap may have left links of new names to
		// make; nothing else is missing.
		return false, w.linkTopLevel()
	}
	next, err := w.createDataDir()
	if err != nil {
		return false, err
	}
	if err := w.step(StepCreateDir); err != nil {
		return false, err
	}
	if err := w.fill(next); err != nil {
		return false, w.abandon(next, err)
	}
	if err := w.linkTopLevel(); err != nil {
		return false, w.abandon(next, err)
	}
	if err := w.step(StepLinkNew); err != nil {
		return false, err
	}
	if err := w.swap(next); err != nil {
		return false, w.abandon(next, err)
	}
	if err := w.removeStaleLinks(); err != nil {
		return true, err
	}
	if err := w.step(StepRemoveLinks); err != nil {
		return true, err
	}
	if current != "" {
		if err := safefs.RemoveAllAt(context.Background(), w.dfd, current, w.path(current)); err != nil {
			return true, err
		}
	}
	return true, w.step(StepRemoveOld)
}

func (w *writer) path(name string) string { return w.dir + "/" + name }

// abandon removes what an update made before failing; a crash leaves it to
// the next Write.
func (w *writer) abandon(next string, err error) error {
	var c *crash
	if errors.As(err, &c) {
		return err
	}
	_ = unix.Unlinkat(w.dfd, dataTmpLink, 0)
	_ = safefs.RemoveAllAt(context.Background(), w.dfd, next, w.path(next))
	return err
}

// currentDir returns the directory ..data points at, "" if there is none.
func (w *writer) currentDir() (string, error) {
	target, err := readlinkat(w.dfd, dataLink)
	switch {
	case errors.Is(err, unix.ENOENT):
		return "", nil
	case errors.Is(err, unix.EINVAL):
		// Not a link: the writer never makes that, so it is debris (the
		// swap's rename replaces a link, not a directory).
		if err := safefs.RemoveAllAt(context.Background(), w.dfd, dataLink, w.path(dataLink)); err != nil {
			return "", err
		}
		return "", nil
	case err != nil:
		return "", &os.PathError{Op: "readlink", Path: w.path(dataLink), Err: err}
	}
	if !isTimestampDir(target) {
		// Not the writer's: never followed, replaced by the swap.
		return "", nil
	}
	var st unix.Stat_t
	if err := unix.Fstatat(w.dfd, target, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "", nil // dangling: write as if for the first time
		}
		return "", &os.PathError{Op: "stat", Path: w.path(target), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", fmt.Errorf("%s is not a directory", w.path(target))
	}
	return target, nil
}

func readlinkat(fd int, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(fd, name, buf)
		if err != nil {
			return "", err
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		if len(buf) >= MaxPathLength {
			return "", unix.ENAMETOOLONG
		}
		buf = make([]byte, 2*len(buf))
	}
}

// removeDebris removes what an interrupted update left: a ..data_tmp link
// and data directories ..data does not point at.
func (w *writer) removeDebris(current string) error {
	names, err := readDirNames(w.dfd)
	if err != nil {
		return &os.PathError{Op: "readdir", Path: w.dir, Err: err}
	}
	for _, n := range names {
		switch {
		case n == dataTmpLink:
			if err := unix.Unlinkat(w.dfd, n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return &os.PathError{Op: "unlink", Path: w.path(n), Err: err}
			}
		case isTimestampDir(n) && n != current:
			if err := safefs.RemoveAllAt(context.Background(), w.dfd, n, w.path(n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// sameContent compares the payload with the directory current: the same
// regular files (no more), bytes, modes and owners. Reading stops at the
// first difference and never reads more than the payload's size.
func (w *writer) sameContent(current string) (bool, error) {
	cfd, err := unix.Openat(w.dfd, current, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, &os.PathError{Op: "open", Path: w.path(current), Err: err}
	}
	defer unix.Close(cfd)
	count := 0
	same, err := w.sameTree(cfd, "", &count)
	if err != nil || !same {
		return false, err
	}
	return count == len(w.files), nil
}

func (w *writer) sameTree(fd int, rel string, count *int) (bool, error) {
	names, err := readDirNames(fd)
	if err != nil {
		return false, err
	}
	for _, n := range names {
		p := n
		if rel != "" {
			p = rel + "/" + n
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return false, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if !w.isDirOfPayload(p) {
				return false, nil
			}
			cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return false, err
			}
			same, err := w.sameTree(cfd, p, count)
			unix.Close(cfd)
			if err != nil || !same {
				return false, err
			}
		case unix.S_IFREG:
			f, ok := w.files[p]
			if !ok || !w.sameMeta(&st, f) {
				return false, nil
			}
			*count++
			if same, err := sameBytes(fd, n, f.Data); err != nil || !same {
				return false, err
			}
		default:
			return false, nil
		}
	}
	return true, nil
}

func (w *writer) isDirOfPayload(dir string) bool {
	prefix := dir + "/"
	for p := range w.files {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}

func (w *writer) wantMode(f File) uint32 {
	m := uint32(f.Mode.Perm())
	if w.opts.FSGroup != nil {
		m |= 0o440
	}
	return m
}

func (w *writer) sameMeta(st *unix.Stat_t, f File) bool {
	if st.Mode&0o7777 != w.wantMode(f) || st.Size != int64(len(f.Data)) {
		return false
	}
	if f.UID != nil && int64(st.Uid) != *f.UID {
		return false
	}
	if w.opts.FSGroup != nil && int64(st.Gid) != *w.opts.FSGroup {
		return false
	}
	return true
}

func sameBytes(dirfd int, name string, want []byte) (bool, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	got := make([]byte, len(want)+1)
	n, err := io.ReadFull(f, got)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return false, err
	}
	return n == len(want) && bytes.Equal(got[:n], want), nil
}

// createDataDir makes a new, uniquely named data directory.
func (w *writer) createDataDir() (string, error) {
	ts := w.opts.Now().UTC().Format("2006_01_02_15_04_05")
	for range 100 {
		name := ".." + ts + "." + strconv.FormatUint(uint64(rand.Uint32()), 10)
		err := unix.Mkdirat(w.dfd, name, dirMode)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return "", &os.PathError{Op: "mkdir", Path: w.path(name), Err: err}
		}
		// mkdir is subject to the umask.
		if err := unix.Fchmodat(w.dfd, name, dirMode, 0); err != nil {
			_ = unix.Unlinkat(w.dfd, name, unix.AT_REMOVEDIR)
			return "", &os.PathError{Op: "chmod", Path: w.path(name), Err: err}
		}
		return name, nil
	}
	return "", fmt.Errorf("cannot find a free data directory name in %s", w.dir)
}

// fill writes the files into the new directory and applies fsGroup.
func (w *writer) fill(next string) error {
	nfd, err := unix.Openat(w.dfd, next, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: w.path(next), Err: err}
	}
	defer unix.Close(nfd)
	paths := make([]string, 0, len(w.files))
	for p := range w.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := w.writeFile(nfd, next, p, w.files[p]); err != nil {
			return err
		}
	}
	if err := w.step(StepWriteFiles); err != nil {
		return err
	}
	if w.opts.FSGroup != nil {
		gid := int(*w.opts.FSGroup)
		if err := groupTree(nfd, w.path(next), gid); err != nil {
			return err
		}
		if err := groupEntry(w.dfd, w.dir, gid, true); err != nil {
			return err
		}
	}
	return w.step(StepPermissions)
}

func (w *writer) writeFile(root int, rootName, p string, f File) error {
	full := w.path(rootName + "/" + p)
	dfd, err := mkdirAllAt(root, path.Dir(p))
	if err != nil {
		return &os.PathError{Op: "mkdir", Path: full, Err: err}
	}
	if dfd != root {
		defer unix.Close(dfd)
	}
	name := path.Base(p)
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: full, Err: err}
	}
	file := os.NewFile(uintptr(fd), full)
	defer file.Close()
	if _, err := file.Write(f.Data); err != nil {
		return err
	}
	if f.UID != nil {
		if err := unix.Fchown(fd, int(*f.UID), -1); err != nil {
			return &os.PathError{Op: "chown", Path: full, Err: err}
		}
	}
	// Explicitly: the create mode is subject to the umask.
	if err := unix.Fchmod(fd, uint32(f.Mode.Perm())); err != nil {
		return &os.PathError{Op: "chmod", Path: full, Err: err}
	}
	return nil
}

// mkdirAllAt makes the directories of rel below root (which the writer
// created, so nothing there is a link) and returns a descriptor of the last
// one (root itself for "."), which the caller closes unless it is root.
func mkdirAllAt(root int, rel string) (int, error) {
	if rel == "." {
		return root, nil
	}
	fd := root
	for _, e := range strings.Split(rel, "/") {
		if err := unix.Mkdirat(fd, e, dirMode); err != nil && !errors.Is(err, unix.EEXIST) {
			closeUnlessRoot(fd, root)
			return -1, err
		}
		if err := unix.Fchmodat(fd, e, dirMode, 0); err != nil {
			closeUnlessRoot(fd, root)
			return -1, err
		}
		nfd, err := unix.Openat(fd, e, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		closeUnlessRoot(fd, root)
		if err != nil {
			return -1, err
		}
		fd = nfd
	}
	return fd, nil
}

func closeUnlessRoot(fd, root int) {
	if fd != root {
		unix.Close(fd)
	}
}

// groupTree gives gid everything below the directory open at fd.
func groupTree(fd int, dir string, gid int) error {
	names, err := readDirNames(fd)
	if err != nil {
		return &os.PathError{Op: "readdir", Path: dir, Err: err}
	}
	for _, n := range names {
		p := dir + "/" + n
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "stat", Path: p, Err: err}
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if err := groupEntryAt(fd, n, p, &st, gid, isDir); err != nil {
			return err
		}
		if isDir {
			cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return &os.PathError{Op: "open", Path: p, Err: err}
			}
			err = groupTree(cfd, p, gid)
			unix.Close(cfd)
			if err != nil {
				return err
			}
		}
	}
	return groupEntry(fd, dir, gid, true)
}

// groupEntry applies gid to the directory open at fd itself.
func groupEntry(fd int, p string, gid int, isDir bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: p, Err: err}
	}
	if err := unix.Fchown(fd, -1, gid); err != nil {
		return &os.PathError{Op: "chown", Path: p, Err: err}
	}
	want := groupMode(st.Mode, isDir)
	if want == st.Mode&0o7777 {
		return nil
	}
	if err := unix.Fchmod(fd, want); err != nil {
		return &os.PathError{Op: "chmod", Path: p, Err: err}
	}
	return nil
}

func groupEntryAt(fd int, name, p string, st *unix.Stat_t, gid int, isDir bool) error {
	if err := unix.Fchownat(fd, name, -1, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "chown", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	want := groupMode(st.Mode, isDir)
	if want == st.Mode&0o7777 {
		return nil
	}
	if err := unix.Fchmodat(fd, name, want, 0); err != nil {
		return &os.PathError{Op: "chmod", Path: p, Err: err}
	}
	return nil
}

// groupMode is the kubelet's fsGroup mode for read-only volumes: group
// read, plus search and setgid on directories.
func groupMode(mode uint32, isDir bool) uint32 {
	m := mode&0o7777 | 0o440
	if isDir {
		m |= 0o110 | unix.S_ISGID
	}
	return m
}

// linkTopLevel makes the missing <top> -> ..data/<top> links. An entry
// that exists under such a name is left alone: a correct link from an
// earlier write, or a directory for a volume mounted beneath this one.
func (w *writer) linkTopLevel() error {
	done := map[string]bool{}
	for p := range w.files {
		top := topLevel(p)
		if done[top] {
			continue
		}
		done[top] = true
		err := unix.Symlinkat(dataLink+"/"+top, w.dfd, top)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return &os.PathError{Op: "symlink", Path: w.path(top), Err: err}
		}
		if err == nil && w.opts.FSGroup != nil {
			if err := unix.Fchownat(w.dfd, top, -1, int(*w.opts.FSGroup), unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return &os.PathError{Op: "chown", Path: w.path(top), Err: err}
			}
		}
	}
	return nil
}

// swap points ..data at next with one rename.
func (w *writer) swap(next string) error {
	if err := unix.Unlinkat(w.dfd, dataTmpLink, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "unlink", Path: w.path(dataTmpLink), Err: err}
	}
	if err := unix.Symlinkat(next, w.dfd, dataTmpLink); err != nil {
		return &os.PathError{Op: "symlink", Path: w.path(dataTmpLink), Err: err}
	}
	if err := w.step(StepLinkTmp); err != nil {
		return err
	}
	if err := unix.Renameat(w.dfd, dataTmpLink, w.dfd, dataLink); err != nil {
		return &os.PathError{Op: "rename", Path: w.path(dataLink), Err: err}
	}
	return w.step(StepSwap)
}

// removeStaleLinks removes top-level links into ..data whose name the
// payload no longer has. Only links the writer makes are removed.
func (w *writer) removeStaleLinks() error {
	want := map[string]bool{}
	for p := range w.files {
		want[topLevel(p)] = true
	}
	names, err := readDirNames(w.dfd)
	if err != nil {
		return &os.PathError{Op: "readdir", Path: w.dir, Err: err}
	}
	for _, n := range names {
		if want[n] || strings.HasPrefix(n, "..") {
			continue
		}
		target, err := readlinkat(w.dfd, n)
		if err != nil || target != dataLink+"/"+n {
			continue // not one of ours
		}
		if err := unix.Unlinkat(w.dfd, n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "unlink", Path: w.path(n), Err: err}
		}
	}
	return nil
}

// MakeDirs makes directories (relative paths, checked as payload paths are)
// in dir, never following a link: the mount points of volumes that
// containers mount beneath this one, which they see read-only. Made before
// the first Write, such a directory shadows a key of the same top-level
// name, as in the kubelet.
func MakeDirs(dir string, rels []string) error {
	if len(rels) == 0 {
		return nil
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	for _, rel := range rels {
		if err := ValidatePath(rel); err != nil {
			return fmt.Errorf("mount point beneath the volume: %w", err)
		}
		fd, err := openDirsAt(dfd, path.Clean(rel))
		if err != nil {
			return &os.PathError{Op: "mkdir", Path: dir + "/" + rel, Err: err}
		}
		if fd != dfd {
			unix.Close(fd)
		}
	}
	return nil
}

// openDirsAt is mkdirAllAt for a directory that may already hold entries:
// an existing link or file in the way is an error, never followed.
func openDirsAt(root int, rel string) (int, error) {
	fd := root
	for _, e := range strings.Split(rel, "/") {
		if err := unix.Mkdirat(fd, e, dirMode); err != nil && !errors.Is(err, unix.EEXIST) {
			closeUnlessRoot(fd, root)
			return -1, err
		}
		nfd, err := unix.Openat(fd, e, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		closeUnlessRoot(fd, root)
		if err != nil {
			return -1, err
		}
		fd = nfd
	}
	return fd, nil
}

func readDirNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "")
	defer f.Close()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return f.Readdirnames(-1)
}

// ReadFile reads the file at rel (a payload path) of the content dir holds
// now, at most limit bytes, on file descriptors: ..data must point at a
// data directory, and no link is followed on the way (a link or anything
// but a regular file is an error). For content the agent wrote and must
// read back (a pod certificate's key after a restart).
func ReadFile(dir, rel string, limit int64) ([]byte, error) {
	if err := ValidatePath(rel); err != nil {
		return nil, err
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	target, err := readlinkat(dfd, dataLink)
	if err != nil {
		return nil, &os.PathError{Op: "readlink", Path: dir + "/" + dataLink, Err: err}
	}
	if !isTimestampDir(target) {
		return nil, fmt.Errorf("%s/%s does not point at a data directory", dir, dataLink)
	}
	fd, err := unix.Openat(dfd, target, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir + "/" + target, Err: err}
	}
	elems := strings.Split(path.Clean(rel), "/")
	for _, e := range elems[:len(elems)-1] {
		nfd, err := unix.Openat(fd, e, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: dir + "/" + rel, Err: err}
		}
		fd = nfd
	}
	ffd, err := unix.Openat(fd, elems[len(elems)-1], unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	unix.Close(fd)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir + "/" + rel, Err: err}
	}
	f := os.NewFile(uintptr(ffd), dir+"/"+rel)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s/%s is not a regular file", dir, rel)
	}
	return io.ReadAll(io.LimitReader(f, limit))
}
