package operations

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/volume"
)

type countingObserver struct{ wg *sync.WaitGroup }

func (c countingObserver) OperationFinished(Key, *Operation, time.Duration, error, time.Duration) {
	c.wg.Done()
}

// BenchmarkExecutorThroughput measures the executor's own cost per operation:
// admission through the pending-operations map, a worker slot, the timeout
// context and completion bookkeeping, with operations that do no work.
func BenchmarkExecutorThroughput(b *testing.B) {
	for _, volumes := range []int{1, 100, 10000} {
		b.Run(fmt.Sprintf("volumes=%d", volumes), func(b *testing.B) {
			var wg sync.WaitGroup
			e := NewExecutor(ExecutorOptions{MaxConcurrent: 64, Observer: countingObserver{&wg}})
			keys := make([]Key, volumes)
			for i := range keys {
				keys[i] = Key{Volume: volume.UniqueName(fmt.Sprintf("plugin/v%d", i)), Pod: "pod"}
			}
			op := &Operation{Name: "mount_volume", Target: Target{Plugin: "bench"}, Fn: func(context.Context) error { return nil }}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				wg.Add(1)
				for e.Run(keys[i%volumes], op) != nil {
					// The key is still busy with its previous operation.
					wg.Done()
					wg.Wait()
					wg.Add(1)
				}
			}
			wg.Wait()
		})
	}
}

// BenchmarkExecutorStartable measures a reconciler pass asking which of
// 10,000 planned actions can start while all of them are running, and
// forgetting failed keys.
func BenchmarkExecutorStartable(b *testing.B) {
	release := make(chan struct{})
	e := NewExecutor(ExecutorOptions{MaxConcurrent: 10000})
	cands := make([]Candidate, 10000)
	for i := range cands {
		cands[i] = Candidate{Key: Key{Volume: volume.UniqueName(fmt.Sprintf("plugin/v%d", i)), Pod: "pod"}, Name: "mount_volume"}
		if err := e.Run(cands[i].Key, &Operation{Name: "mount_volume", Fn: func(context.Context) error { <-release; return nil }}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.Startable(cands, e.Mark())
		// Every pass also forgets failed keys that are gone (none here).
		e.Forget(func(Key) bool { return false })
	}
	b.StopTimer()
	close(release)
	if err := e.Wait(context.Background()); err != nil {
		b.Fatal(err)
	}
}
