package cache

import (
	"testing"

	"github.com/volume-agent/volume-agent/volume"
)

// BenchmarkASWWritesWithPasses mounts and unmounts 4000 single-pod volumes
// as BenchmarkASWMountUnmount does, with a reconciler pass's TakeChanges
// and Snapshot every 16 writes, so that the changes are recorded.
func BenchmarkASWWritesWithPasses(b *testing.B) {
	ids, uids := stormVolumes(4000)
	a, _ := newASW()
	n := 0
	pass := func() {
		if n++; n%16 == 0 {
			a.TakeChanges().Each(func(volume.UniqueName) {})
			a.Snapshot()
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		for i, id := range ids {
			a.SetPodMount(id, ActualPodMount{Pod: volume.PodRef{UID: uids[i]}, State: MountUncertain})
			pass()
			a.SetPodMount(id, ActualPodMount{Pod: volume.PodRef{UID: uids[i]}, State: Mounted})
			pass()
		}
		for i, id := range ids {
			a.DeletePodMount(id.Name, uids[i])
			pass()
		}
	}
}
