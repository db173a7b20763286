package csi

import (
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// DriverPolicy is what a driver's CSIDriver object, or its absence, makes
// the plugin do with the driver's volumes, for GET /debug/drivers.
type DriverPolicy struct {
	// CSIDriver says whether the object exists; Error why it could not be
	// read.
	CSIDriver         bool   `json:"csiDriverObject"`
	Error             string `json:"error,omitempty"`
	AttachRequired    bool   `json:"attachRequired"`
	PodInfoOnMount    bool   `json:"podInfoOnMount"`
	RequiresRepublish bool   `json:"requiresRepublish"`
	// FSGroupPolicy is applied by the agent unless the driver has
	// VOLUME_MOUNT_GROUP.
	FSGroupPolicy        storagev1.FSGroupPolicy         `json:"fsGroupPolicy"`
	VolumeLifecycleModes []storagev1.VolumeLifecycleMode `json:"volumeLifecycleModes"`
	// TokenAudiences are the audiences of the service-account tokens
	// NodePublishVolume gets ("" is the API server's own); never tokens.
	TokenAudiences  []string `json:"tokenAudiences,omitempty"`
	TokensInSecrets bool     `json:"serviceAccountTokenInSecrets,omitempty"`
}

// DriverPolicy describes what the plugin does with the volumes of the
// driver named name.
func (p *Plugin) DriverPolicy(name string) DriverPolicy {
	drv, err := p.cfg.CSIDriver(name)
	out := DriverPolicy{}
	switch {
	case err == nil:
		out.CSIDriver = true
	case !apierrors.IsNotFound(err):
		out.Error = err.Error()
		return out
	default:
		drv = nil
	}
	out.AttachRequired = p.attachRequired(drv)
	out.RequiresRepublish = remount(drv)
	out.FSGroupPolicy = fsGroupPolicy(drv)
	out.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}
	if drv == nil {
		return out
	}
	out.PodInfoOnMount = drv.Spec.PodInfoOnMount != nil && *drv.Spec.PodInfoOnMount
	if len(drv.Spec.VolumeLifecycleModes) > 0 {
		out.VolumeLifecycleModes = drv.Spec.VolumeLifecycleModes
	}
	for _, tr := range drv.Spec.TokenRequests {
		out.TokenAudiences = append(out.TokenAudiences, tr.Audience)
	}
	out.TokensInSecrets = tokensInSecrets(drv)
	return out
}

// attachRequired: a CSIDriver says; without one the kubelet assumes attach
// is required, and without an API server there is nothing to attach.
func (p *Plugin) attachRequired(drv *storagev1.CSIDriver) bool {
	if drv == nil {
		return p.cfg.AttachMode != AttachLocal
	}
	return drv.Spec.AttachRequired == nil || *drv.Spec.AttachRequired
}
