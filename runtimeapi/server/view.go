package server

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/volume"
)

// Errors gives the last error of an operation key in backoff (the
// executor).
type Errors interface {
	LastError(key operations.Key) error
}

// hostPathPlugin binds host paths, which are never relabelled.
const hostPathPlugin = "kubernetes.io/host-path"

// View is what the API says about one pod, from a pair of snapshots: a pure
// function, so the same snapshots that make the pod's VolumesReady
// condition True make Ready true (both are cache.PodReady).
func View(p *cache.DesiredPod, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, errs Errors, paths volume.Paths) *runtimeapi.Pod {
	uid := p.Pod.UID
	out := &runtimeapi.Pod{
		APIVersion: runtimeapi.Version, UID: string(uid), Namespace: p.Pod.Namespace, Name: p.Pod.Name,
		Ready: cache.PodReady(p, dsw, asw), Volumes: []runtimeapi.Volume{}, Containers: []runtimeapi.Container{},
	}
	byName := map[string]*volumeView{}
	for _, name := range usedVolumes(p.Containers) {
		v := viewVolume(p, name, dsw, asw, errs, paths)
		byName[name] = v
		out.Volumes = append(out.Volumes, v.Volume)
	}
	for _, c := range p.Containers {
		rc := runtimeapi.Container{Name: c.Name, Type: string(c.Type)}
		for _, m := range c.Mounts {
			v := byName[m.Volume]
			rm := runtimeapi.Mount{
				Volume: m.Volume, ContainerPath: m.MountPath, ReadOnly: m.ReadOnly || v.ReadOnly, SubPath: m.SubPath,
				Propagation: "None", SELinuxRelabel: v.SELinuxRelabel,
			}
			if m.Propagation != "" {
				rm.Propagation = string(m.Propagation)
			}
			if m.RecursiveReadOnly != nil {
				rm.RecursiveReadOnly = string(*m.RecursiveReadOnly)
			}
			if v.Ready && m.SubPathError == "" {
				rm.HostPath = v.HostPath
				if m.SubPath != "" {
					rm.HostPath = paths.SubPathTarget(uid, v.Plugin, v.specName, c.Name, m.Index)
				}
			}
			rc.Mounts = append(rc.Mounts, rm)
		}
		for _, d := range c.Devices {
			v := byName[d.Volume]
			rd := runtimeapi.Device{Volume: d.Volume, ContainerPath: d.DevicePath, ReadOnly: v.ReadOnly, Permissions: "mrw"}
			if v.ReadOnly {
				rd.Permissions = "r"
			}
			if v.Ready {
				rd.HostPath = v.DevicePath
			}
			rc.Devices = append(rc.Devices, rd)
		}
		out.Containers = append(out.Containers, rc)
	}
	if !out.Ready {
		out.Message = notReadyMessage(out.Volumes, podProblems(p, byName))
	}
	return out
}

// podProblems are the pod's errors that name none of its used volumes (a
// pod UID that cannot be a directory name, say).
func podProblems(p *cache.DesiredPod, used map[string]*volumeView) []string {
	var out []string
	for _, e := range p.Errors {
		if _, ok := used[e.Volume]; !ok {
			out = append(out, e.Error())
		}
	}
	return out
}

// volumeView is a volume of the API with what the container mounts need.
type volumeView struct {
	runtimeapi.Volume
	specName string
}

