package housekeeping

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/atomicfile"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Problem is something found on disk the agent cannot account for or
// clean: it is left alone and reported once.
type Problem struct {
	Path   string    `json:"path"`
	PodUID types.UID `json:"podUID,omitempty"`
	Reason string    `json:"reason"`
}

// Reconstruction is the actual state found on disk after a restart.
type Reconstruction struct {
	Volumes  []*cache.ActualVolume
	Problems []Problem
}

// Reconstruct rebuilds the actual state of world from the root directory:
// every pod volume directory (and pod volume state file) and every device
// mount directory, asking the owning plugin to name each one the way the
// populator would. Everything found is uncertain and marked reconstructed:
// until matched with a pod that wants it, it may only be torn down, and only
// once the sources have been read completely. isMountPoint tells what is
// actually mounted; isMapped tells whether a raw block volume's access point
// holds a block device that is pinned (only then is it adopted as mapped).
func Reconstruct(paths volume.Paths, reg *plugins.Registry, isMountPoint, isMapped func(string) (bool, error)) (*Reconstruction, error) {
	r := &Reconstruction{}
	vols := map[volume.UniqueName]*cache.ActualVolume{}
	get := func(name volume.UniqueName, plugin string, attrs volume.Attributes) *cache.ActualVolume {
		v, ok := vols[name]
		if !ok {
			v = &cache.ActualVolume{Name: name, Plugin: plugin, Attributes: attrs, DeviceState: cache.DeviceNotMounted}
			vols[name] = v
		}
		return v
	}

	podDirs, err := os.ReadDir(paths.PodsDir())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, pd := range podDirs {
		if !pd.IsDir() {
			continue
		}
		uid := types.UID(pd.Name())
		for _, found := range podVolumeEntries(paths, uid) {
			p, ok := reg.ByName(found.plugin)
			if !ok {
				r.Problems = append(r.Problems, Problem{Path: found.path, PodUID: uid, Reason: fmt.Sprintf("volume plugin %q is not available on this node", found.plugin)})
				continue
			}
			name, attrs, err := reconstructPodEntry(p, uid, found)
			if err != nil {
				r.Problems = append(r.Problems, Problem{Path: found.path, PodUID: uid, Reason: err.Error()})
				continue
			}
			check := isMountPoint
			if attrs.Block {
				check = isMapped
				if found.stateOnly {
					// Only the state file is left: the access point it
					// describes would be here.
					found.path = paths.PodDevicePath(uid, found.plugin, found.specName)
				}
			}
			mounted, err := check(found.path)
			if err != nil {
				r.Problems = append(r.Problems, Problem{Path: found.path, PodUID: uid, Reason: err.Error()})
				continue
			}
			v := get(name, found.plugin, attrs)
			v.Pods = v.Pods.With(uid, &cache.ActualPodMount{
				Pod: volume.PodRef{UID: uid}, SpecName: found.specName, MountPath: found.path,
				State: cache.MountUncertain, Reconstructed: true, FoundMounted: mounted,
				// Sub-paths on disk are checked (kept if still wanted,
				// removed if not) once the mount is adopted, or removed
				// with it.
				SubPathsOutdated: exists(paths.VolumeSubPathsDir(uid, found.plugin, found.specName)),
			})
		}
	}

	pluginDirs, err := os.ReadDir(filepath.Join(paths.Root, "plugins"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, pld := range pluginDirs {
		plugin := volume.UnescapePlugin(pld.Name())
		mountsDir := filepath.Join(paths.PluginDir(plugin), "mounts")
		entries, err := os.ReadDir(mountsDir)
		if err != nil {
			continue
		}
		p, _ := reg.ByName(plugin)
		rec, ok := p.(plugins.DeviceReconstructor)
		for _, e := range entries {
			dir := filepath.Join(mountsDir, e.Name())
			// An interrupted state write leaves debris.
			atomicfile.RemoveTemps(dir)
			if !ok {
				r.Problems = append(r.Problems, Problem{Path: dir, Reason: fmt.Sprintf("volume plugin %q cannot reconstruct device mounts", plugin)})
				continue
			}
			d, err := rec.ReconstructDevice(dir)
			if err != nil {
				r.Problems = append(r.Problems, Problem{Path: dir, Reason: err.Error()})
				continue
			}
			if d == nil {
				continue // nothing left to undo; the plugin cleaned up
			}
			v := get(d.Name, plugin, d.Attributes)
			v.Attributes = d.Attributes
			v.DeviceState, v.DeviceMountPath = cache.DeviceMountUncertain, d.DeviceMountPath
			v.DeviceReconstructed, v.DeviceFoundMounted = true, d.Mounted
			if d.Attached {
				v.AttachState = cache.AttachUncertain
			}
		}
	}

	names := make([]volume.UniqueName, 0, len(vols))
	for n := range vols {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	for _, n := range names {
		r.Volumes = append(r.Volumes, vols[n])
	}
	return r, nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

type podVolumeEntry struct {
	plugin, specName, path string
	// block: found under volumeDevices/ (a raw block access point).
	block bool
	// stateOnly: only the pod volume state file was found.
	stateOnly bool
}

// reconstructPodEntry asks the entry's plugin to name it.
func reconstructPodEntry(p plugins.Plugin, uid types.UID, found podVolumeEntry) (volume.UniqueName, volume.Attributes, error) {
	if found.block {
		rec, ok := p.(plugins.BlockReconstructor)
		if !ok {
			return "", volume.Attributes{}, fmt.Errorf("volume plugin %q cannot reconstruct raw block volumes", found.plugin)
		}
		name, attrs, err := rec.ReconstructPodDevice(uid, found.specName, found.path)
		attrs.Block = true
		return name, attrs, err
	}
	rec, ok := p.(plugins.Reconstructor)
	if !ok {
		return "", volume.Attributes{}, fmt.Errorf("volume plugin %q cannot reconstruct volumes", found.plugin)
	}
	return rec.ReconstructPodVolume(uid, found.specName, found.path)
}

// podVolumeEntries lists a pod's volume directories and raw block access
// points and, for volumes whose directory is gone but whose state file
// remains (a crash between the two), the directory they would have.
func podVolumeEntries(paths volume.Paths, uid types.UID) []podVolumeEntry {
	var out []podVolumeEntry
	seen := map[string]bool{}
	for _, top := range []struct {
		dir   string
		block bool
	}{{paths.PodVolumesDir(uid), false}, {paths.PodDevicesDir(uid), true}} {
		plugins, _ := os.ReadDir(top.dir)
		for _, pl := range plugins {
			if !pl.IsDir() {
				continue
			}
			plugin := volume.UnescapePlugin(pl.Name())
			entries, _ := os.ReadDir(filepath.Join(top.dir, pl.Name()))
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), ".") {
					// Not a volume (names never start with a dot): the
					// debris of a set-up that was interrupted.
					continue
				}
				out = append(out, podVolumeEntry{plugin: plugin, specName: e.Name(), path: filepath.Join(top.dir, pl.Name(), e.Name()), block: top.block})
				seen[plugin+"/"+e.Name()] = true
			}
		}
	}
	stateDir := filepath.Join(paths.PodDir(uid), "volume-state")
	plugins, _ := os.ReadDir(stateDir)
	for _, pl := range plugins {
		plugin := volume.UnescapePlugin(pl.Name())
		atomicfile.RemoveTemps(filepath.Join(stateDir, pl.Name()))
		entries, _ := os.ReadDir(filepath.Join(stateDir, pl.Name()))
		for _, e := range entries {
			name, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok || strings.HasPrefix(name, ".") || seen[plugin+"/"+name] {
				continue
			}
			out = append(out, podVolumeEntry{plugin: plugin, specName: name, path: paths.PodVolumeDir(uid, plugin, name), stateOnly: true})
		}
	}
	return out
}
