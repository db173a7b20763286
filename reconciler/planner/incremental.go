package planner

import (
	"slices"
	"sort"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// Incremental is Plan made incremental: it keeps the actions each volume
// needed when it was last planned and plans again only the volumes the
// caches say changed since (cache.Changes). A volume's actions depend only
// on its own two entries, the options and whether its pods are protected
// (planVolume), and the caches report a change of protection as a change
// of everything; so the result is Plan's, which a differential test
// checks over random sequences of changes.
//
// Every pass planned every volume before: a node whose pods arrive one by
// one (as the API server binds them) planned all of its volumes for each,
// and a thousand pods arriving over four seconds cost three and a half
// seconds of CPU, most of it planning volumes that were long mounted.
//
// The actions are returned sorted (sortActions). A pass in a storm has
// thousands, of which a few changed: when the caller hands back the
// slice the last pass returned, the sorted list is patched (see patch)
// instead of gathered and sorted again, which was most of such a pass.
// Patching costs less than gathering even when most volumes changed (it
// sorts only their actions and merges), so every pass that is not a full
// one patches: while a quarter of the actions was the limit, none of
// BenchmarkStorm's passes and four in five of BenchmarkStormLimited's did.
type Incremental struct {
	// memo holds the actions of each volume that needs any.
	memo map[volume.UniqueName][]Action
	// free holds the cleared slices of volumes that needed actions and
	// need none now, for the next volumes that come to need some: in a
	// storm every volume needs actions for a while, twice, and allocating
	// a slice each time was a sixth of a storm's allocations.
	free  [][]Action
	opts  Options
	valid bool
	// last is the slice the last pass returned (nil if empty).
	last []Action
	// changed and add are the last pass's buffers, cleared, for the
	// next (a pass in a storm lists hundreds of volumes).
	changed []volume.UniqueName
	add     []actionRef
	// patched counts the passes that patched the last result (tests).
	patched int
	sorter  sorter
}

// Plan returns the actions Plan would return for the snapshots, appending
// to buf[:0]. dchg and achg are the changes taken from the caches before
// the snapshots; full asks for every volume to be planned again.
func (p *Incremental) Plan(buf []Action, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, opts Options,
	dchg, achg cache.Changes, full bool) []Action {
	if full || !p.valid || opts != p.opts || dchg.All || achg.All {
		p.memo = nil
		eachVolume(dsw, asw, func(name volume.UniqueName, dv *cache.DesiredVolume, av *cache.ActualVolume) {
			p.replan(name, dsw, dv, av, opts)
		})
		p.opts, p.valid = opts, true
	} else {
		// The changed volumes come in name order, once each, as patch
		// needs them; their actions are gathered as they are planned,
		// as references into the memo (copies, kept for the next pass,
		// cost as much as the result itself once most volumes change in
		// a pass, as in a storm's).
		patching := len(buf) > 0 && len(buf) == len(p.last) && &buf[0] == &p.last[0]
		changed, add := p.changed[:0], p.add[:0]
		defer func() {
			clear(changed)
			clear(add)
			p.changed, p.add = nil, nil
			if p.memo != nil { // not idle
				p.changed, p.add = changed[:0], add[:0]
			}
		}()
		cache.Union(dchg, achg, func(name volume.UniqueName) {
			actions := p.replan(name, dsw, dsw.Volume(name), asw.Volume(name), opts)
			if patching {
				changed = append(changed, name)
				for i := range actions {
					add = append(add, actionRef{&actions[i], phase(actions[i].Op)})
				}
			}
		})
		if patching {
			p.patched++
			return p.keep(p.patch(buf, changed, add))
		}
	}
	out := buf[:0]
	for _, actions := range p.memo {
		out = append(out, actions...)
	}
	return p.keep(p.sorter.sort(out))
}

// keep remembers out as the last result, and lets go of what an idle agent
// need not hold.
func (p *Incremental) keep(out []Action) []Action {
	p.last = out
	if len(out) == 0 {
		p.last = nil
	}
	if len(p.memo) == 0 {
		// A map keeps its buckets when emptied: an idle agent holds
		// none of a storm's.
		p.memo, p.free, p.add, p.sorter = nil, nil, nil, sorter{}
	}
	return out
}

// patch turns last, the sorted actions of the last pass, into this pass's:
// it drops the actions of the changed volumes (sorted, once each), then
// merges in their actions now (add), sorted, from the back: each new
// action's place is found by galloping back from the last one's and the
// actions after it move up in one copy, so each Action moves at most
// twice.
//
// The changed volumes' actions are found by galloping search, per phase
// (within which last is sorted by volume) and in the order of their
// names, and what lies between is moved in one copy: a lookup of every
// action's volume in a set, and moving the actions one by one, was most
// of a pass with thousands of actions pending.
func (p *Incremental) patch(last []Action, changed []volume.UniqueName, add []actionRef) []Action {
	if len(changed) == 0 {
		return last
	}
	slices.SortFunc(add, func(x, y actionRef) int { return compareActions(x.phase, x.a, y.phase, y.a) })

	kept, from := 0, 0 // last[:kept] are kept; last[from:] not looked at yet
	for start := 0; start < len(last); {
		ph := phase(last[start].Op)
		end := start + gallop(last[start:], func(a *Action) bool { return phase(a.Op) > ph })
		pos := start
		for _, name := range changed {
			lo := pos + gallop(last[pos:end], func(a *Action) bool { return a.Volume >= name })
			hi := lo + gallop(last[lo:end], func(a *Action) bool { return a.Volume > name })
			if lo < hi {
				kept += copy(last[kept:], last[from:lo])
				from = hi
			}
			pos = hi
		}
		start = end
	}
	kept += copy(last[kept:], last[from:])
	if n := kept + len(add); n < len(last) {
		clear(last[n:]) // what is no longer planned is not held either
		last = last[:n]
	} else {
		// Room for the merge, doubled when it grows: a storm's list
		// grows by a few hundred actions per pass to thousands, and
		// append's quarter steps reallocated it five times its size.
		if n > cap(last) {
			last = append(make([]Action, 0, max(n, 2*cap(last))), last...)
		}
		last = last[:n]
	}
	// last[:i] are the kept actions not yet merged, last[end:] the merged.
	i, end := kept, len(last)
	for j := len(add) - 1; j >= 0; j-- {
		a, pa := add[j].a, add[j].phase
		pos := i - gallopBack(last[:i], func(b *Action) bool { return compareActions(phase(b.Op), b, pa, a) > 0 })
		end -= i - pos
		copy(last[end:], last[pos:i])
		i = pos
		end--
		last[end] = *a
	}
	return last
}

// actionRef is an action of the memo and its phase.
type actionRef struct {
	a     *Action
	phase operations.Phase
}

// gallop returns the smallest index of s at which f holds, len(s) if
// none, for an f that holds from some index on: it looks 1, 2, 4, ...
// actions ahead, then searches the last step, so finding an index k costs
// about 2 log k calls of f, however long s is.
func gallop(s []Action, f func(*Action) bool) int {
	lo, step := 0, 1 // f does not hold before lo
	for lo+step <= len(s) && !f(&s[lo+step-1]) {
		lo += step
		step *= 2
	}
	hi := min(lo+step, len(s)) // f holds at hi-1, or hi == len(s)
	return lo + sort.Search(hi-lo, func(x int) bool { return f(&s[lo+x]) })
}

// gallopBack is gallop from the end: it returns how many actions at the
// end of s f holds for, for an f that holds from some index on. The merge
// in patch walks the kept actions from the back, and the place of the
// next new action is near where the last one went: a binary search over
// all of them made a pass that changed many volumes cost more than
// gathering and sorting everything again.
func gallopBack(s []Action, f func(*Action) bool) int {
	n, step := 0, 1 // f holds for the last n
	for n+step <= len(s) && f(&s[len(s)-n-step]) {
		n += step
		step *= 2
	}
	lo := len(s) - min(n+step, len(s)) // f may hold from lo on
	hi := len(s) - n                   // f holds from hi on
	return len(s) - (lo + sort.Search(hi-lo, func(x int) bool { return f(&s[lo+x]) }))
}

// replan plans one volume again and records its actions, which it returns
// (they stay in the memo until the volume is planned again).
func (p *Incremental) replan(name volume.UniqueName, dsw *cache.DesiredSnapshot, dv *cache.DesiredVolume, av *cache.ActualVolume, opts Options) []Action {
	old, had := p.memo[name]
	if !had && len(p.free) > 0 {
		old = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
	}
	actions := planVolume(old[:0], dsw, dv, av, opts)
	switch {
	case len(actions) > 0:
		if p.memo == nil {
			p.memo = map[volume.UniqueName][]Action{}
		}
		p.memo[name] = actions
		return actions
	case old != nil:
		if had {
			delete(p.memo, name)
		}
		if len(p.free) < maxFree {
			clear(old[:cap(old)])
			p.free = append(p.free, old[:0])
		}
	}
	return nil
}

// maxFree bounds the free slices kept while some volume needs actions (an
// idle planner keeps none): a slice is a few Actions.
const maxFree = 1024
