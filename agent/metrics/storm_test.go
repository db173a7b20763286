package metrics

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler"
	"github.com/volume-agent/volume-agent/volume"
)

// BenchmarkReconciledStorm is the metrics' share of a 1000 pods x 4
// volumes storm's reconciler passes: pods arrive 50 at a time, at most 64
// operations start per pass and finish before the next. "all" is the
// observer that walks every pod on every pass, "changed" the one the
// reconciler calls.
func BenchmarkReconciledStorm(b *testing.B) {
	const pods, vols, batch, limit = 1000, 4, 50, 64
	clk := clock.RealClock{}
	spec := &volume.Spec{Name: "v", Volume: &v1.Volume{Name: "v"}, Mode: v1.PersistentVolumeFilesystem}
	type pod struct {
		info volume.PodInfo
		vols []cache.PodVolume
	}
	all := make([]pod, pods)
	for i := range all {
		uid := types.UID(fmt.Sprintf("pod-%04d", i))
		all[i].info = volume.PodInfo{PodRef: volume.PodRef{UID: uid, Namespace: "ns", Name: string(uid)}}
		for j := range vols {
			outer := fmt.Sprintf("v%d", j)
			all[i].vols = append(all[i].vols, cache.PodVolume{Name: volume.PodScopedName("test", uid, outer), Plugin: "test", OuterName: outer, Spec: spec})
		}
	}
	for _, mode := range []string{"all", "changed"} {
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
				m := New()
				var obs reconciler.Observer = m
				if mode == "all" {
					obs = plainObserver{m}
				}
				h := &stormHandler{}
				r := reconciler.New(reconciler.Options{DSW: dsw, ASW: asw, Executor: stormExecutor{limit}, Handler: h, Clock: clk, Observer: obs})
				pass := func() int {
					r.ReconcileOnce()
					n := len(h.started)
					for _, t := range h.started {
						id := cache.VolumeIdentity{Name: t.Volume, Plugin: t.Plugin, Attributes: t.Attributes, Spec: t.Spec}
						switch t.op {
						case operations.OpMountVolume:
							asw.SetPodMount(id, cache.ActualPodMount{Pod: t.Pod.PodRef, SpecName: t.SpecName, MountPath: "/x", State: cache.Mounted, Spec: t.Spec})
						case operations.OpUnmountVolume:
							asw.DeletePodMount(t.Volume, t.Pod.UID)
						}
					}
					h.started = h.started[:0]
					return n
				}
				pass()
				for i := 0; i < pods; i += batch {
					dsw.Batch(func() {
						for _, p := range all[i : i+batch] {
							dsw.SetPod(p.info, p.vols, nil, nil)
						}
					})
					pass()
				}
				for pass() > 0 {
				}
				if n := len(m.ready.ready); n != pods && mode == "changed" {
					b.Fatalf("%d pods ready, want %d", n, pods)
				}
			}
		})
	}
}

// plainObserver hides ReconciledChanged: the reconciler calls Reconciled.
type plainObserver struct{ m *Metrics }

func (o plainObserver) Reconciled(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, actions []reconciler.Action, took time.Duration) {
	o.m.Reconciled(dsw, asw, actions, took)
}

// stormExecutor starts the first limit candidates of every pass.
type stormExecutor struct{ limit int }

func (stormExecutor) Mark() uint64 { return 0 }
func (e stormExecutor) Startable(cands []operations.Candidate, _ uint64) []bool {
	out := make([]bool, len(cands))
	for i := range out {
		out[i] = i < e.limit
	}
	return out
}
func (stormExecutor) Run(operations.Key, *operations.Operation) error { return nil }
func (stormExecutor) Forget(func(operations.Key) bool) int            { return 0 }
func (stormExecutor) Idle() <-chan struct{}                           { return nil }

type stormOp struct {
	op operations.Op
	operations.Target
}

// stormHandler records the targets of the operations it builds.
type stormHandler struct{ started []stormOp }

func (h *stormHandler) Operation(op operations.Op, t operations.Target) *operations.Operation {
	h.started = append(h.started, stormOp{op, t})
	return &operations.Operation{Name: op, Fn: func(context.Context) error { return nil }}
}

func (h *stormHandler) AdoptVolume(cache.VolumeIdentity, bool, map[types.UID]cache.ActualPodMount) {}
