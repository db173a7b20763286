package server

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/plugins/image"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/volume"
)

// An image volume reaches the runtime with its reference and pull policy
// (defaulted as the API server does), read-only, no host path, no SELinux
// relabel, and each mount's sub-path as the image sub-path for the runtime
// to resolve (never a prepared bind mount).
func TestViewImageVolume(t *testing.T) {
	imageAttrs := volume.Attributes{NoHostPath: true, ReadOnlyForContainers: true}
	for _, tc := range []struct {
		name       string
		src        v1.ImageVolumeSource
		mounted    bool
		subPathErr string
		wantVolume runtimeapi.Volume
		wantMounts []runtimeapi.Mount
	}{{
		name:    "ready, tag v1: IfNotPresent; sub-path passed on",
		src:     v1.ImageVolumeSource{Reference: "example.local/greeting:v1"},
		mounted: true,
		wantVolume: runtimeapi.Volume{Name: "tools", Ready: true, Plugin: image.Name, VolumeMode: runtimeapi.Filesystem, ReadOnly: true,
			Image: &runtimeapi.ImageVolume{Reference: "example.local/greeting:v1", PullPolicy: "IfNotPresent"}},
		wantMounts: []runtimeapi.Mount{
			{Volume: "tools", ContainerPath: "/tools", ReadOnly: true, Propagation: "None",
				Image: &runtimeapi.ImageVolume{Reference: "example.local/greeting:v1", PullPolicy: "IfNotPresent"}},
			{Volume: "tools", ContainerPath: "/etc/greeting", ReadOnly: true, SubPath: "etc/greeting", ImageSubPath: "etc/greeting", Propagation: "None",
				Image: &runtimeapi.ImageVolume{Reference: "example.local/greeting:v1", PullPolicy: "IfNotPresent"}},
		},
	}, {
		name:    "ready, no tag: Always",
		src:     v1.ImageVolumeSource{Reference: "busybox"},
		mounted: true,
		wantVolume: runtimeapi.Volume{Name: "tools", Ready: true, Plugin: image.Name, VolumeMode: runtimeapi.Filesystem, ReadOnly: true,
			Image: &runtimeapi.ImageVolume{Reference: "busybox", PullPolicy: "Always"}},
		wantMounts: []runtimeapi.Mount{
			{Volume: "tools", ContainerPath: "/tools", ReadOnly: true, Propagation: "None", Image: &runtimeapi.ImageVolume{Reference: "busybox", PullPolicy: "Always"}},
			{Volume: "tools", ContainerPath: "/etc/greeting", ReadOnly: true, SubPath: "etc/greeting", ImageSubPath: "etc/greeting", Propagation: "None",
				Image: &runtimeapi.ImageVolume{Reference: "busybox", PullPolicy: "Always"}},
		},
	}, {
		name:    "not set up yet: the image is known, no sub-path yet",
		src:     v1.ImageVolumeSource{Reference: "busybox:latest", PullPolicy: v1.PullNever},
		mounted: false,
		wantVolume: runtimeapi.Volume{Name: "tools", Reason: runtimeapi.ReasonWaitingForMount, Plugin: image.Name, VolumeMode: runtimeapi.Filesystem, ReadOnly: true,
			Image: &runtimeapi.ImageVolume{Reference: "busybox:latest", PullPolicy: "Never"}},
		wantMounts: []runtimeapi.Mount{
			{Volume: "tools", ContainerPath: "/tools", ReadOnly: true, Propagation: "None", Image: &runtimeapi.ImageVolume{Reference: "busybox:latest", PullPolicy: "Never"}},
			{Volume: "tools", ContainerPath: "/etc/greeting", ReadOnly: true, SubPath: "etc/greeting", Propagation: "None",
				Image: &runtimeapi.ImageVolume{Reference: "busybox:latest", PullPolicy: "Never"}},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld("img")
			src := tc.src
			s := &volume.Spec{Name: "tools", Mode: v1.PersistentVolumeFilesystem, ReadOnly: true,
				Volume: &v1.Volume{Name: "tools", VolumeSource: v1.VolumeSource{Image: &src}}}
			name := w.volume("tools", image.Name, imageAttrs, s)
			if tc.mounted {
				w.asw.SetPodMount(cache.VolumeIdentity{Name: name, Plugin: image.Name, Attributes: imageAttrs},
					cache.ActualPodMount{Pod: w.pod.PodRef, SpecName: "tools", State: cache.Mounted})
			}
			w.containers = []volume.Container{{Name: "app", Type: volume.RegularContainer, Mounts: []volume.ContainerMount{
				{Volume: "tools", Index: 0, MountPath: "/tools"},
				{Volume: "tools", Index: 1, MountPath: "/etc/greeting", SubPath: "etc/greeting"},
			}}}
			p, dsw, asw := w.snapshots()
			got := View(p, dsw, asw, nil, w.paths)
			if diff := cmp.Diff([]runtimeapi.Volume{tc.wantVolume}, got.Volumes); diff != "" {
				t.Errorf("volumes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantMounts, got.Containers[0].Mounts); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			if got.Ready != tc.mounted {
				t.Errorf("ready %v, want %v (%s)", got.Ready, tc.mounted, got.Message)
			}
		})
	}
}
