package server

import (
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/image"
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
// function of explain.Explain, the answer the pod's VolumesReady condition
// and the operator page give too.
func View(p *cache.DesiredPod, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, errs Errors, paths volume.Paths) *runtimeapi.Pod {
	uid := p.Pod.UID
	ex := explain.Explain(p, dsw, asw, errs)
	out := &runtimeapi.Pod{
		APIVersion: runtimeapi.Version, UID: string(uid), Namespace: p.Pod.Namespace, Name: p.Pod.Name,
		Ready: ex.Ready, Volumes: []runtimeapi.Volume{}, Containers: []runtimeapi.Container{},
	}
	byName := map[string]*volumeView{}
	for _, name := range usedVolumes(p.Containers) {
		v := viewVolume(p, name, &ex, dsw, asw)
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
			if v.Image != nil {
				// The runtime mounts the image and resolves the sub-path
				// in it; there is nothing on the node to bind.
				rm.Image = v.Image
				if v.Ready && m.SubPathError == "" {
					rm.ImageSubPath = m.SubPath
				}
			} else if v.Ready && m.SubPathError == "" {
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
		out.Message = NotReadyMessage(&ex)
	}
	for _, w := range ex.Warnings {
		out.Warnings = append(out.Warnings, runtimeapi.Warning{Volume: w.Volume, Reason: w.Reason, Message: w.Message})
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

// viewVolume says where one pod volume stands, as the explanation says,
// with the paths a runtime needs once it is ready.
func viewVolume(p *cache.DesiredPod, name string, ex *explain.Pod, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot) *volumeView {
	v := &volumeView{Volume: runtimeapi.Volume{Name: name, VolumeMode: runtimeapi.Filesystem}}
	e, ok := ex.Volume(name)
	if !ok {
		// A container names a volume the pod does not have: the populator
		// reports it; nothing is explained for it.
		v.Reason, v.Message = explain.ReasonWaitingForMount, "not resolved yet"
		return v
	}
	v.Plugin, v.ReadOnly, v.Ready = e.Plugin, e.ReadOnly, e.Ready()
	v.Reason, v.Message, v.NeedsChange = e.Reason, e.Message, e.Status == explain.NeedsChange
	if e.Block {
		v.VolumeMode = runtimeapi.Block
	}
	v.SELinuxRelabel = e.Unique != "" && v.VolumeMode == runtimeapi.Filesystem && e.Plugin != hostPathPlugin && !e.NoHostPath
	dv := dsw.Volume(e.Unique)
	if dv != nil && dv.Pods.At(p.Pod.UID) != nil {
		if src := image.Source(dv.Pods.At(p.Pod.UID).Spec); src != nil {
			v.Image = &runtimeapi.ImageVolume{Reference: src.Reference, PullPolicy: string(image.PullPolicy(src))}
		}
	}
	if !v.Ready || e.NoHostPath {
		return v
	}
	v.specName = dv.SpecName
	m := asw.Volume(e.Unique).Pods.At(p.Pod.UID)
	if v.VolumeMode == runtimeapi.Block {
		v.DevicePath = m.MountPath
	} else {
		v.HostPath = m.MountPath
	}
	return v
}

// NotReadyMessage lists a pod's problems and the volumes that are not
// ready and why, like the kubelet's "unmounted volumes=[...]" but with each
// volume's reason.
func NotReadyMessage(ex *explain.Pod) string {
	var parts []string
	for _, e := range ex.Problems {
		parts = append(parts, e.Error())
	}
	for _, v := range ex.NotReady() {
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
	for _, p := range dsw.Pods() {
		out.Pods = append(out.Pods, runtimeapi.PodSummary{UID: string(p.Pod.UID), Namespace: p.Pod.Namespace, Name: p.Pod.Name, Ready: explain.Explain(p, dsw, asw, nil).Ready})
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
	p := dsw.Pod(uid)
	ok := p != nil
	return p, ok
}
