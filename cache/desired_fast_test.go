package cache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/volume"
)

// dumpDesiredFull is dumpDesired with what it leaves out: sub-paths and
// content generations.
func dumpDesiredFull(s *DesiredSnapshot) string {
	out := []string{dumpDesired(s)}
	for name, v := range s.Volumes() {
		for uid, p := range v.Pods.All() {
			out = append(out, fmt.Sprintf("VPX %s %s %v %d", name, uid, p.SubPaths, p.ContentGeneration))
		}
	}
	slices.Sort(out[1:])
	return fmt.Sprint(out)
}

// TestDesiredDedupeOracle sets random pods, some with the same volume under
// two names, on a DSW that finds repeats by looking through the pod's
// volumes and on one that keeps a map (dedupeScanMax -1): both must hold
// the same after every change.
func TestDesiredDedupeOracle(t *testing.T) {
	saved := dedupeScanMax
	t.Cleanup(func() { dedupeScanMax = saved })
	seeds := uint64(3)
	if testing.Short() {
		seeds = 1
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 30))
			scan, sclk := newDSW()
			mapped, mclk := newDSW()
			pvs := []PodVolume{localPV(newPV("a", "1Gi"), ""), localPV(newPV("b", "1Gi"), ""), localPV(newPV("c", "2Gi"), "")}
			pvs[2].Attributes.RequiresRemount = true
			pods := []string{"p1", "p2", "p3", "p4"}
			for op := range 1500 {
				uid := pods[rng.IntN(len(pods))]
				var vols []PodVolume
				if rng.IntN(8) != 0 {
					for k := range rng.IntN(24) {
						var pv PodVolume
						if rng.IntN(2) == 0 {
							pv = pvs[rng.IntN(len(pvs))]
						} else {
							pv = emptyDir(uid, fmt.Sprint("e", rng.IntN(4)))
						}
						pv.OuterName = fmt.Sprint("o", k)
						if rng.IntN(3) == 0 {
							pv.SubPaths = []volume.SubPath{{Container: fmt.Sprint("c", rng.IntN(2)), Path: fmt.Sprint("d", rng.IntN(3))}}
						}
						vols = append(vols, pv)
					}
				}
				del := rng.IntN(10) == 0
				var got [2]bool
				for i, d := range []*DesiredStateOfWorld{scan, mapped} {
					dedupeScanMax = []int{saved, -1}[i]
					if del {
						got[i] = d.DeletePod(types.UID(uid))
					} else {
						got[i] = d.SetPod(testPod(uid), vols, nil, nil)
					}
				}
				dedupeScanMax = saved
				sclk.Step(1)
				mclk.Step(1)
				if got[0] != got[1] {
					t.Fatalf("op %d: changed = %v scanning, %v with a map", op, got[0], got[1])
				}
				if a, b := dumpDesiredFull(scan.Snapshot()), dumpDesiredFull(mapped.Snapshot()); a != b {
					t.Fatalf("op %d: scanning differs from the map:\nscan: %s\nmap:  %s", op, a, b)
				}
			}
		})
	}
}

// BenchmarkDSWSetDeletePods sets 1000 pods of 4 emptyDir volumes each and
// deletes them, as a storm does.
func BenchmarkDSWSetDeletePods(b *testing.B) {
	type pod struct {
		info volume.PodInfo
		vols []PodVolume
	}
	pods := make([]pod, 1000)
	for i := range pods {
		uid := fmt.Sprint("pod", i)
		pods[i].info = testPod(uid)
		for k := range 4 {
			pods[i].vols = append(pods[i].vols, emptyDir(uid, fmt.Sprint("v", k)))
		}
	}
	d, _ := newDSW()
	b.ReportAllocs()
	for b.Loop() {
		for _, p := range pods {
			d.SetPod(p.info, p.vols, nil, nil)
		}
		for _, p := range pods {
			d.DeletePod(p.info.UID)
		}
	}
}
