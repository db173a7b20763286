package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Paths is the layout of the agent's root directory. It is the only place
// that knows it; README.md (root directory layout) and docs/block-volumes.md
// describe it for people.
//
//	<root>/pods/<podUID>/volumes/<plugin~escaped>/<specName>   the volume as the pod sees it
//	<root>/pods/<podUID>/volumeDevices/<plugin~escaped>/<specName>
//	                                                           a raw block volume's access point (below)
//	<root>/pods/<podUID>/volume-state/<plugin~escaped>/<specName>.json
//	                                                           what teardown needs after a restart
//	<root>/pods/<podUID>/volume-subpaths/<plugin~escaped>/<specName>/<container>/<index>
//	                                                           a container's subPath of the volume (bind mount)
//	<root>/plugins/<plugin~escaped>/mounts/<identity>/globalmount
//	                                                           device (staging) mount of a shared volume;
//	                                                           for a Block CSI volume, its staging directory
//	<root>/plugins/<plugin~escaped>/mounts/<identity>/state.json
//	<root>/trash/<entry>                                      a volume directory being deleted
//
// A raw block volume (volumeMode Block, used in a container's
// volumeDevices) gets one access point per pod and volume, at PodDevicePath:
// an empty regular file with the volume's block device bind-mounted onto it
// (by the agent for local volumes, by the CSI driver's NodePublishVolume for
// CSI volumes, whose publish target it is). stat(2) on it reports the block
// device (S_IFBLK and its major:minor), and opening it opens the device, so a
// container runtime creates the container's device node from it. It is
// never a symlink. While it exists the agent holds the device open through a
// read-only loop device backed by the access point (see internal/blockpin),
// so the device cannot be released and its number reused under the pod. The
// actual state records it as the pod mount's MountPath of a volume whose
// Attributes.Block is set; it is usable once that mount is Mounted.
//
// Each path is one filepath.Join of all its elements rather than a Join
// onto its parent's path: the result is the same (Join cleans lexically),
// and a storm builds these paths for every volume several times over.
type Paths struct {
	Root string
}

// EscapePlugin turns a plugin name into one path element the way the kubelet
// does ("kubernetes.io/empty-dir" -> "kubernetes.io~empty-dir").
func EscapePlugin(plugin string) string { return strings.ReplaceAll(plugin, "/", "~") }

// UnescapePlugin reverses EscapePlugin.
func UnescapePlugin(dir string) string { return strings.ReplaceAll(dir, "~", "/") }

// TrashDir holds volume directories being deleted (see internal/trash).
func (p Paths) TrashDir() string { return filepath.Join(p.Root, "trash") }

// PodsDir holds one directory per pod.
func (p Paths) PodsDir() string {
	if cleanRoot(p.Root) {
		return p.Root + "/pods" // what Join makes, without cleaning again
	}
	return filepath.Join(p.Root, "pods")
}

// PodDir is the pod's own directory.
func (p Paths) PodDir(pod types.UID) string { return p.podPath(pod, "") }

// PodVolumesDir holds the pod's volumes, one directory per plugin.
func (p Paths) PodVolumesDir(pod types.UID) string {
	return filepath.Join(p.Root, "pods", string(pod), "volumes")
}

// PodVolumeDir is where the pod's volume is made available.
func (p Paths) PodVolumeDir(pod types.UID, plugin, specName string) string {
	return p.podPluginPath(pod, "volumes", plugin, specName)
}

// podPluginPath is filepath.Join(p.Root, "pods", pod, dir,
// EscapePlugin(plugin), name): a storm builds these for every volume
// several times over, and when every part is already one plain path
// element, one allocation makes it (Join and the escape took three).
func (p Paths) podPluginPath(pod types.UID, dir, plugin, name string) string {
	// The escaped plugin has no "/": it is one plain element unless it is
	// "", "." or "..".
	if !cleanRoot(p.Root) || !plainElement(string(pod)) || !plainElement(name) || plugin == "" || plugin == "." || plugin == ".." {
		return filepath.Join(p.Root, "pods", string(pod), dir, EscapePlugin(plugin), name)
	}
	var b strings.Builder
	b.Grow(len(p.Root) + len("/pods/") + len(pod) + 1 + len(dir) + 1 + len(plugin) + 1 + len(name))
	b.WriteString(p.Root)
	b.WriteString("/pods/")
	b.WriteString(string(pod))
	b.WriteByte('/')
	b.WriteString(dir)
	b.WriteByte('/')
	for i := 0; i < len(plugin); i++ {
		if c := plugin[i]; c == '/' {
			b.WriteByte('~')
		} else {
			b.WriteByte(c)
		}
	}
	b.WriteByte('/')
	b.WriteString(name)
	return b.String()
}

