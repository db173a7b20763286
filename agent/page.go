package agent

import (
	"time"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/reconciler"
	"github.com/volume-agent/volume-agent/ui"
	"github.com/volume-agent/volume-agent/ui/model"
)

// newPage builds the operator page served on the debug endpoint (package
// ui). It is told about changes after every reconciler pass (pageTrigger):
// every change the agent acts on wakes the reconciler.
func (p *parts) newPage() *ui.Server {
	return ui.New(ui.Options{Gather: p.pageInput, Log: p.log.Named("page")})
}

// pageInput gathers what the page shows, once per build.
func (p *parts) pageInput() model.Input {
	in := model.Input{
		Now: time.Now(), Node: p.cfg.NodeName, Mode: "standalone", SourcesReady: p.populator.Ready(),
		DSW: p.dsw.Snapshot(), ASW: p.asw.Snapshot(), Operations: p.executor.Status(),
		Drivers: p.csi.drivers.List(), Sockets: p.csi.watcher.Sockets(), ProbePeriod: p.cfg.CSIProbePeriod,
		Orphans: p.orphans.List(), Events: p.events.Recent(), History: p.history,
		EmptyDirLimits: p.limits.Status(),
	}
	if p.mode.cluster != nil {
		in.Mode = "cluster"
	}
	if p.csi.nodeInfo != nil {
		in.NodeInfo = p.csi.nodeInfo.Statuses()
	}
	if p.localPV != nil {
		doc := p.localPV.Status()
		in.LocalVolumes = &doc
	}
	in.InputErrors = p.source.InputErrors()
	usageInput(p.usage, &in)
	return in
}

// pageTrigger tells the page about every reconciler pass.
type pageTrigger struct{ page *ui.Server }

func (p pageTrigger) Reconciled(*cache.DesiredSnapshot, *cache.ActualSnapshot, []reconciler.Action, time.Duration) {
	p.page.Changed()
}
