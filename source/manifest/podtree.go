package manifest

import (
	"strconv"
	"strings"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// podGVK is the kind decodePodTree decodes.
var podGVK = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}

// decodePodTree decodes a v1 Pod straight from fastYAMLToJSON's tree,
// without writing JSON for fastDecode to read again: the JSON decoder
// was the largest part of a manifest's parse. It knows the fields pod
// manifests use (metadata's names, labels and annotations; volumes of the
// common sources; containers' mounts, commands, env and resources) and
// reads each only in the one shape the JSON path reads alike. Anything
// else (another kind, an unknown key, a null, a scalar of another type, a
// quantity with bytes JSON would escape) answers false, and the document
// takes the JSON path, which then gives today's object, warning or error.
// TestPodTreeFallback lists the cases; FuzzPodTree compares the two.
//
// The pod's string values are copied into one buffer, one allocation
// instead of one each; keys of maps (labels) fill what it has left.
func (p *yamlScanner) decodePodTree(root *yamlNode) (*corev1.Pod, bool) {
	if root.kind != yamlMap {
		return nil, false
	}
	if v := p.get(root, "apiVersion"); v == nil || v.kind != yamlString || p.str(v) != "v1" {
		return nil, false
	}
	if v := p.get(root, "kind"); v == nil || v.kind != yamlString || p.str(v) != "Pod" {
		return nil, false
	}
	size := 0
	for i := range p.nodes {
		if n := &p.nodes[i].node; n.kind == yamlString {
			size += int(n.n)
		}
	}
	d := treeDecoder{p: p, arena: make([]byte, 0, size)}
	pod := &corev1.Pod{}
	pod.APIVersion, pod.Kind = "v1", "Pod"
	ok := d.fields(root, func(k string, v *yamlNode) bool {
		switch k {
		case "apiVersion", "kind":
			return true
		case "metadata":
			return d.meta(v, pod)
		case "spec":
			return d.podSpec(v, &pod.Spec)
		}
		return false
	})
	if !ok {
		return nil, false
	}
	return pod, true
}

type treeDecoder struct {
	p     *yamlScanner
	arena []byte
	// limited holds an emptyDir source with its sizeLimit for each
	// volume that has one: one allocation for the pod's instead of one
	// each.
	limited []limitedEmptyDir
	// qText and q are the last quantity parsed: a pod's volumes or
	// containers often repeat one ("sizeLimit: 1Mi").
	qText string
	q     resource.Quantity
}

// limitedEmptyDir is an emptyDir source and its sizeLimit, allocated
// together.
type limitedEmptyDir struct {
	corev1.EmptyDirVolumeSource
	limit resource.Quantity
}

// fields calls set for each entry of the mapping n; set answers false
// for a key it does not know.
func (d *treeDecoder) fields(n *yamlNode, set func(k string, v *yamlNode) bool) bool {
	if n.kind != yamlMap {
		return false
	}
	for i := range d.p.entries(n) {
		e := &d.p.nodes[int(n.off)+i]
		if !set(d.p.str(&e.key), &e.node) {
			return false
		}
	}
	return true
}

// items decodes the sequence n into a slice of its length.
func items[T any](d *treeDecoder, n *yamlNode, dst *[]T, item func(v *yamlNode, t *T) bool) bool {
	if n.kind != yamlSeq {
		return false
	}
	*dst = make([]T, n.n)
	for i := range *dst {
		if !item(&d.p.nodes[int(n.off)+i].node, &(*dst)[i]) {
			return false
		}
	}
	return true
}

// newObject decodes the mapping n into a new T.
func newObject[T any](d *treeDecoder, n *yamlNode, dst **T, field func(t *T, k string, v *yamlNode) bool) bool {
	t := new(T)
	*dst = t
	return d.fields(n, func(k string, v *yamlNode) bool { return field(t, k, v) })
}

// copyString is s, which shares the scanner's or document's memory,
// kept in the arena.
func (d *treeDecoder) copyString(s string) string {
	if s == "" {
		return ""
	}
	if len(d.arena)+len(s) > cap(d.arena) {
		return strings.Clone(s)
	}
	start := len(d.arena)
	d.arena = append(d.arena, s...)
	return unsafe.String(&d.arena[start], len(s))
}

