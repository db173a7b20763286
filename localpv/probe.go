package localpv

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/internal/hostroot"
	"github.com/volume-agent/volume-agent/internal/mountutil"
)

// Kind is what a path on the node is.
type Kind string

// Kinds of entries.
const (
	KindMissing     Kind = "missing"
	KindDirectory   Kind = "directory"
	KindBlockDevice Kind = "blockDevice"
	KindOther       Kind = "other"
)

// probe is what the provisioner sees at a node path.
type probe struct {
	Kind Kind
	// What kind of other file it is, for messages.
	Detail string
	// Symlink: the entry is a symbolic link (followed below the host root).
	Symlink bool
	// MountPoint: a directory that is the root of a mount.
	MountPoint bool
	// Device is where a block device is visible to the agent.
	Device string
	// Capacity in bytes: the filesystem's size for a mount point, the
	// device's size for a block device.
	Capacity int64
	// Identity changes when another filesystem or device appears at the
	// path; settling waits for it to stay the same.
	Identity string
	// Err: the path could not be inspected.
	Err error
}

// prober inspects node paths; tests replace it.
type prober interface {
	probe(nodePath string) probe
}

// hostProber inspects the node's paths below the host root, every symbolic
// link resolved as the node resolves it (internal/hostroot).
type hostProber struct {
	root    hostroot.Root
	mounter *mountutil.Mounter
}

func (h *hostProber) probe(nodePath string) probe {
	// The entry itself is looked at (it may be a link); the directories
	// leading to it are resolved within the host root.
	agentPath, err := h.root.ResolveParent(nodePath)
	if err != nil {
		return probe{Err: err}
	}
	fi, err := os.Lstat(agentPath)
	if errors.Is(err, fs.ErrNotExist) {
		return probe{Kind: KindMissing}
	}
	if err != nil {
		return probe{Err: err}
	}
	var p probe
	if fi.Mode()&fs.ModeSymlink != 0 {
		// Links to devices (/dev/disk/by-id/...) are usual. The link is
		// the node's, so an absolute target is below the host root too.
		p.Symlink = true
		resolved, err := h.root.Resolve(nodePath)
		if err != nil {
			return probe{Err: err, Symlink: true}
		}
		if fi, err = os.Lstat(resolved); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return probe{Kind: KindMissing, Symlink: true, Detail: "dangling symbolic link"}
			}
			return probe{Err: err, Symlink: true}
		}
		agentPath = resolved
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.IsDir():
		p.Kind = KindDirectory
		if p.Symlink {
			return p
		}
		mp, err := h.mounter.IsMountPoint(agentPath)
		if err != nil {
			p.Err = err
			return p
		}
		p.MountPoint = mp
		if !mp {
			return p
		}
		var sfs unix.Statfs_t
		if err := unix.Statfs(agentPath, &sfs); err != nil {
			p.Err = &os.PathError{Op: "statfs", Path: agentPath, Err: err}
			return p
		}
		bsize := sfs.Frsize
		if bsize == 0 {
			bsize = sfs.Bsize
		}
		p.Capacity = int64(sfs.Blocks) * bsize
		if st != nil {
			p.Identity = fmt.Sprintf("fs %d:%d %d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), p.Capacity)
		}
	case fi.Mode()&fs.ModeDevice != 0 && fi.Mode()&fs.ModeCharDevice == 0:
		p.Kind = KindBlockDevice
		p.Device = agentPath
		size, err := deviceSize(agentPath)
		if err != nil {
			p.Err = err
			return p
		}
		p.Capacity = size
		if st != nil {
			p.Identity = fmt.Sprintf("dev %d:%d %d", unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), size)
		}
	default:
		p.Kind = KindOther
		p.Detail = fileType(fi.Mode())
	}
	return p
}

func fileType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return m.Type().String()
}

// deviceSize returns a block device's size: the end of the device as a
// seek offset, which needs no ioctl.
func deviceSize(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, &os.PathError{Op: "seek", Path: path, Err: err}
	}
	return size, nil
}

// minCapacity: smaller entries are not worth a volume and are most likely
// a mistake (an empty loop file, a tiny tmpfs).
const minCapacity = 1 << 20

