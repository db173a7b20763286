// Package local implements local PersistentVolumes (pv.spec.local): a
// directory on the node is bind-mounted into each pod; a block device is
// formatted if blank (never reformatted), mounted once at a global path and
// bind-mounted from there into each pod. Tearing down never deletes data: the
// volume outlives its pods.
package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/volume-agent/volume-agent/operations/mountutil"
	"github.com/volume-agent/volume-agent/operations/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Name is the plugin's name.
const Name = "kubernetes.io/local-volume"

// DefaultFSType is used to format a blank device when the PV names none.
const DefaultFSType = "ext4"

// Plugin is the local volume plugin.
type Plugin struct{ host plugins.Host }

// New returns the plugin.
func New(host plugins.Host) *Plugin { return &Plugin{host: host} }

func (p *Plugin) Name() string { return Name }

func (p *Plugin) CanSupport(spec *volume.Spec) bool {
	return spec.PV != nil && spec.PV.Spec.Local != nil
}

// Attributes names the volume by its PV (shared by every pod using it) and
// looks at the path: a block device needs a device mount, a directory does
// not.
func (p *Plugin) Attributes(spec *volume.Spec) (volume.Attributes, error) {
	path := spec.PV.Spec.Local.Path
	if !filepath.IsAbs(path) {
		return volume.Attributes{}, fmt.Errorf("local path %q of PV %s is not absolute", path, spec.PV.Name)
	}
	if spec.IsBlock() {
		return volume.Attributes{}, fmt.Errorf("raw block (volumeDevices) use of local PV %s is not supported yet", spec.PV.Name)
	}
	for _, el := range strings.Split(path, "/") {
		if el == ".." {
			return volume.Attributes{}, fmt.Errorf("local path %q of PV %s must not contain '..'", path, spec.PV.Name)
		}
	}
	info, err := os.Stat(p.host.HostPath(path))
	if err != nil {
		return volume.Attributes{}, fmt.Errorf("local path of PV %s: %w", spec.PV.Name, err)
	}
	attrs := volume.Attributes{Identity: spec.PV.Name}
	switch {
	case info.Mode().Type() == os.ModeDevice:
		attrs.DeviceMountable = true
	case info.IsDir():
	default:
		return volume.Attributes{}, fmt.Errorf("local path %s of PV %s is neither a directory nor a block device", path, spec.PV.Name)
	}
	if _, _, err := plugins.BindFlags(plugins.MountOptions(spec)); err != nil && !attrs.DeviceMountable {
		return volume.Attributes{}, fmt.Errorf("PV %s: %w", spec.PV.Name, err)
	}
	return attrs, nil
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
	if err := p.host.Mounter.FormatAndMount(p.host.HostPath(local.Path), req.DeviceMountPath, fsType, plugins.MountOptions(req.Spec)); err != nil {
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
// pod's volume directory.
func (p *Plugin) SetUp(_ context.Context, req *plugins.SetUpRequest) error {
	source := p.host.HostPath(req.Spec.PV.Spec.Local.Path)
	if req.DeviceMountPath != "" {
		source = req.DeviceMountPath
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
	if err := plugins.ApplyFSGroup(req.Dir, req.Pod, readOnly); err != nil {
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
