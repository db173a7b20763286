package cache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/volume"
)

// contentDump shows what the ASW holds by value (not by pointer, which
// differs between two ASWs given the same writes) and checks its count of
// volumes with reconstructed state.
func contentDump(t *testing.T, a *ActualStateOfWorld) string {
	t.Helper()
	var out []string
	for i := range a.shards {
		sh := &a.shards[i]
		recon := 0
		for name, v := range sh.volumes {
			if v.hasReconstructed() {
				recon++
			}
			vv := *v
			vv.Pods, vv.Size = PodSet[ActualPodMount]{}, nil
			out = append(out, fmt.Sprintf("V %s %+v size=%s", name, vv, volume.SizeString(v.Size)))
			for uid, p := range v.Pods.All() {
				out = append(out, fmt.Sprintf("VP %s %s %+v", name, uid, *p))
			}
		}
		if recon != sh.reconstructed {
			t.Fatalf("shard %d counts %d volumes with reconstructed state, holds %d", i, sh.reconstructed, recon)
		}
	}
	slices.Sort(out)
	return fmt.Sprint(out)
}

// TestActualFastPathsOracle applies the same random writes to an ASW
// whose SetPodMount and DeletePodMount take their fast paths and to one
// that takes the simple versions: they must hold the same entries after
// every write, and a snapshot taken before a write must not change.
func TestActualFastPathsOracle(t *testing.T) {
	seeds := uint64(3)
	if testing.Short() {
		seeds = 1
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 31))
			fast, fclk := newASW()
			simple, sclk := newASW()
			simple.simple = true
			ids := make([]VolumeIdentity, 12)
			for i := range ids {
				ids[i] = VolumeIdentity{Name: volume.UniqueName(fmt.Sprintf("test/v%02d", i)), Plugin: "test",
					Attributes: volume.Attributes{DeviceMountable: i%3 == 0}, Spec: &volume.Spec{Name: fmt.Sprint("v", i)}}
				if i%4 == 1 {
					ids[i].Spec = nil // learnt from a later write
				}
			}
			pods := []string{"p1", "p2", "p3"}
			ops := 0
			for range 2500 {
				id := ids[rng.IntN(len(ids))]
				if rng.IntN(8) == 0 {
					id = VolumeIdentity{Name: id.Name} // an identity that knows nothing
				}
				pod := pods[rng.IntN(len(pods))]
				op := rng.IntN(10)
				state := []MountState{Mounted, MountUncertain}[rng.IntN(2)]
				recon := rng.IntN(6) == 0
				dev := []DeviceMountState{DeviceNotMounted, DeviceGloballyMounted, DeviceMountUncertain}[rng.IntN(3)]
				att := []AttachState{NotAttached, Attached, AttachUncertain}[rng.IntN(3)]
				step := time.Duration(rng.IntN(2))
				var before *ActualSnapshot
				var beforeDump string
				if rng.IntN(20) == 0 {
					before = fast.Snapshot()
					beforeDump = dumpActual(before)
				}
				for _, a := range []*ActualStateOfWorld{fast, simple} {
					switch op {
					case 0, 1, 2:
						m := mountOf(pod, state)
						m.Reconstructed = recon
						a.SetPodMount(id, m)
					case 3, 4, 5:
						a.DeletePodMount(id.Name, types.UID(pod))
					case 6:
						a.SetDeviceState(id, dev, "/dev/x", "")
					case 7:
						a.SetAttachState(id, att, "", nil)
					case 8:
						a.SetResizeBlocked(id.Name, "in use")
					case 9:
						a.AddReconstructed([]*ActualVolume{{Name: id.Name, Plugin: "test", DeviceState: dev, DeviceReconstructed: recon,
							Pods: PodSetOf(map[types.UID]*ActualPodMount{types.UID(pod): {Pod: testPod(pod).PodRef, State: MountUncertain, Reconstructed: true}})}})
					}
				}
				fclk.Step(1 + step)
				sclk.Step(1 + step)
				ops++
				if got, want := contentDump(t, fast), contentDump(t, simple); got != want {
					t.Fatalf("write %d (op %d): fast path differs from the simple version:\nfast:   %s\nsimple: %s", ops, op, got, want)
				}
				if fast.Snapshot().HasReconstructed() != simple.Snapshot().HasReconstructed() {
					t.Fatalf("write %d: HasReconstructed differs", ops)
				}
				if before != nil && dumpActual(before) != beforeDump {
					t.Fatalf("write %d (op %d): a snapshot changed after it was taken", ops, op)
				}
			}
		})
	}
}

// BenchmarkASWMountUnmount records and removes one pod's mount of each of
// 4000 volumes, as a storm of single-pod volumes does.
func BenchmarkASWMountUnmount(b *testing.B) {
	ids, uids := stormVolumes(4000)
	a, _ := newASW()
	b.ReportAllocs()
	for b.Loop() {
		for i, id := range ids {
			a.SetPodMount(id, ActualPodMount{Pod: volume.PodRef{UID: uids[i]}, State: Mounted})
		}
		for i, id := range ids {
			a.DeletePodMount(id.Name, uids[i])
		}
	}
}

// stormVolumes names n single-pod emptyDir volumes, four per pod, as a
// storm of pods with four volumes each has, and each volume's pod.
func stormVolumes(n int) ([]VolumeIdentity, []types.UID) {
	ids, uids := make([]VolumeIdentity, n), make([]types.UID, n)
	for i := range ids {
		uids[i] = types.UID(fmt.Sprint("pod", i/4))
		ids[i] = VolumeIdentity{Name: volume.UniqueName(fmt.Sprintf("kubernetes.io/empty-dir/pod%d-v%d", i/4, i%4)), Plugin: "kubernetes.io/empty-dir",
			Spec: &volume.Spec{Name: fmt.Sprint("v", i%4)}}
	}
	return ids, uids
}
