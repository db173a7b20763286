package usage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
)

// BenchmarkRound is the cost of measuring 500 disk emptyDirs of 1,000
// files each (10 directories of 100), once a minute: one round is a
// minute's measuring, so cpu-ms/round is the CPU per minute. "walk" walks
// every volume (no quotas, no images); "source" has a cheap source answer
// for every one (a fake: project quotas are unavailable here, and a quota's
// or an image's answer is one system call).
func BenchmarkRound(b *testing.B) {
	const pods, dirs, files = 500, 10, 100
	w := newWorld(b)
	src := &fakeSource{usage: map[string][2]int64{}}
	for i := range pods {
		name := fmt.Sprintf("p%03d", i)
		w.pod(b, name, "", vol{name: "data", plugin: emptydir.Name, limit: "1Gi", state: cache.Mounted})
		for d := range dirs {
			dir := filepath.Join(w.path(name, "data"), fmt.Sprint(d))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			for f := range files {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(f)), []byte("x"), 0o644); err != nil {
					b.Fatal(err)
				}
			}
		}
		src.usage[w.path(name, "data")] = [2]int64{4096, 1}
	}
	for _, tc := range []struct {
		name   string
		source Source
	}{{"walk", nil}, {"source", src}} {
		b.Run(tc.name, func(b *testing.B) {
			m := New(Options{DSW: w.dsw.Snapshot, ASW: w.asw.Snapshot, Source: tc.source, EntriesPerSecond: 1 << 30, WalkTimeout: time.Hour})
			var cpu time.Duration
			for b.Loop() {
				before := cpuTime(b)
				m.Refresh(context.Background())
				cpu += cpuTime(b) - before
			}
			if len(m.Results()) != pods {
				b.Fatalf("%d results", len(m.Results()))
			}
			b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/round")
		})
	}
}

// cpuTime is the process's user and system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
