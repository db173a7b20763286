package disklimit

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Images is the image backend: one ext4 image per volume, a sparse file in
// Dir named by the volume (ImageKey), formatted once when it is made and
// mounted at the volume's directory through a loop device.
//
// Nothing but the mount keeps the loop device: it is configured with
// autoclear and held open only until the mount holds it, so unmounting
// releases it and a crash between attaching and mounting leaves nothing
// (the kernel clears it when the dead process's descriptor closes). An
// image is made under a temporary name and renamed into place once
// formatted, so an image in Dir is always a complete filesystem. An image
// no loop device uses is garbage: Sweep deletes it at start (before any
// volume is set up), Release when its volume is torn down.
type Images struct {
	Dir string
	Log *zap.Logger
	// SysBlock and Dev default to /sys/block and /dev.
	SysBlock, Dev string

	// mu serialises loop device allocations, which would otherwise race
	// each other for the same free device.
	mu sync.Mutex
}

// ImageKey names a volume's image: "<podUID>~<volume>", or a hash of both
// when either is not a plain path element (a UID from a manifest can be
// anything).
func ImageKey(podUID, volumeName string) string {
	if plainElem(podUID) && plainElem(volumeName) && len(podUID)+len(volumeName) < 200 && !strings.HasPrefix(podUID, "sha256-") {
		return podUID + "~" + volumeName
	}
	sum := sha256.Sum256([]byte(podUID + "/" + volumeName))
	return "sha256-" + hex.EncodeToString(sum[:])
}

func plainElem(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/~\x00") && !strings.HasPrefix(s, ".")
}

// Path is where key's image is.
func (im *Images) Path(key string) string { return filepath.Join(im.Dir, key+".img") }

// ErrNotEmpty is returned by SetUp for a volume directory that exists, is
// not mounted and has content: it was set up without a limit (by a run
// with enforcement off) and mounting over it would hide the pod's files.
var ErrNotEmpty = errors.New("the volume's directory was set up without a limit and holds files")

// SetUp mounts key's image, of limit usable bytes (made if missing), at
// dir. A dir already mounted is done. The caller sets the mode and group
// of the mounted filesystem's root.
func (im *Images) SetUp(ctx context.Context, dir, key string, limit int64) error {
	mounted, _, err := mountPoint(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case mounted:
		return nil
	default:
		if empty, err := isEmptyDir(dir); err != nil || !empty {
			if err == nil {
				err = ErrNotEmpty
			}
			return err
		}
	}
	fresh, err := im.ensureImage(ctx, key, limit)
	if err != nil {
		return err
	}
	loop, err := im.attach(im.Path(key))
	if err != nil {
		return err
	}
	// Until the mount holds the loop device, this descriptor is all that
	// keeps it (autoclear).
	defer loop.Close()
	if err := os.Mkdir(dir, 0o750); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := unix.Mount(loop.Name(), dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mounting %s (image %s) at %s: %w", loop.Name(), im.Path(key), dir, err)
	}
	if fresh {
		// A pod's emptyDir starts empty; mke2fs always makes lost+found.
		if err := os.Remove(filepath.Join(dir, "lost+found")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			im.Log.Warn("cannot remove lost+found from a new emptyDir image", zap.String("dir", dir), zap.Error(err))
		}
	}
	return nil
}

