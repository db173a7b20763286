package cache

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/volume"
)

// liveDump is what the ASW holds right now, read from its shards as the
// simple version of Snapshot would copy it.
func liveDump(a *ActualStateOfWorld) (string, bool) {
	vols := map[volume.UniqueName]*ActualVolume{}
	for i := range a.shards {
		for k, v := range a.shards[i].volumes {
			vols[k] = v
		}
	}
	s := NewActualSnapshot(vols, a.generation.Load())
	return dumpActual(s), s.HasReconstructed()
}

// TestActualSnapshotOracle applies random writes and takes snapshots in
// between (rarely in some phases, so that a shard's list of changes runs
// past its limit): each snapshot must equal what the ASW held when it was
// taken, and must still equal it after every later write.
func TestActualSnapshotOracle(t *testing.T) {
	seeds := uint64(2)
	if testing.Short() {
		seeds = 1
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 30))
			a, clk := newASW()
			names := make([]VolumeIdentity, 40)
			for i := range names {
				names[i] = VolumeIdentity{Name: volume.UniqueName(fmt.Sprintf("test/v%02d", i)), Plugin: "test",
					Attributes: volume.Attributes{DeviceMountable: i%3 == 0}, Spec: &volume.Spec{Name: fmt.Sprint("v", i)}}
			}
			pods := []string{"p1", "p2", "p3"}
			type taken struct {
				s     *ActualSnapshot
				dump  string
				recon bool
			}
			var snaps []taken
			for phase := range 6 {
				// Snapshot every few writes, or seldom enough for a list
				// to pass its limit (256 + 2 * live per shard).
				every := []int{1, 3, 20, 12000, 5, 700}[phase]
				writes := []int{300, 600, 2000, 13000, 1000, 2000}[phase]
				for range writes {
					id := names[rng.IntN(len(names))]
					pod := pods[rng.IntN(len(pods))]
					clk.Step(1)
					switch rng.IntN(9) {
					case 0, 1:
						a.SetPodMount(id, mountOf(pod, []MountState{Mounted, MountUncertain}[rng.IntN(2)]))
					case 2, 3:
						a.DeletePodMount(id.Name, types.UID(pod))
					case 4:
						a.SetDeviceState(id, []DeviceMountState{DeviceNotMounted, DeviceGloballyMounted, DeviceMountUncertain}[rng.IntN(3)], "/dev/x", "")
					case 5:
						a.SetAttachState(id, []AttachState{NotAttached, Attached}[rng.IntN(2)], "", nil)
					case 6:
						q := resource.MustParse(fmt.Sprint(rng.IntN(4)+1, "Gi"))
						a.SetSize(id.Name, &q)
					case 7:
						a.SetSubPaths(id.Name, types.UID(pod), []volume.SubPath{{Path: fmt.Sprint("d", rng.IntN(3))}})
					case 8:
						if rng.IntN(2) == 0 {
							a.AddReconstructed([]*ActualVolume{{Name: id.Name, Plugin: "test", DeviceState: DeviceNotMounted,
								Pods: PodSetOf(map[types.UID]*ActualPodMount{types.UID(pod): {Pod: testPod(pod).PodRef, State: MountUncertain, Reconstructed: true}})}})
						} else {
							a.Adopt(id, true, map[types.UID]ActualPodMount{types.UID(pod): {Pod: testPod(pod).PodRef}})
						}
					}
					if rng.IntN(every) == 0 {
						s := a.Snapshot()
						if len(snaps) > 0 && snaps[len(snaps)-1].s == s {
							continue
						}
						dump, recon := liveDump(a)
						if got := dumpActual(s); got != dump {
							t.Fatalf("phase %d: snapshot differs from the ASW:\ngot:  %s\nwant: %s", phase, got, dump)
						}
						if s.HasReconstructed() != recon {
							t.Fatalf("phase %d: HasReconstructed = %v, want %v", phase, s.HasReconstructed(), recon)
						}
						snaps = append(snaps, taken{s, dump, recon})
					}
				}
				if phase != 3 && phase != 5 {
					continue // earlier snapshots are checked after the long phase and at the end
				}
				for i, tk := range snaps {
					if got := dumpActual(tk.s); got != tk.dump {
						t.Fatalf("phase %d: snapshot %d changed after it was taken:\ngot:  %s\nwant: %s", phase, i, got, tk.dump)
					}
				}
			}
			if len(snaps) < 300 {
				t.Fatalf("only %d snapshots taken", len(snaps))
			}
		})
	}
}
