package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Paths is the layout of the agent's root directory. It is the only place
// that knows it; docs/root-dir.md describes it for people.
//
//	<root>/pods/<podUID>/volumes/<plugin~escaped>/<specName>   the volume as the pod sees it
//	<root>/pods/<podUID>/volume-state/<plugin~escaped>/<specName>.json
//	                                                           what teardown needs after a restart
//	<root>/plugins/<plugin~escaped>/mounts/<identity>/globalmount
//	                                                           device (staging) mount of a shared volume
//	<root>/plugins/<plugin~escaped>/mounts/<identity>/state.json
//	<root>/trash/<entry>                                      a volume directory being deleted
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
func (p Paths) PodsDir() string { return filepath.Join(p.Root, "pods") }

// PodDir is the pod's own directory.
func (p Paths) PodDir(pod types.UID) string { return filepath.Join(p.PodsDir(), string(pod)) }

// PodVolumesDir holds the pod's volumes, one directory per plugin.
func (p Paths) PodVolumesDir(pod types.UID) string {
	return filepath.Join(p.PodDir(pod), "volumes")
}

// PodVolumeDir is where the pod's volume is made available.
func (p Paths) PodVolumeDir(pod types.UID, plugin, specName string) string {
	return filepath.Join(p.PodVolumesDir(pod), EscapePlugin(plugin), specName)
}

// PodVolumeStateFile records what tearing the pod's volume down needs.
func (p Paths) PodVolumeStateFile(pod types.UID, plugin, specName string) string {
	return filepath.Join(p.PodDir(pod), "volume-state", EscapePlugin(plugin), specName+".json")
}

// PluginDir is the plugin's private directory.
func (p Paths) PluginDir(plugin string) string {
	return filepath.Join(p.Root, "plugins", EscapePlugin(plugin))
}

// VolumeDir is the per-volume directory of a shared volume.
func (p Paths) VolumeDir(plugin, identity string) string {
	return filepath.Join(p.PluginDir(plugin), "mounts", PathElement(identity))
}

// DeviceMountPath is where a shared volume's device is mounted (staged).
func (p Paths) DeviceMountPath(plugin, identity string) string {
	return filepath.Join(p.VolumeDir(plugin, identity), "globalmount")
}

// VolumeStateFile records what unmounting a shared volume's device needs.
func (p Paths) VolumeStateFile(plugin, identity string) string {
	return filepath.Join(p.VolumeDir(plugin, identity), "state.json")
}

// PathElement turns an arbitrary identity into one safe path element: names
// that are already safe are kept readable, anything else (slashes, dots,
// very long handles) is replaced by a hash so it can never escape its parent.
func PathElement(s string) string {
	if err := ValidatePathElement(s); err == nil && len(s) <= 128 {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256-" + hex.EncodeToString(sum[:])
}

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
