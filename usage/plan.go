package usage

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/volume"
)

// Kind is what a measured volume is; it decides how it is measured.
type Kind string

const (
	// DiskEmptyDir: an emptyDir on the node's disk (medium ""): a cheap
	// source if one backs it, else a walk. It counts towards the pod's
	// ephemeral storage, as in the kubelet.
	DiskEmptyDir Kind = "emptyDir"
	// MemoryEmptyDir: a tmpfs of its own; statfs says what it holds.
	MemoryEmptyDir Kind = "emptyDir (Memory)"
	// HostPath: a directory of the host, walked (only when asked).
	HostPath Kind = "hostPath"
)

// Target is one pod volume to measure.
type Target struct {
	Pod volume.PodRef
	// Volume is the pod's name for the volume.
	Volume string
	Unique volume.UniqueName
	Kind   Kind
	// Path is the pod's mount of the volume.
	Path string
	// Limit is the emptyDir's sizeLimit in bytes; 0 when it has none.
	Limit int64
}

// key identifies a target's results from round to round.
type key struct {
	pod    types.UID
	volume string
}

func (t Target) key() key { return key{t.Pod.UID, t.Volume} }

// Targets lists what to measure, in a stable order: every emptyDir a pod
// has mounted (not uncertain) and, with hostPath, every hostPath volume.
// Volumes of other kinds are the drivers' (status/volumestats) or hold what
// the agent wrote (API volumes).
func Targets(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, hostPath bool) []Target {
	if dsw == nil || asw == nil {
		return nil
	}
	var out []Target
	for name, dv := range dsw.Volumes() {
		if dv.Plugin != emptydir.Name && (dv.Plugin != hostpath.Name || !hostPath) {
			continue
		}
		av := asw.Volume(name)
		if av == nil {
			continue
		}
		for uid, dpv := range dv.Pods.All() {
			m := av.Pods.At(uid)
			if m == nil || m.State != cache.Mounted || m.MountPath == "" || len(dpv.OuterNames) == 0 {
				continue
			}
			t := Target{Pod: dpv.Pod.PodRef, Volume: slices.Min(dpv.OuterNames), Unique: name, Path: m.MountPath, Kind: HostPath}
			if dv.Plugin == emptydir.Name {
				t.Kind = DiskEmptyDir
				if s := dpv.Spec; s != nil && s.Volume != nil && s.Volume.EmptyDir != nil {
					ed := s.Volume.EmptyDir
					if ed.Medium != v1.StorageMediumDefault {
						t.Kind = MemoryEmptyDir
					}
					if ed.SizeLimit != nil && ed.SizeLimit.Sign() > 0 {
						t.Limit = ed.SizeLimit.Value()
					}
				}
			}
			out = append(out, t)
		}
	}
	slices.SortFunc(out, compareTargets)
	return out
}

func compareTargets(a, b Target) int {
	return cmp.Or(cmp.Compare(a.Pod.Namespace, b.Pod.Namespace), cmp.Compare(a.Pod.Name, b.Pod.Name),
		cmp.Compare(a.Pod.UID, b.Pod.UID), cmp.Compare(a.Volume, b.Volume))
}

// schedule orders a round: the targets never measured first, then those
// measured longest ago, so that a round cut short by its budget or a
// deadline goes on next time where it stopped. Cheap targets (statfs of a
// tmpfs, or a cheap source: tried first for every target anyway) cost
// nothing worth ordering by.
func schedule(targets []Target, last map[key]time.Time) []Target {
	out := slices.Clone(targets)
	slices.SortStableFunc(out, func(a, b Target) int {
		ta, tb := last[a.key()], last[b.key()]
		return ta.Compare(tb)
	})
	return out
}

// Over is a pod or volume over its limit, with the figures. The warning's
// message is the kubelet's eviction message, the same from round to round
// (the figures change; the pod's condition should not).
type Over struct {
	explain.Warning
	Used, Limit int64
}

// overLimits decides, as the kubelet's eviction manager does
// (emptyDirLimitEviction, podEphemeralStorageLimitEviction), which pods
// use more local storage than they may: an emptyDir whose usage exceeds
// its sizeLimit, and a pod whose local ephemeral volumes (its disk
// emptyDirs) together exceed its ephemeral-storage limit. The kubelet adds
// the containers' writable layers and logs to the pod's sum; those are the
// runtime's, which the agent does not see. Only measured volumes count:
// one not measured yet is not assumed full or empty. limits gives each
// pod's ephemeral-storage limit (nil: none).
func overLimits(targets []Target, results map[key]*Result, limits func(types.UID) *resource.Quantity) map[types.UID][]Over {
	out := map[types.UID][]Over{}
	sums := map[types.UID]int64{}
	pods := map[types.UID]volume.PodRef{}
	for _, t := range targets {
		r := results[t.key()]
		if r == nil || !r.Measured() {
			continue
		}
		if t.Kind == DiskEmptyDir || t.Kind == MemoryEmptyDir {
			if t.Limit > 0 && r.UsedBytes > t.Limit {
				out[t.Pod.UID] = append(out[t.Pod.UID], Over{Used: r.UsedBytes, Limit: t.Limit, Warning: explain.Warning{
					Volume: t.Volume, Reason: explain.ReasonEmptyDirOverLimit,
					Message: fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q.", t.Volume, quantity(t.Limit)),
				}})
			}
		}
		if t.Kind == DiskEmptyDir {
			sums[t.Pod.UID] += r.UsedBytes
			pods[t.Pod.UID] = t.Pod
		}
	}
	for uid, used := range sums {
		l := limits(uid)
		if l == nil || used <= l.Value() {
			continue
		}
		out[uid] = append(out[uid], Over{Used: used, Limit: l.Value(), Warning: explain.Warning{
			Reason:  explain.ReasonEphemeralStorageOverLimit,
			Message: fmt.Sprintf("Pod ephemeral local storage usage exceeds the total limit of containers %s.", l.String()),
		}})
	}
	for uid := range out {
		slices.SortFunc(out[uid], func(a, b Over) int { return cmp.Compare(a.Volume, b.Volume) })
	}
	return out
}

// quantity is n bytes as the kubelet prints sizes (1Gi, 17Mi, 1500).
func quantity(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }
