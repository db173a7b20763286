package localpv

import (
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/status/events"
)

type recorded struct {
	obj                     events.Object
	eventType, reason, text string
}

type fakeRecorder struct {
	mu  sync.Mutex
	evs []recorded
}

func (r *fakeRecorder) Event(obj events.Object, eventType, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, recorded{obj, eventType, reason, message})
}

func (r *fakeRecorder) take() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.evs
	r.evs = nil
	return out
}

// Events go out on transitions only: a missing disk is reported once (and
// once again when it is back), an unsupported policy once per PV.
func TestReportEvents(t *testing.T) {
	p := testProvisioner(t, "/nonexistent")
	rec := &fakeRecorder{}
	p.opts.Recorder = rec
	cfg := &Config{Classes: map[string]*Class{}}
	in := &planInput{ClassErr: map[string]string{}}
	pass := func(vols ...Volume) []recorded {
		p.report(cfg, in, &planOutput{Volumes: vols}, true, "", time.Now())
		return rec.take()
	}
	missing := Volume{Class: "c", Path: "/d/a", PV: "a", UID: "ua", State: StateMissing, Reason: "/d/a no longer exists"}
	bound := missing
	bound.State, bound.Reason = StateBound, ""
	recycle := Volume{Class: "c", Path: "/d/b", PV: "b", UID: "ub", State: StateReleased, ReclaimPolicy: v1.PersistentVolumeReclaimRecycle, Reason: "Recycle is not supported"}
	odd := Volume{Class: "c", Path: "/d/c", PV: "c", UID: "uc", State: StateReleased, ReclaimPolicy: "Shred", Reason: "unknown"}
	retain := Volume{Class: "c", Path: "/d/d", PV: "d", UID: "ud", State: StateReleased, ReclaimPolicy: v1.PersistentVolumeReclaimRetain}

	evs := pass(missing, recycle, odd, retain)
	reasons := map[string]recorded{}
	for _, e := range evs {
		reasons[e.reason] = e
	}
	if len(evs) != 3 || reasons[ReasonMissing].obj.Name != "a" || reasons[ReasonMissing].obj.Kind != "PersistentVolume" ||
		reasons[ReasonMissing].obj.UID != "ua" || reasons[ReasonMissing].eventType != events.Warning ||
		reasons[ReasonUnsupportedPolicy].obj.Name != "b" || reasons[ReasonUnknownPolicy].obj.Name != "c" {
		t.Fatalf("first pass: %+v", evs)
	}
	if evs := pass(missing, recycle, odd, retain); len(evs) != 0 {
		t.Fatalf("repeated: %+v", evs)
	}
	first := p.Status().Volumes[0].Since
	if evs := pass(bound); len(evs) != 1 || evs[0].reason != ReasonBack || evs[0].eventType != events.Normal {
		t.Fatalf("back: %+v", evs)
	}
	if v := p.Status().Volumes[0]; !v.Since.After(first) {
		t.Errorf("since not updated: %v", v.Since)
	}
	// Missing again after a restart-like gap: reported again.
	if evs := pass(missing); len(evs) != 1 || evs[0].reason != ReasonMissing || !strings.Contains(evs[0].text, "no longer exists") {
		t.Fatalf("missing again: %+v", evs)
	}
}
