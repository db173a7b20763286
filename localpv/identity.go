package localpv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/hostroot"
	v1 "k8s.io/api/core/v1"
)

// Annotations recording which disk a PV was made from. Paths in a
// discovery directory name whatever is there now: after disks
// re-enumerate (a reboot, a disk replaced, loop devices attached in
// another order) the same path can lead to another disk, and a cleanup
// owed to the old one would wipe it. The provisioner records the disk's
// identity when it creates the PV and cleans nothing else.
const (
	// AnnDiskDevice is the device number ("major:minor"): of the
	// filesystem mounted at the path (its st_dev), or of the block device
	// (its st_rdev).
	AnnDiskDevice = "volume-agent.io/disk-device"
	// AnnDiskFSUUID is the UUID of the filesystem mounted at the path, when
	// it has one (ext4, xfs... on a block device; not tmpfs).
	AnnDiskFSUUID = "volume-agent.io/disk-fs-uuid"
	// AnnDiskSerial is a block device's hardware identity when it has one:
	// its WWID or serial number from sysfs, a device-mapper UUID, or a loop
	// device's backing file.
	AnnDiskSerial = "volume-agent.io/disk-serial"
)

// DiskIdentity is what identifies the disk behind a PV's path.
//
// A filesystem's UUID names the filesystem whatever device number it gets;
// a device's serial names the hardware. Device numbers are what is left
// when there is neither (tmpfs, a disk without a serial): they identify the
// disk only until it re-enumerates, so a PV recorded with a device number
// alone is not cleaned after its disk came back with another one.
//
// A block device's filesystem UUID is not part of its identity: the tenant
// of a Block volume (or the first mount of a device used as a filesystem)
// writes the filesystem, so it changes while the disk stays the same.
type DiskIdentity struct {
	Device string `json:"device,omitempty"`
	FSUUID string `json:"fsUUID,omitempty"`
	Serial string `json:"serial,omitempty"`
}

// IsZero reports whether nothing was recorded (a PV made before identities
// were recorded, or by hand).
func (id DiskIdentity) IsZero() bool { return id == DiskIdentity{} }

func (id DiskIdentity) String() string {
	var parts []string
	if id.Device != "" {
		parts = append(parts, "device "+id.Device)
	}
	if id.FSUUID != "" {
		parts = append(parts, "filesystem UUID "+id.FSUUID)
	}
	if id.Serial != "" {
		parts = append(parts, "serial "+id.Serial)
	}
	if len(parts) == 0 {
		return "no identity"
	}
	return strings.Join(parts, ", ")
}

// annotate records the identity in a PV's annotations.
func (id DiskIdentity) annotate(ann map[string]string) {
	for k, v := range map[string]string{AnnDiskDevice: id.Device, AnnDiskFSUUID: id.FSUUID, AnnDiskSerial: id.Serial} {
		if v != "" {
			ann[k] = v
		}
	}
}

// identityOf reads the identity recorded in a PV's annotations.
func identityOf(pv *v1.PersistentVolume) DiskIdentity {
	return DiskIdentity{
		Device: pv.Annotations[AnnDiskDevice],
		FSUUID: pv.Annotations[AnnDiskFSUUID],
		Serial: pv.Annotations[AnnDiskSerial],
	}
}

