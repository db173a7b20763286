package planner

import (
	"github.com/volume-agent/volume-agent/cache"
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
type Incremental struct {
	// memo holds the actions of each volume that needs any.
	memo  map[volume.UniqueName][]Action
	opts  Options
	valid bool
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
		dchg.Each(func(name volume.UniqueName) {
			p.replan(name, dsw, dsw.Volumes[name], asw.Volumes[name], opts)
		})
		achg.Each(func(name volume.UniqueName) {
			if !dchg.Has(name) {
				p.replan(name, dsw, dsw.Volumes[name], asw.Volumes[name], opts)
			}
		})
	}
	out := buf[:0]
	for _, actions := range p.memo {
		out = append(out, actions...)
	}
	if len(p.memo) == 0 {
		// A map keeps its buckets when emptied: an idle agent holds
		// none of a storm's.
		p.memo = nil
	}
	return sortActions(out)
}

// replan plans one volume again and records its actions.
func (p *Incremental) replan(name volume.UniqueName, dsw *cache.DesiredSnapshot, dv *cache.DesiredVolume, av *cache.ActualVolume, opts Options) {
	old := p.memo[name]
	actions := planVolume(old[:0], dsw, dv, av, opts)
	switch {
	case len(actions) > 0:
		if p.memo == nil {
			p.memo = map[volume.UniqueName][]Action{}
		}
		p.memo[name] = actions
	case old != nil:
		delete(p.memo, name)
	}
}
