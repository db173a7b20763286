package volumestats

import (
	"sort"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/registry"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/volume"
)

// source says how a volume's stats are read.
type source int

const (
	// fromDriver: NodeGetVolumeStats of its CSI driver.
	fromDriver source = iota
	// fromFilesystem: statfs of the pod's mount of the volume.
	fromFilesystem
	// fromDevice: the size of the block device at the pod's access point.
	fromDevice
)

func (s source) String() string {
	switch s {
	case fromDriver:
		return "NodeGetVolumeStats"
	case fromFilesystem:
		return "statfs"
	default:
		return "block device size"
	}
}

type claimKey struct{ namespace, name string }

func (k claimKey) String() string { return k.namespace + "/" + k.name }

// job is reading one claim's stats.
type job struct {
	key    claimKey
	volume volume.UniqueName
	plugin string
	source source
	// path is the pod's mount (or access point) of the volume, the same
	// pod every round.
	path string
	// CSI volumes only.
	driver        *registry.Driver
	handle        string
	staging       string
	withCondition bool
	// pods are the volume's mounted pods, which get its health events.
	pods []podVolume
}

// podVolume is a pod that has the volume mounted.
type podVolume struct {
	pod      volume.PodRef
	specName string
}

// errorLabel is the driver label of the job's errors.
func (j job) errorLabel() string {
	if j.driver != nil {
		return j.driver.Name
	}
	return j.plugin
}

// plan picks the volumes to read and how, as the kubelet's volume stats
// do: every volume a pod has mounted (not uncertain) through a claim, one
// job per claim, with the same pod's path every round (the lowest UID):
//
//   - CSI persistent volumes of a registered driver with GET_VOLUME_STATS:
//     NodeGetVolumeStats with the pod's target (a Block volume's access
//     point), and the staging path when the driver stages;
//   - local volumes: statfs of the pod's mount, or for a Block volume the
//     size of the device at its access point;
//   - nothing else: hostPath persistent volumes have no stats in the
//     kubelet either, and inline volumes have no claim.
//
// drivers looks a CSI driver up; nil means none is registered.
func plan(snap *cache.ActualSnapshot, drivers func(name string) (*registry.Driver, bool)) []job {
	if snap == nil {
		return nil
	}
	names := make([]volume.UniqueName, 0, snap.VolumesLen())
	for n, v := range snap.Volumes() {
		if v.Plugin == csiplugin.Name || v.Plugin == local.Name {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	seen := map[claimKey]bool{}
	var jobs []job
	for _, n := range names {
		v := snap.Volume(n)
		m, pods := mountedClaimPods(v)
		if m == nil {
			continue
		}
		key := claimKey{m.Spec.PVC.Namespace, m.Spec.PVC.Name}
		if seen[key] {
			continue
		}
		j := job{key: key, volume: n, plugin: v.Plugin, path: m.MountPath, pods: pods}
		switch {
		case v.Plugin == local.Name && m.Spec.PV.Spec.Local != nil:
			j.source = fromFilesystem
			if m.Spec.IsBlock() {
				j.source = fromDevice
			}
		case v.Plugin == csiplugin.Name && m.Spec.PV.Spec.CSI != nil:
			if drivers == nil {
				continue
			}
			src := m.Spec.PV.Spec.CSI
			d, ok := drivers(src.Driver)
			if !ok || !d.VolumeStats {
				continue
			}
			j.source, j.driver, j.handle, j.withCondition = fromDriver, d, src.VolumeHandle, d.VolumeCondition
			if d.StageUnstage {
				j.staging = v.DeviceMountPath
			}
		default:
			continue
		}
		seen[key] = true
		jobs = append(jobs, j)
	}
	return jobs
}

// mountedClaimPods returns the pod mounts of v that are mounted and came
// through a claim, sorted by pod UID, and the first of them (nil if none).
func mountedClaimPods(v *cache.ActualVolume) (*cache.ActualPodMount, []podVolume) {
	var ms []*cache.ActualPodMount
	for _, m := range v.Pods.All() {
		if m.State != cache.Mounted || m.Spec == nil || m.Spec.PVC == nil || m.Spec.PV == nil || m.MountPath == "" {
			continue
		}
		ms = append(ms, m)
	}
	if len(ms) == 0 {
		return nil, nil
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Pod.UID < ms[j].Pod.UID })
	pods := make([]podVolume, len(ms))
	for i, m := range ms {
		pods[i] = podVolume{pod: m.Pod, specName: m.SpecName}
	}
	return ms[0], pods
}
