package agent

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/ui/model"
	"github.com/volume-agent/volume-agent/usage"
)

// newUsage builds the measurer of emptyDir (and hostPath) usage; nil when
// --volume-usage-period is negative. Pods that go over a limit wake the
// reconciler, whose pass rewrites their condition and the page.
func (p *parts) newUsage(wake func()) *usage.Measurer {
	if p.cfg.UsagePeriod < 0 {
		return nil
	}
	// The enforcement knows what it enforces (a quota's charge, an
	// image's statfs) for a system call; only what it does not back is
	// walked.
	return usage.New(usage.Options{
		DSW: p.dsw.Snapshot, ASW: p.asw.Snapshot, Source: usage.Sources{p.cfg.UsageSource, p.limits},
		Period: p.cfg.UsagePeriod, EntriesPerSecond: p.cfg.UsageEntriesPerSecond, WalkTimeout: p.cfg.UsageWalkTimeout,
		HostPath: p.cfg.MeasureHostPathUsage, Events: p.events, OnChange: wake, Log: p.log.Named("usage"),
	})
}

// failuresWithLimits is the executor's failures and the measurer's
// warnings as one value, so every surface asking explain.Explain with it
// sees both (explain.Limits).
type failuresWithLimits struct {
	*operations.Executor
	usage *usage.Measurer
}

func (f failuresWithLimits) OverLimit(pod types.UID) []explain.Warning {
	if f.usage == nil {
		return nil
	}
	return f.usage.OverLimit(pod)
}

// usageInput is what the page shows of the usage: each volume's figures and
// the pods' warnings.
func usageInput(m *usage.Measurer, in *model.Input) {
	if m == nil {
		return
	}
	in.Usage = map[types.UID]map[string]model.VolumeUsage{}
	for _, r := range m.Results() {
		if !r.Measured() {
			continue
		}
		if in.Usage[r.Pod.UID] == nil {
			in.Usage[r.Pod.UID] = map[string]model.VolumeUsage{}
		}
		in.Usage[r.Pod.UID][r.Volume] = model.VolumeUsage{UsedBytes: r.UsedBytes, InodesUsed: r.InodesUsed, LimitBytes: r.Limit,
			Method: r.Method, At: r.At, Error: r.Err}
	}
	in.OverLimit = map[types.UID][]explain.Warning{}
	for uid, os := range m.Over() {
		for _, o := range os {
			in.OverLimit[uid] = append(in.OverLimit[uid], o.Warning)
		}
	}
}
