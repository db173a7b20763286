package cluster_test

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// Image volumes on a real API server (ImageVolume is GA and locked on in
// 1.36): the pod is ready as with the kubelet (nothing is mounted on the
// node), and the runtime API hands the runtime each image's reference with
// the pull policy the API server defaulted, read-only, and a container's
// subPath as the image sub-path; nothing is left behind when the pod goes.
func TestImageVolumesReachTheRuntimeAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "image")
	a := e.start()
	pod := e.pod("app",
		corev1.Volume{Name: "greeting", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "example.local/greeting:v1"}}},
		corev1.Volume{Name: "tools", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "example.local/tools"}}},
	)
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
		corev1.VolumeMount{Name: "greeting", MountPath: "/motd", SubPath: "etc/motd"})
	pod = e.createPod(pod)

	p, err := a.RuntimeClient().Wait(t.Context(), string(pod.UID), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := e2eutil.CheckReadyPaths(p); err != nil {
		t.Error(err)
	}
	for _, tc := range []struct {
		volume string
		want   runtimeapi.ImageVolume
	}{
		{"greeting", runtimeapi.ImageVolume{Reference: "example.local/greeting:v1", PullPolicy: "IfNotPresent"}},
		{"tools", runtimeapi.ImageVolume{Reference: "example.local/tools", PullPolicy: "Always"}},
	} {
		v := volumeOf(t, p, tc.volume)
		if v.Image == nil || *v.Image != tc.want || !v.Ready || !v.ReadOnly || v.HostPath != "" || v.SELinuxRelabel || v.Plugin != "kubernetes.io/image" {
			t.Errorf("volume %s: %+v (image %+v), want ready, read-only, image %+v, no host path", tc.volume, v, v.Image, tc.want)
		}
	}
	m := mountOf(t, p, "main", "/motd")
	if m.Image == nil || m.Image.Reference != "example.local/greeting:v1" || m.ImageSubPath != "etc/motd" || m.HostPath != "" || !m.ReadOnly {
		t.Errorf("sub-path mount %+v, want the image sub-path etc/motd and no host path", m)
	}
	if m := mountOf(t, p, "main", "/mnt/greeting"); m.Image == nil || m.ImageSubPath != "" || !m.ReadOnly {
		t.Errorf("whole-image mount %+v", m)
	}
	// The agent made nothing for them on the node.
	if _, err := os.Lstat(e.podDir(pod.UID)); !os.IsNotExist(err) {
		t.Errorf("pod directory %s exists (%v): image volumes have no host path", e.podDir(pod.UID), err)
	}
	e.waitConditionStatus("app", corev1.ConditionTrue)

	if err := suite.Admin.CoreV1().Pods(e.ns).Delete(t.Context(), "app", *metav1.NewDeleteOptions(0)); err != nil {
		t.Fatal(err)
	}
	e2eutil.Poll(t, time.Minute, "the agent forgets the pod", func(_ context.Context) (bool, string) {
		return !desiredPod(t, a, string(pod.UID)), "still desired"
	})
}

func volumeOf(t *testing.T, p *runtimeapi.Pod, name string) runtimeapi.Volume {
	t.Helper()
	for _, v := range p.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("pod %s has no volume %s: %+v", p.Name, name, p.Volumes)
	return runtimeapi.Volume{}
}

func mountOf(t *testing.T, p *runtimeapi.Pod, container, path string) runtimeapi.Mount {
	t.Helper()
	for _, c := range p.Containers {
		for _, m := range c.Mounts {
			if c.Name == container && m.ContainerPath == path {
				return m
			}
		}
	}
	t.Fatalf("pod %s: container %s has no mount at %s", p.Name, container, path)
	return runtimeapi.Mount{}
}
