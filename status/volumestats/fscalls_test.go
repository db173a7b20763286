package volumestats

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/plugins/local"
)

// fsCalls with calls that block until told (fault injection): one call per
// path, none started while maxHung hang, and the count goes down as hung
// calls return.
func TestFSCallsBound(t *testing.T) {
	g := newFSCalls(2)
	ctx := context.Background()
	const timeout = 20 * time.Millisecond
	release := map[string]chan struct{}{}
	var mu sync.Mutex
	calls := map[string]int{}
	blocking := func(path string) func() (Usage, error) {
		ch := make(chan struct{})
		release[path] = ch
		return func() (Usage, error) {
			mu.Lock()
			calls[path]++
			mu.Unlock()
			<-ch
			return Usage{CapacityBytes: 1}, nil
		}
	}
	quick := func() (Usage, error) { return Usage{CapacityBytes: 42}, nil }
	callCount := func(path string) int {
		mu.Lock()
		defer mu.Unlock()
		return calls[path]
	}

	steps := []struct {
		name     string
		path     string
		fn       func() (Usage, error)
		err      error
		hung     int
		outstand int
	}{
		{name: "a quick call", path: "/ok", fn: quick, hung: 0, outstand: 0},
		{name: "a hung call times out", path: "/a", fn: blocking("/a"), err: errFSTimeout, hung: 1, outstand: 1},
		{name: "the same path again: refused, nothing started", path: "/a", fn: quick, err: errFSBusy, hung: 1, outstand: 1},
		{name: "another path hangs", path: "/b", fn: blocking("/b"), err: errFSTimeout, hung: 2, outstand: 2},
		{name: "the bound is reached: refused", path: "/c", fn: quick, err: errFSTooManyHung, hung: 2, outstand: 2},
	}
	for _, s := range steps {
		u, err := g.do(ctx, s.path, timeout, s.fn)
		if !errors.Is(err, s.err) || (err == nil && u.CapacityBytes != 42) {
			t.Fatalf("%s: %+v, %v; want error %v", s.name, u, err, s.err)
		}
		if g.hungCalls() != s.hung || g.outstandingCalls() != s.outstand {
			t.Fatalf("%s: %d hung, %d outstanding; want %d, %d", s.name, g.hungCalls(), g.outstandingCalls(), s.hung, s.outstand)
		}
	}
	if n := callCount("/a"); n != 1 {
		t.Errorf("/a called %d times, want 1", n)
	}
	// /a returns: a call can start again, on another path and on /a.
	close(release["/a"])
	waitFor(t, "/a to return", func() bool { return g.hungCalls() == 1 && g.outstandingCalls() == 1 })
	if u, err := g.do(ctx, "/c", timeout, quick); err != nil || u.CapacityBytes != 42 {
		t.Errorf("after /a returned: %+v, %v", u, err)
	}
	if u, err := g.do(ctx, "/a", timeout, quick); err != nil || u.CapacityBytes != 42 {
		t.Errorf("/a after it returned: %+v, %v", u, err)
	}
	close(release["/b"])
	waitFor(t, "/b to return", func() bool { return g.hungCalls() == 0 && g.outstandingCalls() == 0 })

	// A call that returns within the timeout is never counted as hung;
	// one cut short by its context says so.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.do(cctx, "/d", time.Minute, blocking("/d")); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	close(release["/d"])
	waitFor(t, "/d to return", func() bool { return g.outstandingCalls() == 0 })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// countingFS is the host's FS counting calls per path and how many run at
// once.
type countingFS struct {
	HostFS
	mu        sync.Mutex
	calls     map[string]int
	active    int
	maxActive int
}

func (f *countingFS) Statfs(path string) (unix.Statfs_t, error) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[path]++
	f.active++
	f.maxActive = max(f.maxActive, f.active)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.active--
		f.mu.Unlock()
	}()
	return f.HostFS.Statfs(path)
}

func (f *countingFS) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[path]
}

func (f *countingFS) stats() (active, maxActive int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.active, f.maxActive
}

