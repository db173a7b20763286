package payload

import (
	v1 "k8s.io/api/core/v1"
)

// Refs is what an API volume's content depends on besides its spec: the
// objects whose changes must reach the volume, and the parts of the pod
// it reads.
type Refs struct {
	// ConfigMaps and Secrets are names in the pod's namespace.
	ConfigMaps []string
	Secrets    []string
	// TrustBundles are the clusterTrustBundle projections.
	TrustBundles []*v1.ClusterTrustBundleProjection
	// Tokens is set when the volume holds service-account tokens.
	Tokens bool
	// PodCertificates is set when the volume holds podCertificate
	// projections: their requests' changes must reach it.
	PodCertificates bool
	// Labels, Annotations and Resources are set when a downwardAPI item
	// reads the pod's labels, annotations or container resources.
	Labels, Annotations, Resources bool
}

// IsAPIVolume reports whether the volume source is one of the four API
// volume types.
func IsAPIVolume(vs *v1.VolumeSource) bool {
	return vs.ConfigMap != nil || vs.Secret != nil || vs.DownwardAPI != nil || vs.Projected != nil
}

// RefsOf lists what the volume source depends on.
func RefsOf(vs *v1.VolumeSource) Refs {
	var r Refs
	switch {
	case vs.ConfigMap != nil:
		r.ConfigMaps = append(r.ConfigMaps, vs.ConfigMap.Name)
	case vs.Secret != nil:
		r.Secrets = append(r.Secrets, vs.Secret.SecretName)
	case vs.DownwardAPI != nil:
		r.downward(vs.DownwardAPI.Items)
	case vs.Projected != nil:
		for i := range vs.Projected.Sources {
			s := &vs.Projected.Sources[i]
			switch {
			case s.ConfigMap != nil:
				r.ConfigMaps = append(r.ConfigMaps, s.ConfigMap.Name)
			case s.Secret != nil:
				r.Secrets = append(r.Secrets, s.Secret.Name)
			case s.DownwardAPI != nil:
				r.downward(s.DownwardAPI.Items)
			case s.ServiceAccountToken != nil:
				r.Tokens = true
			case s.ClusterTrustBundle != nil:
				r.TrustBundles = append(r.TrustBundles, s.ClusterTrustBundle)
			case s.PodCertificate != nil:
				r.PodCertificates = true
			}
		}
	}
	return r
}

func (r *Refs) downward(items []v1.DownwardAPIVolumeFile) {
	for i := range items {
		if f := items[i].FieldRef; f != nil {
			r.Labels = r.Labels || ReadsLabels(f.FieldPath)
			r.Annotations = r.Annotations || ReadsAnnotations(f.FieldPath)
		}
		if items[i].ResourceFieldRef != nil {
			r.Resources = true
		}
	}
}

// ReadsPod reports whether the content depends on the pod object beyond
// its name, namespace and UID.
func (r Refs) ReadsPod() bool { return r.Labels || r.Annotations || r.Resources }
