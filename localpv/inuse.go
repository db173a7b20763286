package localpv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mountutil"
)

// Who still uses a disk the provisioner is about to clean. A Released PV
// means its claim is gone, not that every pod has let go of the volume: a
// pod being torn down (by this agent or a kubelet) may still have it
// mounted or mapped. Cleaning then would destroy data in use.

// blockDeviceUsers says who uses the block device at dev (a path visible
// to the agent), "" if nobody the agent can see:
//   - a filesystem mounted from it, in any mount namespace, or an
//     exclusive holder (device-mapper, md, bcache, another O_EXCL opener):
//     the kernel refuses an exclusive open (EBUSY);
//   - a mount of it in the agent's mount table;
//   - its device node bind-mounted somewhere: how the kubelet and the agent
//     map a raw block volume (volumeDevices) for a pod;
//   - a loop device backed by it: how they pin a mapped device.
func blockDeviceUsers(dev string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", &os.PathError{Op: "stat", Path: dev, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", fmt.Errorf("%s is not a block device", dev)
	}
	rdev := st.Rdev
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.EBUSY):
		return "it is mounted or held by another exclusive user (a filesystem, device-mapper, md...)", nil
	case err != nil:
		return "", &os.PathError{Op: "open", Path: dev, Err: err}
	}
	unix.Close(fd)

	mounts, err := mountutil.ReadMountInfo()
	if err != nil {
		return "", err
	}
	for _, m := range mounts {
		if uint64(unix.Mkdev(uint32(m.Major), uint32(m.Minor))) == rdev {
			return "it is mounted at " + m.Mountpoint, nil
		}
	}
	for _, m := range mounts {
		// A bind mount of a single file has that file's path as its root.
		if m.Root != "/" && isDeviceNode(m.Mountpoint, rdev) {
			return "it is mapped for a pod: its device node is bind-mounted at " + m.Mountpoint, nil
		}
	}
	if loop, backing := loopBackedBy(rdev); loop != "" {
		return fmt.Sprintf("loop device %s is backed by it (%s): a pod's mapping of it is pinned", loop, backing), nil
	}
	return "", nil
}

// isDeviceNode reports whether path is a block device node of rdev.
func isDeviceNode(path string, rdev uint64) bool {
	var st unix.Stat_t
	return unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == rdev
}

// sysBlock is where loopBackedBy finds loop devices; tests replace it.
var sysBlock = "/sys/block"

// loopBackedBy returns a loop device whose backing file is a node of block
// device rdev, and that file.
func loopBackedBy(rdev uint64) (loop, backing string) {
	loops, _ := filepath.Glob(filepath.Join(sysBlock, "loop*", "loop", "backing_file"))
	for _, f := range loops {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		path := strings.TrimSuffix(strings.TrimSpace(string(data)), " (deleted)")
		if isDeviceNode(path, rdev) {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f))), path
		}
	}
	return "", ""
}

// directoryUsers says where else the filesystem mounted at dir (a path
// visible to the agent) is mounted, "" if nowhere: pods' bind mounts of
// the volume (or of a directory in it) that are not torn down yet.
func directoryUsers(dir string) (string, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Stat(real, &st); err != nil {
		return "", &os.PathError{Op: "stat", Path: real, Err: err}
	}
	mounts, err := mountutil.ReadMountInfo()
	if err != nil {
		return "", err
	}
	var others []string
	for _, m := range mounts {
		if uint64(unix.Mkdev(uint32(m.Major), uint32(m.Minor))) != st.Dev || m.Mountpoint == real {
			continue
		}
		others = append(others, m.Mountpoint)
	}
	switch len(others) {
	case 0:
		return "", nil
	case 1:
		return "its filesystem is also mounted at " + others[0], nil
	}
	return fmt.Sprintf("its filesystem is also mounted at %s and %d other places", others[0], len(others)-1), nil
}
