package reconciler

import (
	"context"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/volume"
)

// fakeExecutor refuses the keys in busy and records what it was asked to
// run.
type fakeExecutor struct {
	busy map[operations.Key]bool
	ran  []string
}

func (e *fakeExecutor) Startable(cands []operations.Candidate) []bool {
	out := make([]bool, len(cands))
	for i, c := range cands {
		out[i] = !e.busy[c.Key]
	}
	return out
}

func (e *fakeExecutor) Run(key operations.Key, op *operations.Operation) error {
	e.ran = append(e.ran, string(op.Name)+" "+string(key.Volume)+" "+string(key.Pod))
	return nil
}

// opHandler builds an operation for every action and records which.
type opHandler struct{ built []string }

func (h *opHandler) Operation(a *Action) *operations.Operation {
	h.built = append(h.built, rcActs([]Action{*a})[0])
	return &operations.Operation{Name: a.Op, Plugin: a.Plugin, Fn: func(context.Context) error { return nil }}
}

func (h *opHandler) Adopt(Adoption) {}

// A pass plans, asks the executor which actions can start, and builds and
// runs exactly those, each on its own key.
func TestReconcilerRunsOnlyStartableActions(t *testing.T) {
	clk := clock.RealClock{}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	var names []volume.UniqueName
	for _, uid := range []types.UID{"p1", "p2", "p3"} {
		name := volume.PodScopedName(emptydir.Name, uid, "scratch")
		names = append(names, name)
		dsw.SetPod(volume.PodInfo{PodRef: rcRef(uid)}, []cache.PodVolume{
			{Name: name, Plugin: emptydir.Name, OuterName: "scratch", Spec: emptyDirSpec("scratch", v1.StorageMediumDefault)},
		}, nil, nil)
	}
	exec := &fakeExecutor{busy: map[operations.Key]bool{{Volume: names[1], Pod: "p2"}: true}}
	h := &opHandler{}
	r := New(Options{DSW: dsw, ASW: asw, Executor: exec, Handler: h, Clock: clk})

	if actions := r.ReconcileOnce(); len(actions) != 3 {
		t.Fatalf("planned %q, want three mounts", rcActs(actions))
	}
	want := []string{
		"mount_volume " + string(names[0]) + " p1",
		"mount_volume " + string(names[2]) + " p3",
	}
	if !slices.Equal(h.built, want) {
		t.Errorf("built operations for %q, want %q (not for the busy key)", h.built, want)
	}
	if !slices.Equal(exec.ran, want) {
		t.Errorf("ran %q, want %q", exec.ran, want)
	}
}
