// Package containerenv builds a container's environment the way the kubelet
// does when it starts the container (kubelet_pods.go,
// makeEnvironmentVariables), as far as a volume manager needs it: to expand
// the container's subPathExpr mounts (makeMounts). It does no I/O: objects
// come from the Inputs' getters, and what only the node knows (its IPs and
// allocatable resources) from the Inputs too.
//
// The kubelet's rules, in its order: envFrom first (ConfigMaps' data and
// Secrets' data, each key with the source's prefix, later sources
// overriding earlier ones; keys are taken as they are, as 1.36 does), then
// env in order, each overriding what came before; a value's $(VAR)
// references are expanded from what is defined so far, a reference to
// anything else staying as written; an optional object or key that is
// missing leaves the variable as it was (an envFrom value of the same name
// survives); a required one fails the whole environment.
//
// One thing the agent cannot know as the kubelet does: the pod's IPs before
// the pod's status has them (the kubelet reads them from the sandbox it just
// made). Such a variable is pending, and only a subPathExpr that reads it
// (directly or through another variable) waits for it.
package containerenv

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/volume-agent/volume-agent/plugins/apivolume/payload"
	"github.com/volume-agent/volume-agent/volume"
)

// Inputs are what a container's environment is made from besides the pod.
type Inputs struct {
	Pod *v1.Pod
	// NodeName stands for spec.nodeName when the pod has none (standalone
	// mode's manifests need not set it).
	NodeName string
	// ConfigMap and Secret read objects of the pod's namespace as they
	// are now, never waiting: NotFound (apierrors.IsNotFound) when the
	// object does not exist, a volume.IsWaiting error while it is not
	// read yet.
	ConfigMap func(name string) (*v1.ConfigMap, error)
	Secret    func(name string) (*v1.Secret, error)
	// HostIPs are the node's IPs as the kubelet picks them (the first
	// InternalIP, else ExternalIP, and one of the other family); empty
	// when not known, and the pod's status.hostIPs are used then.
	HostIPs []string
	// Allocatable is the node's allocatable resources: what a
	// resourceFieldRef to an unset cpu, memory or ephemeral-storage limit
	// reads. Called only then.
	Allocatable func() v1.ResourceList
}

// Env is a container's environment.
type Env struct {
	values map[string]string
	// pending are the variables whose value the agent does not know yet,
	// with the wait (a volume.IsWaiting error).
	pending map[string]error
}

// LookupError is a failed read of an object the environment names (not
// "not found", not "not read yet"): tried again, nothing to change.
type LookupError struct{ Err error }

func (e *LookupError) Error() string { return e.Err.Error() }
func (e *LookupError) Unwrap() error { return e.Err }

// Build makes the environment of c, a container of in.Pod. A required
// ConfigMap, Secret or key that is missing is an error that needs a change
// (as for the kubelet, which does not start the container); one not read
// yet is a volume.IsWaiting error; any other failed read is a
// *LookupError.
func Build(c *v1.Container, in Inputs) (*Env, error) {
	pod := in.Pod
	e := &Env{values: map[string]string{}, pending: map[string]error{}}
	configMaps := map[string]*v1.ConfigMap{}
	secrets := map[string]*v1.Secret{}
	// getCM and getSecret return nil, nil for an optional object that
	// does not exist.
	getCM := func(name string, optional bool) (*v1.ConfigMap, error) {
		if cm, ok := configMaps[name]; ok {
			return cm, nil
		}
		cm, err := in.ConfigMap(name)
		if err != nil {
			return nil, readError(err, "ConfigMap", pod.Namespace, name, optional)
		}
		configMaps[name] = cm
		return cm, nil
	}
	getSecret := func(name string, optional bool) (*v1.Secret, error) {
		if s, ok := secrets[name]; ok {
			return s, nil
		}
		s, err := in.Secret(name)
		if err != nil {
			return nil, readError(err, "Secret", pod.Namespace, name, optional)
		}
		secrets[name] = s
		return s, nil
	}

	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := getCM(from.ConfigMapRef.Name, isTrue(from.ConfigMapRef.Optional))
			if err != nil {
				return nil, err
			}
			if cm != nil {
				for k, v := range cm.Data {
					e.set(from.Prefix+k, v)
				}
			}
		case from.SecretRef != nil:
			s, err := getSecret(from.SecretRef.Name, isTrue(from.SecretRef.Optional))
			if err != nil {
				return nil, err
			}
			if s != nil {
				for k, v := range s.Data {
					e.set(from.Prefix+k, string(v))
				}
			}
		}
	}

	for _, ev := range c.Env {
		if ev.Value != "" || ev.ValueFrom == nil {
			var waitsFor string
			var wait error
			v := Expand(ev.Value, func(name string) string {
				if w, ok := e.pending[name]; ok {
					if wait == nil {
						waitsFor, wait = name, w
					}
					return ""
				}
				if v, ok := e.values[name]; ok {
					return v
				}
				return "$(" + name + ")"
			})
			if wait != nil {
				e.pend(ev.Name, volume.Waiting(fmt.Errorf("refers to $(%s), which %w", waitsFor, wait)))
				continue
			}
			e.set(ev.Name, v)
			continue
		}
		src := ev.ValueFrom
		switch {
		case src.FieldRef != nil:
			v, err := fieldValue(src.FieldRef, in)
			switch {
			case volume.IsWaiting(err):
				e.pend(ev.Name, err)
			case err != nil:
				return nil, fmt.Errorf("env %s: %w", ev.Name, err)
			default:
				e.set(ev.Name, v)
			}
		case src.ResourceFieldRef != nil:
			v, err := resourceValue(src.ResourceFieldRef, c, in)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", ev.Name, err)
			}
			e.set(ev.Name, v)
		case src.ConfigMapKeyRef != nil:
			ref := src.ConfigMapKeyRef
			optional := isTrue(ref.Optional)
			cm, err := getCM(ref.Name, optional)
			if err != nil {
				return nil, err
			}
			if cm == nil {
				continue
			}
			v, ok := cm.Data[ref.Key]
			if !ok {
				if optional {
					continue
				}
				return nil, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)
			}
			e.set(ev.Name, v)
		case src.SecretKeyRef != nil:
			ref := src.SecretKeyRef
			optional := isTrue(ref.Optional)
			s, err := getSecret(ref.Name, optional)
			if err != nil {
				return nil, err
			}
			if s == nil {
				continue
			}
			v, ok := s.Data[ref.Key]
			if !ok {
				if optional {
					continue
				}
				return nil, fmt.Errorf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)
			}
			e.set(ev.Name, string(v))
		default:
			// fileKeyRef (alpha, gate EnvFiles) reads a file of a volume
			// the container mounts: known only once the volumes are
			// set up, after the sub-paths are decided.
			return nil, fmt.Errorf("env %s: valueFrom source not supported by volume-agent for subPathExpr", ev.Name)
		}
	}
	return e, nil
}

