package payload

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/internal/atomicdir"
)

// downwardAPI adds the downward API items to out.
func downwardAPI(out atomicdir.Payload, items []v1.DownwardAPIVolumeFile, def os.FileMode, in Inputs) error {
	var errs []error
	for i := range items {
		it := &items[i]
		if err := atomicdir.ValidatePath(it.Path); err != nil {
			errs = append(errs, fmt.Errorf("downwardAPI: %w", err))
			continue
		}
		var value string
		var err error
		switch {
		case it.FieldRef != nil && it.ResourceFieldRef != nil:
			err = errors.New("both fieldRef and resourceFieldRef are set")
		case it.FieldRef != nil:
			value, err = FieldValue(it.FieldRef, in.Pod)
		case it.ResourceFieldRef != nil:
			value, err = ResourceValue(it.ResourceFieldRef, in.Pod, in.NodeAllocatable)
		default:
			err = errors.New("neither fieldRef nor resourceFieldRef is set")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("downwardAPI %q: %w", it.Path, err))
			continue
		}
		out[it.Path] = atomicdir.File{Data: []byte(value), Mode: itemMode(it.Mode, def)}
	}
	return errors.Join(errs...)
}

// ReadsLabels and ReadsAnnotations tell whether a fieldRef path reads the
// pod's labels or annotations (whole map or one key).
func ReadsLabels(fieldPath string) bool { return strings.HasPrefix(fieldPath, "metadata.labels") }

func ReadsAnnotations(fieldPath string) bool {
	return strings.HasPrefix(fieldPath, "metadata.annotations")
}

// FieldValue is the content of a fieldRef item: the fields the API allows
// in volumes, in the kubelet's formats.
func FieldValue(ref *v1.ObjectFieldSelector, pod *Pod) (string, error) {
	if ref.APIVersion != "" && ref.APIVersion != "v1" {
		return "", fmt.Errorf("fieldRef apiVersion %q is not supported (v1 is)", ref.APIVersion)
	}
	if pod == nil {
		return "", errors.New("the pod's metadata is not known")
	}
	path := ref.FieldPath
	if key, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[key], nil
	}
	if key, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[strings.ToLower(key)], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return FormatMap(pod.Labels), nil
	case "metadata.annotations":
		return FormatMap(pod.Annotations), nil
	}
	return "", fmt.Errorf("fieldPath %q is not supported in volumes (metadata.name, metadata.namespace, metadata.uid, metadata.labels, metadata.annotations and their ['key'] forms are)", path)
}

// subscript parses "<prefix>['key']".
func subscript(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"['")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "']")
}

// FormatMap is the kubelet's format of labels and annotations: one
// key="value" line per key, sorted by key, the value quoted with Go's
// escapes, and no newline after the last line.
func FormatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(m[k]))
	}
	return b.String()
}

// ResourceValue is the content of a resourceFieldRef item: the named
// container's request or limit divided by the divisor and rounded up. An
// unset (or zero) cpu, memory or ephemeral-storage limit is the node's
// allocatable amount.
func ResourceValue(ref *v1.ResourceFieldSelector, pod *Pod, allocatable v1.ResourceList) (string, error) {
	if ref.ContainerName == "" {
		return "", errors.New("resourceFieldRef needs a containerName in volumes")
	}
	if pod == nil {
		return "", errors.New("the pod's containers are not known")
	}
	var c *Container
	for i := range pod.Containers {
		if pod.Containers[i].Name == ref.ContainerName {
			c = &pod.Containers[i]
			break
		}
	}
	if c == nil {
		return "", fmt.Errorf("container %q not found in the pod", ref.ContainerName)
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") {
		return "", fmt.Errorf("resource %q is not supported (limits.<name> or requests.<name>)", ref.Resource)
	}
	rn := v1.ResourceName(name)
	switch {
	case rn == v1.ResourceCPU, rn == v1.ResourceMemory, rn == v1.ResourceEphemeralStorage, strings.HasPrefix(name, v1.ResourceHugePagesPrefix):
	default:
		return "", fmt.Errorf("resource %q is not supported (cpu, memory, ephemeral-storage, hugepages-<size>)", ref.Resource)
	}
	list := c.Resources.Requests
	if kind == "limits" {
		list = c.Resources.Limits
	}
	q, set := list[rn]
	if kind == "limits" && (!set || q.IsZero()) && (rn == v1.ResourceCPU || rn == v1.ResourceMemory || rn == v1.ResourceEphemeralStorage) {
		q, set = allocatable[rn]
		if !set {
			return "", fmt.Errorf("container %q has no %s limit and the node's allocatable %s is not known", c.Name, name, name)
		}
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if rn == v1.ResourceCPU {
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	}
	if divisor.Value() == 0 {
		return "", fmt.Errorf("divisor %s is below 1 for %s", divisor.String(), name)
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
}
