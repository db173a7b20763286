package volume

import (
	"path/filepath"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestPathsNestUnderTheirParents checks that every path built in one Join
// is the one built by joining onto its parent's path, which is how the
// layout is defined, for well-formed and hostile elements alike.
func TestPathsNestUnderTheirParents(t *testing.T) {
	roots := []string{"/var/lib/volume-agent", "/var/lib/volume-agent/", "rel/root", "/"}
	uids := []types.UID{"0b6c2f1e-7d1a-4c55-9a51-3f2d6f1a9e10", "..", "a/../b", "", "./x", "/abs"}
	plugins := []string{"kubernetes.io/empty-dir", "kubernetes.io/csi", "..", ""}
	specs := []string{"data", "..", "../../etc", "a/b", ""}
	identities := []string{"pv-1", "..", "a/b"}
	for _, root := range roots {
		p := Paths{Root: root}
		for _, uid := range uids {
			podDir := filepath.Join(filepath.Join(root, "pods"), string(uid))
			checks := map[string][2]string{
				"PodDir":            {p.PodDir(uid), podDir},
				"PodVolumesDir":     {p.PodVolumesDir(uid), filepath.Join(podDir, "volumes")},
				"PodDevicesDir":     {p.PodDevicesDir(uid), filepath.Join(podDir, "volumeDevices")},
				"PodVolumeStateDir": {p.PodVolumeStateDir(uid), filepath.Join(podDir, "volume-state")},
				"PodSubPathsDir":    {p.PodSubPathsDir(uid), filepath.Join(podDir, "volume-subpaths")},
			}
			for _, plugin := range plugins {
				for _, spec := range specs {
					esc := EscapePlugin(plugin)
					sub := filepath.Join(filepath.Join(podDir, "volume-subpaths"), esc, spec)
					checks["PodVolumeDir "+plugin+" "+spec] = [2]string{p.PodVolumeDir(uid, plugin, spec), filepath.Join(filepath.Join(podDir, "volumes"), esc, spec)}
					checks["PodDevicePath "+plugin+" "+spec] = [2]string{p.PodDevicePath(uid, plugin, spec), filepath.Join(filepath.Join(podDir, "volumeDevices"), esc, spec)}
					checks["PodVolumeStateFile "+plugin+" "+spec] = [2]string{p.PodVolumeStateFile(uid, plugin, spec), filepath.Join(filepath.Join(podDir, "volume-state"), esc, spec+".json")}
					checks["VolumeSubPathsDir "+plugin+" "+spec] = [2]string{p.VolumeSubPathsDir(uid, plugin, spec), sub}
					checks["SubPathTarget "+plugin+" "+spec] = [2]string{p.SubPathTarget(uid, plugin, spec, "c", 3), filepath.Join(sub, "c", strconv.Itoa(3))}
				}
			}
			for name, c := range checks {
				if c[0] != c[1] {
					t.Errorf("root %q uid %q: %s = %q, joined onto its parent %q", root, uid, name, c[0], c[1])
				}
			}
		}
		for _, plugin := range plugins {
			for _, id := range identities {
				vol := filepath.Join(filepath.Join(p.PluginDir(plugin), "mounts"), PathElement(id))
				for name, c := range map[string][2]string{
					"VolumeDir":       {p.VolumeDir(plugin, id), vol},
					"DeviceMountPath": {p.DeviceMountPath(plugin, id), filepath.Join(vol, "globalmount")},
					"VolumeStateFile": {p.VolumeStateFile(plugin, id), filepath.Join(vol, "state.json")},
				} {
					if c[0] != c[1] {
						t.Errorf("root %q plugin %q identity %q: %s = %q, joined onto its parent %q", root, plugin, id, name, c[0], c[1])
					}
				}
			}
		}
	}
}

func BenchmarkPodVolumeDir(b *testing.B) {
	p := Paths{Root: "/var/lib/volume-agent"}
	uid := types.UID("0b6c2f1e-7d1a-4c55-9a51-3f2d6f1a9e10")
	b.ReportAllocs()
	for b.Loop() {
		_ = p.PodVolumeDir(uid, "kubernetes.io/empty-dir", "cache")
	}
}