// decideEntry says what an entry of class c becomes: a PV of the returned
// mode (and fsType for a block device used as a filesystem), or nothing,
// with the reason.
func decideEntry(c *Class, p probe) (mode v1.PersistentVolumeMode, fsType, skip string) {
	if p.Err != nil {
		return "", "", "cannot inspect it: " + p.Err.Error()
	}
	switch p.Kind {
	case KindMissing:
		if p.Detail != "" {
			return "", "", p.Detail
		}
		return "", "", "it no longer exists"
	case KindOther:
		return "", "", fmt.Sprintf("neither a directory nor a block device (a %s)", p.Detail)
	case KindDirectory:
		switch {
		case c.VolumeMode == v1.PersistentVolumeBlock:
			return "", "", "a directory in a Block class: only block devices become Block volumes"
		case p.Symlink:
			return "", "", "a symbolic link to a directory: put the mount point itself in the discovery directory (only block devices may be linked)"
		case !p.MountPoint:
			return "", "", "not a mount point: a plain directory would share the node's root filesystem; mount a filesystem here (or bind-mount the directory onto itself)"
		}
		mode = v1.PersistentVolumeFilesystem
	case KindBlockDevice:
		switch {
		case c.VolumeMode == v1.PersistentVolumeBlock:
			mode = v1.PersistentVolumeBlock
		case c.FSType != "":
			mode, fsType = v1.PersistentVolumeFilesystem, c.FSType
		default:
			return "", "", "a block device in a Filesystem class without fsType: set fsType to have it used as a filesystem, or use a Block class"
		}
	}
	if p.Capacity < minCapacity {
		return "", "", fmt.Sprintf("capacity %d bytes is below 1Mi", p.Capacity)
	}
	return mode, fsType, ""
}

// wantsBlockDevice reports whether a PV's path must be a block device (a
// Block volume, or a device used as a filesystem) rather than a mounted
// directory.
func wantsBlockDevice(pv *v1.PersistentVolume) bool {
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == v1.PersistentVolumeBlock {
		return true
	}
	return pv.Spec.Local != nil && pv.Spec.Local.FSType != nil && *pv.Spec.Local.FSType != ""
}

// missingReason says why the disk behind one of our PVs is gone, or ""
// when it is there. A path that cannot be inspected counts as missing:
// cleaning or offering what cannot be seen is never safe.
func missingReason(pv *v1.PersistentVolume, p probe) string {
	if p.Err != nil {
		return "cannot inspect " + pvPath(pv) + ": " + p.Err.Error()
	}
	block := wantsBlockDevice(pv)
	switch {
	case p.Kind == KindMissing:
		return pvPath(pv) + " no longer exists"
	case block && p.Kind != KindBlockDevice:
		return fmt.Sprintf("%s is no longer a block device (it is a %s)", pvPath(pv), describe(p))
	case !block && p.Kind != KindDirectory:
		return fmt.Sprintf("%s is no longer a directory (it is a %s)", pvPath(pv), describe(p))
	case !block && p.Symlink:
		return pvPath(pv) + " is now a symbolic link"
	case !block && !p.MountPoint:
		return pvPath(pv) + " is no longer a mount point: its disk was unmounted or removed"
	}
	return ""
}

func describe(p probe) string {
	switch p.Kind {
	case KindDirectory:
		return "directory"
	case KindBlockDevice:
		return "block device"
	}
	if p.Detail != "" {
		return p.Detail
	}
	return string(p.Kind)
}

// pvPath is the node path of a PV (local or hostPath), "" if it has none.
func pvPath(pv *v1.PersistentVolume) string {
	switch {
	case pv.Spec.Local != nil:
		return filepath.Clean(pv.Spec.Local.Path)
	case pv.Spec.HostPath != nil:
		return filepath.Clean(pv.Spec.HostPath.Path)
	}
	return ""
}

// roundCapacity rounds a size down so that PVs show readable quantities
// and never promise more than the disk has: to whole GiB from 10 GiB up,
// to whole MiB below.
func roundCapacity(b int64) int64 {
	const mi, gi = int64(1) << 20, int64(1) << 30
	if b >= 10*gi {
		return b / gi * gi
	}
	return b / mi * mi
}

func quantity(b int64) resource.Quantity {
	return *resource.NewQuantity(b, resource.BinarySI)
}
