package image

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

func imageSpec(src v1.ImageVolumeSource, mode v1.PersistentVolumeMode) *volume.Spec {
	return &volume.Spec{Name: "v", Mode: mode, Volume: &v1.Volume{Name: "v", VolumeSource: v1.VolumeSource{Image: &src}}}
}

// The pull policy a runtime is given when the pod says none: the API
// server's default (k8s.io/kubernetes pkg/apis/core/v1 SetDefaults_Volume).
func TestPullPolicy(t *testing.T) {
	for _, tc := range []struct {
		ref    string
		policy v1.PullPolicy
		want   v1.PullPolicy
	}{
		{ref: "image:v1", want: v1.PullIfNotPresent},
		{ref: "image:latest", want: v1.PullAlways},
		{ref: "image", want: v1.PullAlways},
		{ref: "docker.io/library/busybox", want: v1.PullAlways},
		{ref: "registry.example:5000/team/tools:1.2", want: v1.PullIfNotPresent},
		{ref: "registry.example:5000/team/tools", want: v1.PullAlways}, // the port is no tag
		{ref: "image@sha256:" + strings.Repeat("a", 64), want: v1.PullIfNotPresent},
		{ref: "image:latest@sha256:" + strings.Repeat("a", 64), want: v1.PullAlways},
		{ref: "Not A Reference", want: v1.PullIfNotPresent}, // unparsable: no "latest" tag found
		{ref: "image:latest", policy: v1.PullNever, want: v1.PullNever},
		{ref: "image:v1", policy: v1.PullAlways, want: v1.PullAlways},
		{ref: "image", policy: v1.PullIfNotPresent, want: v1.PullIfNotPresent},
	} {
		if got := PullPolicy(&v1.ImageVolumeSource{Reference: tc.ref, PullPolicy: tc.policy}); got != tc.want {
			t.Errorf("PullPolicy(%q, %q) = %s, want %s", tc.ref, tc.policy, got, tc.want)
		}
	}
}

func TestAttributes(t *testing.T) {
	p := New()
	for _, tc := range []struct {
		name    string
		spec    *volume.Spec
		wantErr string
	}{
		{name: "reference", spec: imageSpec(v1.ImageVolumeSource{Reference: "tools:v1"}, v1.PersistentVolumeFilesystem)},
		{name: "every policy", spec: imageSpec(v1.ImageVolumeSource{Reference: "tools:v1", PullPolicy: v1.PullNever}, "")},
		{name: "no reference", spec: imageSpec(v1.ImageVolumeSource{}, ""), wantErr: "image volume has no reference"},
		{name: "bad policy", spec: imageSpec(v1.ImageVolumeSource{Reference: "tools", PullPolicy: "Sometimes"}, ""), wantErr: `pullPolicy "Sometimes" is not one of`},
		{name: "block", spec: imageSpec(v1.ImageVolumeSource{Reference: "tools"}, v1.PersistentVolumeBlock), wantErr: "raw block device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !p.CanSupport(tc.spec) {
				t.Fatal("CanSupport false for an image volume")
			}
			a, err := p.Attributes(tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := volume.Attributes{NoHostPath: true, ReadOnlyForContainers: true}
			if a != want {
				t.Errorf("attributes %+v, want %+v (no host path, read-only, per pod)", a, want)
			}
		})
	}
}

func TestCanSupportOnlyImages(t *testing.T) {
	p := New()
	for _, s := range []*volume.Spec{
		nil, {Name: "pv", PV: &v1.PersistentVolume{}},
		{Name: "e", Volume: &v1.Volume{VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}},
	} {
		if p.CanSupport(s) {
			t.Errorf("CanSupport(%+v) = true", s)
		}
	}
}

// Setting up and tearing down touch nothing: the runtime mounts the image.
func TestSetUpAndTearDownTouchNothing(t *testing.T) {
	p := New()
	dir := t.TempDir() + "/never-made"
	ctx := context.Background()
	if err := p.SetUp(ctx, &plugins.SetUpRequest{Spec: imageSpec(v1.ImageVolumeSource{Reference: "tools"}, ""), Dir: dir}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("SetUp made %s (%v): an image volume has no host path", dir, err)
	}
	if err := p.TearDown(ctx, &plugins.TearDownRequest{Dir: dir}); err != nil {
		t.Fatal(err)
	}
}