// usedVolumes lists the pod volume names its containers use, sorted: the
// volumes the pod waits for (the kubelet's WaitForAttachAndMount).
func usedVolumes(containers []volume.Container) []string {
	var names []string
	for _, c := range containers {
		for _, m := range c.Mounts {
			names = append(names, m.Volume)
		}
		for _, d := range c.Devices {
			names = append(names, d.Volume)
		}
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// viewVolume says where one pod volume stands.
func viewVolume(p *cache.DesiredPod, name string, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, errs Errors, paths volume.Paths) *volumeView {
	v := &volumeView{Volume: runtimeapi.Volume{Name: name, VolumeMode: runtimeapi.Filesystem}}
	uid := p.Pod.UID
	dv, dp := desiredVolume(p, name, dsw)
	if dv != nil {
		v.Plugin, v.specName = dv.Plugin, dv.SpecName
		v.ReadOnly = (dp.Spec != nil && dp.Spec.ReadOnly) || volume.ReadOnlyForContainers(dv.Plugin)
		if dp.Spec != nil && dp.Spec.IsBlock() {
			v.VolumeMode = runtimeapi.Block
		}
		v.SELinuxRelabel = v.VolumeMode == runtimeapi.Filesystem && dv.Plugin != hostPathPlugin
	}
	// Problems with the pod's spec or the objects it refers to come
	// first: they need a change, not time.
	var problems []string
	for _, e := range p.Errors {
		if e.Volume == name {
			if v.Reason == "" {
				v.Reason = e.Reason
			}
			problems = append(problems, e.Err.Error())
		}
	}
	if len(problems) > 0 {
		v.Message = strings.Join(problems, "; ")
		return v
	}
	if dv == nil {
		// Not resolved and no error: the populator has not got to it.
		v.Reason, v.Message = runtimeapi.ReasonWaitingForMount, "not resolved yet"
		return v
	}
	av := asw.Volumes[dv.Name]
	var m *cache.ActualPodMount
	if av != nil {
		m = av.Pods[uid]
	}
	if cache.PodVolumeReady(dp.SubPaths, m) {
		v.Ready = true
		if v.VolumeMode == runtimeapi.Block {
			v.DevicePath = m.MountPath
		} else {
			v.HostPath = m.MountPath
		}
		return v
	}
	podErr := lastError(errs, operations.Key{Volume: dv.Name, Pod: uid})
	switch {
	case m != nil && m.State == cache.Mounted:
		v.Reason, v.Message = runtimeapi.ReasonWaitingForSubPaths, fmt.Sprintf("%d sub-paths to prepare", len(dp.SubPaths))
		if podErr != nil {
			v.Reason, v.Message = runtimeapi.ReasonSubPathFailed, podErr.Error()
		}
	case podErr != nil:
		v.Reason, v.Message = runtimeapi.ReasonMountFailed, podErr.Error()
	case lastError(errs, operations.Key{Volume: dv.Name}) != nil:
		v.Reason, v.Message = runtimeapi.ReasonMountFailed, lastError(errs, operations.Key{Volume: dv.Name}).Error()
	case cache.AttachNeeded(dv.Attributes, av):
		v.Reason = runtimeapi.ReasonWaitingForAttach
	case cache.DeviceMountNeeded(dv.Attributes, av):
		v.Reason = runtimeapi.ReasonWaitingForDevice
	default:
		v.Reason = runtimeapi.ReasonWaitingForMount
		if m != nil {
			v.Message = "mount " + string(m.State)
		}
	}
	return v
}

// desiredVolume finds the desired volume a pod volume name resolved to.
func desiredVolume(p *cache.DesiredPod, name string, dsw *cache.DesiredSnapshot) (*cache.DesiredVolume, *cache.DesiredPodVolume) {
	for _, u := range p.Volumes {
		dv := dsw.Volumes[u]
		if dv == nil {
			continue
		}
		if dp := dv.Pods[p.Pod.UID]; dp != nil && slices.Contains(dp.OuterNames, name) {
			return dv, dp
		}
	}
	return nil, nil
}

func lastError(errs Errors, key operations.Key) error {
	if errs == nil {
		return nil
	}
	return errs.LastError(key)
}

// notReadyMessage lists the volumes that are not ready and why, like the
// kubelet's "unmounted volumes=[...]" but with each volume's reason.
func notReadyMessage(vols []runtimeapi.Volume, podProblems []string) string {
	parts := podProblems
	for _, v := range vols {
		if v.Ready {
			continue
		}
		s := v.Name + " (" + v.Reason
		if v.Message != "" {
			s += ": " + v.Message
		}
		parts = append(parts, s+")")
	}
	return "volumes not ready: " + strings.Join(parts, ", ")
}

// List summarises the pods of a DSW snapshot, sorted by namespace and name.
func List(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot) *runtimeapi.PodList {
	out := &runtimeapi.PodList{APIVersion: runtimeapi.Version, Pods: []runtimeapi.PodSummary{}}
	for _, p := range dsw.Pods {
		out.Pods = append(out.Pods, runtimeapi.PodSummary{UID: string(p.Pod.UID), Namespace: p.Pod.Namespace, Name: p.Pod.Name, Ready: cache.PodReady(p, dsw, asw)})
	}
	sort.Slice(out.Pods, func(i, j int) bool {
		a, b := out.Pods[i], out.Pods[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	return out
}

// lookup finds a pod of the snapshot.
func lookup(dsw *cache.DesiredSnapshot, uid types.UID) (*cache.DesiredPod, bool) {
	if dsw == nil {
		return nil, false
	}
	p, ok := dsw.Pods[uid]
	return p, ok
}
