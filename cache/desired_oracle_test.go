package cache

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/volume"
)

// desiredFull is the simple version of the DSW's Snapshot: a full copy of
// its maps.
func desiredFull(d *DesiredStateOfWorld) *DesiredSnapshot {
	return NewDesiredSnapshot(maps.Clone(d.volumes), maps.Clone(d.pods), d.generation)
}

// sameDesired compares a snapshot with the full copy entry by entry
// (pointers, so a stale entry is caught), through every accessor.
func sameDesired(s, want *DesiredSnapshot, names []volume.UniqueName, uids []types.UID) error {
	if s.VolumesLen() != want.VolumesLen() || s.PodsLen() != want.PodsLen() {
		return fmt.Errorf("holds %d volumes, %d pods; want %d, %d", s.VolumesLen(), s.PodsLen(), want.VolumesLen(), want.PodsLen())
	}
	if got, w := maps.Collect(s.Volumes()), maps.Collect(want.Volumes()); !maps.Equal(got, w) || len(got) != s.VolumesLen() {
		return fmt.Errorf("volumes differ: %d listed, want %d", len(got), len(w))
	}
	if got, w := maps.Collect(s.Pods()), maps.Collect(want.Pods()); !maps.Equal(got, w) || len(got) != s.PodsLen() {
		return fmt.Errorf("pods differ: %d listed, want %d", len(got), len(w))
	}
	for _, n := range names {
		if s.Volume(n) != want.Volume(n) {
			return fmt.Errorf("volume %s: %p, want %p", n, s.Volume(n), want.Volume(n))
		}
	}
	for _, u := range uids {
		if s.Pod(u) != want.Pod(u) {
			return fmt.Errorf("pod %s: %p, want %p", u, s.Pod(u), want.Pod(u))
		}
	}
	return nil
}

// TestDesiredSnapshotOracle applies random changes and takes snapshots in
// between (rarely in one phase, so that the list of changes runs past its
// limit; after many small changes, so that views fold): each snapshot
// must equal a full copy of the DSW when it was taken, and still equal it
// after every later change.
func TestDesiredSnapshotOracle(t *testing.T) {
	seeds := uint64(2)
	if testing.Short() {
		seeds = 1
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 30))
			d, clk := newDSW()
			var uids []types.UID
			for i := range 60 {
				uids = append(uids, types.UID(fmt.Sprintf("p%02d", i)))
			}
			var pvs []*v1.PersistentVolume
			for i := range 8 {
				pvs = append(pvs, newPV(fmt.Sprint("pv", i), "1Gi"))
			}
			// The names a pod may want: its own emptyDirs and the shared PVs.
			wants := func(uid types.UID) []PodVolume {
				var out []PodVolume
				for j := range 3 {
					if rng.IntN(2) == 0 {
						pv := emptyDir(string(uid), fmt.Sprint("e", j))
						pv.Attributes.RequiresRemount = j == 0
						out = append(out, pv)
					}
				}
				if rng.IntN(2) == 0 {
					out = append(out, localPV(pvs[rng.IntN(len(pvs))], "data"))
				}
				return out
			}
			var names []volume.UniqueName
			for _, u := range uids {
				for j := range 3 {
					names = append(names, emptyDir(string(u), fmt.Sprint("e", j)).Name)
				}
			}
			for _, p := range pvs {
				names = append(names, localPV(p, "data").Name)
			}
			type taken struct {
				s, want *DesiredSnapshot
			}
			var snaps []taken
			// The last phase mostly deletes, so that a view holds under a
			// quarter of what its base was made for.
			for phase := range 6 {
				every := []int{1, 4, 30, 3000, 2, 2}[phase]
				changes := []int{400, 800, 1500, 3000, 1500, 300}[phase]
				for range changes {
					uid := uids[rng.IntN(len(uids))]
					clk.Step(1)
					op := rng.IntN(6)
					if phase == 5 && op < 3 {
						op = 3
					}
					switch op {
					case 0, 1, 2:
						d.SetPod(testPod(string(uid)), wants(uid), nil, nil)
					case 3, 4:
						d.DeletePod(uid)
					case 5:
						d.RefreshPodVolume(emptyDir(string(uid), "e0").Name, uid)
					}
					if rng.IntN(every) != 0 {
						continue
					}
					s := d.Snapshot()
					want := desiredFull(d)
					if err := sameDesired(s, want, names, uids); err != nil {
						t.Fatalf("phase %d: snapshot differs from the DSW: %v", phase, err)
					}
					if dumpDesired(s) != dumpDesired(want) {
						t.Fatalf("phase %d: snapshot differs from the DSW:\ngot:  %s\nwant: %s", phase, dumpDesired(s), dumpDesired(want))
					}
					snaps = append(snaps, taken{s, want})
				}
				for i, tk := range snaps {
					if err := sameDesired(tk.s, tk.want, names, uids); err != nil {
						t.Fatalf("phase %d: snapshot %d changed after it was taken: %v", phase, i, err)
					}
				}
			}
			if len(snaps) < 300 {
				t.Fatalf("only %d snapshots taken", len(snaps))
			}
		})
	}
}
