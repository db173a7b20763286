package operations

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/volume"
)

// order records the keys in the order their operations ran: with one
// worker, the order they finished in.
type order struct {
	mu   sync.Mutex
	keys []Key
}

// TestStartableForgetsFinishedLikeOracle compares Startable and the
// bookkeeping of finished keys, which forgets them oldest first, with the
// simple rule it implements: a key is held back while an operation on it
// (or a conflicting key) finished after the mark, and nothing older than
// the mark is kept.
func TestStartableForgetsFinishedLikeOracle(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			obs := &order{}
			e := NewExecutor(ExecutorOptions{MaxConcurrent: 1})
			var keys []Key
			for v := range 4 {
				for _, pod := range []string{"", "a", "b"} {
					keys = append(keys, Key{Volume: volume.UniqueName(fmt.Sprintf("p/v%d", v)), Pod: types.UID(pod)})
				}
			}
			var mark uint64
			for round := range 30 {
				for range rng.IntN(6) {
					k := keys[rng.IntN(len(keys))]
					fail := rng.IntN(3) == 0
					name := Op(fmt.Sprintf("op%d", rng.IntN(2)))
					_ = e.Run(k, &Operation{Name: name, Fn: func(context.Context) error {
						obs.mu.Lock()
						obs.keys = append(obs.keys, k)
						obs.mu.Unlock()
						if fail {
							return errors.New("failed")
						}
						return nil
					}})
				}
				waitIdle(t, e)
				if rng.IntN(2) == 0 {
					// Marks never go back; one may lag what finished.
					now := e.Mark()
					mark = max(mark, now-min(now, uint64(rng.IntN(3))))
				}
				cands := make([]Candidate, len(keys))
				for i, k := range keys {
					cands[i] = Candidate{Key: k, Name: "op0"}
				}
				got := e.Startable(cands, mark)

				obs.mu.Lock()
				finished := slices.Clone(obs.keys)
				obs.mu.Unlock()
				now := e.opts.Clock.Now()
				e.mu.Lock()
				for i, c := range cands {
					_, want := e.admit(c.Key, c.Name, c.Generation, now)
					for seq := mark + 1; want && seq <= uint64(len(finished)); seq++ {
						if f := finished[seq-1]; f.Volume == c.Key.Volume && matches(f, c.Key) {
							want = false
						}
					}
					if got[i] != want {
						t.Errorf("round %d, mark %d: Startable(%v) = %v, want %v (recent %v)", round, mark, c.Key, got[i], want, e.recent)
					}
				}
				var recent []finishedKey
				for seq := mark + 1; seq <= uint64(len(finished)); seq++ {
					// vol: the volume's bookkeeping, the one in the map.
					recent = append(recent, finishedKey{key: finished[seq-1], seq: seq, vol: e.byVolume[finished[seq-1].Volume]})
				}
				if !slices.Equal(e.recent, recent) {
					t.Errorf("round %d: recent %v, want %v", round, e.recent, recent)
				}
				for name, v := range e.byVolume {
					if v.empty() {
						t.Errorf("round %d: volume %s kept with nothing on it", round, name)
					}
					want := slices.DeleteFunc(slices.Clone(recent), func(f finishedKey) bool { return f.key.Volume != name })
					if !slices.Equal(v.recent, want) {
						t.Errorf("round %d: volume %s recent %v, want %v", round, name, v.recent, want)
					}
				}
				failed := 0
				for name, v := range e.byVolume {
					for _, en := range v.entries {
						if en.vol != v {
							t.Errorf("round %d: an entry of volume %s points to other bookkeeping", round, name)
						}
						if !en.pending {
							failed++
						}
					}
				}
				if failed != e.failed {
					t.Errorf("round %d: failed count %d, want %d", round, e.failed, failed)
				}
				e.mu.Unlock()
				if rng.IntN(4) == 0 {
					e.Forget(func(k Key) bool { return rng.IntN(2) == 0 })
				}
			}
		})
	}
}

func waitIdle(t *testing.T, e *Executor) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}
