package pathcheck_test

import (
	"errors"
	"io/fs"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/internal/pathcheck"
)

// disk is a fault-injecting stand-in for a filesystem: each stat blocks
// until the test answers it.
type disk struct {
	calls   atomic.Int64
	answers chan answer
}

type answer struct {
	mode fs.FileMode
	err  error
}

func newDisk() *disk { return &disk{answers: make(chan answer)} }

func (d *disk) stat(string) (fs.FileMode, error) {
	d.calls.Add(1)
	a := <-d.answers
	return a.mode, a.err
}

// signal counts Changed calls and lets a test wait for the next one.
type signal struct{ ch chan struct{} }

func newSignal() *signal { return &signal{ch: make(chan struct{}, 16)} }

func (s *signal) changed() { s.ch <- struct{}{} }

func (s *signal) wait(t *testing.T) {
	t.Helper()
	select {
	case <-s.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("Changed was not called")
	}
}

func TestChecker(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d, sig := newDisk(), newSignal()
	c := pathcheck.New(d.stat, pathcheck.Options{Timeout: 10 * time.Second, MaxAge: time.Minute, Changed: sig.changed, Clock: clk})

	// First ask: pending, one check running however often it is asked.
	for range 3 {
		if _, err := c.Type("/disk"); !errors.Is(err, pathcheck.ErrPending) {
			t.Fatalf("Type = %v, want ErrPending", err)
		}
	}
	// The disk does not answer: once the timeout passes the caller is
	// told, and asking says so.
	clk.Step(10 * time.Second)
	sig.wait(t)
	if _, err := c.Type("/disk"); !errors.Is(err, pathcheck.ErrNoAnswer) {
		t.Fatalf("Type after the timeout = %v, want ErrNoAnswer", err)
	}
	// It answers at last.
	d.answers <- answer{mode: fs.ModeDir | 0o755}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("%d checks of one path ran, want 1", n)
	}
	sig.wait(t)
	if m, err := c.Type("/disk"); err != nil || m != fs.ModeDir {
		t.Fatalf("Type = %v, %v; want a directory", m, err)
	}
	// Past MaxAge the answer is given at once and checked again in the
	// background; a different answer tells the caller.
	clk.Step(time.Minute)
	if m, err := c.Type("/disk"); err != nil || m != fs.ModeDir {
		t.Fatalf("stale Type = %v, %v; want the last answer at once", m, err)
	}
	d.answers <- answer{mode: fs.ModeDevice}
	sig.wait(t)
	if m, err := c.Type("/disk"); err != nil || m != fs.ModeDevice {
		t.Fatalf("Type = %v, %v; want the new answer", m, err)
	}
	// The same answer again changes nothing for the caller.
	clk.Step(time.Minute)
	c.Type("/disk")
	d.answers <- answer{mode: fs.ModeDevice}
	// The next check starts once that one has finished.
	calls := d.calls.Load()
	deadline := time.Now().Add(10 * time.Second)
	for d.calls.Load() == calls {
		if time.Now().After(deadline) {
			t.Fatal("no new check")
		}
		clk.Step(time.Minute)
		c.Type("/disk")
		time.Sleep(time.Millisecond)
	}
	d.answers <- answer{err: fs.ErrNotExist}
	sig.wait(t)
	if _, err := c.Type("/disk"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Type = %v, want not found", err)
	}
	select {
	case <-sig.ch:
		t.Error("Changed was called for an answer that changed nothing")
	default:
	}
}

// A disk that answers within FirstWait answers the first ask itself: a new
// local volume needs no second round through Changed.
func TestFirstAnswerWithinFirstWait(t *testing.T) {
	stat := func(string) (fs.FileMode, error) { return fs.ModeDir, nil }
	var changes atomic.Int64
	c := pathcheck.New(stat, pathcheck.Options{FirstWait: time.Minute, Changed: func() { changes.Add(1) }})
	if m, err := c.Type("/disk"); err != nil || m != fs.ModeDir {
		t.Fatalf("first Type = %v, %v; want the directory at once", m, err)
	}
	// The asker was told the answer itself: nobody needs telling again
	// (Changed runs before the waiter is woken, so it would show here).
	if n := changes.Load(); n != 0 {
		t.Errorf("Changed called %d times for an answer the asker got", n)
	}
	// Without waiting, the first ask is told it is pending.
	c = pathcheck.New(newDisk().stat, pathcheck.Options{FirstWait: -1})
	if _, err := c.Type("/disk"); !errors.Is(err, pathcheck.ErrPending) {
		t.Fatalf("first Type without FirstWait = %v, want ErrPending", err)
	}
}
