package localpv

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/status/events"
)

// Events go out on transitions only: a missing disk is reported once (and
// once again when it is back), an unsupported policy once per PV.
func TestReportEvents(t *testing.T) {
	p := testProvisioner(t, "/nonexistent")
	rec := &events.Memory{}
	p.opts.Recorder = rec
	cfg := &Config{Classes: map[string]*Class{}}
	in := &planInput{ClassErr: map[string]string{}}
	pass := func(vols ...Volume) []events.Event {
		p.report(cfg, in, &planOutput{Volumes: vols}, true, "", time.Now())
		return rec.Take()
	}
	missing := Volume{Class: "c", Path: "/d/a", PV: "a", UID: "ua", State: StateMissing, Reason: "/d/a no longer exists"}
	bound := missing
	bound.State, bound.Reason = StateBound, ""
	recycle := Volume{Class: "c", Path: "/d/b", PV: "b", UID: "ub", State: StateReleased, ReclaimPolicy: v1.PersistentVolumeReclaimRecycle, Reason: "Recycle is not supported"}
	odd := Volume{Class: "c", Path: "/d/c", PV: "c", UID: "uc", State: StateReleased, ReclaimPolicy: "Shred", Reason: "unknown"}
	retain := Volume{Class: "c", Path: "/d/d", PV: "d", UID: "ud", State: StateReleased, ReclaimPolicy: v1.PersistentVolumeReclaimRetain}

	evs := pass(missing, recycle, odd, retain)
	reasons := map[string]events.Event{}
	for _, e := range evs {
		reasons[e.Reason] = e
	}
	if len(evs) != 3 || reasons[ReasonMissing].Object.Name != "a" || reasons[ReasonMissing].Object.Kind != "PersistentVolume" ||
		reasons[ReasonMissing].Object.UID != "ua" || reasons[ReasonMissing].Type != events.Warning ||
		reasons[ReasonUnsupportedPolicy].Object.Name != "b" || reasons[ReasonUnknownPolicy].Object.Name != "c" {
		t.Fatalf("first pass: %+v", evs)
	}
	if evs := pass(missing, recycle, odd, retain); len(evs) != 0 {
		t.Fatalf("repeated: %+v", evs)
	}
	first := p.Status().Volumes[0].Since
	if evs := pass(bound); len(evs) != 1 || evs[0].Reason != ReasonBack || evs[0].Type != events.Normal {
		t.Fatalf("back: %+v", evs)
	}
	if v := p.Status().Volumes[0]; !v.Since.After(first) {
		t.Errorf("since not updated: %v", v.Since)
	}
	// Missing again after a restart-like gap: reported again.
	if evs := pass(missing); len(evs) != 1 || evs[0].Reason != ReasonMissing || !strings.Contains(evs[0].Message, "no longer exists") {
		t.Fatalf("missing again: %+v", evs)
	}
}
