// Package local implements local PersistentVolumes (pv.spec.local): a
// directory on the node is bind-mounted into each pod; a block device is
// formatted if blank (never reformatted), mounted once at a global path and
// bind-mounted from there into each pod; a block device of a Block volume
// (volumeDevices) is never formatted or mounted, only bind-mounted onto each
// pod's access point. Tearing down never deletes data: the volume outlives
// its pods.
package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/volume-agent/volume-agent/internal/hostroot"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/pathcheck"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Name is the plugin's name.
const Name = "kubernetes.io/local-volume"

// DefaultFSType is used to format a blank device when the PV names none.
const DefaultFSType = "ext4"

// Plugin is the local volume plugin.
type Plugin struct {
	host plugins.Host
	root hostroot.Root
	// paths answers Attributes' question (directory or block device?)
	// without it waiting on the disk.
	paths *pathcheck.Checker
}

// The agent finds a plugin's capabilities by type assertion: these make a
// changed signature fail the build instead of a volume at run time.
var (
	_ plugins.Plugin              = (*Plugin)(nil)
	_ plugins.DeviceMounter       = (*Plugin)(nil)
	_ plugins.Expander            = (*Plugin)(nil)
	_ plugins.Reconstructor       = (*Plugin)(nil)
	_ plugins.DeviceReconstructor = (*Plugin)(nil)
	_ plugins.BlockMapper         = (*Plugin)(nil)
	_ plugins.BlockReconstructor  = (*Plugin)(nil)
)

// New returns the plugin.
func New(host plugins.Host) *Plugin { return NewWithOptions(host, pathcheck.Options{}) }

// NewWithOptions is New with the path checker's options (timeouts), for
// tests; Changed defaults to host.Recheck.
func NewWithOptions(host plugins.Host, checks pathcheck.Options) *Plugin {
	p := &Plugin{host: host, root: hostroot.New(host.HostRoot)}
	if checks.Changed == nil {
		checks.Changed = host.Recheck
	}
	p.paths = pathcheck.New(p.statType, checks)
	return p
}

func (p *Plugin) statType(path string) (fs.FileMode, error) {
	fi, err := p.stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Mode(), nil
}

func (p *Plugin) Name() string { return Name }

func (p *Plugin) CanSupport(spec *volume.Spec) bool {
	return spec.PV != nil && spec.PV.Spec.Local != nil
}

// Attributes names the volume by its PV (shared by every pod using it) and
// looks at the path: a block device needs a device mount, a directory does
// not. It never waits on the disk: the path is looked at in the background
// (ErrNotReady until the first answer; an error if the disk does not answer
// in time) and the answer kept, refreshed in the background every minute.
func (p *Plugin) Attributes(spec *volume.Spec) (volume.Attributes, error) {
	path := spec.PV.Spec.Local.Path
	if !filepath.IsAbs(path) {
		return volume.Attributes{}, fmt.Errorf("local path %q of PV %s is not absolute", path, spec.PV.Name)
	}
	for _, el := range strings.Split(path, "/") {
		if el == ".." {
			return volume.Attributes{}, fmt.Errorf("local path %q of PV %s must not contain '..'", path, spec.PV.Name)
		}
	}
	if spec.IsBlock() {
		// Checked to be a block device each time it is mapped (see
		// MapPodDevice), not here: nothing is staged, so no device phase.
		return volume.Attributes{Identity: spec.PV.Name, Block: true}, nil
	}
	typ, err := p.paths.Type(path)
	if errors.Is(err, pathcheck.ErrPending) {
		return volume.Attributes{}, fmt.Errorf("local path %s of PV %s: %w", path, spec.PV.Name, plugins.ErrNotReady)
	}
	if err != nil {
		return volume.Attributes{}, fmt.Errorf("local path of PV %s: %w", spec.PV.Name, err)
	}
	attrs := volume.Attributes{Identity: spec.PV.Name}
	switch {
	case typ == os.ModeDevice:
		attrs.DeviceMountable = true
	case typ.IsDir():
	default:
		return volume.Attributes{}, fmt.Errorf("local path %s of PV %s is neither a directory nor a block device", path, spec.PV.Name)
	}
	if _, _, err := plugins.BindFlags(plugins.MountOptions(spec)); err != nil && !attrs.DeviceMountable {
		return volume.Attributes{}, fmt.Errorf("PV %s: %w", spec.PV.Name, err)
	}
	return attrs, nil
}

