package localpv

import (
	"errors"
	"testing"
	"time"
)

func TestTrackerStateMachine(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := newTracker(time.Second, 4*time.Second)
	a := target{PV: "a", UID: "uid-a", ClaimUID: "claim-1", Class: "c", Path: "/d/a"}
	fail := errors.New("boom")

	type step struct {
		name   string
		do     func() bool // returns what start returned, or true
		want   bool
		state  CleanupState
		tries  int
		nextIn time.Duration // NextRetry - t0, checked when non-zero
	}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	steps := []step{
		{name: "first start", do: func() bool { return tr.start(a, "wipefs", at(0)) }, want: true, state: CleanupRunning, tries: 1},
		{name: "never twice at once", do: func() bool { return tr.start(a, "wipefs", at(0)) }, want: false, state: CleanupRunning, tries: 1},
		{name: "fails", do: func() bool { tr.finish(a.UID, fail, at(time.Second)); return true }, want: true, state: CleanupFailed, tries: 1, nextIn: 2 * time.Second},
		{name: "not before the retry time", do: func() bool { return tr.start(a, "wipefs", at(1500*time.Millisecond)) }, want: false, state: CleanupFailed, tries: 1},
		{name: "retry", do: func() bool { return tr.start(a, "wipefs", at(2*time.Second)) }, want: true, state: CleanupRunning, tries: 2},
		{name: "fails again: backoff doubles", do: func() bool { tr.finish(a.UID, fail, at(2*time.Second)); return true }, want: true, state: CleanupFailed, tries: 2, nextIn: 4 * time.Second},
		{name: "retry 3", do: func() bool { return tr.start(a, "wipefs", at(4*time.Second)) }, want: true, state: CleanupRunning, tries: 3},
		{name: "fails: capped", do: func() bool { tr.finish(a.UID, fail, at(4*time.Second)); return true }, want: true, state: CleanupFailed, tries: 3, nextIn: 8 * time.Second},
		{name: "retry 4", do: func() bool { return tr.start(a, "wipefs", at(8*time.Second)) }, want: true, state: CleanupRunning, tries: 4},
		{name: "succeeds", do: func() bool { tr.finish(a.UID, nil, at(9*time.Second)); return true }, want: true, state: CleanupSucceeded, tries: 4},
		{name: "a success is not cleaned again for the same release", do: func() bool { return tr.start(a, "wipefs", at(10*time.Second)) }, want: false, state: CleanupSucceeded, tries: 4},
	}
	for _, s := range steps {
		if got := s.do(); got != s.want {
			t.Fatalf("%s: got %v, want %v", s.name, got, s.want)
		}
		c, ok := tr.get(a.UID)
		if !ok || c.State != s.state || c.Attempts != s.tries {
			t.Fatalf("%s: %+v, want state %s after %d attempts", s.name, c, s.state, s.tries)
		}
		if s.nextIn != 0 && !c.NextRetry.Equal(at(s.nextIn)) {
			t.Fatalf("%s: next retry %v, want %v", s.name, c.NextRetry.Sub(t0), s.nextIn)
		}
		if s.state == CleanupFailed && c.LastError != "boom" {
			t.Fatalf("%s: last error %q", s.name, c.LastError)
		}
		if s.state == CleanupSucceeded && c.LastError != "" {
			t.Fatalf("%s: last error %q kept after success", s.name, c.LastError)
		}
	}

	// A later release of the same PV (another claim) is a new cleanup: the
	// stale success is not reused.
	a2 := a
	a2.ClaimUID = "claim-2"
	if !tr.start(a2, "wipefs", at(20*time.Second)) {
		t.Fatal("a new release must be cleaned again")
	}
	if c, _ := tr.get(a.UID); c.Attempts != 1 || c.ClaimUID != "claim-2" {
		t.Fatalf("new release: %+v", c)
	}

	// A recreated PV has another UID: nothing is inherited.
	b := a
	b.UID = "uid-b"
	if _, ok := tr.get(b.UID); ok {
		t.Fatal("the recreated PV inherits a cleanup")
	}
	// ...and while the old one still runs on that path, it waits.
	if tr.start(b, "wipefs", at(21*time.Second)) {
		t.Fatal("two cleanups of one path at once")
	}
	tr.finish(a.UID, nil, at(22*time.Second))
	if !tr.start(b, "wipefs", at(22*time.Second)) {
		t.Fatal("the path is free again")
	}

	tr.forget(a.UID)
	if _, ok := tr.get(a.UID); ok {
		t.Fatal("forget")
	}
	if n := len(tr.snapshot()); n != 1 {
		t.Fatalf("snapshot has %d cleanups", n)
	}
}

func TestTrackerPVDeletedUncleaned(t *testing.T) {
	t0 := time.Now()
	tr := newTracker(time.Second, time.Minute)
	a := target{PV: "a", UID: "uid-a", ClaimUID: "claim-1", Path: "/d/a"}

	// Deleted before any cleanup: queued, and it owes the path.
	tr.pvDeleted(a, t0)
	c, ok := tr.get(a.UID)
	if !ok || c.State != CleanupPending || !c.PVGone || !c.blocksPath() {
		t.Fatalf("%+v", c)
	}
	if !tr.start(a, "wipefs", t0) {
		t.Fatal("a pending cleanup starts")
	}
	tr.finish(a.UID, nil, t0)
	if c, _ := tr.get(a.UID); c.blocksPath() || !c.PVGone {
		t.Fatalf("cleaned: %+v", c)
	}

	// Deleted after its cleanup succeeded (the provisioner's own delete):
	// nothing more to do.
	b := target{PV: "b", UID: "uid-b", ClaimUID: "claim-1", Path: "/d/b"}
	tr.start(b, "wipefs", t0)
	tr.finish(b.UID, nil, t0)
	tr.pvDeleted(b, t0)
	if c, _ := tr.get(b.UID); c.State != CleanupSucceeded || c.blocksPath() {
		t.Fatalf("%+v", c)
	}

	// Deleted while its cleanup runs or has failed: it keeps going.
	d := target{PV: "d", UID: "uid-d", ClaimUID: "claim-1", Path: "/d/d"}
	tr.start(d, "wipefs", t0)
	tr.pvDeleted(d, t0)
	if c, _ := tr.get(d.UID); c.State != CleanupRunning || !c.blocksPath() {
		t.Fatalf("%+v", c)
	}
	tr.finish(d.UID, errors.New("x"), t0)
	if c, _ := tr.get(d.UID); c.State != CleanupFailed || !c.blocksPath() {
		t.Fatalf("%+v", c)
	}

	// Deleted after an older release's success: this release is owed.
	e := target{PV: "e", UID: "uid-e", ClaimUID: "claim-1", Path: "/d/e"}
	tr.start(e, "wipefs", t0)
	tr.finish(e.UID, nil, t0)
	e.ClaimUID = "claim-2"
	tr.pvDeleted(e, t0)
	if c, _ := tr.get(e.UID); c.State != CleanupPending || !c.blocksPath() {
		t.Fatalf("%+v", c)
	}
}
