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