// stat looks at the node's path, resolved within the host root.
func (p *Plugin) stat(path string) (os.FileInfo, error) {
	f, err := p.root.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Stat()
}

// device is where the node's device path is visible to the agent, every
// link resolved within the host root (/dev/disk/by-id links are relative
// to the node's /dev): a path, for the programs that format, check and
// mount it.
func (p *Plugin) device(spec *volume.Spec) (string, error) {
	return p.root.Resolve(spec.PV.Spec.Local.Path)
}

// MountDevice formats the device if it is blank and mounts it at the global
// path with the PV's mount options.
func (p *Plugin) MountDevice(_ context.Context, req *plugins.DeviceRequest) error {
	local := req.Spec.PV.Spec.Local
	if _, err := mountutil.EnsureDir(req.DeviceMountPath, 0o750); err != nil {
		return err
	}
	mounted, err := p.host.Mounter.IsMountPoint(req.DeviceMountPath)
	if err != nil || mounted {
		return err
	}
	fsType := DefaultFSType
	if local.FSType != nil && *local.FSType != "" {
		fsType = *local.FSType
	}
	device, err := p.device(req.Spec)
	if err != nil {
		return err
	}
	if req.DesiredSize != nil {
		if err := deviceFits(device, *req.DesiredSize); err != nil {
			return err
		}
		grown, err := p.growOffline(device)
		if err != nil {
			return err
		}
		if grown {
			size := req.DesiredSize.DeepCopy()
			req.Resized = &size
		}
	}
	if err := p.host.Mounter.FormatAndMount(device, req.DeviceMountPath, fsType, plugins.MountOptions(req.Spec)); err != nil {
		// mount(8) may have been killed half way: the mount is uncertain
		// only if something is now mounted there.
		if mounted, _ := p.host.Mounter.IsMountPoint(req.DeviceMountPath); mounted {
			return volume.Uncertain(err)
		}
		return err
	}
	return nil
}

// UnmountDevice unmounts the global mount. It refuses while any other mount
// of the same filesystem (a pod's bind mount) remains: unmounting under a pod
// would hide its data from the node and leak the pod's mount.
func (p *Plugin) UnmountDevice(_ context.Context, req *plugins.DeviceRequest) error {
	mounted, err := p.host.Mounter.IsMountPoint(req.DeviceMountPath)
	if err != nil {
		return err
	}
	if mounted {
		refs, err := p.host.Mounter.MountRefs(req.DeviceMountPath)
		if err != nil {
			return err
		}
		if len(refs) > 0 {
			return fmt.Errorf("device mount %s is still used by %v", req.DeviceMountPath, refs)
		}
	}
	return plugins.UnmountAndRemoveEntry(p.host.Mounter, req.DeviceMountPath)
}

// SetUp bind-mounts the directory, or the device's global mount, into the
// pod's volume directory. The directory is opened within the host root and
// mounted from that descriptor: what was checked is what is mounted.
func (p *Plugin) SetUp(ctx context.Context, req *plugins.SetUpRequest) error {
	source := req.DeviceMountPath
	if source == "" {
		path := req.Spec.PV.Spec.Local.Path
		dir, err := p.root.Open(path)
		if err != nil {
			return fmt.Errorf("local path of PV %s: %w", req.Spec.PV.Name, err)
		}
		defer dir.Close()
		if info, err := dir.Stat(); err != nil {
			return err
		} else if !info.IsDir() {
			return fmt.Errorf("local path %s of PV %s is not a directory (and the volume has no device mount)", path, req.Spec.PV.Name)
		}
		source = hostroot.FDPath(dir)
	}
	flags, readOnly, err := bindOptions(req)
	if err != nil {
		return err
	}
	if _, err := mountutil.EnsureDir(req.Dir, 0o750); err != nil {
		return err
	}
	mounted, err := p.host.Mounter.IsMountPoint(req.Dir)
	if err != nil || mounted {
		return err
	}
	if err := p.host.Mounter.BindMount(source, req.Dir, mountutil.BindOptions{ReadOnly: readOnly, Flags: flags}); err != nil {
		return err
	}
	if err := plugins.ApplyFSGroup(ctx, req.Dir, req.Pod, readOnly); err != nil {
		// The mount is there; say so, so it is retried or torn down.
		return volume.Uncertain(fmt.Errorf("applying fsGroup: %w", err))
	}
	return nil
}

