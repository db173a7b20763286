package csi

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/csi/csiclient"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Expand grows the volume on the node with NodeExpandVolume, when the
// driver can, with the secret of the PV's nodeExpandSecretRef. The volume path is a pod's mount, or the staging path when no
// pod has the volume yet (offline expansion, after staging and before
// publishing). FailedPrecondition means the driver will not do it while the
// volume is in use; Unimplemented means there is nothing to do on the node;
// InvalidArgument, OutOfRange and NotFound that it cannot be done.
func (p *Plugin) Expand(ctx context.Context, req *plugins.ExpandRequest) (*resource.Quantity, error) {
	if req.Spec == nil || req.Spec.PV == nil {
		return nil, fmt.Errorf("inline CSI volumes cannot be expanded: %w", plugins.ErrExpansionNotSupported)
	}
	src := sourceOf(req.Spec, volume.PodRef{})
	d, err := p.driver(src.driver)
	if err != nil {
		return nil, err
	}
	if !d.Expand {
		return nil, fmt.Errorf("driver %s has no EXPAND_VOLUME node capability: %w", src.driver, plugins.ErrExpansionNotSupported)
	}
	staging := ""
	if d.StageUnstage {
		staging = req.DeviceMountPath
	}
	path := req.VolumePath
	if path == "" && !src.block {
		// A raw block volume's staging directory is not the device: it
		// is grown through a pod's access point.
		path = staging
	}
	if path == "" {
		return nil, fmt.Errorf("driver %s does not stage %s: %w", src.driver, src.handle, plugins.ErrNotPublished)
	}
	secrets, err := p.secrets(ctx, src.expandSecret)
	if err != nil {
		return nil, err
	}
	resp, err := d.Client.Node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: src.handle, VolumePath: path, StagingTargetPath: staging,
		CapacityRange:    &csi.CapacityRange{RequiredBytes: req.NewSize.Value()},
		VolumeCapability: capability(src, "", nodeAccessMode(src, d)), Secrets: secrets,
	})
	switch csiclient.Code(err) {
	case codes.OK:
	case codes.FailedPrecondition:
		return nil, fmt.Errorf("NodeExpandVolume of %s (driver %s): %v: %w", src.handle, src.driver, err, plugins.ErrVolumeInUse)
	case codes.Unimplemented:
		return nil, fmt.Errorf("NodeExpandVolume of %s (driver %s): %v: %w", src.handle, src.driver, err, plugins.ErrExpansionNotSupported)
	case codes.InvalidArgument, codes.OutOfRange, codes.NotFound:
		// The kubelet's isInfeasibleError.
		return nil, fmt.Errorf("NodeExpandVolume of %s (driver %s): %w: %w", src.handle, src.driver, err, plugins.ErrExpansionInfeasible)
	default:
		return nil, fmt.Errorf("NodeExpandVolume of %s (driver %s): %w", src.handle, src.driver, csiclient.Classify(err))
	}
	size := req.NewSize
	if b := resp.GetCapacityBytes(); b > 0 {
		size = *resource.NewQuantity(b, resource.BinarySI)
		if size.Cmp(req.NewSize) < 0 {
			return nil, fmt.Errorf("driver %s grew %s to %s, less than the requested %s", src.driver, src.handle, size.String(), req.NewSize.String())
		}
	}
	return &size, nil
}
