package planner

import (
	"sort"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/volume"
)

// Adoption confirms reconstructed state that pods want, in the terms of
// the ASW's Adopt.
type Adoption struct {
	// ID is what the desired state says of the volume: it replaces what
	// was guessed from disk.
	ID cache.VolumeIdentity
	// Device: the device mount was in place.
	Device bool
	// Pods whose mounts were in place (or need none), with the pod and the
	// spec they want.
	Pods map[types.UID]cache.ActualPodMount
}

// Adoptions matches reconstructed state with what pods want: a device mount
// that was found mounted, for a volume a pod wants, is adopted as mounted; a
// pod mount that was found mounted (or, for volumes set up without a mount,
// found at all), for a pod that wants it, is adopted as mounted. Adopting
// runs no operation: the volume is neither mounted again (no stacked
// mounts) nor unmounted. It is a pure function of the snapshots.
func Adoptions(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, setUpWithoutMount func(plugin string, spec *volume.Spec) bool) []Adoption {
	var out []Adoption
	for name, av := range asw.Volumes() {
		dv := dsw.Volume(name)
		wanted := dv != nil
		if !wanted {
			continue
		}
		a := Adoption{ID: cache.VolumeIdentity{Name: name, Plugin: dv.Plugin, Attributes: dv.Attributes, Spec: dv.Spec},
			Device: av.DeviceReconstructed && av.DeviceFoundMounted}
		for uid, m := range av.Pods.All() {
			dp, ok := dv.Pods.Get(uid)
			if !ok || !m.Reconstructed {
				continue
			}
			if m.FoundMounted || (setUpWithoutMount != nil && setUpWithoutMount(av.Plugin, dp.Spec)) {
				if a.Pods == nil {
					a.Pods = map[types.UID]cache.ActualPodMount{}
				}
				a.Pods[uid] = cache.ActualPodMount{Pod: dp.Pod.PodRef, Spec: dp.Spec}
			}
		}
		if a.Device || len(a.Pods) > 0 {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID.Name < out[j].ID.Name })
	return out
}
