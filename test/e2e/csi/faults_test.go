package csi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/utils/ptr"
)

// A final error (InvalidArgument) from NodePublishVolume: the volume stays
// staged but is not mounted into the pod, the agent records no mount, a
// FailedMount event names the volume and the error, and the publish is
// retried with a growing backoff. Once the driver stops failing, the
// volume is mounted.
func TestFinalPublishErrorRetriedWithBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "final-error")
	d := e.newDriver("drv", driverOptions{}, "--fault=NodePublishVolume=InvalidArgument")
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	v := e.claimPV(d, "data")
	a := e.startAgent(agentOptions{args: []string{d.flag()}})

	pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", v.claim)))
	staging, target := e.stagingPath(v), e.publishPath(pod.UID, v.pv)
	e.waitMounted(staging)
	ev := e.waitEvent("app", "FailedMount", `volume "`+v.pv+` (PVC `+e.ns+`/data)"`, "NodePublishVolume", "InvalidArgument", "injected fault")
	t.Logf("event: %s", ev.Message)
	found := false
	for _, ev := range e2eutil.Must(t, a.Events).Events {
		if ev.Object.Kind == "Pod" && ev.Object.Namespace == e.ns && ev.Object.Name == "app" && ev.Type == "Warning" &&
			ev.Reason == "FailedMount" && e2eutil.ContainsAll(ev.Message, v.pv, "NodePublishVolume", "InvalidArgument") {
			found = true
		}
	}
	if !found {
		t.Errorf("/debug/events has no FailedMount event of pod app naming %s and the error: %+v", v.pv, e2eutil.Must(t, a.Events).Events)
	}

	// Retried with a delay that grows: watch the operation's backoff.
	var delays []time.Duration
	lastSince := time.Time{}
	e2eutil.Poll(t, 60*time.Second, "three publish attempts with growing delays", func(context.Context) (bool, string) {
		op, ok := e2eutil.Must(t, a.Operations).Find(v.uniqueName(), "mount_volume")
		if ok && op.State == "backoff" && op.RetryAt != nil && !op.Since.Equal(lastSince) {
			if !e2eutil.ContainsAll(op.LastError, "NodePublishVolume", "InvalidArgument") {
				t.Fatalf("mount_volume failed with %q", op.LastError)
			}
			lastSince = op.Since
			delays = append(delays, op.RetryAt.Sub(op.Since))
		}
		return len(delays) >= 3, fmt.Sprintf("delays so far %v (%+v)", delays, op)
	})
	t.Logf("publish retried after %v", delays)
	for i := 1; i < len(delays); i++ {
		if delays[i] < delays[i-1] {
			t.Errorf("backoff delays %v do not grow", delays)
		}
	}
	if delays[len(delays)-1] < 2*delays[0] {
		t.Errorf("backoff delays %v never doubled", delays)
	}
	if _, ok := mountAt(t, target); ok || mounttest.Exists(t, target) {
		t.Errorf("%s exists or is mounted after a final publish error", target)
	}
	for _, vol := range e2eutil.Must(t, a.ASW).Volumes {
		for _, p := range vol.Pods {
			if p.UID == string(pod.UID) {
				t.Errorf("/debug/asw records a mount for the pod after a final error: %+v", p)
			}
		}
	}
	if n := d.CallCounts(t)["NodePublishVolume"]; n < 3 {
		t.Errorf("%d NodePublishVolume calls, want 3 or more", n)
	}

	if err := d.Control.ClearFault("NodePublishVolume"); err != nil {
		t.Fatal(err)
	}
	e.waitMounted(target)
	checkExt4FromLoop(t, target)

	e.deletePod("app")
	e.waitGone(target, e.podDir(pod.UID), staging)
	d.waitCalls("NodeUnstageVolume", 1)
	d.checkCalls(t, map[string]int{"NodeStageVolume": 1, "NodeUnpublishVolume": 1, "NodeUnstageVolume": 1})
	d.waitNoLoopDevices()
}

