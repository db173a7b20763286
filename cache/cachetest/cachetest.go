// Package cachetest builds the actual-state values tests expect of a
// restart: what reconstruction finds on disk, in the shape the ASW holds
// it. Planner and housekeeping tests share it.
package cachetest

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/volume"
)

// ReconstructedPod is a pod mount found on disk after a restart.
func ReconstructedPod(uid types.UID, specName, path string, foundMounted bool) *cache.ActualPodMount {
	return &cache.ActualPodMount{
		Pod: volume.PodRef{UID: uid}, SpecName: specName, MountPath: path,
		State: cache.MountUncertain, Reconstructed: true, FoundMounted: foundMounted,
	}
}

// ReconstructedVolume is a volume found on disk without a device mount.
func ReconstructedVolume(name volume.UniqueName, plugin string, attrs volume.Attributes, pods ...*cache.ActualPodMount) *cache.ActualVolume {
	v := &cache.ActualVolume{Name: name, Plugin: plugin, Attributes: attrs, DeviceState: cache.DeviceNotMounted,
		Pods: cache.PodSet[cache.ActualPodMount]{}}
	for _, p := range pods {
		v.Pods = v.Pods.With(p.Pod.UID, p)
	}
	return v
}

// JSON renders v for a failure message.
func JSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}
