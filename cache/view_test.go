package cache

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// TestViewPatchOracle: views patched over random sets (and folded, as done
// decides) hold what a plain map written the same way holds, count it
// right, and keep no entry for a name that is in neither the base nor the
// live map.
func TestViewPatchOracle(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 3))
		want := map[int]*int{}
		v := viewOf(map[int]*int{})
		peak := 0
		for pass := range 40 {
			p := newPatcher(v, 0)
			for range r.IntN(12) {
				k := r.IntN(16)
				var e *int
				if r.IntN(3) > 0 {
					e = new(int)
					*e = pass
					want[k] = e
				} else {
					delete(want, k)
				}
				p.set(k, e)
			}
			v = p.done(&peak)
			got := maps.Collect(v.all())
			if !maps.Equal(got, want) || v.n != len(want) {
				t.Fatalf("seed %d pass %d: view %v (n %d), want %v", seed, pass, got, v.n, want)
			}
			for k, e := range v.over {
				if _, inBase := v.base[k]; e == nil && !inBase {
					t.Fatalf("seed %d pass %d: overlay keeps %d gone, which the base never held", seed, pass, k)
				}
			}
		}
	}
}
