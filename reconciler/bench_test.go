package reconciler

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/volume"
)

// BenchmarkPassWhileBusy measures a pass in the middle of a storm: 4,000
// volumes wanted, none mounted yet, every operation still running, and one
// of them changed since the last pass.
func BenchmarkPassWhileBusy(b *testing.B) {
	clk := clock.RealClock{}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	exec := &fakeExecutor{busy: map[operations.Key]bool{}}
	setPod := func(i int) {
		uid := types.UID(fmt.Sprintf("pod-%04d", i))
		name := volume.PodScopedName(emptydir.Name, uid, "scratch")
		dsw.SetPod(volume.PodInfo{PodRef: rcRef(uid)}, []cache.PodVolume{
			{Name: name, Plugin: emptydir.Name, OuterName: "scratch", Spec: emptyDirSpec("scratch", v1.StorageMediumDefault)},
		}, nil, nil)
		exec.busy[operations.Key{Volume: name, Pod: uid}] = true
	}
	for i := range 4000 {
		setPod(i)
	}
	r := New(Options{DSW: dsw, ASW: asw, Executor: exec, Handler: &opHandler{}, Clock: clk})
	r.ReconcileOnce()
	b.ReportAllocs()
	for b.Loop() {
		dsw.DeletePod("pod-0000")
		setPod(0)
		if n := len(r.ReconcileOnce()); n != 4000 {
			b.Fatalf("%d actions, want 4000", n)
		}
	}
}
