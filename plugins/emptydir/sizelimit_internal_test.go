package emptydir

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/volume"
)

// Only a disk emptyDir with a sizeLimit, or a volume whose spec is unknown
// (found on disk after a restart), may hold an image or a project to
// release at teardown.
func TestMayBeLimited(t *testing.T) {
	limit := resource.MustParse("16Mi")
	zero := resource.MustParse("0")
	spec := func(e *v1.EmptyDirVolumeSource) *volume.Spec {
		return &volume.Spec{Volume: &v1.Volume{Name: "v", VolumeSource: v1.VolumeSource{EmptyDir: e}}}
	}
	for _, c := range []struct {
		name string
		spec *volume.Spec
		want bool
	}{
		{"unknown spec", nil, true},
		{"no volume", &volume.Spec{}, true},
		{"disk with a limit", spec(&v1.EmptyDirVolumeSource{SizeLimit: &limit}), true},
		{"disk without a limit", spec(&v1.EmptyDirVolumeSource{}), false},
		{"disk with a zero limit", spec(&v1.EmptyDirVolumeSource{SizeLimit: &zero}), false},
		{"memory with a limit", spec(&v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory, SizeLimit: &limit}), false},
		{"hugepages", spec(&v1.EmptyDirVolumeSource{Medium: v1.StorageMediumHugePages, SizeLimit: &limit}), false},
	} {
		if got := mayBeLimited(c.spec); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}
