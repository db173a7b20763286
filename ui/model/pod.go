package model

import (
	"cmp"
	"slices"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

// MaxPodEvents bounds the events of a PodDetail.
const MaxPodEvents = 30

// BuildPod makes the detail view of the pod namespace/name, and reports
// whether the agent knows the pod (desired, or with volumes still
// mounted).
func BuildPod(in Input, namespace, name string) (*PodDetail, bool) {
	ix := index(in)
	var pod *Pod
	for _, p := range ix.pods() {
		if p.Namespace == namespace && p.Name == name {
			// A desired pod comes before an older one of the same name
			// being torn down (pods sorts by UID then; prefer desired).
			if pod == nil || pod.State == PodTerminating {
				p := p
				pod = &p
			}
		}
	}
	if pod == nil {
		return nil, false
	}
	d := &PodDetail{Node: in.Node, Now: in.Now, Pod: *pod, Mounts: []MountTree{}, Timeline: []TimelineEntry{}, Events: []events.Event{}}
	vols := map[volume.UniqueName]bool{}
	var names []volume.UniqueName
	for _, v := range pod.Volumes {
		if v.Volume != "" && !vols[v.Volume] {
			vols[v.Volume] = true
			names = append(names, v.Volume)
		}
		d.Mounts = append(d.Mounts, ix.mountTree(pod, v))
	}
	d.Operations = ix.operations(func(o operations.OperationStatus) bool {
		return vols[o.Volume] && (o.Pod == nil || o.Pod.UID == pod.UID)
	})
	byVolume := map[volume.UniqueName]string{}
	for _, v := range pod.Volumes {
		byVolume[v.Volume] = v.Name
	}
	for _, r := range ix.history(pod.UID, names) {
		d.Timeline = append(d.Timeline, TimelineEntry{Record: r, Name: cmp.Or(byVolume[r.Volume], r.SpecName, string(r.Volume))})
	}
	for i := len(in.Events) - 1; i >= 0 && len(d.Events) < MaxPodEvents; i-- {
		e := in.Events[i]
		if e.Object.Kind == "Pod" && e.Object.Namespace == namespace && e.Object.Name == name &&
			(e.Object.UID == "" || e.Object.UID == string(pod.UID)) {
			d.Events = append(d.Events, e)
		}
	}
	return d, true
}

// mountTree is how a volume reaches the pod, and which other pods share
// it.
func (ix *indexed) mountTree(pod *Pod, v PodVolume) MountTree {
	t := MountTree{Name: v.Name, State: v.State, Volume: v.Volume, GlobalMount: v.DeviceMountPath, Mounts: []PodMount{}}
	av := ix.ASW.Volume(v.Volume)
	var spec *volume.Spec
	if dv := ix.DSW.Volume(v.Volume); dv != nil {
		spec = dv.Spec
	} else if av != nil {
		spec = av.Spec
	}
	t.Origin = origin(spec, av, v)
	if av != nil {
		for _, m := range av.Pods.All() {
			t.Mounts = append(t.Mounts, PodMount{Pod: m.Pod, Path: m.MountPath, State: mountState(m), This: m.Pod.UID == pod.UID})
		}
	}
	if len(t.Mounts) == 0 || !slices.ContainsFunc(t.Mounts, func(m PodMount) bool { return m.This }) {
		t.Mounts = append(t.Mounts, PodMount{Pod: pod.PodRef, State: "not mounted", This: true})
	}
	slices.SortFunc(t.Mounts, func(a, b PodMount) int {
		if a.This != b.This {
			if a.This {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.Pod.Namespace, b.Pod.Namespace), cmp.Compare(a.Pod.Name, b.Pod.Name), cmp.Compare(a.Pod.UID, b.Pod.UID))
	})
	return t
}

func mountState(m *cache.ActualPodMount) string {
	if m.State == cache.Mounted {
		return "mounted"
	}
	return "uncertain"
}

// origin is where a volume's data comes from.
func origin(spec *volume.Spec, av *cache.ActualVolume, v PodVolume) string {
	if av != nil && av.DevicePath != "" {
		return av.DevicePath
	}
	switch {
	case spec == nil:
	case spec.PV != nil && spec.PV.Spec.Local != nil:
		return spec.PV.Spec.Local.Path
	case spec.PV != nil && spec.PV.Spec.CSI != nil:
		return "CSI " + spec.PV.Spec.CSI.Driver + " " + spec.PV.Spec.CSI.VolumeHandle
	case spec.Volume != nil && spec.Volume.HostPath != nil:
		return spec.Volume.HostPath.Path
	case spec.Volume != nil && spec.Volume.EmptyDir != nil:
		if spec.Volume.EmptyDir.Medium != "" {
			return "tmpfs"
		}
		return "directory on the node's disk"
	case spec.Volume != nil && spec.Volume.CSI != nil:
		return "CSI " + spec.Volume.CSI.Driver + " (ephemeral)"
	}
	return cmp.Or(v.Source, v.Plugin, "unresolved")
}