// bindOptions: for a directory the PV's mount options apply to the bind
// mount itself; for a device they were applied when it was mounted.
func bindOptions(req *plugins.SetUpRequest) (uintptr, bool, error) {
	if req.DeviceMountPath != "" {
		return 0, req.Spec.ReadOnly, nil
	}
	flags, ro, err := plugins.BindFlags(plugins.MountOptions(req.Spec))
	return flags, ro || req.Spec.ReadOnly, err
}

func (p *Plugin) TearDown(_ context.Context, req *plugins.TearDownRequest) error {
	return plugins.UnmountAndRemoveEntry(p.host.Mounter, req.Dir)
}

// Expand grows the filesystem of a block-backed local volume while it is
// mounted (resize2fs online for ext*, xfs_growfs for xfs). A directory has
// nothing to grow: its size is its filesystem's.
func (p *Plugin) Expand(_ context.Context, req *plugins.ExpandRequest) (*resource.Quantity, error) {
	if req.Spec.IsBlock() {
		return nil, fmt.Errorf("local PV %s is a raw block device, whose size is the device's: %w", req.Spec.PV.Name, plugins.ErrExpansionNotSupported)
	}
	if req.DeviceMountPath == "" {
		return nil, fmt.Errorf("local PV %s is a directory: %w", req.Spec.PV.Name, plugins.ErrExpansionNotSupported)
	}
	device, err := p.device(req.Spec)
	if err != nil {
		return nil, err
	}
	if err := deviceFits(device, req.NewSize); err != nil {
		return nil, err
	}
	resizer := mount.NewResizeFs(utilexec.New())
	need, err := resizer.NeedResize(device, req.DeviceMountPath)
	if err != nil {
		return nil, err
	}
	if need {
		if _, err := resizer.Resize(device, req.DeviceMountPath); err != nil {
			return nil, err
		}
	}
	size := req.NewSize
	return &size, nil
}

// growOffline grows an ext2/3/4 filesystem on an unmounted device before it
// is mounted (the offline path of node expansion): the kernel need not
// allow online resizing, and resize2fs insists on a clean check first. It
// reports whether it grew anything; other filesystems are left for the
// online path.
func (p *Plugin) growOffline(device string) (bool, error) {
	format, err := p.host.Mounter.DiskFormat(device)
	if err != nil || (format != "ext2" && format != "ext3" && format != "ext4") {
		return false, err
	}
	ex := utilexec.New()
	out, err := ex.Command("e2fsck", "-f", "-p", device).CombinedOutput()
	if err != nil {
		// Exit status 1 means errors were corrected, which is fine.
		var ee utilexec.ExitError
		if !errors.As(err, &ee) || ee.ExitStatus() > 1 {
			return false, fmt.Errorf("e2fsck %s before growing it: %v: %s", device, err, out)
		}
	}
	if out, err := ex.Command("resize2fs", device).CombinedOutput(); err != nil {
		return false, fmt.Errorf("resize2fs %s: %v: %s", device, err, out)
	}
	return true, nil
}

// deviceFits checks that the block device itself is at least the requested
// size: the filesystem can only grow into space the device has, and
// reporting a size the device lacks would be a lie on the claim.
func deviceFits(device string, want resource.Quantity) error {
	f, err := os.Open(device)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("reading the size of %s: %w", device, err)
	}
	if size < want.Value() {
		return fmt.Errorf("device %s has %d bytes, less than the requested %s: grow the device first", device, size, want.String())
	}
	return nil
}

// ReconstructPodVolume implements plugins.Reconstructor: a local volume is
// named by its PV, which is the directory's name.
func (p *Plugin) ReconstructPodVolume(_ types.UID, specName, _ string) (volume.UniqueName, volume.Attributes, error) {
	attrs := volume.Attributes{Identity: specName}
	if _, err := os.Stat(p.host.Paths.VolumeDir(Name, specName)); err == nil {
		attrs.DeviceMountable = true
	}
	return volume.SharedName(Name, specName), attrs, nil
}

// ReconstructDevice implements plugins.DeviceReconstructor.
func (p *Plugin) ReconstructDevice(volumeDir string) (*plugins.ReconstructedDevice, error) {
	identity := filepath.Base(volumeDir)
	path := filepath.Join(volumeDir, "globalmount")
	mounted, err := p.host.Mounter.IsMountPoint(path)
	if err != nil {
		return nil, err
	}
	return &plugins.ReconstructedDevice{
		Name: volume.SharedName(Name, identity), Attributes: volume.Attributes{Identity: identity, DeviceMountable: true},
		DeviceMountPath: path, Mounted: mounted,
	}, nil
}
