package ui

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/ui/model"
	"github.com/volume-agent/volume-agent/ui/timeline"
	"github.com/volume-agent/volume-agent/volume"
)

// bigNode is a node with pods pods of four mounted emptyDirs each, and
// their operations in the timeline.
func bigNode(pods int) model.Input {
	now := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(now)
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	ring := timeline.New(timeline.Options{Now: clk.Now})
	for i := range pods {
		ref := volume.PodRef{UID: types.UID(fmt.Sprintf("uid-%05d", i)), Namespace: fmt.Sprintf("ns-%d", i%20), Name: fmt.Sprintf("pod-%05d", i)}
		var vols []cache.PodVolume
		for j := range 4 {
			name := fmt.Sprintf("vol-%d", j)
			spec := &volume.Spec{Name: name, Volume: &v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}}}
			vols = append(vols, cache.PodVolume{Name: volume.PodScopedName("kubernetes.io/empty-dir", ref.UID, name), Plugin: "kubernetes.io/empty-dir", OuterName: name, Spec: spec})
		}
		dsw.SetPod(volume.PodInfo{PodRef: ref}, vols, nil, nil)
		for _, pv := range vols {
			asw.SetPodMount(cache.VolumeIdentity{Name: pv.Name, Plugin: pv.Plugin, Spec: pv.Spec}, cache.ActualPodMount{
				Pod: ref, SpecName: pv.Spec.Name, State: cache.Mounted, MountPath: "/var/lib/volume-agent/pods/" + string(ref.UID) + "/volumes/kubernetes.io~empty-dir/" + pv.Spec.Name,
			})
			ring.OperationFinished(operations.Key{Volume: pv.Name, Pod: ref.UID}, &operations.Operation{Name: operations.OpMountVolume, Target: operations.Target{Pod: volume.PodInfo{PodRef: ref}, Spec: pv.Spec}}, time.Millisecond, nil, 0)
		}
	}
	return model.Input{Now: now, Node: "node", Mode: "standalone", SourcesReady: true, DSW: dsw.Snapshot(), ASW: asw.Snapshot(), History: ring}
}

// BenchmarkRebuild is what one change costs while someone watches: the
// model and its fingerprint (once for every viewer).
func BenchmarkRebuild(b *testing.B) {
	for _, pods := range []int{100, 1000} {
		in := bigNode(pods)
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) {
			h := newHub(func() model.Input { return in }, time.Millisecond, time.Minute)
			b.ReportAllocs()
			for b.Loop() {
				h.current(true)
			}
		})
	}
}

// BenchmarkRenderMain is what each live view of the node's page costs per
// change.
func BenchmarkRenderMain(b *testing.B) {
	for _, pods := range []int{100, 1000} {
		page := model.Build(bigNode(pods))
		t := parseTemplates()
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) {
			b.ReportAllocs()
			var size int
			for b.Loop() {
				out, _, err := t.main(page, model.Filter{}, "/?watch=1", true)
				if err != nil {
					b.Fatal(err)
				}
				size = len(out)
			}
			b.ReportMetric(float64(size), "bytes/view")
		})
	}
}
