package mountutil

import (
	"os"

	"golang.org/x/sys/unix"
)

// MountHugetlbfs mounts a new hugetlbfs at target, which must exist, with
// pages of pageSize (the kernel reads a number with K, M or G: "2Mi" is
// 2 MiB, as the kubelet writes it).
func (m *Mounter) MountHugetlbfs(target, pageSize string) error {
	if err := unix.Mount("nodev", target, "hugetlbfs", unix.MS_NOSUID|unix.MS_NODEV, "pagesize="+pageSize); err != nil {
		return &os.PathError{Op: "mount hugetlbfs pagesize=" + pageSize, Path: target, Err: err}
	}
	return nil
}
