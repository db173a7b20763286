// Package image implements image volumes (volumes[].image, KEP 4639): an
// OCI image or artifact the container runtime pulls and mounts read-only.
// Like the kubelet's own image plugin, it mounts nothing: setting one up
// records it, and it is ready as soon as it is resolved. What a runtime
// needs to mount it (the reference, the pull policy as the API server
// defaults it, and each container's sub-path inside the image) goes to it
// through the runtime API. There is no host path: no directory is made, no
// sub-path is prepared, no fsGroup is applied, nothing is left on disk to
// reconstruct after a restart (the volume is set up again, which is free).
package image

import (
	"context"
	"fmt"

	"github.com/distribution/reference"
	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Name is the plugin's name (the kubelet's).
const Name = "kubernetes.io/image"

// Plugin is the image volume plugin.
type Plugin struct{}

var _ plugins.Plugin = (*Plugin)(nil)

// New returns the plugin.
func New() *Plugin { return &Plugin{} }

func (p *Plugin) Name() string { return Name }

// Source returns the volume's image source, or nil.
func Source(spec *volume.Spec) *v1.ImageVolumeSource {
	if spec == nil || spec.Volume == nil {
		return nil
	}
	return spec.Volume.Image
}

func (p *Plugin) CanSupport(spec *volume.Spec) bool { return Source(spec) != nil }

// Attributes: an image volume has no host path and is read-only for every
// container, whatever the pod says.
func (p *Plugin) Attributes(spec *volume.Spec) (volume.Attributes, error) {
	src := Source(spec)
	if src.Reference == "" {
		// The API server requires it for pods; a manifest may lack it.
		return volume.Attributes{}, fmt.Errorf("image volume has no reference")
	}
	if spec.IsBlock() {
		return volume.Attributes{}, fmt.Errorf("image volume cannot be used as a raw block device")
	}
	switch src.PullPolicy {
	case "", v1.PullAlways, v1.PullNever, v1.PullIfNotPresent:
	default:
		return volume.Attributes{}, fmt.Errorf("image volume pullPolicy %q is not one of Always, IfNotPresent, Never", src.PullPolicy)
	}
	return volume.Attributes{NoHostPath: true, ReadOnlyForContainers: true}, nil
}

// PullPolicy is the volume's pull policy as the API server defaults it:
// as given, else Always for a reference tagged :latest or with neither tag
// nor digest, IfNotPresent otherwise (a reference that does not parse
// included, as there). Standalone manifests are not defaulted by anyone
// else.
func PullPolicy(src *v1.ImageVolumeSource) v1.PullPolicy {
	if src.PullPolicy != "" {
		return src.PullPolicy
	}
	named, err := reference.ParseNormalizedNamed(src.Reference)
	if err != nil {
		return v1.PullIfNotPresent
	}
	tagged, isTagged := named.(reference.Tagged)
	_, isDigested := named.(reference.Digested)
	if (isTagged && tagged.Tag() == "latest") || (!isTagged && !isDigested) {
		return v1.PullAlways
	}
	return v1.PullIfNotPresent
}

// SetUp records the volume: the runtime pulls and mounts the image when it
// creates the containers, as with the kubelet.
func (p *Plugin) SetUp(context.Context, *plugins.SetUpRequest) error { return nil }

// TearDown has nothing to undo.
func (p *Plugin) TearDown(context.Context, *plugins.TearDownRequest) error { return nil }
