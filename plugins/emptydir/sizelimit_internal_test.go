package emptydir

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/plugins"
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

// The hint Attributes gives (NoSizeLimit) agrees with mayBeLimited for
// every emptyDir spec, so teardown answers the same with or without it.
func TestSizeLimitHint(t *testing.T) {
	limit := resource.MustParse("16Mi")
	zero := resource.MustParse("0")
	p := New(plugins.Host{})
	for _, c := range []struct {
		name string
		src  v1.EmptyDirVolumeSource
	}{
		{"disk", v1.EmptyDirVolumeSource{}},
		{"disk with a limit", v1.EmptyDirVolumeSource{SizeLimit: &limit}},
		{"disk with a zero limit", v1.EmptyDirVolumeSource{SizeLimit: &zero}},
		{"memory", v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}},
		{"memory with a limit", v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory, SizeLimit: &limit}},
		{"hugepages", v1.EmptyDirVolumeSource{Medium: v1.StorageMediumHugePages}},
		{"hugepages-2Mi with a limit", v1.EmptyDirVolumeSource{Medium: "HugePages-2Mi", SizeLimit: &limit}},
	} {
		src := c.src
		spec := &volume.Spec{Volume: &v1.Volume{Name: "v", VolumeSource: v1.VolumeSource{EmptyDir: &src}}}
		attrs, err := p.Attributes(spec)
		if err != nil {
			t.Fatalf("%s: Attributes: %v", c.name, err)
		}
		want := mayBeLimited(spec)
		if attrs.NoSizeLimit == want {
			t.Errorf("%s: NoSizeLimit %v, but mayBeLimited says %v", c.name, attrs.NoSizeLimit, want)
		}
		for _, hint := range []bool{false, attrs.NoSizeLimit} {
			if got := mayHoldLimit(&plugins.TearDownRequest{Spec: spec, NoSizeLimit: hint}); got != want {
				t.Errorf("%s: mayHoldLimit with hint %v = %v, want %v", c.name, hint, got, want)
			}
		}
	}
}

// A volume found on disk after a restart has no spec and no hint: its
// teardown still looks for an image or a project to release.
func TestReconstructedTakesCheck(t *testing.T) {
	p := New(plugins.Host{})
	_, attrs, err := p.ReconstructPodVolume("pod-uid", "v", "")
	if err != nil {
		t.Fatal(err)
	}
	if attrs.NoSizeLimit {
		t.Fatal("a reconstructed volume claims to have no size limit")
	}
	if !mayHoldLimit(&plugins.TearDownRequest{NoSizeLimit: attrs.NoSizeLimit}) {
		t.Error("a reconstructed volume's teardown skips the release of its limit")
	}
}
