package nodeinfo

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Keys the kubelet writes on its Node, and so does the agent.
const (
	// AnnotationNodeID maps each driver on the node to its node ID, as
	// JSON ({"driver": "id"}).
	AnnotationNodeID = "csi.volume.kubernetes.io/nodeid"
	// AnnotationControllerAttachDetach tells the attach/detach controller
	// to attach and detach the node's volumes.
	AnnotationControllerAttachDetach = "volumes.kubernetes.io/controller-managed-attach-detach"
)

// Driver is what a registered driver said about this node (NodeGetInfo).
type Driver struct {
	Name   string
	NodeID string
	// Topology is the driver's accessible topology: its keys become the
	// CSINode entry's topologyKeys, the pairs the Node's labels.
	Topology map[string]string
	// MaxVolumes is the allocatable volume count; 0 for none.
	MaxVolumes int64
}

// AttachDetach is what the agent does with the Node's
// controller-managed-attach-detach annotation.
type AttachDetach int

const (
	// AttachDetachLeave leaves the annotation as it is.
	AttachDetachLeave AttachDetach = iota
	// AttachDetachController sets it to "true": the attach/detach
	// controller creates and deletes the node's VolumeAttachments.
	AttachDetachController
	// AttachDetachSelf removes it: the agent attaches itself.
	AttachDetachSelf
)

// Desired is what the node should say about its CSI drivers.
type Desired struct {
	// Install are the drivers to install (or keep installed) with this
	// information.
	Install []Driver
	// Remove are the drivers whose entry and annotation key go.
	Remove       []string
	AttachDetach AttachDetach
}

// NodeChange is a change of the Node's metadata: annotation and label
// values to set, and annotations to delete (labels are never deleted: the
// kubelet leaves topology labels behind too).
type NodeChange struct {
	SetAnnotations    map[string]string
	DeleteAnnotations []string
	SetLabels         map[string]string
}

// Empty reports whether the change changes nothing.
func (c NodeChange) Empty() bool {
	return len(c.SetAnnotations) == 0 && len(c.DeleteAnnotations) == 0 && len(c.SetLabels) == 0
}

// MergePatch is the change as a JSON merge patch that applies only to the
// node at resourceVersion: a node changed since it was read fails with a
// conflict instead of losing another writer's change.
func (c NodeChange) MergePatch(resourceVersion string) ([]byte, error) {
	meta := map[string]any{"resourceVersion": resourceVersion}
	if len(c.SetAnnotations) > 0 || len(c.DeleteAnnotations) > 0 {
		a := map[string]any{}
		for k, v := range c.SetAnnotations {
			a[k] = v
		}
		for _, k := range c.DeleteAnnotations {
			a[k] = nil
		}
		meta["annotations"] = a
	}
	if len(c.SetLabels) > 0 {
		meta["labels"] = c.SetLabels
	}
	return json.Marshal(map[string]any{"metadata": meta})
}

// DriverError says why a driver cannot be installed; the other drivers are
// not held up by it.
type DriverError struct {
	Driver string
	Err    error
}

func (e DriverError) Error() string { return fmt.Sprintf("CSI driver %s: %v", e.Driver, e.Err) }

// PlanNode computes the Node's change: the node ID annotation holds every
// installed driver (other drivers' keys are kept, removed drivers' keys
// go, an empty map deletes the annotation), topology labels are added, and
// the attach/detach annotation follows the attach mode. A driver whose
// topology collides with an existing label of another value is not
// installed at all (never overwritten; the kubelet refuses it the same
// way), nor is a driver without a node ID; they come back as errors. A node
// ID annotation that is not valid JSON is an error for the whole node:
// whoever wrote it, rewriting it would lose their entries.
func PlanNode(node *v1.Node, d Desired) (NodeChange, []DriverError, error) {
	var change NodeChange
	ids, err := NodeIDs(node)
	if err != nil {
		return change, nil, err
	}
	var failed []DriverError
	newIDs := maps.Clone(ids)
	labels := map[string]string{}
	for _, drv := range sortedDrivers(d.Install) {
		if err := installable(node, labels, drv); err != nil {
			failed = append(failed, DriverError{Driver: drv.Name, Err: err})
			continue
		}
		newIDs[drv.Name] = drv.NodeID
		for k, v := range drv.Topology {
			if node.Labels[k] != v {
				labels[k] = v
			}
		}
	}
	for _, name := range d.Remove {
		delete(newIDs, name)
	}
	if !maps.Equal(ids, newIDs) {
		if len(newIDs) == 0 {
			change.DeleteAnnotations = append(change.DeleteAnnotations, AnnotationNodeID)
		} else {
			data, err := json.Marshal(newIDs) // sorted keys
			if err != nil {
				return NodeChange{}, nil, err
			}
			change.SetAnnotations = map[string]string{AnnotationNodeID: string(data)}
		}
	}
	if len(labels) > 0 {
		change.SetLabels = labels
	}
	cur, set := node.Annotations[AnnotationControllerAttachDetach]
	switch {
	case d.AttachDetach == AttachDetachController && cur != "true":
		if change.SetAnnotations == nil {
			change.SetAnnotations = map[string]string{}
		}
		change.SetAnnotations[AnnotationControllerAttachDetach] = "true"
	case d.AttachDetach == AttachDetachSelf && set:
		change.DeleteAnnotations = append(change.DeleteAnnotations, AnnotationControllerAttachDetach)
	}
	return change, failed, nil
}

