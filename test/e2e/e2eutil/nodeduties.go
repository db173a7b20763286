package e2eutil

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What a kubelet publishes about its node for CSI (k8s.io/kubernetes
// pkg/volume/csi/nodeinfomanager, and the attach/detach controller's
// annotation): the tests check it on the Node and its CSINode, whoever
// wrote it.
const (
	// NodeIDAnnotation on a Node is a JSON map of driver name → the node
	// ID that driver's NodeGetInfo returned.
	NodeIDAnnotation = "csi.volume.kubernetes.io/nodeid"
	// ControllerManagedAttachAnnotation on a Node makes the attach/detach
	// controller manage the attachments of its pods' volumes.
	ControllerManagedAttachAnnotation = "volumes.kubernetes.io/controller-managed-attach-detach"
)

// NodeDuty is what a node publishes about one CSI driver registered on it.
type NodeDuty struct {
	Driver string
	// NodeID, Topology and MaxVolumes are what the driver's NodeGetInfo
	// returned; MaxVolumes 0 is no limit (no allocatable count).
	NodeID     string
	Topology   map[string]string
	MaxVolumes int64
	// ControllerAttach also wants the Node to carry
	// ControllerManagedAttachAnnotation=true (attach mode controller).
	ControllerAttach bool
}

// CheckNodeDuties returns nil if the Node and its CSINode carry what the
// kubelet writes for a registered driver, or an error saying what differs:
// the CSINode named after the node, owned by the Node, with the driver's
// entry {nodeID, sorted topology keys, allocatable count}; the Node's
// NodeIDAnnotation naming the driver's node ID, its topology labels and,
// for ControllerAttach, ControllerManagedAttachAnnotation=true.
func (cp *ControlPlane) CheckNodeDuties(ctx context.Context, node string, d NodeDuty) error {
	n, err := cp.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ids, err := nodeIDs(n.Annotations)
	if err != nil {
		return err
	}
	if ids[d.Driver] != d.NodeID {
		return fmt.Errorf("node %s: annotation %s = %q, want %s → %s", node, NodeIDAnnotation, n.Annotations[NodeIDAnnotation], d.Driver, d.NodeID)
	}
	for k, v := range d.Topology {
		if got, ok := n.Labels[k]; !ok || got != v {
			return fmt.Errorf("node %s: label %s = %q, want %q (labels %v)", node, k, got, v, n.Labels)
		}
	}
	if got := n.Annotations[ControllerManagedAttachAnnotation]; d.ControllerAttach && got != "true" {
		return fmt.Errorf("node %s: annotation %s = %q, want true", node, ControllerManagedAttachAnnotation, got)
	}

	csiNode, err := cp.Admin.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("CSINode %s: %w", node, err)
	}
	if !slices.ContainsFunc(csiNode.OwnerReferences, func(r metav1.OwnerReference) bool {
		return r.APIVersion == "v1" && r.Kind == "Node" && r.Name == node && r.UID == n.UID
	}) {
		return fmt.Errorf("CSINode %s: owner references %+v, want the Node (uid %s)", node, csiNode.OwnerReferences, n.UID)
	}
	entry := csiNodeDriver(csiNode, d.Driver)
	if entry == nil {
		return fmt.Errorf("CSINode %s: no entry for driver %s (drivers %+v)", node, d.Driver, csiNode.Spec.Drivers)
	}
	if entry.NodeID != d.NodeID {
		return fmt.Errorf("CSINode %s: driver %s has node ID %q, want %q", node, d.Driver, entry.NodeID, d.NodeID)
	}
	if keys := slices.Sorted(maps.Keys(d.Topology)); !slices.Equal(entry.TopologyKeys, keys) {
		return fmt.Errorf("CSINode %s: driver %s has topology keys %q, want %q", node, d.Driver, entry.TopologyKeys, keys)
	}
	var count int64
	if entry.Allocatable != nil && entry.Allocatable.Count != nil {
		count = int64(*entry.Allocatable.Count)
	}
	if count != d.MaxVolumes {
		return fmt.Errorf("CSINode %s: driver %s has allocatable count %d, want %d", node, d.Driver, count, d.MaxVolumes)
	}
	return nil
}

// WaitNodeDuties waits (60 s at most) until CheckNodeDuties holds.
func (cp *ControlPlane) WaitNodeDuties(t *testing.T, node string, d NodeDuty) {
	t.Helper()
	Poll(t, 60*time.Second, fmt.Sprintf("node %s's CSINode entry, annotations and labels for driver %s", node, d.Driver), func(ctx context.Context) (bool, string) {
		if err := cp.CheckNodeDuties(ctx, node, d); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// CheckNodeDutiesGone returns nil once the node no longer publishes the
// driver, as the kubelet leaves it after the driver deregistered: no entry
// for it in the CSINode (which stays) and no key for it in
// NodeIDAnnotation (removed when empty). Topology labels stay, as the
// kubelet leaves them.
func (cp *ControlPlane) CheckNodeDutiesGone(ctx context.Context, node, driver string) error {
	n, err := cp.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ids, err := nodeIDs(n.Annotations)
	if err != nil {
		return err
	}
	if id, ok := ids[driver]; ok {
		return fmt.Errorf("node %s: annotation %s still maps %s to %q", node, NodeIDAnnotation, driver, id)
	}
	if v, ok := n.Annotations[NodeIDAnnotation]; ok && len(ids) == 0 {
		return fmt.Errorf("node %s: annotation %s = %q: empty, it should have been removed", node, NodeIDAnnotation, v)
	}
	csiNode, err := cp.Admin.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if e := csiNodeDriver(csiNode, driver); e != nil {
		return fmt.Errorf("CSINode %s: still has an entry for driver %s: %+v", node, driver, *e)
	}
	return nil
}

// WaitNodeDutiesGone waits (60 s at most) until CheckNodeDutiesGone holds.
func (cp *ControlPlane) WaitNodeDutiesGone(t *testing.T, node, driver string) {
	t.Helper()
	Poll(t, 60*time.Second, fmt.Sprintf("node %s no longer publishing driver %s", node, driver), func(ctx context.Context) (bool, string) {
		if err := cp.CheckNodeDutiesGone(ctx, node, driver); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// nodeIDs decodes a Node's NodeIDAnnotation (none: an empty map).
func nodeIDs(annotations map[string]string) (map[string]string, error) {
	ids := map[string]string{}
	if v, ok := annotations[NodeIDAnnotation]; ok {
		if err := json.Unmarshal([]byte(v), &ids); err != nil {
			return nil, fmt.Errorf("annotation %s = %q: %w", NodeIDAnnotation, v, err)
		}
	}
	return ids, nil
}

func csiNodeDriver(n *storagev1.CSINode, driver string) *storagev1.CSINodeDriver {
	for i := range n.Spec.Drivers {
		if n.Spec.Drivers[i].Name == driver {
			return &n.Spec.Drivers[i]
		}
	}
	return nil
}