// Release deletes key's image once its volume's directory is unmounted,
// and lets go of a loop device still configured over it (autoclear: one
// still in use, mounted elsewhere, goes when its last user does).
func (im *Images) Release(key string) error {
	path := im.Path(key)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &os.PathError{Op: "stat", Path: path, Err: err}
	}
	loops, err := im.scan()
	if err != nil {
		return err
	}
	for _, l := range loops {
		if l.device == st.Dev && l.inode == st.Ino {
			if err := im.clear(l.name); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Sweep cleans up what a crash left in Dir: loop devices over its images
// that nothing mounts, half-made images, and images no loop device uses
// (their volume's mount is gone). It must not run while a volume is being
// set up.
func (im *Images) Sweep() error {
	entries, err := os.ReadDir(im.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	loops, err := im.scan()
	if err != nil {
		return err
	}
	prefix := filepath.Clean(im.Dir) + "/"
	for _, l := range loops {
		if strings.HasPrefix(l.backing, prefix) {
			// Clears only a loop device nothing holds; a mounted one
			// already has autoclear.
			if err := im.clear(l.name); err != nil {
				return err
			}
		}
	}
	if loops, err = im.scan(); err != nil {
		return err
	}
	used := map[[2]uint64]bool{}
	for _, l := range loops {
		used[[2]uint64{l.device, l.inode}] = true
	}
	for _, e := range entries {
		path := filepath.Join(im.Dir, e.Name())
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG && used[[2]uint64{st.Dev, st.Ino}] {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			continue // not ours: never made here
		}
		im.Log.Info("removing an emptyDir image nothing mounts", zap.String("image", path))
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// ensureImage makes key's image if it is missing and reports whether it did.
func (im *Images) ensureImage(ctx context.Context, key string, limit int64) (bool, error) {
	path := im.Path(key)
	if _, err := os.Lstat(path); err == nil {
		return false, nil
	}
	if err := os.MkdirAll(im.Dir, 0o700); err != nil {
		return false, err
	}
	tmp := path + ".tmp"
	if err := MakeImage(ctx, tmp, limit); err != nil {
		os.Remove(tmp)
		return false, err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return false, err
	}
	return true, nil
}

// maxSizingRounds bounds MakeImage's formatting rounds (each a mkfs of a
// sparse file, milliseconds); two or three nearly always land within
// sizingTolerance of the limit.
const (
	maxSizingRounds = 6
	sizingTolerance = 512 << 10
)

// MakeImage makes a sparse ext4 image at path whose filesystem offers at
// least limit bytes, and little more, to an unprivileged writer. No block
// is reserved for root (-m 0); the filesystem's own overhead (inode
// tables, journal, the kernel's reserve for delayed allocation) is added to
// the file's size, measured from the superblock mke2fs wrote and formatted
// again at the corrected size, so a 16Mi limit lets the pod write 16Mi
// and not 17Mi.
func MakeImage(ctx context.Context, path string, limit int64) error {
	if limit <= 0 {
		return fmt.Errorf("image size limit %d is not positive", limit)
	}
	size := roundUp(limit, 4096)
	best := int64(0) // the smallest size found to be enough
	for range maxSizingRounds {
		if err := format(ctx, path, size); err != nil {
			return err
		}
		avail, err := available(path)
		if err != nil {
			return err
		}
		if avail >= limit {
			if avail-limit <= sizingTolerance {
				return syncFile(path)
			}
			if best == 0 || size < best {
				best = size
			}
		}
		// The overhead grows about in proportion to the size (inode
		// tables, the reserve), plus steps (the journal): a Newton step
		// on that slope nearly always lands within the tolerance.
		slope := float64(max(avail, 4096)) / float64(size)
		next := roundUp(size+int64(float64(limit-avail)/slope), 4096)
		if avail < limit {
			next = max(next, size+4096)
		} else {
			next = min(next, size-4096)
		}
		size = next
	}
	if best == 0 {
		return fmt.Errorf("formatting %s: no size up to %d bytes offers %d usable bytes", path, size, limit)
	}
	if err := format(ctx, path, best); err != nil {
		return err
	}
	return syncFile(path)
}

func format(ctx context.Context, path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// No resize inode: nothing grows these filesystems, and its reserved
	// blocks would be overhead. Lazy init: the file stays sparse.
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096",
		"-O", "^resize_inode", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// available is what an unprivileged writer can write to the unmounted ext4
// filesystem at path: its free blocks less the kernel's reserve for
// delayed allocation (ext4_calculate_resv_clusters: 2 % of the blocks, at
// most 4096), as statfs(2) reports f_bavail once it is mounted.
func available(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return 0, fmt.Errorf("reading the superblock of %s: %w", path, err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[0x38:]) != 0xEF53 {
		return 0, fmt.Errorf("%s: no ext4 superblock", path)
	}
	blockSize := int64(1024) << le.Uint32(sb[0x18:])
	blocks := int64(le.Uint32(sb[0x4:]))
	free := int64(le.Uint32(sb[0xC:]))
	reserved := int64(le.Uint32(sb[0x8:]))
	const incompat64bit = 0x80
	if le.Uint32(sb[0x60:])&incompat64bit != 0 {
		blocks |= int64(le.Uint32(sb[0x150:])) << 32
		reserved |= int64(le.Uint32(sb[0x154:])) << 32
		free |= int64(le.Uint32(sb[0x158:])) << 32
	}
	resv := min(blocks/50, 4096)
	return (free - reserved - resv) * blockSize, nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// attach configures a free loop device over the image at path, with
// autoclear, and returns it open.
func (im *Images) attach(path string) (*os.File, error) {
	backing, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer backing.Close()
	im.mu.Lock()
	defer im.mu.Unlock()
	ctl, err := os.OpenFile(filepath.Join(im.dev(), "loop-control"), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("attaching %s: %w", path, err)
	}
	defer ctl.Close()
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], path)
	var lastErr error
	// Another program may take the free device between the two calls.
	for range 16 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("attaching %s: no free loop device: %w", path, err)
		}
		lf, err := os.OpenFile(filepath.Join(im.dev(), "loop"+strconv.Itoa(n)), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			lastErr = err
			continue
		}
		if err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg); err == nil {
			return lf, nil
		}
		lf.Close()
		lastErr = err
		if !errors.Is(err, unix.EBUSY) {
			break
		}
	}
	return nil, fmt.Errorf("attaching %s to a loop device: %w", path, lastErr)
}

// clear detaches a loop device nothing holds; one in use (mounted) is
// only marked autoclear by the kernel, and goes with its last user.
func (im *Images) clear(name string) error {
	f, err := os.OpenFile(filepath.Join(im.dev(), name), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detaching %s: %w", name, err)
	}
	return nil
}

type loopDev struct {
	name, backing string
	device, inode uint64
}

// scan lists the attached loop devices with their backing files.
func (im *Images) scan() ([]loopDev, error) {
	entries, err := os.ReadDir(im.sysBlock())
	if err != nil {
		return nil, err
	}
	var out []loopDev
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "loop") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(im.sysBlock(), name, "loop", "backing_file"))
		if err != nil {
			continue // not attached
		}
		l := loopDev{name: name, backing: strings.TrimSuffix(strings.TrimRight(string(raw), "\n"), " (deleted)")}
		f, err := os.OpenFile(filepath.Join(im.dev(), name), os.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
		f.Close()
		if err != nil {
			continue // detached meanwhile
		}
		l.device, l.inode = info.Device, info.Inode
		out = append(out, l)
	}
	return out, nil
}

// backs tells whether the filesystem on device dev is one of im's images:
// a loop device whose backing file is in im.Dir.
func (im *Images) backs(dev uint64) bool {
	link := filepath.Join(filepath.Dir(im.sysBlock()), "dev", "block", fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev)), "loop", "backing_file")
	raw, err := os.ReadFile(link)
	if err != nil {
		return false // not a loop device, or detached
	}
	backing := strings.TrimSuffix(strings.TrimRight(string(raw), "\n"), " (deleted)")
	return filepath.Dir(backing) == filepath.Clean(im.Dir) && strings.HasSuffix(backing, ".img")
}

func (im *Images) sysBlock() string {
	if im.SysBlock != "" {
		return im.SysBlock
	}
	return "/sys/block"
}

func (im *Images) dev() string {
	if im.Dev != "" {
		return im.Dev
	}
	return "/dev"
}

func isEmptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return len(names) == 0, err
}
