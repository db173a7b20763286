package csi_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// A PV with spec.csi of a staging driver (attachRequired false), created
// through the driver's CreateVolume and bound statically: the agent stages
// it (ext4 on a loop device at the global mount) and publishes it into the
// pod (a bind mount of the staged filesystem); when the pod is deleted it
// unpublishes and unstages, exactly once each, and the driver detaches the
// loop device.
func TestStagePublishUnpublishUnstage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "lifecycle")
	d := e.newDriver("drv", driverOptions{})
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	v := e.claimPV(d, "data")
	a := e.startAgent(agentOptions{args: []string{d.flag()}})

	e2eutil.Poll(t, 30*time.Second, "the driver on /debug/drivers", func(context.Context) (bool, string) {
		drivers := e2eutil.Must(t, a.Drivers).Drivers
		return len(drivers) == 1 && drivers[0].Name == d.name && drivers[0].Source == "static" && drivers[0].StageUnstage &&
			drivers[0].NodeID == e.node && drivers[0].Endpoint == d.endpoint(), fmt.Sprintf("%+v", drivers)
	})

	pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", v.claim)))
	staging, target := e.stagingPath(v), e.publishPath(pod.UID, v.pv)
	e.waitMounted(staging, target)
	sm, tm := checkExt4FromLoop(t, staging), checkExt4FromLoop(t, target)
	if sm.Major != tm.Major || sm.Minor != tm.Minor || sm.Source != tm.Source {
		t.Errorf("the pod's mount (%s %d:%d) is not the staged filesystem (%s %d:%d)", tm.Source, tm.Major, tm.Minor, sm.Source, sm.Major, sm.Minor)
	}
	// The same filesystem: written in the pod's view, read at the stage.
	mounttest.WriteFile(t, filepath.Join(target, "hello"), "from the pod")
	if got := mounttest.ReadFile(t, filepath.Join(staging, "hello")); got != "from the pod" {
		t.Errorf("read %q through the staging mount", got)
	}
	info, ok := d.Volume(t, v.handle)
	if !ok || info.LoopDevice != sm.Source || info.StagingPath != staging || !slices.Equal(info.TargetPaths, []string{target}) {
		t.Errorf("driver's view of the volume: %+v; want staged at %s and published at %s from %s", info, staging, target, sm.Source)
	}
	d.checkCalls(t, map[string]int{"NodeStageVolume": 1, "NodePublishVolume": 1, "NodeUnpublishVolume": 0, "NodeUnstageVolume": 0})

	e.deletePod("app")
	e.waitGone(target, e.podDir(pod.UID), filepath.Dir(staging))
	d.waitCalls("NodeUnstageVolume", 1)
	d.checkCalls(t, map[string]int{"NodeStageVolume": 1, "NodePublishVolume": 1, "NodeUnpublishVolume": 1, "NodeUnstageVolume": 1})
	info, _ = d.Volume(t, v.handle)
	if info.LoopDevice != "" || info.StagingPath != "" || len(info.TargetPaths) != 0 {
		t.Errorf("driver's view after the pod was deleted: %+v", info)
	}
	d.waitNoLoopDevices()
	if _, err := os.Stat(info.BackingFile); err != nil {
		t.Errorf("the volume's data is gone: %v", err)
	}
}

// An inline ephemeral CSI volume (CSIDriver with the Ephemeral lifecycle
// mode): published straight into the pod with the ephemeral flag (the
// driver creates, formats and mounts a volume for it), never staged, and
// unpublished — which deletes it — with the pod.
func TestInlineEphemeralVolume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inline")
	d := e.newDriver("drv", driverOptions{})
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{
		AttachRequired:       ptr.To(false),
		PodInfoOnMount:       ptr.To(true),
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral},
	})
	e.startAgent(agentOptions{args: []string{d.flag()}})

	pod := e.createPod(e.pod("app", corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
		Driver: d.name, VolumeAttributes: map[string]string{"size": "8Mi"},
	}}}))
	target := e.publishPath(pod.UID, "scratch")
	e.waitMounted(target)
	m := checkExt4FromLoop(t, target)
	mounttest.WriteFile(t, filepath.Join(target, "hello"), "ephemeral")

	id := inlineHandle(pod.UID, "scratch")
	info, ok := d.Volume(t, id)
	if !ok || !info.Ephemeral || info.LoopDevice != m.Source || !slices.Equal(info.TargetPaths, []string{target}) || info.CapacityBytes != 8<<20 {
		t.Errorf("driver's view of the inline volume %s: %+v (found %v)", id, info, ok)
	}
	d.checkCalls(t, map[string]int{"NodeStageVolume": 0, "NodePublishVolume": 1})

	e.deletePod("app")
	e.waitGone(target, e.podDir(pod.UID))
	d.waitCalls("NodeUnpublishVolume", 1)
	d.checkCalls(t, map[string]int{"NodeStageVolume": 0, "NodePublishVolume": 1, "NodeUnpublishVolume": 1, "NodeUnstageVolume": 0})
	if _, ok := d.Volume(t, id); ok {
		t.Errorf("the driver still has the inline volume %s after the pod was deleted", id)
	}
	d.waitNoLoopDevices()
}

// waitPodMountState waits until /debug/asw shows the pod's mount of the
// volume in the state.
func waitPodMountState(t *testing.T, a *e2eutil.Agent, volume, podUID, state string) {
	t.Helper()
	e2eutil.Poll(t, 60*time.Second, fmt.Sprintf("mount of %s for pod %s %s on /debug/asw", volume, podUID, state), func(context.Context) (bool, string) {
		for _, v := range e2eutil.Must(t, a.ASW).Volumes {
			if v.Name != volume {
				continue
			}
			for _, p := range v.Pods {
				if p.UID == podUID {
					return p.MountState == state, fmt.Sprintf("%+v", v)
				}
			}
			return false, fmt.Sprintf("no mount for the pod: %+v", v)
		}
		return false, "volume not in the ASW"
	})
}
