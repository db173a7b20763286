// Package hostpath implements hostPath volumes: an existing path on the node
// (checked, or created, according to the volume's type) bind-mounted into the
// pod's volume directory. Tearing down unmounts and never deletes anything of
// the host path.
package hostpath

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Name is the plugin's name.
const Name = "kubernetes.io/host-path"

// Plugin is the hostPath plugin.
type Plugin struct{ host plugins.Host }

// The agent finds a plugin's capabilities by type assertion: these make a
// changed signature fail the build instead of a volume at run time.
var (
	_ plugins.Plugin        = (*Plugin)(nil)
	_ plugins.Reconstructor = (*Plugin)(nil)
)

// New returns the plugin.
func New(host plugins.Host) *Plugin { return &Plugin{host: host} }

func (p *Plugin) Name() string { return Name }

func source(spec *volume.Spec) *v1.HostPathVolumeSource {
	switch {
	case spec.Volume != nil:
		return spec.Volume.HostPath
	case spec.PV != nil:
		return spec.PV.Spec.HostPath
	}
	return nil
}

func (p *Plugin) CanSupport(spec *volume.Spec) bool { return source(spec) != nil }

func (p *Plugin) Attributes(spec *volume.Spec) (volume.Attributes, error) {
	src := source(spec)
	if !filepath.IsAbs(src.Path) {
		return volume.Attributes{}, fmt.Errorf("hostPath %q is not an absolute path", src.Path)
	}
	for _, el := range strings.Split(src.Path, "/") {
		if el == ".." {
			return volume.Attributes{}, fmt.Errorf("hostPath %q must not contain '..'", src.Path)
		}
	}
	if _, err := checkerFor(pathType(src)); err != nil {
		return volume.Attributes{}, err
	}
	return volume.Attributes{}, nil
}

func pathType(src *v1.HostPathVolumeSource) v1.HostPathType {
	if src.Type == nil {
		return v1.HostPathUnset
	}
	return *src.Type
}

// checker validates (and for *OrCreate types, creates) the host path.
type checker func(path string) error

func checkerFor(t v1.HostPathType) (checker, error) {
	switch t {
	case v1.HostPathUnset:
		return mustExist, nil
	case v1.HostPathDirectoryOrCreate:
		return func(path string) error {
			if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
				if err := os.MkdirAll(path, 0o755); err != nil {
					return err
				}
			}
			return mustBe(path, fs.ModeDir, "a directory")
		}, nil
	case v1.HostPathDirectory:
		return func(path string) error { return mustBe(path, fs.ModeDir, "a directory") }, nil
	case v1.HostPathFileOrCreate:
		return func(path string) error {
			if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
				// Like the kubelet, the parent directory is not created.
				f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
				if err != nil && !errors.Is(err, fs.ErrExist) {
					return fmt.Errorf("creating file %s: %w", path, err)
				}
				if f != nil {
					f.Close()
				}
			}
			return mustBe(path, 0, "a regular file")
		}, nil
	case v1.HostPathFile:
		return func(path string) error { return mustBe(path, 0, "a regular file") }, nil
	case v1.HostPathSocket:
		return func(path string) error { return mustBe(path, fs.ModeSocket, "a socket") }, nil
	case v1.HostPathCharDev:
		return func(path string) error { return mustBe(path, fs.ModeDevice|fs.ModeCharDevice, "a character device") }, nil
	case v1.HostPathBlockDev:
		return func(path string) error { return mustBe(path, fs.ModeDevice, "a block device") }, nil
	}
	return nil, fmt.Errorf("hostPath type %q is not one of DirectoryOrCreate, Directory, FileOrCreate, File, Socket, CharDevice, BlockDevice", t)
}

func mustExist(path string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("hostPath %s: %w", path, err)
	}
	return nil
}

// mustBe checks the type of what path points to (symlinks followed, as the
// bind mount will follow them).
func mustBe(path string, typ fs.FileMode, what string) error {
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("hostPath %s: %w", path, err)
	}
	if info.Mode().Type() != typ {
		return fmt.Errorf("hostPath %s is not %s (it is %s)", path, what, describe(info.Mode()))
	}
	return nil
}

func describe(m fs.FileMode) string {
	switch t := m.Type(); {
	case t == 0:
		return "a regular file"
	case t == fs.ModeDir:
		return "a directory"
	case t == fs.ModeSocket:
		return "a socket"
	case t == fs.ModeDevice|fs.ModeCharDevice:
		return "a character device"
	case t == fs.ModeDevice:
		return "a block device"
	case t == fs.ModeNamedPipe:
		return "a named pipe"
	default:
		return "of type " + t.String()
	}
}

func (p *Plugin) SetUp(_ context.Context, req *plugins.SetUpRequest) error {
	src := source(req.Spec)
	check, err := checkerFor(pathType(src))
	if err != nil {
		return err
	}
	path := p.host.HostPath(src.Path)
	if err := check(path); err != nil {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	// The mount point must be of the same kind as the source: a directory
	// for a directory, a file for anything else.
	if info.IsDir() {
		_, err = mountutil.EnsureDir(req.Dir, 0o750)
	} else {
		err = ensureFile(req.Dir)
	}
	if err != nil {
		return err
	}
	mounted, err := p.host.Mounter.IsMountPoint(req.Dir)
	if err != nil || mounted {
		return err
	}
	return p.host.Mounter.BindMount(path, req.Dir, mountutil.BindOptions{ReadOnly: req.Spec.ReadOnly, Recursive: true})
}

func ensureFile(path string) error {
	if _, err := mountutil.EnsureDir(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	// O_EXCL: never open what is there already. Once set up, path is the
	// mounted socket, device or FIFO itself, and opening it fails (ENXIO
	// for a socket) or blocks (a FIFO without a writer).
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o640)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}

// TearDown unmounts the recursive bind mount, submounts included, and
// removes the (empty) mount point; nothing of the host path is deleted.
func (p *Plugin) TearDown(_ context.Context, req *plugins.TearDownRequest) error {
	if err := p.host.Mounter.UnmountTree(req.Dir); err != nil {
		return err
	}
	return plugins.UnmountAndRemoveEntry(p.host.Mounter, req.Dir)
}

// ReconstructPodVolume implements plugins.Reconstructor.
func (p *Plugin) ReconstructPodVolume(pod types.UID, specName, _ string) (volume.UniqueName, volume.Attributes, error) {
	return volume.PodScopedName(Name, pod, specName), volume.Attributes{}, nil
}
