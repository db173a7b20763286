// Package mountutil is the agent's thin layer over the kernel's mount table:
// tmpfs and bind mounts straight through mount(2) (forking mount(8) per
// volume would cost more than the whole mount budget), unmounts that treat
// "not mounted" as done, mount-point checks and formatting through
// k8s.io/mount-utils. Removing a volume's content is internal/safefs's.
package mountutil

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
	"k8s.io/utils/exec"

	"github.com/volume-agent/volume-agent/internal/pathcall"
)

// Mounter performs mounts. It is safe for concurrent use.
type Mounter struct {
	utils *mount.SafeFormatAndMount
}

// New returns a Mounter for this host.
func New() *Mounter {
	return &Mounter{utils: &mount.SafeFormatAndMount{Interface: mount.NewWithoutSystemd(""), Exec: exec.New()}}
}

// IsMountPoint reports whether path is a mount point. A missing path is not.
func (m *Mounter) IsMountPoint(path string) (bool, error) {
	ok, err := m.utils.IsMountPoint(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil && mount.IsCorruptedMnt(err) {
		// A mount whose backing store went away (stale NFS, dead FUSE) is
		// still a mount point and must be unmounted.
		return true, nil
	}
	return ok, err
}

// TmpfsOptions configures a tmpfs mount.
type TmpfsOptions struct {
	// SizeBytes limits the tmpfs; 0 leaves the kernel default (half of RAM).
	SizeBytes int64
	// Mode of the tmpfs root directory.
	Mode os.FileMode
	// NoSwap keeps the tmpfs's pages out of swap (Linux 6.4+; ignored by
	// older kernels): for secrets that must never reach a disk.
	NoSwap bool
	// Resize changes the size of the tmpfs mounted at target instead of
	// mounting a new one (Mode and NoSwap are then ignored).
	Resize bool
}

// tmpfsData is the mount data of a new tmpfs,
// mode=0<octal>[,size=<bytes>][,noswap], NUL-terminated for mount(2): one
// allocation (a storm mounts thousands).
func tmpfsData(o TmpfsOptions, noswap bool) []byte {
	b := make([]byte, 0, 56)
	b = append(b, "mode=0"...)
	if perm := o.Mode.Perm(); perm != 0 {
		b = strconv.AppendUint(b, uint64(perm), 8)
	}
	if o.SizeBytes > 0 {
		b = append(b, ",size="...)
		b = strconv.AppendInt(b, o.SizeBytes, 10)
	}
	if noswap {
		b = append(b, ",noswap"...)
	}
	return append(b, 0)
}

// MountTmpfs mounts a new tmpfs at target, which must exist (or resizes
// the one there, see TmpfsOptions.Resize).
func (m *Mounter) MountTmpfs(target string, o TmpfsOptions) error {
	if o.Resize {
		if err := unix.Mount("tmpfs", target, "tmpfs", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d", o.SizeBytes)); err != nil {
			return &os.PathError{Op: "resize tmpfs", Path: target, Err: err}
		}
		return nil
	}
	var err error
	if o.NoSwap {
		err = mountTmpfs(target, tmpfsData(o, true))
	}
	// Kernels before 6.4 do not know noswap. Without it, nothing was tried
	// (no error to match, which took a storm's errors.Is twice a volume).
	if !o.NoSwap || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		err = mountTmpfs(target, tmpfsData(o, false))
	}
	if err != nil {
		return &os.PathError{Op: "mount tmpfs", Path: target, Err: err}
	}
	return nil
}

// tmpfs names the source and the type of a tmpfs mount, NUL-terminated.
var tmpfs = [...]byte{'t', 'm', 'p', 'f', 's', 0}

