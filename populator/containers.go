package populator

import (
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/subpath"
	"github.com/volume-agent/volume-agent/populator/containerenv"
	"github.com/volume-agent/volume-agent/volume"
)

// ReasonInvalidSubPath classifies a volumeMount whose subPath or
// subPathExpr cannot be used.
const ReasonInvalidSubPath = "InvalidSubPath"

// ReasonSubPathExprWaiting classifies a subPathExpr that reads what the
// agent does not know yet: a ConfigMap or Secret not read from the API
// server yet, the pod's IP before its status has one. The volume waits;
// this is not reported as an error (no event, no metric).
const ReasonSubPathExprWaiting = "SubPathExprWaiting"

// podContainers is what the pod's containers take from its volumes.
type podContainers struct {
	containers []volume.Container
	// subPaths are the sub-paths to prepare, by the pod's volume name.
	subPaths map[string][]volume.SubPath
	errs     []*volume.PodVolumeError
	// expanded are the subPathExpr expansions that succeeded, kept for
	// the pod's life (pins); unpinned says some did not yet.
	expanded map[mountKey]string
	unpinned bool
}

// mountKey names one volumeMounts entry of the pod.
type mountKey struct {
	container string
	index     int
}

// envInputs is what containers' environments are built from besides the
// pod (containerenv.Inputs without the pod).
type envInputs = containerenv.Inputs

// containerMounts reads the volumeMounts and volumeDevices of every
// container of the pod, expanding subPathExpr from the container's
// environment as the kubelet does when it starts the container. The kubelet
// expands once per container start, so an expansion that succeeded is kept
// (pinned) for the pod's life: a ConfigMap, a label or an IP that changes
// afterwards never moves a prepared sub-path under a running container.
// A mount whose sub-path cannot be used gets an error naming the
// container and the mount; the others are unaffected.
func containerMounts(pod *v1.Pod, in envInputs, pinned map[mountKey]string) podContainers {
	// The maps are made when first written: most pods mount no sub-path.
	var out podContainers
	in.Pod = pod
	podRef := volume.PodRef{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name}
	add := func(typ volume.ContainerType, c *v1.Container) {
		if len(c.VolumeMounts) == 0 && len(c.VolumeDevices) == 0 {
			return
		}
		vc := volume.Container{Name: c.Name, Type: typ}
		if len(c.VolumeMounts) > 0 {
			vc.Mounts = make([]volume.ContainerMount, 0, len(c.VolumeMounts))
		}
		var env *containerenv.Env
		var envErr error
		for i, m := range c.VolumeMounts {
			cm := volume.ContainerMount{Volume: m.Name, Index: i, MountPath: m.MountPath, ReadOnly: m.ReadOnly, RecursiveReadOnly: m.RecursiveReadOnly}
			if m.MountPropagation != nil {
				cm.Propagation = *m.MountPropagation
			}
			if m.SubPath != "" || m.SubPathExpr != "" {
				key := mountKey{c.Name, i}
				sub, ok := pinned[key]
				var err error
				if !ok {
					if env == nil && envErr == nil && m.SubPathExpr != "" && typ != volume.EphemeralContainer {
						env, envErr = containerenv.Build(c, in)
						if envErr != nil {
							envErr = fmt.Errorf("environment: %w", envErr)
						}
					}
					sub, err = subPathOf(typ, m, env, envErr)
				}
				if err != nil {
					reason, transient := ReasonInvalidSubPath, false
					var lookup *containerenv.LookupError
					switch {
					case volume.IsWaiting(err):
						reason, transient = ReasonSubPathExprWaiting, true
						out.unpinned = true
					case errors.As(err, &lookup):
						transient = true
						out.unpinned = true
					case m.SubPathExpr != "":
						// A missing object or key may come.
						out.unpinned = true
					}
					cm.SubPathError = err.Error()
					out.errs = append(out.errs, &volume.PodVolumeError{
						Pod: podRef, Volume: m.Name, Reason: reason, Transient: transient,
						Err: fmt.Errorf("container %q volumeMount at %s: %w", c.Name, m.MountPath, err),
					})
				} else {
					if m.SubPathExpr != "" {
						if out.expanded == nil {
							out.expanded = map[mountKey]string{}
						}
						out.expanded[key] = sub
					}
					if sub != "." {
						cm.SubPath = sub
						if out.subPaths == nil {
							out.subPaths = map[string][]volume.SubPath{}
						}
						out.subPaths[m.Name] = append(out.subPaths[m.Name], volume.SubPath{Container: c.Name, Index: i, MountPath: m.MountPath, Path: sub, ReadOnly: m.ReadOnly})
					}
				}
			}
			vc.Mounts = append(vc.Mounts, cm)
		}
		for _, d := range c.VolumeDevices {
			vc.Devices = append(vc.Devices, volume.ContainerDevice{Volume: d.Name, DevicePath: d.DevicePath})
		}
		if out.containers == nil {
			out.containers = make([]volume.Container, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers)+len(pod.Spec.EphemeralContainers))
		}
		out.containers = append(out.containers, vc)
	}
	for i := range pod.Spec.InitContainers {
		add(volume.InitContainer, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		add(volume.RegularContainer, &pod.Spec.Containers[i])
	}
	for i := range pod.Spec.EphemeralContainers {
		c := v1.Container(pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		add(volume.EphemeralContainer, &c)
	}
	return out
}

// subPathOf checks a mount's subPath, or expands and checks its
// subPathExpr, and returns it cleaned ("." for the whole volume).
func subPathOf(typ volume.ContainerType, m v1.VolumeMount, env *containerenv.Env, envErr error) (string, error) {
	switch {
	case typ == volume.EphemeralContainer:
		return "", fmt.Errorf("ephemeral containers may not use subPath or subPathExpr")
	case m.SubPath != "" && m.SubPathExpr != "":
		return "", fmt.Errorf("subPath and subPathExpr are mutually exclusive")
	case m.SubPath != "":
		return subpath.Validate(m.SubPath)
	}
	// The API checks the expression before expansion; manifests in
	// standalone mode are not checked by anyone else.
	if _, err := subpath.Validate(m.SubPathExpr); err != nil {
		return "", fmt.Errorf("subPathExpr: %w", err)
	}
	if envErr != nil {
		return "", fmt.Errorf("subPathExpr %q: %w", m.SubPathExpr, envErr)
	}
	expanded, err := env.ExpandSubPathExpr(m.SubPathExpr)
	if err != nil {
		return "", fmt.Errorf("subPathExpr %q: %w", m.SubPathExpr, err)
	}
	sub, err := subpath.Validate(expanded)
	if err != nil {
		return "", fmt.Errorf("subPathExpr %q expands to an unusable path: %w", m.SubPathExpr, err)
	}
	return sub, nil
}
