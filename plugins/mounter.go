package plugins

import "github.com/volume-agent/volume-agent/internal/mountutil"

// Mounter is what plugins do to the node's mount table. The agent gives
// them *mountutil.Mounter; unit tests give them pluginstest.Mounter, which
// keeps a mount table in memory, records every call and injects faults.
type Mounter interface {
	// IsMountPoint reports whether path is a mount point. A missing path
	// is not; a mount whose backing store went away still is.
	IsMountPoint(path string) (bool, error)
	// MountTmpfs mounts a new tmpfs at target, which must exist.
	MountTmpfs(target string, o mountutil.TmpfsOptions) error
	// BindMount makes source visible at target, which must exist.
	BindMount(source, target string, o mountutil.BindOptions) error
	// FormatAndMount mounts a block device, formatting it only when it has
	// no filesystem at all.
	FormatAndMount(device, target, fsType string, options []string) error
	// Unmount unmounts the top mount on target; a target that is not
	// mounted, or missing, is already done.
	Unmount(target string) error
	// UnmountAll unmounts every mount stacked on target; a target that is
	// not mounted, or missing, is already done.
	UnmountAll(target string) error
	// UnmountTree unmounts every mount stacked on target and every mount
	// below it.
	UnmountTree(target string) error
	// DiskFormat returns the filesystem on device, "" if none.
	DiskFormat(device string) (string, error)
	// MountRefs lists the other mount points of the mount at path.
	MountRefs(path string) ([]string, error)
}

var _ Mounter = (*mountutil.Mounter)(nil)
