package apivolume

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/volume-agent/volume-agent/plugins/apivolume/payload"
)

// What an API volume's content depends on, for whoever keeps it current
// (package refresh): the objects it is built from and the parts of the pod
// it reads. The answers are payload's, which builds the content, so the two
// cannot disagree; they are here so that the rest of the agent needs only
// this package.

// Refs is what a volume's content is built from besides its spec.
type Refs = payload.Refs

// Pod is what content is built from of the pod object (PodMetadata).
type Pod = payload.Pod

// RefsOf lists what the content of an API volume source depends on.
func RefsOf(vs *v1.VolumeSource) Refs { return payload.RefsOf(vs) }

// PodOf copies what the content of volumes with refs reads of a pod: its
// labels and annotations only when some item reads them (annotations can
// be large, and most pods have no such item).
func PodOf(pod *v1.Pod, refs Refs) *Pod {
	return payload.FromObject(pod, refs.Labels, refs.Annotations)
}

// PodChangeMatters reports whether a volume with refs reads something of
// the pod that differs between a and b.
func PodChangeMatters(refs Refs, a, b *Pod) bool {
	return (refs.Labels && !equality.Semantic.DeepEqual(a.Labels, b.Labels)) ||
		(refs.Annotations && !equality.Semantic.DeepEqual(a.Annotations, b.Annotations)) ||
		(refs.Resources && !equality.Semantic.DeepEqual(a.Containers, b.Containers))
}