func str[T ~string](d *treeDecoder, n *yamlNode, dst *T) bool {
	if n.kind != yamlString {
		return false
	}
	*dst = T(d.copyString(d.p.str(n)))
	return true
}

func strPtr[T ~string](d *treeDecoder, n *yamlNode, dst **T) bool {
	*dst = new(T)
	return str(d, n, *dst)
}

func (d *treeDecoder) boolean(n *yamlNode, dst *bool) bool {
	switch n.kind {
	case yamlTrue:
		*dst = true
	case yamlFalse:
		*dst = false
	default:
		return false
	}
	return true
}

func (d *treeDecoder) boolPtr(n *yamlNode, dst **bool) bool {
	*dst = new(bool)
	return d.boolean(n, *dst)
}

func integer[T int32 | int64](d *treeDecoder, n *yamlNode, dst **T) bool {
	if n.kind != yamlNumber {
		return false
	}
	i, err := strconv.ParseInt(d.p.str(n), 10, int(unsafe.Sizeof(T(0)))*8)
	if err != nil {
		return false
	}
	*dst = new(T)
	**dst = T(i)
	return true
}

// quantity parses n as Quantity.UnmarshalJSON parses its JSON, which it
// does not unescape: text that JSON would escape is left to that path.
func (d *treeDecoder) quantity(n *yamlNode, dst *resource.Quantity) bool {
	if n.kind != yamlString && n.kind != yamlNumber {
		return false
	}
	s := d.p.str(n)
	for i := range len(s) {
		if c := s[i]; c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	if s == d.qText && s != "" {
		// The same text parses to the same value; DeepCopy keeps the two
		// from sharing a big number's memory.
		*dst = d.q.DeepCopy()
		return true
	}
	t := strings.TrimSpace(s)
	if t == "0" {
		// ParseQuantity keeps this text as the quantity's string, and
		// t is the scanner's memory, which the next document reuses.
		t = "0"
	}
	q, err := resource.ParseQuantity(t)
	if err != nil {
		return false
	}
	*dst = q
	d.qText, d.q = s, q.DeepCopy()
	return true
}

func (d *treeDecoder) strings(n *yamlNode, dst *[]string) bool {
	return items(d, n, dst, func(v *yamlNode, s *string) bool { return str(d, v, s) })
}

func (d *treeDecoder) stringMap(n *yamlNode, dst *map[string]string) bool {
	if n.kind != yamlMap {
		return false
	}
	m := make(map[string]string, n.n)
	*dst = m
	return d.fields(n, func(k string, v *yamlNode) bool {
		var s string
		if !str(d, v, &s) {
			return false
		}
		m[d.copyString(k)] = s
		return true
	})
}

func (d *treeDecoder) resourceList(n *yamlNode, dst *corev1.ResourceList) bool {
	if n.kind != yamlMap {
		return false
	}
	m := make(corev1.ResourceList, n.n)
	*dst = m
	return d.fields(n, func(k string, v *yamlNode) bool {
		var q resource.Quantity
		if !d.quantity(v, &q) {
			return false
		}
		m[corev1.ResourceName(d.copyString(k))] = q
		return true
	})
}

func (d *treeDecoder) meta(n *yamlNode, pod *corev1.Pod) bool {
	m := &pod.ObjectMeta
	return d.fields(n, func(k string, v *yamlNode) bool {
		switch k {
		case "name":
			return str(d, v, &m.Name)
		case "namespace":
			return str(d, v, &m.Namespace)
		case "uid":
			return str(d, v, &m.UID)
		case "labels":
			return d.stringMap(v, &m.Labels)
		case "annotations":
			return d.stringMap(v, &m.Annotations)
		}
		return false
	})
}

func (d *treeDecoder) podSpec(n *yamlNode, s *corev1.PodSpec) bool {
	return d.fields(n, func(k string, v *yamlNode) bool {
		switch k {
		case "volumes":
			if n := d.limitedEmptyDirs(v); n > 0 {
				d.limited = make([]limitedEmptyDir, n)
			}
			return items(d, v, &s.Volumes, d.volume)
		case "containers":
			return items(d, v, &s.Containers, d.container)
		case "initContainers":
			return items(d, v, &s.InitContainers, d.container)
		case "nodeName":
			return str(d, v, &s.NodeName)
		case "serviceAccountName":
			return str(d, v, &s.ServiceAccountName)
		case "restartPolicy":
			return str(d, v, &s.RestartPolicy)
		case "automountServiceAccountToken":
			return d.boolPtr(v, &s.AutomountServiceAccountToken)
		case "securityContext":
			return newObject(d, v, &s.SecurityContext, d.podSecurity)
		}
		return false
	})
}

func (d *treeDecoder) podSecurity(sc *corev1.PodSecurityContext, k string, v *yamlNode) bool {
	switch k {
	case "fsGroup":
		return integer(d, v, &sc.FSGroup)
	case "runAsUser":
		return integer(d, v, &sc.RunAsUser)
	case "runAsGroup":
		return integer(d, v, &sc.RunAsGroup)
	case "runAsNonRoot":
		return d.boolPtr(v, &sc.RunAsNonRoot)
	case "fsGroupChangePolicy":
		return strPtr(d, v, &sc.FSGroupChangePolicy)
	}
	return false
}

func (d *treeDecoder) container(n *yamlNode, c *corev1.Container) bool {
	return d.fields(n, func(k string, v *yamlNode) bool {
		switch k {
		case "name":
			return str(d, v, &c.Name)
		case "image":
			return str(d, v, &c.Image)
		case "imagePullPolicy":
			return str(d, v, &c.ImagePullPolicy)
		case "command":
			return d.strings(v, &c.Command)
		case "args":
			return d.strings(v, &c.Args)
		case "workingDir":
			return str(d, v, &c.WorkingDir)
		case "volumeMounts":
			return items(d, v, &c.VolumeMounts, d.volumeMount)
		case "volumeDevices":
			return items(d, v, &c.VolumeDevices, d.volumeDevice)
		case "env":
			return items(d, v, &c.Env, d.envVar)
		case "resources":
			return d.fields(v, func(k string, v *yamlNode) bool {
				switch k {
				case "limits":
					return d.resourceList(v, &c.Resources.Limits)
				case "requests":
					return d.resourceList(v, &c.Resources.Requests)
				}
				return false
			})
		}
		return false
	})
}

func (d *treeDecoder) volumeMount(n *yamlNode, m *corev1.VolumeMount) bool {
	return d.fields(n, func(k string, v *yamlNode) bool {
		switch k {
		case "name":
			return str(d, v, &m.Name)
		case "mountPath":
			return str(d, v, &m.MountPath)
		case "subPath":
			return str(d, v, &m.SubPath)
		case "subPathExpr":
			return str(d, v, &m.SubPathExpr)
		case "readOnly":
			return d.boolean(v, &m.ReadOnly)
		case "mountPropagation":
			return strPtr(d, v, &m.MountPropagation)
		}
		return false
	})
}

func (d *treeDecoder) volumeDevice(n *yamlNode, dev *corev1.VolumeDevice) bool {
	return d.fields(n, func(k string, v *yamlNode) bool {
		switch k {
		case "name":
			return str(d, v, &dev.Name)
		case "devicePath":
			return str(d, v, &dev.DevicePath)
		}
		return false
	})
}

func (d *treeDecoder) envVar(n *yamlNode, e *corev1.EnvVar) bool {
	return d.fields(n, func(k string, v *yamlNode) bool {
		switch k {
		case "name":
			return str(d, v, &e.Name)
		case "value":
			return str(d, v, &e.Value)
		case "valueFrom":
			return newObject(d, v, &e.ValueFrom, func(src *corev1.EnvVarSource, k string, v *yamlNode) bool {
				switch k {
				case "fieldRef":
					return newObject(d, v, &src.FieldRef, d.fieldRef)
				case "resourceFieldRef":
					return newObject(d, v, &src.ResourceFieldRef, d.resourceFieldRef)
				}
				return false
			})
		}
		return false
	})
}

func (d *treeDecoder) fieldRef(f *corev1.ObjectFieldSelector, k string, v *yamlNode) bool {
	switch k {
	case "fieldPath":
		return str(d, v, &f.FieldPath)
	case "apiVersion":
		return str(d, v, &f.APIVersion)
	}
	return false
}

func (d *treeDecoder) resourceFieldRef(f *corev1.ResourceFieldSelector, k string, v *yamlNode) bool {
	switch k {
	case "containerName":
		return str(d, v, &f.ContainerName)
	case "resource":
		return str(d, v, &f.Resource)
	case "divisor":
		return d.quantity(v, &f.Divisor)
	}
	return false
}

func (d *treeDecoder) volume(n *yamlNode, vol *corev1.Volume) bool {
	vs := &vol.VolumeSource
	return d.fields(n, func(k string, v *yamlNode) bool {
		switch k {
		case "name":
			return str(d, v, &vol.Name)
		case "emptyDir":
			if d.p.get(v, "sizeLimit") != nil {
				// The limit in the same allocation as the source, and the
				// pod's limited sources in one (limitedEmptyDirs counted
				// them).
				if len(d.limited) == 0 {
					d.limited = make([]limitedEmptyDir, 1)
				}
				e := &d.limited[0]
				d.limited = d.limited[1:]
				e.SizeLimit, vs.EmptyDir = &e.limit, &e.EmptyDirVolumeSource
				return d.fields(v, func(k string, v *yamlNode) bool { return d.emptyDir(vs.EmptyDir, k, v) })
			}
			return newObject(d, v, &vs.EmptyDir, d.emptyDir)
		case "hostPath":
			return newObject(d, v, &vs.HostPath, d.hostPath)
		case "configMap":
			return newObject(d, v, &vs.ConfigMap, d.configMap)
		case "secret":
			return newObject(d, v, &vs.Secret, d.secret)
		case "persistentVolumeClaim":
			return newObject(d, v, &vs.PersistentVolumeClaim, d.claim)
		case "csi":
			return newObject(d, v, &vs.CSI, d.csi)
		case "downwardAPI":
			return newObject(d, v, &vs.DownwardAPI, d.downwardAPI)
		case "projected":
			return newObject(d, v, &vs.Projected, d.projected)
		}
		return false
	})
}

// limitedEmptyDirs counts the emptyDir volumes with a sizeLimit in the
// volumes n.
func (d *treeDecoder) limitedEmptyDirs(n *yamlNode) int {
	count := 0
	for i := range n.seqLen() {
		if d.p.get(d.p.get(&d.p.nodes[int(n.off)+i].node, "emptyDir"), "sizeLimit") != nil {
			count++
		}
	}
	return count
}

func (d *treeDecoder) emptyDir(e *corev1.EmptyDirVolumeSource, k string, v *yamlNode) bool {
	switch k {
	case "medium":
		return str(d, v, &e.Medium)
	case "sizeLimit":
		if e.SizeLimit == nil {
			e.SizeLimit = new(resource.Quantity)
		}
		return d.quantity(v, e.SizeLimit)
	}
	return false
}

func (d *treeDecoder) hostPath(h *corev1.HostPathVolumeSource, k string, v *yamlNode) bool {
	switch k {
	case "path":
		return str(d, v, &h.Path)
	case "type":
		return strPtr(d, v, &h.Type)
	}
	return false
}

func (d *treeDecoder) keyToPath(n *yamlNode, kp *corev1.KeyToPath) bool {
	return d.fields(n, func(k string, v *yamlNode) bool {
		switch k {
		case "key":
			return str(d, v, &kp.Key)
		case "path":
			return str(d, v, &kp.Path)
		case "mode":
			return integer(d, v, &kp.Mode)
		}
		return false
	})
}

func (d *treeDecoder) configMap(c *corev1.ConfigMapVolumeSource, k string, v *yamlNode) bool {
	switch k {
	case "name":
		return str(d, v, &c.Name)
	case "items":
		return items(d, v, &c.Items, d.keyToPath)
	case "defaultMode":
		return integer(d, v, &c.DefaultMode)
	case "optional":
		return d.boolPtr(v, &c.Optional)
	}
	return false
}

func (d *treeDecoder) secret(s *corev1.SecretVolumeSource, k string, v *yamlNode) bool {
	switch k {
	case "secretName":
		return str(d, v, &s.SecretName)
	case "items":
		return items(d, v, &s.Items, d.keyToPath)
	case "defaultMode":
		return integer(d, v, &s.DefaultMode)
	case "optional":
		return d.boolPtr(v, &s.Optional)
	}
	return false
}

func (d *treeDecoder) claim(c *corev1.PersistentVolumeClaimVolumeSource, k string, v *yamlNode) bool {
	switch k {
	case "claimName":
		return str(d, v, &c.ClaimName)
	case "readOnly":
		return d.boolean(v, &c.ReadOnly)
	}
	return false
}

func (d *treeDecoder) csi(c *corev1.CSIVolumeSource, k string, v *yamlNode) bool {
	switch k {
	case "driver":
		return str(d, v, &c.Driver)
	case "readOnly":
		return d.boolPtr(v, &c.ReadOnly)
	case "fsType":
		return strPtr(d, v, &c.FSType)
	case "volumeAttributes":
		return d.stringMap(v, &c.VolumeAttributes)
	case "nodePublishSecretRef":
		return newObject(d, v, &c.NodePublishSecretRef, func(r *corev1.LocalObjectReference, k string, v *yamlNode) bool {
			return k == "name" && str(d, v, &r.Name)
		})
	}
	return false
}

func (d *treeDecoder) downwardAPIFile(n *yamlNode, f *corev1.DownwardAPIVolumeFile) bool {
	return d.fields(n, func(k string, v *yamlNode) bool {
		switch k {
		case "path":
			return str(d, v, &f.Path)
		case "fieldRef":
			return newObject(d, v, &f.FieldRef, d.fieldRef)
		case "resourceFieldRef":
			return newObject(d, v, &f.ResourceFieldRef, d.resourceFieldRef)
		case "mode":
			return integer(d, v, &f.Mode)
		}
		return false
	})
}

func (d *treeDecoder) downwardAPI(a *corev1.DownwardAPIVolumeSource, k string, v *yamlNode) bool {
	switch k {
	case "items":
		return items(d, v, &a.Items, d.downwardAPIFile)
	case "defaultMode":
		return integer(d, v, &a.DefaultMode)
	}
	return false
}

func (d *treeDecoder) projected(pr *corev1.ProjectedVolumeSource, k string, v *yamlNode) bool {
	switch k {
	case "sources":
		return items(d, v, &pr.Sources, d.projection)
	case "defaultMode":
		return integer(d, v, &pr.DefaultMode)
	}
	return false
}

func (d *treeDecoder) projection(n *yamlNode, pr *corev1.VolumeProjection) bool {
	return d.fields(n, func(k string, v *yamlNode) bool {
		switch k {
		case "configMap":
			return newObject(d, v, &pr.ConfigMap, func(c *corev1.ConfigMapProjection, k string, v *yamlNode) bool {
				switch k {
				case "name":
					return str(d, v, &c.Name)
				case "items":
					return items(d, v, &c.Items, d.keyToPath)
				case "optional":
					return d.boolPtr(v, &c.Optional)
				}
				return false
			})
		case "secret":
			return newObject(d, v, &pr.Secret, func(s *corev1.SecretProjection, k string, v *yamlNode) bool {
				switch k {
				case "name":
					return str(d, v, &s.Name)
				case "items":
					return items(d, v, &s.Items, d.keyToPath)
				case "optional":
					return d.boolPtr(v, &s.Optional)
				}
				return false
			})
		case "downwardAPI":
			return newObject(d, v, &pr.DownwardAPI, func(a *corev1.DownwardAPIProjection, k string, v *yamlNode) bool {
				return k == "items" && items(d, v, &a.Items, d.downwardAPIFile)
			})
		case "serviceAccountToken":
			return newObject(d, v, &pr.ServiceAccountToken, func(t *corev1.ServiceAccountTokenProjection, k string, v *yamlNode) bool {
				switch k {
				case "path":
					return str(d, v, &t.Path)
				case "audience":
					return str(d, v, &t.Audience)
				case "expirationSeconds":
					return integer(d, v, &t.ExpirationSeconds)
				}
				return false
			})
		}
		return false
	})
}
