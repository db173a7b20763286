package model_test

import (
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/ui/model"
	"github.com/volume-agent/volume-agent/volume"
)

// The page says what an image volume is, with the pull policy in force,
// and that the runtime mounts it (it has no path on the node to show).
func TestDescribeImage(t *testing.T) {
	for _, tc := range []struct {
		src  v1.ImageVolumeSource
		want string
	}{
		{v1.ImageVolumeSource{Reference: "example.local/greeting:v1"}, "image example.local/greeting:v1 (pull IfNotPresent, mounted by the runtime)"},
		{v1.ImageVolumeSource{Reference: "tools"}, "image tools (pull Always, mounted by the runtime)"},
		{v1.ImageVolumeSource{Reference: "tools", PullPolicy: v1.PullNever}, "image tools (pull Never, mounted by the runtime)"},
	} {
		spec := &volume.Spec{Name: "v", Volume: &v1.Volume{Name: "v", VolumeSource: v1.VolumeSource{Image: &tc.src}}}
		if got := model.Describe(spec, "kubernetes.io/image"); got != tc.want {
			t.Errorf("Describe(%+v) = %q, want %q", tc.src, got, tc.want)
		}
	}
}