func (e *Env) set(name, value string) {
	e.values[name] = value
	delete(e.pending, name)
}

func (e *Env) pend(name string, why error) {
	delete(e.values, name)
	e.pending[name] = why
}

func isTrue(b *bool) bool { return b != nil && *b }

// readError classifies a failed read of an object; nil for an optional
// object that does not exist.
func readError(err error, kind, namespace, name string, optional bool) error {
	switch {
	case apierrors.IsNotFound(err) && optional:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s %s/%s not found", kind, namespace, name)
	case volume.IsWaiting(err):
		return volume.Waiting(fmt.Errorf("%s %s/%s is not read yet: %w", kind, namespace, name, err))
	}
	return &LookupError{Err: fmt.Errorf("reading %s %s/%s: %w", kind, namespace, name, err)}
}

// fieldValue is the value of a fieldRef in env: the pod's metadata and
// spec fields, its IPs and the node's, as the kubelet's
// podFieldSelectorRuntimeValue gives them.
func fieldValue(ref *v1.ObjectFieldSelector, in Inputs) (string, error) {
	pod := in.Pod
	switch ref.FieldPath {
	case "spec.nodeName":
		if pod.Spec.NodeName != "" {
			return pod.Spec.NodeName, nil
		}
		return in.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		ips := podIPs(pod)
		if len(ips) == 0 {
			return "", volume.Waitingf("comes from fieldRef %s, and the pod's status has no IP yet", ref.FieldPath)
		}
		if ref.FieldPath == "status.podIP" {
			return ips[0], nil
		}
		return strings.Join(ips, ","), nil
	case "status.hostIP", "status.hostIPs":
		ips := in.HostIPs
		if len(ips) == 0 {
			ips = hostIPs(pod)
		}
		if len(ips) == 0 {
			return "", volume.Waitingf("comes from fieldRef %s, and neither the node's addresses nor the pod's status have the host's IP yet", ref.FieldPath)
		}
		if ref.FieldPath == "status.hostIP" {
			return ips[0], nil
		}
		return strings.Join(ips, ","), nil
	}
	md := &payload.Pod{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, Labels: pod.Labels, Annotations: pod.Annotations}
	return payload.FieldValue(ref, md)
}

func podIPs(pod *v1.Pod) []string {
	var out []string
	for _, ip := range pod.Status.PodIPs {
		out = append(out, ip.IP)
	}
	if len(out) == 0 && pod.Status.PodIP != "" {
		out = []string{pod.Status.PodIP}
	}
	return out
}

func hostIPs(pod *v1.Pod) []string {
	var out []string
	for _, ip := range pod.Status.HostIPs {
		out = append(out, ip.IP)
	}
	if len(out) == 0 && pod.Status.HostIP != "" {
		out = []string{pod.Status.HostIP}
	}
	return out
}