// Local volumes on a really hung filesystem (an autofs mount whose daemon
// never answers: every lookup blocks in the kernel): a round waits for it
// one timeout, a scrape not at all; the next rounds skip the path, whose
// call still hangs, instead of piling up another; with more hung paths
// than MaxHungCalls the calls outstanding stay within MaxHungCalls +
// Concurrency; the volume on a healthy disk is read throughout; when the
// filesystem gives up, every call returns and the paths are read again.
func TestHungFilesystem(t *testing.T) {
	mounttest.RequireRoot(t)
	healthyDir := filepath.Join(mounttest.TempDir(t), "healthy")
	if err := os.Mkdir(healthyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	mounttest.MountTmpfs(t, healthyDir)

	const (
		timeout     = time.Second
		concurrency = 2
		maxHung     = 2
	)
	fs := &countingFS{}
	w := newASW()
	w.put(localVolume("pv-ok", "ns", "ok", false, "pod-ok", healthyDir))
	c := New(Options{ASW: w.snapshot, FS: fs, CallTimeout: timeout, Concurrency: concurrency, MaxHungCalls: maxHung, Log: testLogger(t)})
	errorsOf := func() float64 { return testutil.ToFloat64(c.errors.WithLabelValues(local.Name)) }
	var hungPaths []string

	t.Run("hung", func(t *testing.T) {
		hung := mounttest.HungDir(t)
		addHung := func(n int) {
			for range n {
				name := "vol-" + string(rune('a'+len(hungPaths)))
				path := filepath.Join(hung, name)
				hungPaths = append(hungPaths, path)
				w.put(localVolume("pv-"+name, "ns", name, false, types.UID("pod-"+name), path))
			}
		}
		addHung(1)

		// Round 1: the hung path costs one timeout; the healthy volume
		// is stored meanwhile, and a scrape then answers at once.
		roundDone := make(chan struct{})
		start := time.Now()
		go func() {
			defer close(roundDone)
			c.Refresh(context.Background())
		}()
		waitFor(t, "the healthy volume's stats", func() bool { _, ok := gauge(t, c, capacityName, "ns", "ok"); return ok })
		scrape := time.Now()
		n := testutil.CollectAndCount(c, capacityName)
		scrapeTook := time.Since(scrape)
		select {
		case <-roundDone:
			t.Fatalf("round 1 ended after %v, before its hung call's timeout", time.Since(start))
		default:
		}
		if n != 1 || scrapeTook > 500*time.Millisecond {
			t.Errorf("scrape during the hung round: %d series in %v", n, scrapeTook)
		}
		<-roundDone
		took := time.Since(start)
		t.Logf("round 1: %v (timeout %v), scrape during it: %v", took, timeout, scrapeTook)
		if took < timeout || took > timeout+5*time.Second {
			t.Errorf("round 1 took %v, want one timeout (%v)", took, timeout)
		}
		if _, ok := gauge(t, c, capacityName, "ns", "vol-a"); ok {
			t.Error("stats for the hung volume")
		}
		if v := testutil.ToFloat64(c.errors.WithLabelValues(local.Name)); v != 1 {
			t.Errorf("errors_total = %v after one hung call, want 1", v)
		}
		if v, _ := gaugeValue(t, c, hungName); v != 1 {
			t.Errorf("hung_calls = %v, want 1", v)
		}

		// Round 2: the path's call still hangs: skipped at once, counted
		// as an error, no second call.
		start = time.Now()
		c.Refresh(context.Background())
		took = time.Since(start)
		t.Logf("round 2: %v", took)
		if took >= timeout {
			t.Errorf("round 2 took %v: it waited for a path whose call hangs", took)
		}
		if n := fs.count(hungPaths[0]); n != 1 {
			t.Errorf("hung path called %d times, want 1 (no second goroutine on it)", n)
		}
		if v := errorsOf(); v != 2 {
			t.Errorf("errors_total = %v, want 2", v)
		}
		if _, ok := gauge(t, c, capacityName, "ns", "ok"); !ok {
			t.Error("the healthy volume lost its stats")
		}

		// More hung paths than the bound: the calls outstanding stay
		// within it, and no path ever has two.
		addHung(4)
		for range 3 {
			c.Refresh(context.Background())
			active, maxActive := fs.stats()
			if maxActive > maxHung+concurrency {
				t.Errorf("%d filesystem calls at once, bound %d", maxActive, maxHung+concurrency)
			}
			if c.fs.outstandingCalls() != active {
				t.Errorf("%d calls outstanding, %d in the filesystem", c.fs.outstandingCalls(), active)
			}
		}
		total := 0
		for _, p := range hungPaths {
			if n := fs.count(p); n > 1 {
				t.Errorf("hung path %s called %d times", p, n)
			}
			total += fs.count(p)
		}
		active, maxActive := fs.stats()
		t.Logf("5 hung paths, bound %d+%d: %d calls made, %d hang now, at most %d at once", maxHung, concurrency, total, active, maxActive)
		if active < maxHung || active > maxHung+concurrency {
			t.Errorf("%d calls hang, want between %d and %d", active, maxHung, maxHung+concurrency)
		}
		if total == len(hungPaths) {
			t.Errorf("every hung path was called: the bound refused none")
		}
	})

	// The filesystem gave up (HungDir's cleanup): every call returns, and
	// the next round reads the paths again (they fail at once now).
	waitFor(t, "the hung calls to return", func() bool { return c.fs.outstandingCalls() == 0 })
	if v, _ := gaugeValue(t, c, hungName); v != 0 {
		t.Errorf("hung_calls = %v after the filesystem gave up", v)
	}
	before := errorsOf()
	counts := map[string]int{}
	for _, p := range hungPaths {
		counts[p] = fs.count(p)
	}
	start := time.Now()
	c.Refresh(context.Background())
	if took := time.Since(start); took >= timeout {
		t.Errorf("round after the release took %v", took)
	}
	for _, p := range hungPaths {
		if n := fs.count(p); n != counts[p]+1 {
			t.Errorf("%s called %d times, %d before the release: want it read once more", p, n, counts[p])
		}
	}
	if v := errorsOf(); v != before+float64(len(hungPaths)) {
		t.Errorf("errors_total %v → %v, want one more per gone path", before, v)
	}
	if _, ok := gauge(t, c, capacityName, "ns", "ok"); !ok {
		t.Error("the healthy volume lost its stats")
	}
}
