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

// TestViewEachChangedOracle: between any two views of a sequence that
// share their base, eachChanged reports what comparing every entry of both
// reports: each key whose entry differs, once, with its entry in the newer
// view.
func TestViewEachChangedOracle(t *testing.T) {
	shared := 0
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 4))
		views := []view[int, int]{viewOf(map[int]*int{})}
		peak := 0
		for range 30 {
			p := newPatcher(views[len(views)-1], 0)
			for range r.IntN(6) {
				k := r.IntN(16)
				var e *int
				if r.IntN(3) > 0 {
					e = new(int)
				}
				p.set(k, e)
			}
			views = append(views, p.done(&peak))
		}
		for i := range views {
			for j := range views {
				cur, prev := &views[i], &views[j]
				got := map[int]*int{}
				if !cur.eachChanged(prev, func(k int, e *int) {
					if _, dup := got[k]; dup {
						t.Fatalf("seed %d: key %d reported twice", seed, k)
					}
					got[k] = e
				}) {
					continue
				}
				if i != j {
					shared++
				}
				want := map[int]*int{}
				for k, e := range cur.all() {
					if old, _ := prev.get(k); old != e {
						want[k] = e
					}
				}
				for k := range prev.all() {
					if _, ok := cur.get(k); !ok {
						want[k] = nil
					}
				}
				if !maps.Equal(got, want) {
					t.Fatalf("seed %d views %d, %d: eachChanged %v, want %v", seed, i, j, got, want)
				}
			}
		}
	}
	if shared < 200*60 {
		t.Fatalf("only %d pairs shared a base", shared)
	}
}