// sameDisk says whether the disk now at a path (current) may be the one a
// PV was made from (recorded), and if not, why. Every strong identifier
// recorded (filesystem UUID, serial) must be there and equal; the device
// number counts only when no strong identifier was recorded, because it
// legitimately changes when the same disk re-enumerates.
func sameDisk(recorded, current DiskIdentity) (bool, string) {
	strong := false
	if recorded.FSUUID != "" {
		strong = true
		if current.FSUUID != recorded.FSUUID {
			return false, fmt.Sprintf("the filesystem UUID is %s, the PV was made from %s", orNone(current.FSUUID), recorded.FSUUID)
		}
	}
	if recorded.Serial != "" {
		strong = true
		if current.Serial != recorded.Serial {
			return false, fmt.Sprintf("the device's serial is %s, the PV was made from %s", orNone(current.Serial), recorded.Serial)
		}
	}
	if !strong && recorded.Device != current.Device {
		return false, fmt.Sprintf("the device number is %s, the PV was made from %s (nothing else identifies this disk)", orNone(current.Device), recorded.Device)
	}
	return true, ""
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// DiskMismatchError is a cleanup refused because the disk at the PV's path
// is not the one the PV was made from.
type DiskMismatchError struct {
	Path              string
	Recorded, Current DiskIdentity
	Why               string
}

func (e *DiskMismatchError) Error() string {
	return fmt.Sprintf("%s is not the disk this PV was made from (%s): recorded %s; found %s; not cleaning it",
		e.Path, e.Why, e.Recorded, e.Current)
}

// identifier reads the identity of the disk at a node path; tests replace
// it.
type identifier interface {
	identify(ctx context.Context, nodePath string, block bool) (DiskIdentity, error)
}

// hostIdentifier identifies disks below the host root through stat(2),
// sysfs and blkid.
type hostIdentifier struct {
	root hostroot.Root
	// sys and dev are /sys and /dev unless a test changes them.
	sys, dev string
	// blkid runs blkid; tests replace it.
	blkid func(ctx context.Context, device string) (string, error)
}

func newHostIdentifier(root string) *hostIdentifier {
	return &hostIdentifier{root: hostroot.New(root), sys: "/sys", dev: "/dev", blkid: runBlkid}
}

// identify returns the identity of the disk at nodePath: for a block
// device (block, following symbolic links as the node would) its device
// number and serial; for a mounted directory its filesystem's device
// number and UUID.
func (h *hostIdentifier) identify(ctx context.Context, nodePath string, block bool) (DiskIdentity, error) {
	// A block device is usually named through links (/dev/disk/by-id/...),
	// followed within the host root; a directory is looked at itself.
	resolve := h.root.ResolveParent
	if block {
		resolve = h.root.Resolve
	}
	agentPath, err := resolve(nodePath)
	if err != nil {
		return DiskIdentity{}, err
	}
	var st unix.Stat_t
	if block {
		err = unix.Stat(agentPath, &st)
	} else {
		err = unix.Lstat(agentPath, &st)
	}
	if err != nil {
		return DiskIdentity{}, &os.PathError{Op: "stat", Path: agentPath, Err: err}
	}
	switch {
	case block && st.Mode&unix.S_IFMT == unix.S_IFBLK:
		major, minor := unix.Major(st.Rdev), unix.Minor(st.Rdev)
		return DiskIdentity{Device: devNumber(major, minor), Serial: h.serial(major, minor)}, nil
	case !block && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		major, minor := unix.Major(st.Dev), unix.Minor(st.Dev)
		id := DiskIdentity{Device: devNumber(major, minor)}
		// A filesystem on a block device has the device in sysfs; tmpfs
		// and other virtual filesystems (major 0) have none, and no UUID.
		if name := h.deviceName(major, minor); name != "" {
			uuid, err := h.blkid(ctx, filepath.Join(h.dev, name))
			if err != nil {
				return DiskIdentity{}, fmt.Errorf("reading the filesystem UUID of %s (mounted at %s): %w", filepath.Join(h.dev, name), nodePath, err)
			}
			id.FSUUID = uuid
		}
		return id, nil
	case block:
		return DiskIdentity{}, fmt.Errorf("%s is not a block device", nodePath)
	}
	return DiskIdentity{}, fmt.Errorf("%s is not a directory", nodePath)
}

func devNumber(major, minor uint32) string { return fmt.Sprintf("%d:%d", major, minor) }

// deviceName returns the kernel's name of block device major:minor
// (DEVNAME in its uevent), "" if there is no such block device.
func (h *hostIdentifier) deviceName(major, minor uint32) string {
	if major == 0 {
		return ""
	}
	data, err := os.ReadFile(filepath.Join(h.sys, "dev", "block", devNumber(major, minor), "uevent"))
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "DEVNAME="); ok && v != "" && !strings.Contains(v, "..") {
			return v
		}
	}
	return ""
}

// serial returns the hardware identity of block device major:minor from
// sysfs, "" if it has none: the WWID or serial number of the disk (with the
// partition number for a partition), a device-mapper UUID, or a loop
// device's backing file.
func (h *hostIdentifier) serial(major, minor uint32) string {
	dir := filepath.Join(h.sys, "dev", "block", devNumber(major, minor))
	read := func(dir, name string) string {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(bytes.ToValidUTF8(data, nil)))
	}
	if id := read(dir, "dm/uuid"); id != "" {
		return "dm:" + id
	}
	if f := read(dir, "loop/backing_file"); f != "" {
		return "loop:" + f
	}
	disk, suffix := dir, ""
	if part := read(dir, "partition"); part != "" {
		// The disk is the partition's parent directory in sysfs.
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			disk, suffix = filepath.Dir(real), "-part"+part
		}
	}
	for _, name := range []string{"wwid", "device/wwid", "serial", "device/serial"} {
		if id := read(disk, name); id != "" {
			return id + suffix
		}
	}
	return ""
}

// blkidTimeout bounds one blkid run: a hung disk must not hang the
// provisioner.
const blkidTimeout = 30 * time.Second

// runBlkid returns the UUID of the filesystem on device, "" if it has
// none. It probes the device itself (-p), not blkid's cache.
func runBlkid(ctx context.Context, device string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, blkidTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "blkid", "-p", "-s", "UUID", "-o", "value", device)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return strings.TrimSpace(string(out)), nil
	case errors.As(err, &ee) && ee.ExitCode() == 2:
		// Nothing found: no filesystem, or one without a UUID.
		return "", nil
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("blkid is not installed: %w", err)
	}
	return "", fmt.Errorf("blkid %s: %w: %s", device, err, strings.TrimSpace(stderr.String()))
}
