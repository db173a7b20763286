package disklimit

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kernel is the real Quotactl: quotactl_fd(2) (Linux 5.14+) on a
// descriptor of the filesystem, so no device path has to be found (the
// agent in a container may not see the node's /dev), and the fsxattr
// ioctls.
type Kernel struct{}

var _ Quotactl = Kernel{}

// The kernel's constants and structures, which golang.org/x/sys does not
// define (linux/quota.h, linux/dqblk_xfs.h, linux/fs.h).
const (
	prjQuota = 2

	qGetQuota   = 0x800007
	qSetQuota   = 0x800008
	qXGetQStatV = 'X'<<8 + 8

	qifBLimits = 1

	fsQuotaPDQEnforced = 1 << 5
	fsQStatVVersion1   = 1

	fsIocFSGetXattr    = 0x801c581f
	fsIocFSSetXattr    = 0x401c5820
	fsXflagProjInherit = 0x200

	// qifBlockSize is the unit of if_dqblk's block limits.
	qifBlockSize = 1024
)

type ifDqblk struct {
	BHardLimit, BSoftLimit, CurSpace  uint64
	IHardLimit, ISoftLimit, CurInodes uint64
	BTime, ITime                      uint64
	Valid                             uint32
	_                                 uint32
}

type fsxattr struct {
	XFlags, ExtSize, NExtents, ProjID, CowExtSize uint32
	_                                             [8]byte
}

func qcmd(cmd, typ uint32) uint32 { return cmd<<8 | typ&0xff }

func quotactlFD(dir string, cmd uint32, id uint32, addr unsafe.Pointer) error {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, _, errno := unix.Syscall6(unix.SYS_QUOTACTL_FD, f.Fd(), uintptr(cmd), uintptr(id), uintptr(addr), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// Enforced implements Quotactl.
func (Kernel) Enforced(dir string) error {
	var buf [256]byte
	buf[0] = fsQStatVVersion1
	err := quotactlFD(dir, qcmd(qXGetQStatV, prjQuota), 0, unsafe.Pointer(&buf[0]))
	switch {
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("the kernel has no quotactl_fd (quota support off, or older than 5.14): %w", err)
	case err != nil:
		return fmt.Errorf("project quotas are not on for %s: %w", dir, err)
	}
	if flags := uint16(buf[2]) | uint16(buf[3])<<8; flags&fsQuotaPDQEnforced == 0 {
		return fmt.Errorf("project quotas are accounted but not enforced on %s", dir)
	}
	return nil
}

func fsxattrOf(dir string, req uint) (*os.File, *fsxattr, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var a fsxattr
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(unsafe.Pointer(&a))); errno != 0 {
		f.Close()
		return nil, nil, &os.PathError{Op: "FS_IOC_FSGETXATTR", Path: dir, Err: errno}
	}
	return f, &a, nil
}

// Project implements Quotactl.
func (Kernel) Project(dir string) (uint32, error) {
	f, a, err := fsxattrOf(dir, fsIocFSGetXattr)
	if err != nil {
		return 0, err
	}
	f.Close()
	return a.ProjID, nil
}

// SetProject implements Quotactl.
func (Kernel) SetProject(dir string, id uint32) error {
	f, a, err := fsxattrOf(dir, fsIocFSGetXattr)
	if err != nil {
		return err
	}
	defer f.Close()
	a.ProjID = id
	a.XFlags |= fsXflagProjInherit
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFSSetXattr, uintptr(unsafe.Pointer(a))); errno != 0 {
		return &os.PathError{Op: "FS_IOC_FSSETXATTR", Path: dir, Err: errno}
	}
	return nil
}

// SetLimit implements Quotactl.
func (Kernel) SetLimit(fsDir string, id uint32, bytes int64) error {
	d := ifDqblk{Valid: qifBLimits, BHardLimit: uint64((bytes + qifBlockSize - 1) / qifBlockSize)}
	return quotactlFD(fsDir, qcmd(qSetQuota, prjQuota), id, unsafe.Pointer(&d))
}

// Quota implements Quotactl.
func (Kernel) Quota(fsDir string, id uint32) (Quota, error) {
	var d ifDqblk
	err := quotactlFD(fsDir, qcmd(qGetQuota, prjQuota), id, unsafe.Pointer(&d))
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return Quota{}, nil // XFS: no quota record, nothing charged
	}
	if err != nil {
		return Quota{}, err
	}
	return Quota{Bytes: int64(d.CurSpace), Inodes: int64(d.CurInodes),
		LimitBytes: int64(d.BHardLimit) * qifBlockSize, LimitInodes: int64(d.IHardLimit)}, nil
}
