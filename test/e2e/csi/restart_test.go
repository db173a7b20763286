package csi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// The driver dies twice: killed with SIGKILL while NodeStageVolume hangs in
// it, and exiting on its own (crash-after) right after answering
// NodeUnpublishVolume. Each time the agent's operation fails (uncertain:
// the driver went away mid-call), is retried, and completes once the driver
// is started again on the same state; nothing is mounted twice and nothing
// is left behind.
func TestDriverKilledAndRestarted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "restart")
	d := e.newDriver("drv", driverOptions{}, "--hang=NodeStageVolume")
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	v := e.claimPV(d, "data")
	a := e.startAgent(agentOptions{args: []string{d.flag()}})

	pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", v.claim)))
	d.waitCalls("NodeStageVolume", 1)
	if op, ok := e2eutil.Must(t, a.Operations).Find(v.uniqueName(), "mount_device"); !ok || op.State != "running" {
		t.Errorf("/debug/operations while NodeStageVolume hangs: %+v (found %v), want mount_device running", op, ok)
	}
	d.Kill()
	// The agent sees the call fail; the volume is uncertain, not mounted.
	e2eutil.Poll(t, 30*time.Second, "mount_device failed after the driver died", func(context.Context) (bool, string) {
		op, ok := e2eutil.Must(t, a.Operations).Find(v.uniqueName(), "mount_device")
		return ok && op.State == "backoff", fmt.Sprintf("%+v", op)
	})
	staging, target := e.stagingPath(v), e.publishPath(pod.UID, v.pv)
	if _, ok := mountAt(t, staging); ok {
		t.Fatalf("%s is mounted although the driver died before staging", staging)
	}

	d.start() // no hang this time
	e.waitMounted(staging, target)
	checkExt4FromLoop(t, staging)
	if n := len(mounttest.MountsAt(t, staging)); n != 1 {
		t.Errorf("%d mounts at %s, want 1", n, staging)
	}
	if n := len(mounttest.MountsAt(t, target)); n != 1 {
		t.Errorf("%d mounts at %s, want 1", n, target)
	}

	// Second death: the driver exits right after answering the next call
	// (NodeUnpublishVolume), so NodeUnstageVolume finds it gone.
	if err := d.Control.SetCrashAfter(1); err != nil {
		t.Fatal(err)
	}
	e.deletePod("app")
	select {
	case <-d.Process().Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("the driver did not crash after its next call")
	}
	if code := d.Process().ExitCode(); code != 2 {
		t.Errorf("driver exit code %d, want 2 (crash-after)", code)
	}
	// Wait until the agent has tried (and failed) to tear down without it:
	// normally NodeUnstageVolume; NodeUnpublishVolume if another call (a
	// probe) happened to be the driver's last.
	e2eutil.Poll(t, 30*time.Second, "teardown failing while the driver is down", func(context.Context) (bool, string) {
		var ops []e2eutil.Operation
		for _, name := range []string{"unmount_device", "unmount_volume"} {
			if op, ok := e2eutil.Must(t, a.Operations).Find(v.uniqueName(), name); ok {
				if op.State == "backoff" {
					return true, ""
				}
				ops = append(ops, op)
			}
		}
		return false, fmt.Sprintf("%+v", ops)
	})
	if _, ok := mountAt(t, staging); !ok {
		t.Errorf("%s was unmounted without the driver", staging)
	}
	d.start()
	e.waitGone(target, e.podDir(pod.UID), staging)
	d.waitCalls("NodeUnstageVolume", 1)
	d.waitNoLoopDevices()
	info, _ := d.Volume(t, v.handle)
	if info.StagingPath != "" || len(info.TargetPaths) != 0 {
		t.Errorf("driver's view after the pod was deleted: %+v", info)
	}
}
