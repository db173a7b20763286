package e2eutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/runtimeapi/client"
)

// RuntimeClient is a client of the agent's runtime API, on its default
// socket <root>/runtime.sock.
func (a *Agent) RuntimeClient() *client.Client { return client.New(runtimeapi.Socket(a.opts.Root)) }

// SubPathTarget is the documented place of a container's sub-path of a
// pod's volume.
func SubPathTarget(root, podUID, plugin, specName, container string, index int) string {
	return filepath.Join(PodDir(root, podUID), "volume-subpaths", escape(plugin), specName, container, strconv.Itoa(index))
}

// CheckReadyPaths checks what a pod the runtime API says is ready must
// have: every host path it gives is a mount point in /proc/self/mountinfo
// (a volume, a sub-path's bind mount) or a block device, except the
// directory of an emptyDir on the node's disk or of a configMap, which is a
// plain directory (the kubelet does not mount those either).
func CheckReadyPaths(p *runtimeapi.Pod) error {
	if !p.Ready {
		return fmt.Errorf("pod %s/%s is not ready", p.Namespace, p.Name)
	}
	plain := map[string]bool{}
	for _, v := range p.Volumes {
		if v.Image != nil {
			continue // the runtime mounts the image: no path on the node
		}
		if v.HostPath == "" && v.DevicePath == "" {
			return fmt.Errorf("ready volume %s has no path", v.Name)
		}
		if (v.Plugin == EmptyDirPlugin || v.Plugin == ConfigMapPlugin) && v.VolumeMode == runtimeapi.Filesystem {
			if ms, err := mountsAt(v.HostPath); err != nil || len(ms) == 0 {
				// Memory emptyDirs are tmpfs mounts; disk ones and
				// configMaps not.
				plain[v.HostPath] = true
			}
		}
	}
	check := func(what, path string, block bool) error {
		if path == "" {
			return fmt.Errorf("%s: no path although the pod is ready", what)
		}
		if block {
			var st unix.Stat_t
			if err := unix.Stat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
				return fmt.Errorf("%s: %s is not a block device (%v)", what, path, err)
			}
			return nil
		}
		if plain[path] {
			fi, err := os.Lstat(path)
			if err != nil || !fi.IsDir() {
				return fmt.Errorf("%s: %s is not a directory (%v)", what, path, err)
			}
			return nil
		}
		ms, err := mountsAt(path)
		if err != nil {
			return err
		}
		if len(ms) == 0 {
			return fmt.Errorf("%s: %s is not a mount point", what, path)
		}
		return nil
	}
	for _, v := range p.Volumes {
		if v.Image != nil {
			if v.HostPath != "" {
				return fmt.Errorf("image volume %s has a host path %s", v.Name, v.HostPath)
			}
			continue
		}
		if err := check("volume "+v.Name, v.HostPath+v.DevicePath, v.VolumeMode == runtimeapi.Block); err != nil {
			return err
		}
	}
	for _, c := range p.Containers {
		for _, m := range c.Mounts {
			if m.Image != nil {
				if m.HostPath != "" || !m.ReadOnly {
					return fmt.Errorf("container %s mount %s of an image: host path %q, read-only %v", c.Name, m.ContainerPath, m.HostPath, m.ReadOnly)
				}
				continue
			}
			if err := check(fmt.Sprintf("container %s mount %s", c.Name, m.ContainerPath), m.HostPath, false); err != nil {
				return err
			}
		}
		for _, d := range c.Devices {
			if err := check(fmt.Sprintf("container %s device %s", c.Name, d.ContainerPath), d.HostPath, true); err != nil {
				return err
			}
		}
	}
	return nil
}

func mountsAt(path string) ([]mounttest.Mount, error) {
	all, err := mounttest.ReadMounts()
	if err != nil {
		return nil, err
	}
	real := mounttest.Real(path)
	var out []mounttest.Mount
	for _, m := range all {
		if m.MountPoint == real {
			out = append(out, m)
		}
	}
	return out, nil
}
