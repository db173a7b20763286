package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/hostroot"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// MapDevice implements plugins.BlockMapper: a local block volume has nothing
// to prepare once per node (its Attributes are not DeviceMountable, so it is
// never called).
func (p *Plugin) MapDevice(context.Context, *plugins.DeviceRequest) error { return nil }

// UnmapDevice implements plugins.BlockMapper: nothing to undo.
func (p *Plugin) UnmapDevice(context.Context, *plugins.DeviceRequest) error { return nil }

// MapPodDevice bind-mounts the PV's block device onto the pod's access point.
// The PV's path is resolved inside the host root (a symbolic link such as
// /dev/disk/by-id/... may point anywhere on the node, never out of it) and
// must be a block device now, when it is used: the device is opened once and
// the mount is made from that open file, so what was checked is what gets
// mounted. An access point that already holds the device is left as it is;
// one that holds another device is an error (the pod may be using it).
func (p *Plugin) MapPodDevice(_ context.Context, req *plugins.SetUpRequest) error {
	local := req.Spec.PV.Spec.Local
	dev, err := p.root.Open(local.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("local path %s of PV %s does not exist: %w", local.Path, req.Spec.PV.Name, err)
	}
	if err != nil {
		return fmt.Errorf("local path %s of PV %s: %w", local.Path, req.Spec.PV.Name, err)
	}
	defer dev.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(dev.Fd()), &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return fmt.Errorf("local path %s of PV %s is not a block device (volumeMode Block needs one)", local.Path, req.Spec.PV.Name)
	}

	mounted, err := p.host.Mounter.IsMountPoint(req.Dir)
	if err != nil {
		return err
	}
	if mounted {
		var have unix.Stat_t
		if err := unix.Stat(req.Dir, &have); err != nil {
			return volume.Uncertain(err)
		}
		if have.Mode&unix.S_IFMT == unix.S_IFBLK && have.Rdev == st.Rdev {
			return nil
		}
		return volume.Uncertainf("access point %s already holds device %s, not %s (the device of PV %s): not replacing it",
			req.Dir, devNumber(have.Rdev), devNumber(st.Rdev), req.Spec.PV.Name)
	}
	if err := makeAccessPoint(req.Dir); err != nil {
		return err
	}
	if err := p.host.Mounter.BindMount(hostroot.FDPath(dev), req.Dir, mountutil.BindOptions{ReadOnly: req.Spec.ReadOnly}); err != nil {
		if mounted, _ := p.host.Mounter.IsMountPoint(req.Dir); mounted {
			return volume.Uncertain(err)
		}
		return err
	}
	return nil
}

// UnmapPodDevice unmounts and removes the access point. The device is not
// touched.
func (p *Plugin) UnmapPodDevice(_ context.Context, req *plugins.TearDownRequest) error {
	return plugins.UnmountAndRemoveEntry(p.host.Mounter, req.Dir)
}

// ReconstructPodDevice implements plugins.BlockReconstructor: the access
// point is named by the PV.
func (p *Plugin) ReconstructPodDevice(_ types.UID, specName, _ string) (volume.UniqueName, volume.Attributes, error) {
	return volume.SharedName(Name, specName), volume.Attributes{Identity: specName, Block: true}, nil
}

// makeAccessPoint creates the empty file a device is bind-mounted onto. An
// existing regular file is reused; anything else there is refused.
func makeAccessPoint(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating access point %s: %w", path, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("access point %s exists and is not a regular file (%s)", path, info.Mode().Type())
	}
	return nil
}

func devNumber(rdev uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(rdev), unix.Minor(rdev))
}
