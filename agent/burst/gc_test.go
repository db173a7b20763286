package burst

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"

	"github.com/volume-agent/volume-agent/reconciler"
)

// gcSettings reads the process's GC percent and memory limit.
func gcSettings() (percent int, limit int64) {
	percent = debug.SetGCPercent(100)
	debug.SetGCPercent(percent)
	return percent, debug.SetMemoryLimit(-1)
}

func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// A pass that plans a burst raises the GC percent under a memory limit
// that follows the live heap (never below what the steady percent lets
// it reach, plus Extra); a pass that plans nothing puts the process's
// settings back. Small passes change nothing.
func TestBurstGC(t *testing.T) {
	percent, limit := gcSettings()
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })
	debug.SetGCPercent(50)
	debug.SetMemoryLimit(math.MaxInt64)

	const extra = 4 << 20
	g := NewGC(GCOptions{Actions: 4, Percent: 300, Extra: extra})
	actions := func(n int) []reconciler.Action { return make([]reconciler.Action, n) }
	check := func(step string, wantPercent int, minLimit, maxLimit int64) {
		t.Helper()
		p, l := gcSettings()
		if p != wantPercent || l < minLimit || l > maxLimit {
			t.Fatalf("%s: GC percent %d, limit %d; want %d and a limit in [%d, %d]", step, p, l, wantPercent, minLimit, maxLimit)
		}
	}

	g.Reconciled(nil, nil, actions(3), 0)
	check("a small pass", 50, math.MaxInt64, math.MaxInt64)

	runtime.GC()
	g.Reconciled(nil, nil, actions(4), 0)
	live := int64(liveHeap())
	check("a burst", 300, live*3/2+extra, math.MaxInt64-1)
	_, first := gcSettings()

	// The live heap grows by 64 MiB: the limit follows it.
	held := make([][]byte, 64)
	for i := range held {
		held[i] = make([]byte, 1<<20)
	}
	runtime.GC()
	g.Reconciled(nil, nil, actions(1), 0)
	live = int64(liveHeap())
	check("a burst whose live heap grew", 300, max(first, live*3/2+extra), math.MaxInt64-1)
	runtime.KeepAlive(held)

	g.Reconciled(nil, nil, nil, 0)
	check("steady", 50, math.MaxInt64, math.MaxInt64)

	var none *GC
	none.Reconciled(nil, nil, actions(100), 0)
	check("no tuning", 50, math.MaxInt64, math.MaxInt64)
}

// A large read starts a burst before any pass plans; a small one does
// not. The burst ends at the next pass that plans nothing, whether or not
// a pass planned work in between (a batch of pods without volumes plans
// none), and its extra follows the work, up to MaxExtra.
func TestBurstGCFromReads(t *testing.T) {
	percent, limit := gcSettings()
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })
	debug.SetGCPercent(50)
	debug.SetMemoryLimit(math.MaxInt64)

	const extra, perFile, perItem, maxExtra = 4 << 20, 64 << 10, 128 << 10, 16 << 20
	// The extra moves in whole MiB.
	mib := func(n int64) int64 { return n &^ (1<<20 - 1) }
	type step struct {
		read    int // files read, or
		actions int // actions planned by a pass (-1: none)
		percent int // GC percent after the step
		extra   int64
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"small read", []step{{read: 7, percent: 50}, {actions: -1, percent: 50}}},
		{"large read, pods without volumes", []step{
			{read: 8, percent: 300, extra: extra},
			{actions: -1, percent: 50},
		}},
		{"large read, then its work", []step{
			{read: 8, percent: 300, extra: extra},
			{read: 100, percent: 300, extra: mib(108 * perFile)},
			{actions: 3, percent: 300, extra: mib(108*perFile + 3*perItem)},
			{actions: 1000, percent: 300, extra: maxExtra},
			{actions: -1, percent: 50},
		}},
		{"a pass starts it, reads add to it", []step{
			{actions: 4, percent: 300, extra: extra},
			{read: 200, percent: 300, extra: mib(200*perFile + 4*perItem)},
			{actions: -1, percent: 50},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGC(GCOptions{Actions: 4, Files: 8, Percent: 300, Extra: extra, PerFile: perFile, PerItem: perItem, MaxExtra: maxExtra})
			for i, s := range tc.steps {
				if s.read > 0 {
					g.Reading(s.read)
				} else {
					g.Reconciled(nil, nil, make([]reconciler.Action, max(s.actions, 0)), 0)
				}
				p, l := gcSettings()
				if p != s.percent {
					t.Fatalf("step %d: GC percent %d, want %d", i, p, s.percent)
				}
				if s.percent == 50 {
					if l != math.MaxInt64 {
						t.Fatalf("step %d: memory limit %d left after the burst", i, l)
					}
					continue
				}
				if g.extra != s.extra {
					t.Fatalf("step %d: extra %d, want %d", i, g.extra, s.extra)
				}
				if least := s.extra + int64(liveHeap())*3/2; l < least {
					t.Fatalf("step %d: memory limit %d, want at least %d", i, l, least)
				}
			}
		})
	}
	var none *GC
	none.Reading(1000)
	if p, _ := gcSettings(); p != 50 {
		t.Fatalf("a nil GC changed the GC percent to %d", p)
	}
}

// By default a burst turns the GC percent off, so that the memory limit
// alone decides: a raised percent of a small live heap came first and
// collected twice in a 1000-pod setup.
func TestBurstGCDefaultPercentOff(t *testing.T) {
	percent, limit := gcSettings()
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })
	debug.SetGCPercent(50)
	debug.SetMemoryLimit(math.MaxInt64)

	g := NewGC(GCOptions{})
	g.Reading(1000)
	p, l := gcSettings()
	if p != -1 {
		t.Fatalf("GC percent %d in a burst, want -1 (off)", p)
	}
	// 1000 files at the default 24 KiB each: the extra covers the storm
	// they lead to, so the limit is at least that above the steady goal.
	if least := int64(1000*24<<10)&^(1<<20-1) + int64(liveHeap())*3/2; l < least || l == math.MaxInt64 {
		t.Fatalf("memory limit %d in a burst of 1000 files, want at least %d and a limit", l, least)
	}
	g.Reconciled(nil, nil, nil, 0)
	if p, l := gcSettings(); p != 50 || l != math.MaxInt64 {
		t.Fatalf("after the burst: GC percent %d, limit %d; want 50 and none", p, l)
	}
}