// mountTmpfs is unix.Mount("tmpfs", target, "tmpfs", MS_NOSUID|MS_NODEV,
// data) with data already NUL-terminated: one copy of a string (target)
// where unix.Mount makes four, and builds data in a fifth.
func mountTmpfs(target string, data []byte) error {
	t, err := unix.BytePtrFromString(target)
	if err != nil {
		return err
	}
	_, _, errno := unix.Syscall6(unix.SYS_MOUNT, uintptr(unsafe.Pointer(&tmpfs[0])), uintptr(unsafe.Pointer(t)),
		uintptr(unsafe.Pointer(&tmpfs[0])), unix.MS_NOSUID|unix.MS_NODEV, uintptr(unsafe.Pointer(&data[0])), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// BindOptions configures a bind mount.
type BindOptions struct {
	ReadOnly bool
	// Recursive also binds the mounts below source (what users of hostPath
	// expect: a container runtime binds host paths recursively too).
	Recursive bool
	// Flags are extra MS_* flags applied with the read-only remount, from
	// mount options such as nosuid or noexec.
	Flags uintptr
}

// BindMount makes source visible at target, which must exist (a directory
// for a directory source, a file for anything else).
func (m *Mounter) BindMount(source, target string, o BindOptions) error {
	flags := uintptr(unix.MS_BIND)
	if o.Recursive {
		flags |= unix.MS_REC
	}
	if err := unix.Mount(source, target, "", flags, ""); err != nil {
		return &os.PathError{Op: "bind mount " + source + " on", Path: target, Err: err}
	}
	if !o.ReadOnly && o.Flags == 0 {
		return nil
	}
	if err := m.remountBind(target, o); err != nil {
		// Never leave a writable bind mount where a read-only one was asked.
		_ = unix.Unmount(target, 0)
		return err
	}
	return nil
}

// remountBind applies read-only and other flags to a fresh bind mount. The
// flags the source mount is locked with (nosuid, nodev, noexec...) must be
// repeated or the kernel refuses the remount.
func (m *Mounter) remountBind(target string, o BindOptions) error {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return &os.PathError{Op: "statfs", Path: target, Err: err}
	}
	flags := uintptr(unix.MS_BIND|unix.MS_REMOUNT) | o.Flags | lockedFlags(st.Flags)
	if o.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return &os.PathError{Op: "remount", Path: target, Err: err}
	}
	if o.ReadOnly && o.Recursive {
		// Make the mounts below read-only too; without this a recursive
		// read-only bind would leave submounts writable.
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(-1, target, unix.AT_RECURSIVE, attr); err != nil && !errors.Is(err, unix.ENOSYS) {
			return &os.PathError{Op: "mount_setattr", Path: target, Err: err}
		}
	}
	return nil
}

func lockedFlags(statfsFlags int64) uintptr {
	var f uintptr
	for _, m := range []struct {
		st int64
		ms uintptr
	}{
		{unix.ST_NOSUID, unix.MS_NOSUID},
		{unix.ST_NODEV, unix.MS_NODEV},
		{unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
		{unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if statfsFlags&m.st != 0 {
			f |= m.ms
		}
	}
	return f
}

// Unmount unmounts target. A target that is not mounted, or missing, is
// already done.
func (m *Mounter) Unmount(target string) error {
	_, err := m.unmountOnce(target)
	return err
}

// unmountOnce unmounts the top mount on target and reports whether there
// was one. umount(2) answers EINVAL for a path that is not a mount point,
// which makes a separate mount-point check unnecessary.
func (m *Mounter) unmountOnce(target string) (bool, error) {
	err := pathcall.Unmount(target, 0)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EINVAL):
		return false, nil
	}
	return false, &os.PathError{Op: "unmount", Path: target, Err: err}
}

// maxStackedMounts bounds how many mounts UnmountAll peels off one path:
// more than one means something mounted twice, which must still be cleaned
// up.
const maxStackedMounts = 16

// UnmountAll unmounts every mount stacked on target.
func (m *Mounter) UnmountAll(target string) error {
	for i := 0; i < maxStackedMounts; i++ {
		unmounted, err := m.unmountOnce(target)
		if err != nil || !unmounted {
			return err
		}
	}
	return fmt.Errorf("%s is still a mount point after %d unmounts", target, maxStackedMounts)
}

// UnmountTree unmounts every mount stacked on target and every mount below
// it: a recursive bind mount brings the source's submounts along, and the
// kernel refuses (EBUSY) to unmount a mount that has others below it. The
// tree is made a slave first, so that unmounting the submounts can never
// propagate back to the mounts they were bound from.
func (m *Mounter) UnmountTree(target string) error {
	err := m.UnmountAll(target)
	if err == nil || !errors.Is(err, unix.EBUSY) {
		return err
	}
	below, lerr := mountsBelow(target)
	if lerr != nil || len(below) == 0 {
		// Busy for another reason (open files): report that.
		return err
	}
	if err := unix.Mount("", target, "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil && !errors.Is(err, unix.EINVAL) {
		return &os.PathError{Op: "make rslave", Path: target, Err: err}
	}
	for _, p := range below {
		if err := m.UnmountAll(p); err != nil {
			return err
		}
	}
	return m.UnmountAll(target)
}

// mountsBelow lists the mount points strictly below dir, deepest first.
func mountsBelow(dir string) ([]string, error) {
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	mounts, err := ReadMountInfo()
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for i := len(mounts) - 1; i >= 0; i-- {
		p := mounts[i].Mountpoint
		if rest, ok := within(p, filepath.Clean(dir)); ok && rest != "/" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	// Deepest first; among equals, the newest (listed last) first.
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out, nil
}

// FormatAndMount mounts a block device, formatting it first only when it has
// no filesystem at all; a device with a different filesystem is never
// reformatted and fails with an error saying so.
func (m *Mounter) FormatAndMount(device, target, fsType string, options []string) error {
	err := m.utils.FormatAndMount(device, target, fsType, options)
	var me mount.MountError
	if errors.As(err, &me) && me.Type == mount.FilesystemMismatch {
		// mount(8)'s "wrong fs type, bad option, bad superblock" does
		// not say what is wrong.
		if existing, ferr := m.DiskFormat(device); ferr == nil && existing != "" && existing != fsType {
			return fmt.Errorf("device %s is formatted as %s, not %s, and is never reformatted: %w", device, existing, fsType, err)
		}
	}
	return err
}

// DiskFormat returns the filesystem on device, "" if none.
func (m *Mounter) DiskFormat(device string) (string, error) {
	return m.utils.GetDiskFormat(device)
}

// MountRefs lists other mount points of the same mount as path (bind
// mounts of a device mount).
func (m *Mounter) MountRefs(path string) ([]string, error) {
	return mountRefs(path)
}

// EnsureDir creates dir (and parents) with mode if missing. It reports
// whether it created dir: a directory made just now cannot be a mount point,
// which saves callers a check.
func EnsureDir(dir string, mode os.FileMode) (created bool, err error) {
	err = mkdir(dir, mode)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		if err := mkdirParents(filepath.Dir(dir)); err != nil {
			return false, err
		}
		err = mkdir(dir, mode)
		if err == nil {
			return true, nil
		}
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
	}
	return false, err
}

