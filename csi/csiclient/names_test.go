package csiclient_test

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/volume-agent/volume-agent/csi/csiclient"
)

// Capabilities are named for people whatever spec version defined them:
// values the spec removed by their old names, values no spec defined as
// UNKNOWN(n), never a bare number.
func TestCapabilityNames(t *testing.T) {
	node := []struct {
		value csi.NodeServiceCapability_RPC_Type
		want  string
	}{
		{0, "UNKNOWN"},
		{csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME, "STAGE_UNSTAGE_VOLUME"},
		{csi.NodeServiceCapability_RPC_GET_VOLUME_STATS, "GET_VOLUME_STATS"},
		{csi.NodeServiceCapability_RPC_EXPAND_VOLUME, "EXPAND_VOLUME"},
		{4, "VOLUME_CONDITION"},
		{csiclient.NodeVolumeCondition, "VOLUME_CONDITION"},
		{csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER, "SINGLE_NODE_MULTI_WRITER"},
		{csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP, "VOLUME_MOUNT_GROUP"},
		{csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH, "GET_VOLUME_HEALTH"},
		{csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH, "GET_STORAGE_HEALTH"},
		{99, "UNKNOWN(99)"},
		{-1, "UNKNOWN(-1)"},
	}
	for _, c := range node {
		if got := csiclient.NodeCapabilityName(c.value); got != c.want {
			t.Errorf("node capability %d: %q, want %q", int32(c.value), got, c.want)
		}
	}
	controller := []struct {
		value csi.ControllerServiceCapability_RPC_Type
		want  string
	}{
		{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME, "CREATE_DELETE_VOLUME"},
		{csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES, "LIST_VOLUMES_PUBLISHED_NODES"},
		{11, "VOLUME_CONDITION"},
		{csiclient.ControllerVolumeCondition, "VOLUME_CONDITION"},
		{csi.ControllerServiceCapability_RPC_GET_VOLUME, "GET_VOLUME"},
		{csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH, "LIST_VOLUME_HEALTH"},
		{200, "UNKNOWN(200)"},
	}
	for _, c := range controller {
		if got := csiclient.ControllerCapabilityName(c.value); got != c.want {
			t.Errorf("controller capability %d: %q, want %q", int32(c.value), got, c.want)
		}
	}
	// Every value the spec in go.mod defines keeps its own name.
	for v, name := range csi.NodeServiceCapability_RPC_Type_name {
		if got := csiclient.NodeCapabilityName(csi.NodeServiceCapability_RPC_Type(v)); got != name {
			t.Errorf("node capability %d: %q, want the spec's %q", v, got, name)
		}
	}
	for v, name := range csi.ControllerServiceCapability_RPC_Type_name {
		if got := csiclient.ControllerCapabilityName(csi.ControllerServiceCapability_RPC_Type(v)); got != name {
			t.Errorf("controller capability %d: %q, want the spec's %q", v, got, name)
		}
	}
}
