package podstatus_test

import (
	"fmt"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/volume"
)

// BenchmarkReconciled is the reporter's share of a reconciler pass: every
// pod's condition computed from the snapshots, 2,000 pods of 4 volumes.
func BenchmarkReconciled(b *testing.B) {
	for _, mounted := range []string{"all", "none", "half"} {
		b.Run("mounted="+mounted, func(b *testing.B) {
			pods := map[types.UID]*cache.DesiredPod{}
			vols := map[volume.UniqueName]*cache.ActualVolume{}
			for i := range 2000 {
				ref := volume.PodRef{UID: types.UID(fmt.Sprintf("uid-%04d", i)), Namespace: "ns", Name: fmt.Sprintf("pod-%04d", i)}
				p := &cache.DesiredPod{Pod: volume.PodInfo{PodRef: ref}}
				for j := range 4 {
					name := fmt.Sprintf("v%d", j)
					vol := volume.PodScopedName(plugin, ref.UID, name)
					p.Volumes = append(p.Volumes, vol)
					if mounted == "all" || (mounted == "half" && j%2 == 0) {
						vols[vol] = &cache.ActualVolume{Name: vol, Pods: cache.PodSetOf(map[types.UID]*cache.ActualPodMount{
							ref.UID: {Pod: ref, SpecName: name, State: cache.Mounted},
						})}
					}
				}
				pods[ref.UID] = p
			}
			dsw, asw := cache.NewDesiredSnapshot(nil, pods, 0), cache.NewActualSnapshot(vols, 0)
			r := podstatus.New(podstatus.Options{Patcher: newRecorder(), Errors: lastErrors{}, Log: zap.NewNop(),
				GetPod: func(string, string) (*v1.Pod, bool) { return nil, false }})
			r.Reconciled(dsw, asw, nil, 0)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				r.Reconciled(dsw, asw, nil, 0)
			}
		})
	}
}