// podPath is filepath.Join(p.Root, "pods", pod, dir) (dir a plain element
// or ""), in one allocation when the elements are plain: a teardown storm
// checks these for every volume.
func (p Paths) podPath(pod types.UID, dir string) string {
	if !cleanRoot(p.Root) || !plainElement(string(pod)) {
		return filepath.Join(p.Root, "pods", string(pod), dir)
	}
	n := len(p.Root) + len("/pods/") + len(pod)
	if dir != "" {
		n += 1 + len(dir)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(p.Root)
	b.WriteString("/pods/")
	b.WriteString(string(pod))
	if dir != "" {
		b.WriteByte('/')
		b.WriteString(dir)
	}
	return b.String()
}

// cleanRoot reports whether root is a path Join keeps as it is in front of
// more elements: absolute, clean, and not "/" (filepath.Clean(root) ==
// root, by one scan for what Clean would change: every path built checks
// it).
func cleanRoot(root string) bool {
	if len(root) < 2 || root[0] != '/' || root[len(root)-1] == '/' {
		return false
	}
	// Each element (after a "/") must be neither empty, "." nor "..".
	for i := 0; i < len(root); {
		j := i + 1
		for j < len(root) && root[j] != '/' {
			j++
		}
		if e := root[i+1 : j]; e == "" || e == "." || e == ".." {
			return false
		}
		i = j
	}
	return true
}

// plainElement reports whether Join keeps s as one element as it is.
func plainElement(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.Contains(s, "/")
}

// PodDevicesDir holds the pod's raw block volumes' access points, one
// directory per plugin.
func (p Paths) PodDevicesDir(pod types.UID) string {
	return filepath.Join(p.Root, "pods", string(pod), "volumeDevices")
}

// PodDevicePath is the access point of the pod's raw block volume: a file
// onto which the block device is bind-mounted (see Paths).
func (p Paths) PodDevicePath(pod types.UID, plugin, specName string) string {
	return p.podPluginPath(pod, "volumeDevices", plugin, specName)
}

// PodVolumeStateDir holds the state files of the pod's volumes.
func (p Paths) PodVolumeStateDir(pod types.UID) string {
	return p.podPath(pod, "volume-state")
}

// PodVolumeStateFile records what tearing the pod's volume down needs.
func (p Paths) PodVolumeStateFile(pod types.UID, plugin, specName string) string {
	return filepath.Join(p.Root, "pods", string(pod), "volume-state", EscapePlugin(plugin), specName+".json")
}

// PluginDir is the plugin's private directory.
func (p Paths) PluginDir(plugin string) string {
	return filepath.Join(p.Root, "plugins", EscapePlugin(plugin))
}

// VolumeDir is the per-volume directory of a shared volume.
func (p Paths) VolumeDir(plugin, identity string) string {
	return filepath.Join(p.Root, "plugins", EscapePlugin(plugin), "mounts", PathElement(identity))
}

// DeviceMountPath is where a shared volume's device is mounted (staged).
func (p Paths) DeviceMountPath(plugin, identity string) string {
	return filepath.Join(p.Root, "plugins", EscapePlugin(plugin), "mounts", PathElement(identity), "globalmount")
}

// VolumeStateFile records what unmounting a shared volume's device needs.
func (p Paths) VolumeStateFile(plugin, identity string) string {
	return filepath.Join(p.Root, "plugins", EscapePlugin(plugin), "mounts", PathElement(identity), "state.json")
}

// PathElement turns an arbitrary identity into one safe path element: names
// that are already safe are kept readable, anything else (slashes, dots,
// very long handles) is replaced by a hash so it can never escape its parent.
// A name that starts like a hashed one is hashed too: otherwise an identity
// spelt as another's hash (a PV named after the hash of a long PV name)
// would share its directory.
func PathElement(s string) string {
	if err := ValidatePathElement(s); err == nil && len(s) <= 128 && !strings.HasPrefix(s, hashedPrefix) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return hashedPrefix + hex.EncodeToString(sum[:])
}

// hashedPrefix starts the names PathElement makes by hashing.
const hashedPrefix = "sha256-"

// ValidatePathElement checks that s can be used as a single directory entry
// name without escaping its parent or confusing people: non-empty, not "."
// or "..", no "/", no NUL, no leading dot, printable ASCII.
func ValidatePathElement(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty name")
	case len(s) > 253:
		return fmt.Errorf("name %.20q... is longer than 253 characters", s)
	case s[0] == '.':
		return fmt.Errorf("name %q starts with a dot", s)
	}
	for _, r := range s {
		if r == '/' || r < 0x21 || r > 0x7e {
			return fmt.Errorf("name %q contains %q", s, r)
		}
	}
	return nil
}

// PodSubPathsDir holds the sub-paths prepared for the pod's containers.
func (p Paths) PodSubPathsDir(pod types.UID) string {
	return p.podPath(pod, "volume-subpaths")
}

// VolumeSubPathsDir holds the sub-paths of one of the pod's volumes: one
// directory per container, one target per volumeMounts index. Unlike the
// kubelet's volume-subpaths/<specName>, the plugin is part of the path, as
// for the volume itself: two volumes of a pod may share a spec name.
func (p Paths) VolumeSubPathsDir(pod types.UID, plugin, specName string) string {
	return p.podPluginPath(pod, "volume-subpaths", plugin, specName)
}

