package cache

import (
	"slices"

	"github.com/volume-agent/volume-agent/volume"
)

// Changes names the volumes whose entries changed between two calls of a
// cache's TakeChanges, so that the reconciler plans only those again. All
// says that any entry may have changed: the first call, a change that
// concerns volumes the cache cannot name, or too many to list.
//
// The caches list changes with repeats, one append per change, and sort
// the list once per take (sortedOnce): a set kept a map insert per change,
// a tenth of every cache write in a storm.
type Changes struct {
	All bool
	// names is sorted, without repeats.
	names []volume.UniqueName
}

// Has reports whether the volume is among the changed ones (always when
// All).
func (c Changes) Has(name volume.UniqueName) bool {
	if c.All {
		return true
	}
	_, ok := slices.BinarySearch(c.names, name)
	return ok
}

// Each calls fn for every name listed, once each.
func (c Changes) Each(fn func(volume.UniqueName)) {
	for _, name := range c.names {
		fn(name)
	}
}

// Union calls fn for every name either a or b lists, once each, in name
// order (for neither when one of them is All: the caller plans everything
// then). It walks the two sorted lists side by side: calling Each of one
// and Has of the other, then sorting the names again for the planner's
// patch, was a tenth of a storm's planning.
func Union(a, b Changes, fn func(volume.UniqueName)) {
	if a.All || b.All {
		return
	}
	i, j := 0, 0
	for i < len(a.names) && j < len(b.names) {
		switch x, y := a.names[i], b.names[j]; {
		case x < y:
			fn(x)
			i++
		case y < x:
			fn(y)
			j++
		default:
			fn(x)
			i++
			j++
		}
	}
	for _, name := range a.names[i:] {
		fn(name)
	}
	for _, name := range b.names[j:] {
		fn(name)
	}
}

// sortedOnce sorts names and drops the repeats, in place.
func sortedOnce(names []volume.UniqueName) []volume.UniqueName {
	slices.Sort(names)
	return slices.Compact(names)
}

// changeLimit is how many names a change log lists, at most, for a cache
// holding live entries: beyond that, planning everything costs no more.
func changeLimit(live int) int { return 256 + 2*live }

// shrunk returns m, or a copy of it sized to its contents once it holds
// under a quarter of the most it held since it was made (*peak, kept up to
// date): a Go map keeps the table of its largest size, and a snapshot
// cloned from it would copy that table too, long after a storm of pods has
// gone.
func shrunk[K comparable, V any](m map[K]V, peak *int) map[K]V {
	n := len(m)
	if !shrinks(n, peak) {
		return m
	}
	c := make(map[K]V, n)
	for k, v := range m {
		c[k] = v
	}
	return c
}

// shrinks reports whether a map of n entries, whose most since it was
// made is *peak, should be copied into a table sized to n: it holds under
// a quarter of its peak. It keeps *peak up to date (n, once copied).
func shrinks(n int, peak *int) bool {
	switch {
	case n > *peak:
		*peak = n
		return false
	case *peak < 64 || n >= *peak/4:
		return false
	}
	*peak = n
	return true
}
