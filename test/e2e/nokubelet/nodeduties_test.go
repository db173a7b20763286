package nokubelet_test

import (
	"encoding/json"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// nodeDutiesByHand does for a driver that registered on the node what the
// kubelet would (nodeinfomanager's InstallCSIDriver, and
// --enable-controller-attach-detach): the CSINode named after the node,
// owned by the Node, with the driver's entry {nodeID, topology keys,
// allocatable count}; on the Node, the driver's key in
// csi.volume.kubernetes.io/nodeid, the topology labels and
// volumes.kubernetes.io/controller-managed-attach-detach=true. Other
// drivers' entries and keys are kept; conflicts are retried.
//
// Without it the cluster never learns the driver is on the node: the
// attach/detach controller ignores a Node without the annotation,
// external-attacher finds no node ID for ControllerPublishVolume and
// external-provisioner no topology.
//
// TODO(issue 26): the agent does this.
func (e *env) nodeDutiesByHand(d e2eutil.NodeDuty) {
	e.t.Helper()
	ctx := e.t.Context()
	nodes := suite.Admin.CoreV1().Nodes()
	var node *corev1.Node
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ids := map[string]string{}
		if v, ok := n.Annotations[e2eutil.NodeIDAnnotation]; ok {
			if err := json.Unmarshal([]byte(v), &ids); err != nil {
				return err
			}
		}
		ids[d.Driver] = d.NodeID
		v, err := json.Marshal(ids)
		if err != nil {
			return err
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[e2eutil.NodeIDAnnotation] = string(v)
		if d.ControllerAttach {
			n.Annotations[e2eutil.ControllerManagedAttachAnnotation] = "true"
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		maps.Copy(n.Labels, d.Topology)
		node, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("node duties by hand: node %s: %v", e.node, err)
	}

	entry := storagev1.CSINodeDriver{Name: d.Driver, NodeID: d.NodeID, TopologyKeys: slices.Sorted(maps.Keys(d.Topology))}
	if d.MaxVolumes > 0 {
		entry.Allocatable = &storagev1.VolumeNodeResources{Count: ptr.To(int32(d.MaxVolumes))}
	}
	csiNodes := suite.Admin.StorageV1().CSINodes()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cn, err := csiNodes.Get(ctx, e.node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = csiNodes.Create(ctx, &storagev1.CSINode{
				ObjectMeta: metav1.ObjectMeta{Name: e.node, OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}}},
				Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{entry}},
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(storagev1.Resource("csinodes"), e.node, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		cn.Spec.Drivers = slices.DeleteFunc(cn.Spec.Drivers, func(x storagev1.CSINodeDriver) bool { return x.Name == d.Driver })
		cn.Spec.Drivers = append(cn.Spec.Drivers, entry)
		_, err = csiNodes.Update(ctx, cn, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("node duties by hand: CSINode %s: %v", e.node, err)
	}
	e.t.Logf("node duties done by hand for driver %s: node ID %s, topology %v, %d volumes", d.Driver, d.NodeID, d.Topology, d.MaxVolumes)
}

// nodeDutiesUndoneByHand does what the kubelet does when a driver
// deregisters (nodeinfomanager's UninstallCSIDriver): the driver's CSINode
// entry removed, then its key in csi.volume.kubernetes.io/nodeid (the
// annotation removed when empty). Topology labels and the CSINode stay.
//
// TODO(issue 26): the agent does this.
func (e *env) nodeDutiesUndoneByHand(driver string) {
	e.t.Helper()
	ctx := e.t.Context()
	csiNodes := suite.Admin.StorageV1().CSINodes()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cn, err := csiNodes.Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cn.Spec.Drivers = slices.DeleteFunc(cn.Spec.Drivers, func(x storagev1.CSINodeDriver) bool { return x.Name == driver })
		_, err = csiNodes.Update(ctx, cn, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("undoing node duties by hand: CSINode %s: %v", e.node, err)
	}
	nodes := suite.Admin.CoreV1().Nodes()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ids := map[string]string{}
		if v, ok := n.Annotations[e2eutil.NodeIDAnnotation]; ok {
			if err := json.Unmarshal([]byte(v), &ids); err != nil {
				return err
			}
		}
		delete(ids, driver)
		if len(ids) == 0 {
			delete(n.Annotations, e2eutil.NodeIDAnnotation)
		} else {
			v, err := json.Marshal(ids)
			if err != nil {
				return err
			}
			n.Annotations[e2eutil.NodeIDAnnotation] = string(v)
		}
		_, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("undoing node duties by hand: node %s: %v", e.node, err)
	}
}

// waitNodeDuties waits until the node publishes the driver as the kubelet
// would (e2eutil.CheckNodeDuties), in attach mode controller.
func (e *env) waitNodeDuties(driver, nodeID string, topology map[string]string, count int64) {
	e.t.Helper()
	suite.WaitNodeDuties(e.t, e.node, e2eutil.NodeDuty{
		Driver: driver, NodeID: nodeID, Topology: topology, MaxVolumes: count, ControllerAttach: true,
	})
}

// waitNodeDutiesGone waits until the node no longer publishes the driver
// (e2eutil.CheckNodeDutiesGone).
func (e *env) waitNodeDutiesGone(driver string) {
	e.t.Helper()
	suite.WaitNodeDutiesGone(e.t, e.node, driver)
}
