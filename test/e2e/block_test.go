package e2e

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// Raw block local PersistentVolumes (volumeMode Block, used in
// volumeDevices) on real loop devices: each pod gets an access point under
// <root>/pods/<uid>/volumeDevices/kubernetes.io~local-volume/<pv> that is
// the device (bind-mounted) and pinned by a read-only loop device; data
// written through one pod's access point is read through another's and
// from the device; one pod listing the volume in two containers gets one
// access point; a PV whose path is not a block device fails that pod alone
// with FailedMapVolume; deleting the pods removes access points and pins
// and leaves the device's data as it was: nothing is formatted or mounted.
func TestLocalBlockVolumes(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	host := mounttest.TempDir(t)
	loop := mounttest.LoopDevice(t, 32<<20)
	head := e2eutil.RandomHead(t, loop, 1<<20)
	a := newAgent(t)

	notADevice := filepath.Join(host, "file.img")
	mounttest.WriteFile(t, notADevice, "a regular file")
	pv := e2eutil.LocalPV("blk", loop, "claim-blk", "kubernetes.io/hostname", nodeName)
	pvc := e2eutil.PVC("claim-blk", "blk")
	badPV := e2eutil.LocalPV("not-blk", notADevice, "claim-bad", "kubernetes.io/hostname", nodeName)
	badPVC := e2eutil.PVC("claim-bad", "not-blk")
	e2eutil.AsBlock(pv, pvc, badPV, badPVC)
	a.Write("storage.yaml", pv, pvc, badPV, badPVC)
	a.Write("writer.yaml", e2eutil.DevicePod("default", "", "writer", claim("disk", "claim-blk", false)))
	reader := e2eutil.DevicePod("default", "", "reader", claim("disk", "claim-blk", true))
	// A second container of the same pod lists the same volume: still one
	// access point.
	second := reader.Spec.Containers[0].DeepCopy()
	second.Name = "sidecar"
	reader.Spec.Containers = append(reader.Spec.Containers, *second)
	a.Write("reader.yaml", reader)
	a.Write("bad.yaml", e2eutil.DevicePod("default", "", "bad", claim("disk", "claim-bad", false)))
	a.Start()
	uids := a.waitReady("writer", "reader")

	want, err := e2eutil.Rdev(loop)
	if err != nil {
		t.Fatal(err)
	}
	aps := map[string]string{}
	for name, uid := range uids {
		ap := e2eutil.DevicePath(a.Root(), uid, e2eutil.LocalPlugin, "blk")
		aps[name] = ap
		if got, err := e2eutil.Rdev(ap); err != nil || got != want {
			t.Errorf("%s: access point %s is %d (%v), want %s's %d", name, ap, got, err, loop, want)
		}
		if n := len(mounttest.MountsAt(t, ap)); n != 1 {
			t.Errorf("%s: %d mounts at %s, want 1", name, n, ap)
		}
	}
	if m, err := mountAt(t, aps["reader"]); err != nil || !m.HasOption("ro") {
		t.Errorf("reader's access point %+v (%v), want read-only", m, err)
	}
	pins := e2eutil.Pins(t, a.Root())
	if len(pins) != 2 || pins[aps["writer"]] == "" || pins[aps["reader"]] == "" {
		t.Errorf("pins %v, want one per access point", pins)
	}

	data := []byte("written through the writer's access point")
	if err := e2eutil.WriteAt(aps["writer"], 8<<20, data); err != nil {
		t.Fatal(err)
	}
	for _, from := range []string{aps["reader"], loop} {
		if got, err := e2eutil.ReadAt(from, 8<<20, len(data)); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s reads %q (%v)", from, got, err)
		}
	}

	asw, err := a.ASW()
	if err != nil {
		t.Fatal(err)
	}
	v := asw.Volume(e2eutil.LocalPlugin + "/blk")
	if v == nil || v.Mode != "Block" || v.DeviceMountState != "NotMounted" || len(v.Pods) != 2 {
		t.Fatalf("asw of the block volume: %+v", v)
	}
	for _, p := range v.Pods {
		if p.MountState != "Mounted" || p.MountPath != aps[p.Name] {
			t.Errorf("asw pod %+v, want Mounted at its access point", p)
		}
	}

	// The bad pod: an event and an error naming the pod, the volume and
	// the reason; nothing mounted for it.
	badUID := a.podUID("bad")
	e2eutil.PollErr(t, settleTimeout, "a FailedMapVolume event for pod bad", func() error {
		ev, err := a.Events()
		if err != nil {
			return err
		}
		for _, e := range ev.Events {
			if e.Object.Name == "bad" && e.Reason == "FailedMapVolume" && e2eutil.ContainsAll(e.Message, "not-blk", "not a block device") {
				return nil
			}
		}
		return fmt.Errorf("events: %+v", ev.Events)
	})
	if ms := mounttest.MountsUnder(t, e2eutil.PodDir(a.Root(), badUID)); len(ms) != 0 {
		t.Errorf("bad pod has mounts: %v", mounttest.MountPoints(ms))
	}
	if got, err := a.Metric(`volume_agent_operation_duration_seconds_count{operation="map_volume",plugin="kubernetes.io/local-volume",result="success"}`); err != nil || got < 2 {
		t.Errorf("map_volume successes metric = %v (%v), want at least 2", got, err)
	}

	for _, name := range []string{"writer", "reader", "bad"} {
		a.Remove(name + ".yaml")
	}
	e2eutil.PollErr(t, settleTimeout, "access points, pins and pod directories gone", func() error {
		if err := noMountsUnder(t, a.Root()); err != nil {
			return err
		}
		if pins := e2eutil.Pins(t, a.Root()); len(pins) > 0 {
			return fmt.Errorf("pins left: %v", pins)
		}
		if dirs, err := a.podDirs(); err != nil || len(dirs) > 0 {
			return fmt.Errorf("pod directories left: %v (%v)", dirs, err)
		}
		return nil
	})
	if same, err := e2eutil.SameHead(loop, head); err != nil || !same {
		t.Errorf("the device's first MiB changed (%v): a Block volume must never be formatted", err)
	}
	if fs := mounttest.DiskFormat(t, loop); fs != "" {
		t.Errorf("the device holds a %s filesystem", fs)
	}
	if got, err := e2eutil.ReadAt(loop, 8<<20, len(data)); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the pods' data is gone from the device: %q (%v)", got, err)
	}
}
