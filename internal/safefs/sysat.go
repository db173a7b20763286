package safefs

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The *at system calls on a NUL-terminated name still in a walker's dirent
// buffer: the unix package's versions take a string and copy it, an
// allocation per call that the group walk, three calls per file, would
// otherwise make for every entry of a volume.

// statAtC is statAt on a NUL-terminated name.
func statAtC(dirfd int, cname []byte) (fileStat, error) {
	var stx unix.Statx_t
	_, _, e := unix.Syscall6(unix.SYS_STATX, uintptr(dirfd), uintptr(unsafe.Pointer(&cname[0])),
		unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, statxMask, uintptr(unsafe.Pointer(&stx)), 0)
	if e != 0 {
		return fileStat{}, e
	}
	return statxToFileStat(&stx), nil
}

// fchownatC gives the NUL-terminated name (never a link's target) the
// group gid.
func fchownatC(dirfd int, cname []byte, gid int) error {
	noUID := -1
	_, _, e := unix.Syscall6(unix.SYS_FCHOWNAT, uintptr(dirfd), uintptr(unsafe.Pointer(&cname[0])),
		uintptr(noUID), uintptr(gid), unix.AT_SYMLINK_NOFOLLOW, 0)
	if e != 0 {
		return e
	}
	return nil
}

// fchmodat2C changes the mode of the NUL-terminated name unless it is a
// symbolic link (EOPNOTSUPP then; ENOSYS before Linux 6.6: chmodNoFollow
// does it another way).
func fchmodat2C(dirfd int, cname []byte, mode uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_FCHMODAT2, uintptr(dirfd), uintptr(unsafe.Pointer(&cname[0])),
		uintptr(mode), unix.AT_SYMLINK_NOFOLLOW, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