// installable checks a driver against the node as it is and the labels
// other drivers add in the same change.
func installable(node *v1.Node, adding map[string]string, drv Driver) error {
	if drv.NodeID == "" {
		return fmt.Errorf("empty node ID")
	}
	for _, k := range slices.Sorted(maps.Keys(drv.Topology)) {
		v := drv.Topology[k]
		if cur, ok := node.Labels[k]; ok && cur != v {
			return fmt.Errorf("topology value collision: the driver reports %s=%s but the node's label is %s=%s", k, v, k, cur)
		}
		if cur, ok := adding[k]; ok && cur != v {
			return fmt.Errorf("topology value collision: the driver reports %s=%s but another driver reports %s=%s", k, v, k, cur)
		}
	}
	return nil
}

// NodeIDs reads the node ID annotation.
func NodeIDs(node *v1.Node) (map[string]string, error) {
	ids := map[string]string{}
	raw := node.Annotations[AnnotationNodeID]
	if raw == "" {
		return ids, nil
	}
	if err := json.Unmarshal([]byte(raw), &ids); err != nil {
		return nil, fmt.Errorf("the node's %s annotation %q is not a JSON map of driver names to node IDs: %w", AnnotationNodeID, raw, err)
	}
	if ids == nil { // "null"
		ids = map[string]string{}
	}
	return ids, nil
}

// Entry is the CSINode entry of a driver, as the kubelet writes it: sorted
// topology keys, and an allocatable count only when the driver reports a
// limit (capped at the API's int32).
func Entry(d Driver) storagev1.CSINodeDriver {
	e := storagev1.CSINodeDriver{Name: d.Name, NodeID: d.NodeID, TopologyKeys: slices.Sorted(maps.Keys(d.Topology))}
	if e.TopologyKeys == nil {
		e.TopologyKeys = []string{}
	}
	if d.MaxVolumes > 0 {
		n := int32(min(d.MaxVolumes, math.MaxInt32))
		e.Allocatable = &storagev1.VolumeNodeResources{Count: &n}
	}
	return e
}

// PlanCSINode computes the CSINode's drivers: the entries of installed
// drivers added or replaced, those of removed drivers dropped, everything
// else kept as it is (in its order). changed is false when the entries
// already say all that.
func PlanCSINode(cur []storagev1.CSINodeDriver, install []Driver, remove []string) (drivers []storagev1.CSINodeDriver, changed bool) {
	want := map[string]storagev1.CSINodeDriver{}
	for _, d := range install {
		want[d.Name] = Entry(d)
	}
	for _, name := range remove {
		if _, ok := want[name]; !ok {
			want[name] = storagev1.CSINodeDriver{} // zero Name: drop
		}
	}
	out := make([]storagev1.CSINodeDriver, 0, len(cur)+len(install))
	placed := map[string]bool{}
	for _, e := range cur {
		w, ok := want[e.Name]
		switch {
		case !ok:
			out = append(out, e)
		case w.Name == "":
			changed = true
		default:
			placed[e.Name] = true
			if !sameEntry(e, w) {
				changed = true
				e = w
			}
			out = append(out, e)
		}
	}
	for _, d := range sortedDrivers(install) {
		if !placed[d.Name] {
			out = append(out, want[d.Name])
			changed = true
		}
	}
	return out, changed
}

// sameEntry compares what the agent writes of an entry, the way the
// kubelet decides to leave one alone: node ID, the set of topology keys and
// the count.
func sameEntry(a, b storagev1.CSINodeDriver) bool {
	if a.NodeID != b.NodeID {
		return false
	}
	ak, bk := slices.Clone(a.TopologyKeys), slices.Clone(b.TopologyKeys)
	sort.Strings(ak)
	sort.Strings(bk)
	if !slices.Equal(slices.Compact(ak), slices.Compact(bk)) {
		return false
	}
	count := func(e storagev1.CSINodeDriver) int32 {
		if e.Allocatable == nil || e.Allocatable.Count == nil {
			return 0
		}
		return *e.Allocatable.Count
	}
	return count(a) == count(b)
}

// NewCSINode is the CSINode of a node that has none: owned by the Node, so
// that it goes when the Node is deleted.
func NewCSINode(node *v1.Node) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{
			Name: node.Name,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
			}},
		},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{}},
	}
}

// OwnedBy reports whether the CSINode belongs to this Node object: a Node
// deleted and created again under the same name (a new UID) must not
// inherit the old one's entries.
func OwnedBy(n *storagev1.CSINode, nodeName string, nodeUID types.UID) bool {
	for _, o := range n.OwnerReferences {
		if o.Kind == "Node" && o.Name == nodeName && o.UID == nodeUID {
			return true
		}
	}
	return false
}

func sortedDrivers(ds []Driver) []Driver {
	out := slices.Clone(ds)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