// NodePublishVolume hangs until the agent's --operation-timeout cancels it
// (DeadlineExceeded): the outcome is unknown, so /debug/asw shows the
// pod's mount Uncertain, and when the pod is deleted the agent still calls
// NodeUnpublishVolume before unstaging.
func TestUncertainPublishIsUnpublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "uncertain")
	d := e.newDriver("drv", driverOptions{}, "--hang=NodePublishVolume")
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	v := e.claimPV(d, "data")
	a := e.startAgent(agentOptions{args: []string{d.flag(), "--operation-timeout=2s"}})

	pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", v.claim)))
	staging, target := e.stagingPath(v), e.publishPath(pod.UID, v.pv)
	e.waitMounted(staging)
	waitPodMountState(t, a, v.uniqueName(), string(pod.UID), "Uncertain")
	e.waitEvent("app", "FailedMount", "NodePublishVolume", "DeadlineExceeded")
	if _, ok := mountAt(t, target); ok {
		t.Errorf("%s is mounted although NodePublishVolume never returned", target)
	}
	d.checkCalls(t, map[string]int{"NodeUnpublishVolume": 0})

	e.deletePod("app")
	d.waitCalls("NodeUnpublishVolume", 1)
	e.waitGone(target, e.podDir(pod.UID), staging)
	d.waitCalls("NodeUnstageVolume", 1)
	d.waitNoLoopDevices()
}

// NodeStageVolume of one volume hangs (held by a proxy in front of the
// driver): another volume of the same driver and a volume of a second
// driver are staged and published meanwhile; the first completes once its
// call returns.
func TestHungStageDoesNotBlockOtherVolumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "hung-stage")
	d1 := e.newDriver("one", driverOptions{proxy: true})
	d2 := e.newDriver("two", driverOptions{})
	for _, d := range []*csiDriver{d1, d2} {
		suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	}
	hung, sameDriver, otherDriver := e.claimPV(d1, "hung"), e.claimPV(d1, "same"), e.claimPV(d2, "other")
	a := e.startAgent(agentOptions{args: []string{d1.flag(), d2.flag()}})

	d1.proxy.hold(hung.handle)
	podHung := e.createPod(e.pod("hung", e2eutil.ClaimVolume("data", hung.claim)))
	e2eutil.Poll(t, 60*time.Second, "NodeStageVolume of "+hung.handle+" in progress", func(context.Context) (bool, string) {
		return d1.proxy.holding(hung.handle) == 1, fmt.Sprintf("%d calls held", d1.proxy.holding(hung.handle))
	})

	podSame := e.createPod(e.pod("same", e2eutil.ClaimVolume("data", sameDriver.claim)))
	podOther := e.createPod(e.pod("other", e2eutil.ClaimVolume("data", otherDriver.claim)))
	e.waitMounted(e.stagingPath(sameDriver), e.publishPath(podSame.UID, sameDriver.pv),
		e.stagingPath(otherDriver), e.publishPath(podOther.UID, otherDriver.pv))

	if n := d1.proxy.holding(hung.handle); n != 1 {
		t.Fatalf("%d NodeStageVolume calls of %s held, want 1: the test did not hang what it meant to", n, hung.handle)
	}
	if _, ok := mountAt(t, e.stagingPath(hung)); ok {
		t.Fatalf("%s is staged although its NodeStageVolume has not returned", hung.handle)
	}
	if op, ok := e2eutil.Must(t, a.Operations).Find(hung.uniqueName(), "mount_device"); !ok || op.State != "running" {
		t.Errorf("/debug/operations: mount_device of the hung volume %+v (found %v), want running", op, ok)
	}

	d1.proxy.release(hung.handle)
	e.waitMounted(e.stagingPath(hung), e.publishPath(podHung.UID, hung.pv))
	if n := len(d1.proxy.stageRequests(hung.handle)); n != 1 {
		t.Errorf("%d NodeStageVolume calls for %s, want 1 (the one that hung)", n, hung.handle)
	}

	for _, p := range []string{"hung", "same", "other"} {
		e.deletePod(p)
	}
	e.waitGone(e.podDir(podHung.UID), e.podDir(podSame.UID), e.podDir(podOther.UID),
		e.stagingPath(hung), e.stagingPath(sameDriver), e.stagingPath(otherDriver))
	d1.waitCalls("NodeUnstageVolume", 2)
	d2.waitCalls("NodeUnstageVolume", 1)
	d1.waitNoLoopDevices()
	d2.waitNoLoopDevices()
}
