package csi_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// The runtime API in cluster mode with CSI volumes (a staged PV and an
// inline ephemeral volume) and a sub-path inside the CSI filesystem: the
// wait answers with the published paths, which are mounted, and the
// VolumesReady condition the agent publishes on the pod agrees.
func TestRuntimeAPIWithCSIVolumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "runtimeapi")
	d := e.newDriver("drv", driverOptions{})
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{
		AttachRequired:       ptr.To(false),
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral},
	})
	v := e.claimPV(d, "data")
	a := e.startAgent(agentOptions{args: []string{d.flag()}})

	pod := e.pod("app", e2eutil.ClaimVolume("data", v.claim), corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
		Driver: d.name, VolumeAttributes: map[string]string{"size": "8Mi"},
	}}})
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
		corev1.VolumeMount{Name: "data", MountPath: "/logs", SubPath: "logs/app"})
	pod = e.createPod(pod)

	p, err := a.RuntimeClient().Wait(t.Context(), string(pod.UID), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := e2eutil.CheckReadyPaths(p); err != nil {
		t.Error(err)
	}
	data, scratch := e.publishPath(pod.UID, v.pv), e.publishPath(pod.UID, "scratch")
	for name, want := range map[string]string{"data": data, "scratch": scratch} {
		var got runtimeapi.Volume
		for _, vol := range p.Volumes {
			if vol.Name == name {
				got = vol
			}
		}
		if got.HostPath != want || got.Plugin != e2eutil.CSIPlugin || !got.SELinuxRelabel {
			t.Errorf("volume %s: %+v, want the CSI publish path %s", name, got, want)
		}
	}
	target := e2eutil.SubPathTarget(e.root, string(pod.UID), e2eutil.CSIPlugin, v.pv, "main", 2)
	if m := p.Containers[0].Mounts[2]; m.HostPath != target || m.SubPath != "logs/app" {
		t.Errorf("sub-path mount %+v, want %s", m, target)
	}
	mounttest.WriteFile(t, filepath.Join(target, "app.log"), "line")
	if got := mounttest.ReadFile(t, filepath.Join(data, "logs", "app", "app.log")); got != "line" {
		t.Errorf("through the sub-path the CSI volume got %q", got)
	}

	// The condition the agent publishes says the same.
	e2eutil.Poll(t, time.Minute, "VolumesReady True", func(ctx context.Context) (bool, string) {
		got, err := suite.Admin.CoreV1().Pods(e.ns).Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range got.Status.Conditions {
			if c.Type == "volume-agent.io/VolumesReady" {
				return c.Status == corev1.ConditionTrue, fmt.Sprintf("%+v", c)
			}
		}
		return false, "no condition"
	})

	e.deletePod("app")
	e.waitGone(target, data, scratch, e.podDir(pod.UID))
	d.waitCalls("NodeUnstageVolume", 1)
}
