package cache

import (
	"iter"
	"maps"
	"reflect"
)

// view is an immutable map of a snapshot: a base map shared with earlier
// and later snapshots plus the entries changed since the base was made
// (over; a nil entry says the name is gone). Neither map is written once
// the view is published.
//
// A snapshot used to be a copy of every entry: in a 1000-pod storm the
// reconciler snapshots the ASW and the DSW on every pass, and copying
// thousands of entries per pass to patch a few hundred was a tenth of the
// bytes a setup allocated. A view costs the entries changed since its base
// instead; the base is made anew (fold) once the overlays copied since add
// up to its size, so a snapshot costs O(sqrt(base x changes)) amortised
// rather than O(base), and a lookup costs at most two map reads.
type view[K comparable, T any] struct {
	base map[K]*T
	over map[K]*T
	n    int
	// copied counts the overlay entries copied since base was made.
	copied int
}

// viewOf returns a view of m, which the caller must not write afterwards.
func viewOf[K comparable, T any](m map[K]*T) view[K, T] {
	return view[K, T]{base: m, n: len(m)}
}

// eachChanged calls fn for every key whose entry in v is not the one in
// prev (nil when gone from v), when the two views share their base: the
// entries that differ are then in their overlays. It reports false,
// calling nothing, when the bases differ.
func (v *view[K, T]) eachChanged(prev *view[K, T], fn func(K, *T)) bool {
	// The same map, not an equal one (maps compare only to nil).
	if reflect.ValueOf(v.base).UnsafePointer() != reflect.ValueOf(prev.base).UnsafePointer() {
		return false
	}
	for k, e := range v.over {
		if old, _ := prev.get(k); old != e {
			fn(k, e)
		}
	}
	for k, old := range prev.over {
		if _, ok := v.over[k]; ok {
			continue
		}
		if e := v.base[k]; e != old {
			fn(k, e)
		}
	}
	return true
}

func (v *view[K, T]) get(k K) (*T, bool) {
	if e, ok := v.over[k]; ok {
		return e, e != nil
	}
	e, ok := v.base[k]
	return e, ok
}

func (v *view[K, T]) all() iter.Seq2[K, *T] {
	return func(yield func(K, *T) bool) {
		for k, e := range v.base {
			if _, changed := v.over[k]; changed {
				continue
			}
			if !yield(k, e) {
				return
			}
		}
		for k, e := range v.over {
			if e != nil && !yield(k, e) {
				return
			}
		}
	}
}

// patcher makes the view that follows a published one.
type patcher[K comparable, T any] struct {
	prev, next view[K, T]
}

// newPatcher starts the view after prev with room for about changes
// entries changed.
func newPatcher[K comparable, T any](prev view[K, T], changes int) *patcher[K, T] {
	p := &patcher[K, T]{prev: prev, next: prev}
	p.next.copied += len(prev.over)
	if prev.over == nil {
		p.next.over = make(map[K]*T, changes)
	} else {
		// A table copy, without hashing every key again.
		p.next.over = maps.Clone(prev.over)
	}
	return p
}

// set records k's entry (nil: gone) in the new view.
//
// It reads each map once: get, then base again to decide between delete
// and write, cost a third more map reads per changed entry of a pass.
func (p *patcher[K, T]) set(k K, e *T) {
	old, inOver := p.next.over[k]
	_, inBase := p.next.base[k]
	had := inBase
	if inOver {
		had = old != nil
	}
	switch {
	case inBase || e != nil:
		p.next.over[k] = e
	case inOver:
		delete(p.next.over, k)
	}
	switch {
	case had && e == nil:
		p.next.n--
	case !had && e != nil:
		p.next.n++
	}
}

// done returns the new view, folded into a new base when the overlays
// copied since the base was made add up to its size (folding at a third
// of it allocated 5 % more in BenchmarkStorm), or when the view
// holds under a quarter of what its base was made for (see shrinks).
func (p *patcher[K, T]) done(peak *int) view[K, T] {
	v := p.next
	small := v.copied+len(v.over) <= max(len(v.base), 64)
	if shrinks(v.n, peak) {
		b := make(map[K]*T, v.n)
		for k, e := range v.all() {
			b[k] = e
		}
		return viewOf(b)
	}
	if small {
		return v
	}
	// maps.Clone copies the base's table as it is, without hashing every
	// key again.
	b := maps.Clone(v.base)
	for k, e := range v.over {
		if e == nil {
			delete(b, k)
		} else {
			b[k] = e
		}
	}
	return viewOf(b)
}
