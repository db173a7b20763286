//go:build tools

// Package tools pins the CSI sidecars the end-to-end tests run against the
// test CSI driver: external-provisioner (claims → CreateVolume/DeleteVolume,
// topology from CSINode), external-attacher (VolumeAttachments →
// ControllerPublishVolume/ControllerUnpublishVolume with the node ID from
// CSINode) and external-resizer (claims grown → ControllerExpandVolume).
// test/tools/build.sh builds them into a cache directory of their own.
// node-driver-registrar is not here: the module proxy does not serve it,
// and the test driver serves the kubelet plugin-registration API itself
// (--registration-dir).
package tools

import (
	_ "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
	_ "github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
)