// resourceValue is the value of a resourceFieldRef in env: the named
// container's (c's when none is named) request or limit divided by the
// divisor, rounded up; an unset cpu, memory or ephemeral-storage limit is
// the node's allocatable amount, or the pod-level limit when the pod has
// one (the kubelet's defaultPodLimitsForDownwardAPI).
func resourceValue(ref *v1.ResourceFieldSelector, c *v1.Container, in Inputs) (string, error) {
	r := *ref
	pod := &payload.Pod{Name: in.Pod.Name, Namespace: in.Pod.Namespace}
	if r.ContainerName == "" {
		r.ContainerName = c.Name
		pod.Containers = []payload.Container{{Name: c.Name, Resources: c.Resources}}
	} else {
		for _, cs := range [][]v1.Container{in.Pod.Spec.Containers, in.Pod.Spec.InitContainers} {
			for i := range cs {
				pod.Containers = append(pod.Containers, payload.Container{Name: cs[i].Name, Resources: cs[i].Resources})
			}
		}
	}
	var alloc v1.ResourceList
	if needsAllocatable(&r, pod) && in.Allocatable != nil {
		alloc = in.Allocatable()
		if podLimits := podLevelLimits(in.Pod); len(podLimits) > 0 {
			alloc = alloc.DeepCopy()
			for _, rn := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage} {
				if q, ok := podLimits[rn]; ok && !q.IsZero() {
					if _, known := alloc[rn]; known {
						alloc[rn] = q.DeepCopy()
					}
				}
			}
		}
	}
	return payload.ResourceValue(&r, pod, alloc)
}

// needsAllocatable: the reference reads a limit that the container leaves
// unset, so the node's allocatable amount stands in.
func needsAllocatable(r *v1.ResourceFieldSelector, pod *payload.Pod) bool {
	kind, name, _ := strings.Cut(r.Resource, ".")
	if kind != "limits" {
		return false
	}
	for _, c := range pod.Containers {
		if c.Name == r.ContainerName {
			q, ok := c.Resources.Limits[v1.ResourceName(name)]
			return !ok || q.IsZero()
		}
	}
	return false
}

func podLevelLimits(pod *v1.Pod) v1.ResourceList {
	if pod.Spec.Resources == nil {
		return nil
	}
	return pod.Spec.Resources.Limits
}

// ExpandSubPathExpr expands a subPathExpr with the kubelet's rule
// (ExpandContainerVolumeMounts): every variable it refers to must be
// defined and not empty. A variable the agent does not know yet makes it a
// volume.IsWaiting error, unless another one is missing for good.
func (e *Env) ExpandSubPathExpr(expr string) (string, error) {
	missing := map[string]bool{}
	var waits []string
	var wait error
	out := Expand(expr, func(name string) string {
		if w, ok := e.pending[name]; ok {
			waits = append(waits, fmt.Sprintf("$(%s) %v", name, w))
			if wait == nil {
				wait = w
			}
			return ""
		}
		v := e.values[name]
		if v == "" {
			missing[name] = true
		}
		return v
	})
	if len(missing) > 0 {
		names := make([]string, 0, len(missing))
		for n := range missing {
			names = append(names, n)
		}
		sort.Strings(names)
		return "", fmt.Errorf("missing value for %s", strings.Join(names, ", "))
	}
	if wait != nil {
		return "", volume.Waiting(errors.New(strings.Join(waits, "; ")))
	}
	return out, nil
}

// Refs lists the ConfigMaps and Secrets that the environments of the
// pod's containers with a subPathExpr mount name (env and envFrom): the
// objects the agent reads for the pod's sub-paths, and no others.
func Refs(pod *v1.Pod) (configMaps, secrets []string) {
	add := func(c *v1.Container) {
		if !hasSubPathExpr(c) {
			return
		}
		for _, f := range c.EnvFrom {
			switch {
			case f.ConfigMapRef != nil:
				configMaps = append(configMaps, f.ConfigMapRef.Name)
			case f.SecretRef != nil:
				secrets = append(secrets, f.SecretRef.Name)
			}
		}
		for _, ev := range c.Env {
			switch {
			case ev.Value != "" || ev.ValueFrom == nil:
			case ev.ValueFrom.ConfigMapKeyRef != nil:
				configMaps = append(configMaps, ev.ValueFrom.ConfigMapKeyRef.Name)
			case ev.ValueFrom.SecretKeyRef != nil:
				secrets = append(secrets, ev.ValueFrom.SecretKeyRef.Name)
			}
		}
	}
	// Ephemeral containers may not use sub-paths.
	for i := range pod.Spec.InitContainers {
		add(&pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return configMaps, secrets
}

func hasSubPathExpr(c *v1.Container) bool {
	for _, m := range c.VolumeMounts {
		if m.SubPathExpr != "" {
			return true
		}
	}
	return false
}

// Expand replaces $(NAME) by mapping(NAME) the way Kubernetes expands
// command, args, env values and subPathExpr: "$$" is a literal "$", a "$"
// not followed by "(" or "$" is kept, and an unterminated "$(" is kept as
// written.
func Expand(s string, mapping func(string) string) string {
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
