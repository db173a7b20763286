package populator

import (
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/subpath"
	"github.com/volume-agent/volume-agent/volume"
)

// ReasonInvalidSubPath classifies a volumeMount whose subPath or
// subPathExpr cannot be used.
const ReasonInvalidSubPath = "InvalidSubPath"

// podContainers is what the pod's containers take from its volumes.
type podContainers struct {
	containers []volume.Container
	// subPaths are the sub-paths to prepare, by the pod's volume name.
	subPaths map[string][]volume.SubPath
	errs     []*volume.PodVolumeError
}

// containerMounts reads the volumeMounts and volumeDevices of every
// container of the pod, expanding subPathExpr from the container's
// environment as the kubelet does when it starts the container. A mount
// whose sub-path cannot be used gets an error naming the container and the
// mount; the others are unaffected.
func containerMounts(pod *v1.Pod, nodeName string) podContainers {
	out := podContainers{subPaths: map[string][]volume.SubPath{}}
	add := func(typ volume.ContainerType, c *v1.Container) {
		if len(c.VolumeMounts) == 0 && len(c.VolumeDevices) == 0 {
			return
		}
		vc := volume.Container{Name: c.Name, Type: typ}
		var env *containerEnv
		for i, m := range c.VolumeMounts {
			cm := volume.ContainerMount{Volume: m.Name, Index: i, MountPath: m.MountPath, ReadOnly: m.ReadOnly, RecursiveReadOnly: m.RecursiveReadOnly}
			if m.MountPropagation != nil {
				cm.Propagation = *m.MountPropagation
			}
			if m.SubPath != "" || m.SubPathExpr != "" {
				if env == nil {
					env = newContainerEnv(pod, c, nodeName)
				}
				sub, err := subPathOf(typ, m, env)
				if err != nil {
					cm.SubPathError = err.Error()
					out.errs = append(out.errs, &volume.PodVolumeError{
						Pod: volume.PodRef{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name}, Volume: m.Name, Reason: ReasonInvalidSubPath,
						Err: fmt.Errorf("container %q volumeMount at %s: %w", c.Name, m.MountPath, err),
					})
				} else if sub != "." {
					cm.SubPath = sub
					out.subPaths[m.Name] = append(out.subPaths[m.Name], volume.SubPath{Container: c.Name, Index: i, MountPath: m.MountPath, Path: sub, ReadOnly: m.ReadOnly})
				}
			}
			vc.Mounts = append(vc.Mounts, cm)
		}
		for _, d := range c.VolumeDevices {
			vc.Devices = append(vc.Devices, volume.ContainerDevice{Volume: d.Name, DevicePath: d.DevicePath})
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
func subPathOf(typ volume.ContainerType, m v1.VolumeMount, env *containerEnv) (string, error) {
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
	expanded, err := env.expandSubPathExpr(m.SubPathExpr)
	if err != nil {
		return "", fmt.Errorf("subPathExpr %q: %w", m.SubPathExpr, err)
	}
	sub, err := subpath.Validate(expanded)
	if err != nil {
		return "", fmt.Errorf("subPathExpr %q expands to an unusable path: %w", m.SubPathExpr, err)
	}
	return sub, nil
}

// containerEnv is a container's environment as far as a volume manager can
// know it: values from env[].value and from fieldRefs to the pod's
// metadata and spec. What only the kubelet's runtime side knows (status
// fields, resource limits, ConfigMap and Secret keys, service links) is
// unknown, with the reason.
type containerEnv struct {
	values map[string]string
	// unknown says, for variables the container defines but the agent
	// cannot resolve, why.
	unknown map[string]string
	// envFrom, if the container has envFrom, names its sources: any
	// variable env does not define may come from them.
	envFrom string
}

func newContainerEnv(pod *v1.Pod, c *v1.Container, nodeName string) *containerEnv {
	e := &containerEnv{values: map[string]string{}, unknown: map[string]string{}}
	if len(c.EnvFrom) > 0 {
		var from []string
		for _, f := range c.EnvFrom {
			switch {
			case f.ConfigMapRef != nil:
				from = append(from, "ConfigMap "+f.ConfigMapRef.Name)
			case f.SecretRef != nil:
				from = append(from, "Secret "+f.SecretRef.Name)
			}
		}
		e.envFrom = strings.Join(from, ", ")
	}
	for _, ev := range c.Env {
		delete(e.unknown, ev.Name)
		delete(e.values, ev.Name)
		if ev.ValueFrom == nil {
			// Like the kubelet: a value may refer to variables defined
			// before it; references to others stay as written.
			var refersToUnknown, why string
			v := expand(ev.Value, func(name string) string {
				val, defined, w := e.lookup(name)
				if w != "" && refersToUnknown == "" {
					refersToUnknown, why = name, w
				}
				if !defined {
					return "$(" + name + ")"
				}
				return val
			})
			if refersToUnknown != "" {
				e.unknown[ev.Name] = fmt.Sprintf("refers to $(%s), which %s", refersToUnknown, why)
				continue
			}
			e.values[ev.Name] = v
			continue
		}
		v, why := valueFrom(pod, ev.ValueFrom, nodeName)
		if why != "" {
			e.unknown[ev.Name] = why
			continue
		}
		e.values[ev.Name] = v
	}
	return e
}

// valueFrom resolves an env valueFrom, or says why it cannot.
func valueFrom(pod *v1.Pod, src *v1.EnvVarSource, nodeName string) (string, string) {
	switch {
	case src.FieldRef != nil:
		return fieldRefValue(pod, src.FieldRef.FieldPath, nodeName)
	case src.ResourceFieldRef != nil:
		return "", "comes from resourceFieldRef, which only the container runtime resolves"
	case src.ConfigMapKeyRef != nil:
		return "", fmt.Sprintf("comes from key %q of ConfigMap %s, and volume-agent does not read ConfigMaps for environment variables", src.ConfigMapKeyRef.Key, src.ConfigMapKeyRef.Name)
	case src.SecretKeyRef != nil:
		return "", fmt.Sprintf("comes from key %q of Secret %s, and volume-agent does not read Secrets for environment variables", src.SecretKeyRef.Key, src.SecretKeyRef.Name)
	}
	return "", "has a valueFrom source volume-agent does not know"
}

// fieldRefValue resolves the fieldRef paths the downward API allows in env
// that are known before the pod's containers run.
func fieldRefValue(pod *v1.Pod, path, nodeName string) (string, string) {
	switch path {
	case "metadata.name":
		return pod.Name, ""
	case "metadata.namespace":
		return pod.Namespace, ""
	case "metadata.uid":
		return string(pod.UID), ""
	case "spec.nodeName":
		if pod.Spec.NodeName != "" {
			return pod.Spec.NodeName, ""
		}
		return nodeName, ""
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, ""
	case "status.podIP", "status.podIPs", "status.hostIP", "status.hostIPs":
		return "", fmt.Sprintf("comes from fieldRef %s, which is only known once the pod's sandbox runs, after its volumes are set up", path)
	}
	for _, m := range []struct {
		prefix string
		values map[string]string
	}{{"metadata.labels", pod.Labels}, {"metadata.annotations", pod.Annotations}} {
		if key, ok := subscript(path, m.prefix); ok {
			return m.values[key], ""
		}
	}
	return "", fmt.Sprintf("comes from fieldRef %s, which volume-agent does not support", path)
}

// subscript parses prefix['key'] (or prefix["key"]).
func subscript(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"[")
	if !ok || len(rest) < 3 || !strings.HasSuffix(rest, "]") {
		return "", false
	}
	quoted := rest[:len(rest)-1]
	if q := quoted[0]; (q != '\'' && q != '"') || quoted[len(quoted)-1] != q {
		return "", false
	}
	return quoted[1 : len(quoted)-1], true
}

// lookup returns a variable's value and whether the container defines it,
// or why the agent cannot know it.
func (e *containerEnv) lookup(name string) (value string, defined bool, why string) {
	if v, ok := e.values[name]; ok {
		return v, true, ""
	}
	if w, ok := e.unknown[name]; ok {
		return "", true, w
	}
	if e.envFrom != "" {
		return "", false, "is not in env and may come from envFrom (" + e.envFrom + "), which volume-agent does not read"
	}
	return "", false, ""
}

// expandSubPathExpr expands a subPathExpr with the kubelet's rule: every
// variable it refers to must be defined and not empty.
func (e *containerEnv) expandSubPathExpr(expr string) (string, error) {
	missing := map[string]bool{}
	unknown := map[string]string{}
	out := expand(expr, func(name string) string {
		v, _, why := e.lookup(name)
		switch {
		case why != "":
			unknown[name] = why
		case v == "":
			missing[name] = true
		}
		return v
	})
	var problems []string
	if len(missing) > 0 {
		problems = append(problems, "missing value for "+strings.Join(sortedKeys(missing), ", "))
	}
	for _, name := range sortedKeys(unknown) {
		problems = append(problems, fmt.Sprintf("$(%s) %s", name, unknown[name]))
	}
	if len(problems) > 0 {
		return "", fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// expand replaces $(NAME) by mapping(NAME) the way Kubernetes expands
// command, args, env values and subPathExpr: "$$" is a literal "$", a "$"
// not followed by "(" or "$" is kept, and an unterminated "$(" is kept as
// written.
func expand(s string, mapping func(string) string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch next := s[i+1]; next {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				// Unterminated: "$(" is literal, and the rest is read
				// on as usual.
				b.WriteString("$(")
				i++
				continue
			}
			b.WriteString(mapping(s[i+2 : i+2+end]))
			i += 2 + end
		default:
			b.WriteByte('$')
			b.WriteByte(next)
			i++
		}
	}
	return b.String()
}
