package populator

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/volume"
)

// Sub-paths are prepared by the agent only for volumes with a host path;
// the runtime resolves those of a volume it mounts itself (an image
// volume's image_sub_path), so none is planned for it.
func TestWithSubPathsNoHostPath(t *testing.T) {
	sub := volume.SubPath{Container: "app", Index: 1, MountPath: "/etc/greeting", Path: "etc/greeting"}
	for _, tc := range []struct {
		name  string
		attrs volume.Attributes
		want  []volume.SubPath
	}{
		{name: "emptyDir", attrs: volume.Attributes{}, want: []volume.SubPath{sub}},
		{name: "API volume: read-only", attrs: volume.Attributes{ReadOnlyForContainers: true}, want: []volume.SubPath{{Container: "app", Index: 1, MountPath: "/etc/greeting", Path: "etc/greeting", ReadOnly: true}}},
		{name: "image", attrs: volume.Attributes{NoHostPath: true, ReadOnlyForContainers: true}, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pv := withSubPaths(cache.PodVolume{Attributes: tc.attrs, Spec: &volume.Spec{Name: "v"}}, []volume.SubPath{sub})
			if diff := cmp.Diff(tc.want, pv.SubPaths); diff != "" {
				t.Errorf("sub-paths (-want +got):\n%s", diff)
			}
		})
	}
}
