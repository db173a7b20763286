// Package hostpath implements hostPath volumes: an existing path on the node
// (checked, or created, according to the volume's type) bind-mounted into the
// pod's volume directory. The path is resolved within the host root
// (internal/hostroot) and mounted from the descriptor that was checked.
// Tearing down unmounts and never deletes anything of the host path.
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

	"github.com/volume-agent/volume-agent/internal/hostroot"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Name is the plugin's name.
const Name = "kubernetes.io/host-path"

// Plugin is the hostPath plugin.
type Plugin struct {
	host plugins.Host
	root hostroot.Root
}

// The agent finds a plugin's capabilities by type assertion: these make a
// changed signature fail the build instead of a volume at run time.
var (
	_ plugins.Plugin        = (*Plugin)(nil)
	_ plugins.Reconstructor = (*Plugin)(nil)
)

// New returns the plugin.
func New(host plugins.Host) *Plugin { return &Plugin{host: host, root: hostroot.New(host.HostRoot)} }

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
	if _, err := kindOf(pathType(src)); err != nil {
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

// kind is what a hostPath type asks for.
type kind struct {
	// anything: the path must exist, whatever it is (type unset).
	anything bool
	typ      fs.FileMode
	what     string
	// createDir, createFile: *OrCreate types make what is missing.
	createDir, createFile bool
}

func kindOf(t v1.HostPathType) (kind, error) {
	switch t {
	case v1.HostPathUnset:
		return kind{anything: true}, nil
	case v1.HostPathDirectoryOrCreate:
		return kind{typ: fs.ModeDir, what: "a directory", createDir: true}, nil
	case v1.HostPathDirectory:
		return kind{typ: fs.ModeDir, what: "a directory"}, nil
	case v1.HostPathFileOrCreate:
		return kind{typ: 0, what: "a regular file", createFile: true}, nil
	case v1.HostPathFile:
		return kind{typ: 0, what: "a regular file"}, nil
	case v1.HostPathSocket:
		return kind{typ: fs.ModeSocket, what: "a socket"}, nil
	case v1.HostPathCharDev:
		return kind{typ: fs.ModeDevice | fs.ModeCharDevice, what: "a character device"}, nil
	case v1.HostPathBlockDev:
		return kind{typ: fs.ModeDevice, what: "a block device"}, nil
	}
	return kind{}, fmt.Errorf("hostPath type %q is not one of DirectoryOrCreate, Directory, FileOrCreate, File, Socket, CharDevice, BlockDevice", t)
}

// open opens the node's path (symbolic links resolved within the host
// root, as the bind mount will follow them), creating what an *OrCreate
// type asks for, and checks it is of the kind asked.
func (p *Plugin) open(path string, k kind) (*os.File, error) {
	f, err := p.root.Open(path)
	if errors.Is(err, fs.ErrNotExist) && (k.createDir || k.createFile) {
		if k.createDir {
			f, err = p.root.MkdirAll(path, 0o755)
		} else if err = p.root.CreateFile(path, 0o644); err != nil {
			// Like the kubelet, the parent directory is not created.
			return nil, fmt.Errorf("creating file %s: %w", path, err)
		} else {
			f, err = p.root.Open(path)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("hostPath %s: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("hostPath %s: %w", path, err)
	}
	if !k.anything && info.Mode().Type() != k.typ {
		f.Close()
		return nil, fmt.Errorf("hostPath %s is not %s (it is %s)", path, k.what, describe(info.Mode()))
	}
	return f, nil
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
	k, err := kindOf(pathType(src))
	if err != nil {
		return err
	}
	f, err := p.open(src.Path, k)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
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
	// Mounting the descriptor mounts exactly what was checked, whatever
	// happens to the path meanwhile.
	return p.host.Mounter.BindMount(hostroot.FDPath(f), req.Dir, mountutil.BindOptions{ReadOnly: req.Spec.ReadOnly, Recursive: true})
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
