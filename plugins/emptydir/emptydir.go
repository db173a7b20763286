// Package emptydir implements emptyDir volumes: a directory on the node's
// disk (medium ""), a tmpfs (medium Memory) or a hugetlbfs (HugePages,
// HugePages-<size>), created empty for the pod and deleted with it.
package emptydir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/disklimit"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/trash"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Name is the plugin's name (the kubelet's, so directories look familiar).
const Name = "kubernetes.io/empty-dir"

// Plugin is the emptyDir plugin.
type Plugin struct {
	host   plugins.Host
	limits *disklimit.Enforcer // see sizelimit.go
}

// The agent finds a plugin's capabilities by type assertion: these make a
// changed signature fail the build instead of a volume at run time.
var (
	_ plugins.Plugin            = (*Plugin)(nil)
	_ plugins.Reconstructor     = (*Plugin)(nil)
	_ plugins.SetUpWithoutMount = (*Plugin)(nil)
)

// New returns the plugin.
func New(host plugins.Host) *Plugin { return &Plugin{host: host} }

func (p *Plugin) Name() string { return Name }

func (p *Plugin) CanSupport(spec *volume.Spec) bool {
	return spec.Volume != nil && spec.Volume.EmptyDir != nil
}

func (p *Plugin) Attributes(spec *volume.Spec) (volume.Attributes, error) {
	attrs := volume.Attributes{NoSizeLimit: !mayBeLimited(spec)}
	switch m := spec.Volume.EmptyDir.Medium; m {
	case v1.StorageMediumDefault, v1.StorageMediumMemory, v1.StorageMediumHugePages:
		return attrs, nil
	default:
		if isHugePages(m) {
			_, err := mediumPageSize(m)
			return attrs, err
		}
		return volume.Attributes{}, fmt.Errorf("emptyDir medium %q is not supported (use \"\", Memory, HugePages or HugePages-<size>)", m)
	}
}

func (p *Plugin) SetUp(ctx context.Context, req *plugins.SetUpRequest) error {
	src := req.Spec.Volume.EmptyDir
	if isHugePages(src.Medium) {
		if err := p.setUpHugePages(req); err != nil {
			return err
		}
		return plugins.ApplyFSGroup(ctx, req.Dir, req.Pod, false)
	}
	if src.Medium != v1.StorageMediumMemory {
		return p.setUpDisk(ctx, req)
	}
	created, err := mountutil.EnsureDir(req.Dir, 0o777)
	if err != nil {
		return err
	}
	if src.Medium == v1.StorageMediumMemory {
		mounted := false
		if !created {
			if mounted, err = p.host.Mounter.IsMountPoint(req.Dir); err != nil {
				return err
			}
		}
		if !mounted {
			if err := p.host.Mounter.MountTmpfs(req.Dir, mountutil.TmpfsOptions{SizeBytes: p.tmpfsSize(src, req.Pod), Mode: 0o777}); err != nil {
				return err
			}
		}
	}
	return plugins.ApplyFSGroup(ctx, req.Dir, req.Pod, false)
}

// setUpDir makes a disk emptyDir. A new one is prepared under a hidden name
// (mode, fsGroup) and renamed into place, so a directory at the volume's
// path is always completely set up: after a crash, finding it is proof
// enough to adopt it without an operation.
func setUpDir(ctx context.Context, req *plugins.SetUpRequest) error {
	if _, err := os.Lstat(req.Dir); err == nil {
		// Set up before; applying the mode and group again is harmless.
		if err := os.Chmod(req.Dir, 0o777); err != nil {
			return err
		}
		return plugins.ApplyFSGroup(ctx, req.Dir, req.Pod, false)
	}
	tmp := filepath.Join(filepath.Dir(req.Dir), "."+filepath.Base(req.Dir)+".setup")
	if _, err := mountutil.EnsureDir(tmp, 0o777); err != nil {
		return err
	}
	// mkdir is subject to the umask; emptyDir is world-writable so any
	// container user can use it.
	if err := os.Chmod(tmp, 0o777); err != nil {
		return err
	}
	if err := plugins.ApplyFSGroup(ctx, tmp, req.Pod, false); err != nil {
		return err
	}
	return os.Rename(tmp, req.Dir)
}

// tmpfsSize sizes a Memory emptyDir as the kubelet does: the node's
// allocatable memory, lowered to the pod's memory limit and then to
// sizeLimit, each where set and smaller. A memory-backed volume counts
// against the pod's memory, and no pod can use more than the node has for
// pods: without a size the kernel would allow half the node's RAM to a
// pod with no limit at all. 0 (the kernel's default) only when nothing is
// known.
func (p *Plugin) tmpfsSize(src *v1.EmptyDirVolumeSource, pod volume.PodInfo) int64 {
	size := int64(0)
	if p.host.NodeMemory != nil {
		size = p.host.NodeMemory()
	}
	lower := func(limit int64) {
		if limit > 0 && (size <= 0 || limit < size) {
			size = limit
		}
	}
	if pod.MemoryLimit != nil {
		lower(pod.MemoryLimit.Value())
	}
	if src.SizeLimit != nil {
		lower(src.SizeLimit.Value())
	}
	return max(size, 0)
}

// removeDir unmounts a tmpfs (whatever the spec says: after a restart the spec
// may be unknown) and deletes the directory and its contents, never crossing
// into another mount and never following a symbolic link. A directory with
// contents is moved into the trash first, so an agent stopped half way
// never finds a half-deleted volume at the volume's path (where a pod with
// the same UID would adopt it); it finishes the removal from the trash.
//
// One unmount is the rule. A second mount stacked on the directory (mounted
// twice, by a crash between mount and record or by someone else) makes the
// removal fail with EBUSY before anything is deleted: then every mount is
// peeled off and the removal tried again. Peeling up front cost every
// volume a failing umount2.
func (p *Plugin) removeDir(ctx context.Context, req *plugins.TearDownRequest) error {
	if err := p.host.Mounter.Unmount(req.Dir); err != nil {
		return err
	}
	err := p.remove(ctx, req)
	if !errors.Is(err, unix.EBUSY) {
		return err
	}
	if err := p.host.Mounter.UnmountAll(req.Dir); err != nil {
		return err
	}
	return p.remove(ctx, req)
}

// remove is trash.RemoveAll of the volume's directory, with the trash's
// path and the entry's label built only when it has content: most are
// empty once unmounted.
func (p *Plugin) remove(ctx context.Context, req *plugins.TearDownRequest) error {
	if done, err := trash.RemoveEmpty(req.Dir); done {
		return err
	}
	label := string(req.Pod.UID) + "-" + filepath.Base(req.Dir)
	return trash.RemoveAll(ctx, p.host.Paths.TrashDir(), req.Dir, label)
}

// ReconstructPodVolume implements plugins.Reconstructor.
func (p *Plugin) ReconstructPodVolume(pod types.UID, specName, _ string) (volume.UniqueName, volume.Attributes, error) {
	return volume.PodScopedName(Name, pod, specName), volume.Attributes{}, nil
}

// SetUpWithoutMount implements plugins.SetUpWithoutMount: a disk emptyDir
// is a plain directory.
func (p *Plugin) SetUpWithoutMount(spec *volume.Spec) bool {
	return spec.Volume != nil && spec.Volume.EmptyDir != nil && spec.Volume.EmptyDir.Medium == v1.StorageMediumDefault && !p.mountsImage(spec)
}
