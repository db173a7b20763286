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
func (a *Agent) newPage() *ui.Server {
	return ui.New(ui.Options{Gather: a.pageInput, Log: a.log.Named("page")})
}

// pageInput gathers what the page shows, once per build.
func (a *Agent) pageInput() model.Input {
	in := model.Input{
		Now: time.Now(), Node: a.cfg.NodeName, Mode: "standalone", SourcesReady: a.populator.Ready(),
		DSW: a.dsw.Snapshot(), ASW: a.asw.Snapshot(), Operations: a.executor.Status(),
		Drivers: a.csi.drivers.List(), Sockets: a.csi.watcher.Sockets(), ProbePeriod: a.cfg.CSIProbePeriod,
		Orphans: a.orphans.List(), Events: a.events.Recent(), History: a.history,
	}
	if a.mode.cluster != nil {
		in.Mode = "cluster"
	}
	if a.csi.nodeInfo != nil {
		in.NodeInfo = a.csi.nodeInfo.Statuses()
	}
	if a.localPV != nil {
		doc := a.localPV.Status()
		in.LocalVolumes = &doc
	}
	in.InputErrors = a.source.InputErrors()
	return in
}

// pageTrigger tells the page about every reconciler pass.
type pageTrigger struct{ page *ui.Server }

func (p pageTrigger) Reconciled(*cache.DesiredSnapshot, *cache.ActualSnapshot, []reconciler.Action, time.Duration) {
	p.page.Changed()
}
