// Package pathcall makes the path system calls of a storm (umount2,
// rmdir, a link count, mkdir) as golang.org/x/sys/unix does, without allocating
// each path's C string: a storm tears down thousands of volumes with a few
// such calls each, and the copies were most of their user-side cost and
// garbage. A path is copied into a buffer on the stack instead (the
// runtime never moves a stack during a system call); a long path, or one
// with a NUL byte, goes through unix as before. The kernel sees the same
// bytes, so nothing about how a path resolves changes.
package pathcall

import (
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// bufLen bounds the paths copied on the stack: a pod volume's directory
// is about 120 bytes under the default root.
const bufLen = 256

// cString copies s and a NUL into buf, or reports that it cannot: s is
// too long, or holds a NUL (unix then answers EINVAL).
func cString(buf *[bufLen]byte, s string) bool {
	if len(s) >= bufLen || strings.IndexByte(s, 0) >= 0 {
		return false
	}
	copy(buf[:], s)
	buf[len(s)] = 0
	return true
}

// atFDCWD is unix.AT_FDCWD as a call's argument (a negative constant
// does not convert to uintptr).
var atFDCWD = unix.AT_FDCWD

// errno is the error of a call's errno, nil for none.
func errno(e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// Unmount is unix.Unmount.
func Unmount(target string, flags int) error {
	var buf [bufLen]byte
	if !cString(&buf, target) {
		return unix.Unmount(target, flags)
	}
	_, _, e := unix.Syscall(unix.SYS_UMOUNT2, uintptr(unsafe.Pointer(&buf[0])), uintptr(flags), 0)
	return errno(e)
}

// Rmdir is unix.Rmdir.
func Rmdir(path string) error {
	var buf [bufLen]byte
	if !cString(&buf, path) {
		return unix.Rmdir(path)
	}
	_, _, e := unix.Syscall(unix.SYS_UNLINKAT, uintptr(atFDCWD), uintptr(unsafe.Pointer(&buf[0])), unix.AT_REMOVEDIR)
	return errno(e)
}

// Mkdir is unix.Mkdir.
func Mkdir(path string, mode uint32) error {
	var buf [bufLen]byte
	if !cString(&buf, path) {
		return unix.Mkdir(path, mode)
	}
	_, _, e := unix.Syscall(unix.SYS_MKDIRAT, uintptr(atFDCWD), uintptr(unsafe.Pointer(&buf[0])), uintptr(mode))
	return errno(e)
}

// Links is what unix.Lstat says of path's type and link count: whether it
// is a directory, and its links.
func Links(path string) (dir bool, nlink uint64, err error) {
	var buf [bufLen]byte
	if cString(&buf, path) {
		// statx of just these two: lstat's whole stat is more to fill.
		const want = unix.STATX_TYPE | unix.STATX_NLINK
		var stx unix.Statx_t
		_, _, e := unix.Syscall6(unix.SYS_STATX, uintptr(atFDCWD), uintptr(unsafe.Pointer(&buf[0])),
			unix.AT_SYMLINK_NOFOLLOW, want, uintptr(unsafe.Pointer(&stx)), 0)
		switch {
		// ENOSYS, EPERM: no statx here (old kernels, old seccomp
		// profiles); lstat answers.
		case e != 0 && e != unix.ENOSYS && e != unix.EPERM:
			return false, 0, e
		case e == 0 && stx.Mask&want == want:
			return uint32(stx.Mode)&unix.S_IFMT == unix.S_IFDIR, uint64(stx.Nlink), nil
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, 0, err
	}
	return st.Mode&unix.S_IFMT == unix.S_IFDIR, uint64(st.Nlink), nil
}
