package planner

import (
	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
)

// Relevant reports whether an operation key still concerns something the
// snapshots know of: for a pod's key, a pod that wants the volume or has it
// mounted (or may have); for a volume-wide key, a volume some pod wants or
// that is attached or mounted. It is a pure function of the snapshots.
func Relevant(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, key operations.Key) bool {
	if key.Pod == "" {
		actual := asw.Volume(key.Volume) != nil
		return actual || dsw.HasVolume(key.Volume)
	}
	if dsw.HasPodVolume(key.Volume, key.Pod) {
		return true
	}
	_, mounted := asw.PodMount(key.Volume, key.Pod)
	return mounted
}
