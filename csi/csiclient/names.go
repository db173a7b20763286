package csiclient

import (
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// Capability values the CSI spec once defined and later removed (spec 1.13
// reserved them). Drivers built against an older spec still send them, and
// the kubelet (CSI spec 1.9) still acts on them.
const (
	// NodeVolumeCondition is the node capability VOLUME_CONDITION:
	// NodeGetVolumeStats returns volume_condition (field 2).
	NodeVolumeCondition csi.NodeServiceCapability_RPC_Type = 4
	// ControllerVolumeCondition is the controller capability
	// VOLUME_CONDITION (ListVolumes and ControllerGetVolume report it).
	ControllerVolumeCondition csi.ControllerServiceCapability_RPC_Type = 11
)

// removedNodeNames and removedControllerNames name the values the spec
// removed; the generated tables name the rest.
var (
	removedNodeNames       = map[csi.NodeServiceCapability_RPC_Type]string{NodeVolumeCondition: "VOLUME_CONDITION"}
	removedControllerNames = map[csi.ControllerServiceCapability_RPC_Type]string{ControllerVolumeCondition: "VOLUME_CONDITION"}
)

// NodeCapabilityName is the name of a node capability for people, also for
// values the spec in go.mod no longer defines: the generated String()
// prints those as bare numbers ("4"). A value no spec version defined is
// "UNKNOWN(n)".
func NodeCapabilityName(t csi.NodeServiceCapability_RPC_Type) string {
	if n, ok := removedNodeNames[t]; ok {
		return n
	}
	if n, ok := csi.NodeServiceCapability_RPC_Type_name[int32(t)]; ok {
		return n
	}
	return fmt.Sprintf("UNKNOWN(%d)", int32(t))
}

// ControllerCapabilityName is NodeCapabilityName for controller
// capabilities.
func ControllerCapabilityName(t csi.ControllerServiceCapability_RPC_Type) string {
	if n, ok := removedControllerNames[t]; ok {
		return n
	}
	if n, ok := csi.ControllerServiceCapability_RPC_Type_name[int32(t)]; ok {
		return n
	}
	return fmt.Sprintf("UNKNOWN(%d)", int32(t))
}