// mkdir is os.Mkdir without allocating the path's C string (see
// internal/pathcall): a storm makes every volume's directory.
func mkdir(dir string, mode os.FileMode) error {
	if mode&^fs.ModePerm != 0 {
		return os.Mkdir(dir, mode) // os maps the special bits
	}
	for {
		err := pathcall.Mkdir(dir, uint32(mode))
		switch {
		case err == nil:
			return nil
		case err != unix.EINTR:
			return &os.PathError{Op: "mkdir", Path: dir, Err: err}
		}
	}
}

// mkdirParents creates dir and its missing parents with mode 0750. Unlike
// os.MkdirAll it does not stat its way up first: in a mount storm the
// parents are usually a pod directory or two that are missing, and a
// failing mkdir costs what a stat does.
func mkdirParents(dir string) error {
	for range 64 {
		err := unix.Mkdir(dir, 0o750)
		switch {
		case err == nil, errors.Is(err, unix.EEXIST):
			// Another volume of the pod may have made it first; a file in
			// its place fails the mkdir below it with ENOTDIR.
			return nil
		case !errors.Is(err, unix.ENOENT):
			return &os.PathError{Op: "mkdir", Path: dir, Err: err}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return &os.PathError{Op: "mkdir", Path: dir, Err: err}
		}
		if err := mkdirParents(parent); err != nil {
			return err
		}
	}
	return &os.PathError{Op: "mkdir", Path: dir, Err: unix.ENOENT}
}

// hasSubdirs reports whether dir is a directory with directories in it, by
// its link count (2 and one per subdirectory on ext4, xfs and tmpfs): an
// lstat, where a failing rmdir on ext4 starts a journal transaction and
// locks the parent before it finds the directory not empty. In a teardown
// storm, most of a pod's volumes find their siblings still there. On
// filesystems that count otherwise (btrfs: 1) it says no, and rmdir
// decides as before. missing reports that dir is not there (a sibling's
// teardown removed it first): an rmdir would only fail.
func hasSubdirs(dir string) (subdirs, missing bool) {
	isDir, nlink, err := pathcall.Links(dir)
	if err != nil {
		return false, errors.Is(err, unix.ENOENT)
	}
	return isDir && nlink > 2, false
}

// RemoveEmptyDirs removes dir and then its parents while they are empty,
// stopping at (and never removing) stop. Errors are ignored: a directory that
// is not empty is simply still in use.
//
// A directory that goes away under the climb (found, then gone; or gone
// once this climb removed the one below it) was removed by another climb,
// of a sibling volume torn down at the same time, which goes on up from
// there with this climb's removals already done: this one stops instead
// of racing it level by level (a failing lstat and rmdir each). Only
// where dir itself is missing is it unknown whether it ever existed, and
// the climb goes on.
func RemoveEmptyDirs(dir, stop string) {
	RemoveEmptyCleanDirs(filepath.Clean(dir), filepath.Clean(stop))
}

// RemoveEmptyCleanDirs is RemoveEmptyDirs of paths already clean (a
// storm's operations name theirs once), and reports whether this call
// removed dir itself.
func RemoveEmptyCleanDirs(dir, stop string) (removedDir bool) {
	removed := false // the level below, by this climb
	// Each parent of a clean path is the part before its last "/" (all
	// the d below are strictly below stop, so never "/"): no Clean per
	// level, nor a "stop/" to concatenate.
	for d := dir; below(d, stop); d = d[:strings.LastIndexByte(d, '/')] {
		subdirs, missing := hasSubdirs(d)
		switch {
		case subdirs, missing && removed:
			return removedDir
		case missing:
			continue // as a failing rmdir would: its parent may be empty
		}
		if err := pathcall.Rmdir(d); err != nil {
			return removedDir
		}
		removed, removedDir = true, removedDir || len(d) == len(dir)
	}
	return removedDir
}

// below reports whether clean path d is strictly below clean path stop
// other than "/" (d != stop && strings.HasPrefix(d, stop+"/"), without
// the concatenation).
func below(d, stop string) bool {
	return len(d) > len(stop)+1 && d[len(stop)] == '/' && d[:len(stop)] == stop
}
