package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/csi/nodeinfo"
	"github.com/volume-agent/volume-agent/test/csidriver"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// The node's CSINode does not belong to its Node: it was left by an earlier
// Node of the same name (the machine was deleted from the cluster and
// joined again; the garbage collector removes those too, in its own time)
// or made by someone else without an owner, as here. Its entries describe
// another life of the node. The agent deletes it and makes the node's own,
// owned by the Node, with the entry of the driver that is there now (its
// node ID, topology key, volume limit); the Node gets the node ID
// annotation, the topology label and the attach/detach annotation, and
// keeps its other annotations.
func TestCSINodeOfAnEarlierNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "csinode")
	ctx := t.Context()
	admin := suite.Admin
	node, err := admin.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().Patch(ctx, e.node, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"example.com/owner":"team-a"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	stale := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: e.node},
		Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: "gone.csi.volume-agent.io", NodeID: "old"}}},
	}
	stale, err = admin.StorageV1().CSINodes().Create(ctx, stale, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.StorageV1().CSINodes().Delete(context.Background(), e.node, metav1.DeleteOptions{}) })

	const driverName, limit = "csinode.csi.volume-agent.io", 5
	driver := e2eutil.StartCSIDriver(t, e2eutil.CSIDriverOptions{
		Binary: suite.CSIDriverBin, Name: driverName, NodeID: "id-" + e.node,
		StateDir: filepath.Join(e.data, "csi-state"),
		Args:     []string{"--topology", fmt.Sprintf("--max-volumes-per-node=%d", limit)},
	})
	suite.CreateCSIDriver(t, driverName, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	e.start("--csi-driver=" + driverName + "=" + driver.Endpoint())

	wantTopology := map[string]string{csidriver.TopologyKey(driverName): "id-" + e.node}
	e2eutil.Poll(t, 60*time.Second, "the node's own CSINode with the driver's entry", func(ctx context.Context) (bool, string) {
		cn, err := admin.StorageV1().CSINodes().Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ok := len(cn.OwnerReferences) == 1 && cn.OwnerReferences[0].UID == node.UID && len(cn.Spec.Drivers) == 1
		if ok {
			d := cn.Spec.Drivers[0]
			ok = d.Name == driverName && d.NodeID == "id-"+e.node && len(d.TopologyKeys) == 1 &&
				d.TopologyKeys[0] == csidriver.TopologyKey(driverName) && d.Allocatable != nil && ptr.Deref(d.Allocatable.Count, 0) == limit
		}
		return ok, fmt.Sprintf("owners %+v, drivers %+v", cn.OwnerReferences, cn.Spec.Drivers)
	})
	e2eutil.Poll(t, 30*time.Second, "the Node's CSI annotations and topology label", func(ctx context.Context) (bool, string) {
		n, err := admin.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var ids map[string]string
		_ = json.Unmarshal([]byte(n.Annotations[nodeinfo.AnnotationNodeID]), &ids)
		labels := map[string]string{}
		for k := range wantTopology {
			labels[k] = n.Labels[k]
		}
		return maps.Equal(ids, map[string]string{driverName: "id-" + e.node}) && maps.Equal(labels, wantTopology) &&
				n.Annotations[nodeinfo.AnnotationControllerAttachDetach] == "true" && n.Annotations["example.com/owner"] == "team-a",
			fmt.Sprintf("annotations %v, labels %v", n.Annotations, n.Labels)
	})
	e2eutil.Poll(t, 30*time.Second, "the agent's delete of the CSINode in the audit log", func(context.Context) (bool, string) {
		events, err := suite.Cluster.AuditEvents()
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range events {
			if ev.User.Username == suite.User && ev.Verb == "delete" && ev.ObjectRef != nil && ev.ObjectRef.Resource == "csinodes" &&
				ev.ObjectRef.Name == e.node && ev.ResponseStatus != nil && ev.ResponseStatus.Code == 200 {
				return true, ""
			}
		}
		return false, "no delete of CSINode " + e.node + " (uid " + string(stale.UID) + ") by the agent"
	})
	drivers, err := e.agent.Drivers()
	if err != nil {
		t.Fatal(err)
	}
	if st := drivers.NodeInfoState(driverName); st != string(nodeinfo.StateInstalled) {
		t.Errorf("/debug/drivers node info of %s: %q, want installed", driverName, st)
	}
}