// SubPathTarget is the bind mount of a container's sub-path of a volume,
// what a container runtime mounts into the container.
func (p Paths) SubPathTarget(pod types.UID, plugin, specName, container string, index int) string {
	return filepath.Join(p.Root, "pods", string(pod), "volume-subpaths", EscapePlugin(plugin), specName, container, strconv.Itoa(index))
}

// PodVolumeDirs are a pod's volume directory and the directories above it
// that setting it up makes and tearing it down removes, all clean.
type PodVolumeDirs struct {
	Dir    string // PodVolumeDir
	Plugin string // its parent: <pod>/volumes/<plugin>
	Pod    string // PodDir
	Pods   string // PodsDir
}

// PodVolumeDirs names the directories of the pod's volume. An operation
// used to build each (and Clean them again) one by one, several times per
// volume in a storm; when the elements are plain they are one string and
// its prefixes. podVolumeDirsSimple is what it must agree with.
func (p Paths) PodVolumeDirs(pod types.UID, plugin, specName string) PodVolumeDirs {
	if !plainPodVolume(p.Root, pod, plugin, specName) {
		return p.podVolumeDirsSimple(pod, plugin, specName)
	}
	return slicePodVolume(p.PodVolumeDir(pod, plugin, specName), len(p.Root), len(pod), len(plugin))
}

// slicePodVolume is the PodVolumeDirs of dir, a PodVolumeDir with plain
// elements, a root, pod UID and plugin of these lengths.
func slicePodVolume(dir string, root, pod, plugin int) PodVolumeDirs {
	podEnd := root + len("/pods/") + pod
	pluginEnd := podEnd + len("/volumes/") + plugin
	return PodVolumeDirs{Dir: dir, Plugin: dir[:pluginEnd], Pod: dir[:podEnd], Pods: dir[:root+len("/pods")]}
}

// MatchPodVolumeDirs reports whether path is the pod's volume directory
// (path == PodVolumeDir(pod, plugin, specName)) and, when it is, returns
// its PodVolumeDirs, taken from path without building anything when the
// elements are plain: a teardown has the recorded mount path at hand.
func (p Paths) MatchPodVolumeDirs(path string, pod types.UID, plugin, specName string) (PodVolumeDirs, bool) {
	if d, ok := p.podVolumeDirsOf(path, pod, plugin, specName); ok {
		return d, true
	}
	if plainPodVolume(p.Root, pod, plugin, specName) || path != p.PodVolumeDir(pod, plugin, specName) {
		// With plain elements podVolumeDirsOf matched what PodVolumeDir
		// builds exactly, so anything else differs.
		return PodVolumeDirs{}, false
	}
	return p.podVolumeDirsSimple(pod, plugin, specName), true
}

// podVolumeDirsSimple builds each of PodVolumeDirs on its own.
func (p Paths) podVolumeDirsSimple(pod types.UID, plugin, specName string) PodVolumeDirs {
	dir := p.PodVolumeDir(pod, plugin, specName)
	return PodVolumeDirs{Dir: dir, Plugin: filepath.Dir(dir), Pod: p.PodDir(pod), Pods: p.PodsDir()}
}

// plainPodVolume reports whether PodVolumeDir is
// root/pods/<pod>/volumes/<escaped plugin>/<specName> as it is, with no
// element that Join would change.
func plainPodVolume(root string, pod types.UID, plugin, specName string) bool {
	return cleanRoot(root) && plainElement(string(pod)) && plainElement(specName) &&
		plugin != "" && plugin != "." && plugin != ".."
}

// podVolumeDirsOf returns the PodVolumeDirs sliced from path when the
// elements are plain and path spells PodVolumeDir exactly.
func (p Paths) podVolumeDirsOf(path string, pod types.UID, plugin, specName string) (PodVolumeDirs, bool) {
	const pods, volumes = "/pods/", "/volumes/"
	r := len(p.Root)
	podEnd := r + len(pods) + len(pod)
	pluginEnd := podEnd + len(volumes) + len(plugin)
	if len(path) != pluginEnd+1+len(specName) || !plainPodVolume(p.Root, pod, plugin, specName) ||
		path[:r] != p.Root || path[r:r+len(pods)] != pods || path[r+len(pods):podEnd] != string(pod) ||
		path[podEnd:podEnd+len(volumes)] != volumes || path[pluginEnd] != '/' || path[pluginEnd+1:] != specName {
		return PodVolumeDirs{}, false
	}
	for i := 0; i < len(plugin); i++ {
		c, want := path[podEnd+len(volumes)+i], plugin[i]
		if want == '/' {
			want = '~'
		}
		if c != want {
			return PodVolumeDirs{}, false
		}
	}
	return slicePodVolume(path, r, len(pod), len(plugin)), true
}
