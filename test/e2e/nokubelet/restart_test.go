package nokubelet_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/volume-agent/volume-agent/csi/nodeinfo"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// restartUnseen stops the agent and starts it again while the pod's volume
// is attached and mounted, and checks that the cluster saw nothing of it:
// while the agent was down and until the new one has registered the driver
// again, written the node's information and taken the volume back, the
// CSINode entry, the Node's CSI annotations, the VolumeAttachment and the
// pod's VolumesReady condition never changed, and the driver was never
// asked to detach, unpublish or unstage.
func (e *env) restartUnseen(agent *e2eutil.Agent, driver *e2eutil.CSIDriver, pod *corev1.Pod, driverName, vaName, uniqueName string) {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	admin := suite.Admin

	csiNode, err := admin.StorageV1().CSINodes().Get(ctx, e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node, err := admin.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	va, err := admin.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name := func(n string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", n).String()}
	}
	from := func(opts metav1.ListOptions, rv string) metav1.ListOptions {
		opts.ResourceVersion = rv
		return opts
	}
	watches := map[string]watch.Interface{}
	open := func(what string, w watch.Interface, err error) {
		if err != nil {
			t.Fatalf("watching %s: %v", what, err)
		}
		watches[what] = w
	}
	w, err := admin.StorageV1().CSINodes().Watch(ctx, from(name(e.node), csiNode.ResourceVersion))
	open("CSINode", w, err)
	w, err = admin.CoreV1().Nodes().Watch(ctx, from(name(e.node), node.ResourceVersion))
	open("Node", w, err)
	w, err = admin.StorageV1().VolumeAttachments().Watch(ctx, from(name(vaName), va.ResourceVersion))
	open("VolumeAttachment", w, err)
	w, err = admin.CoreV1().Pods(pod.Namespace).Watch(ctx, from(name(pod.Name), p.ResourceVersion))
	open("Pod", w, err)
	defer func() {
		for _, w := range watches {
			w.Stop()
		}
	}()
	before := driver.CallCounts(t)

	if err := agent.Stop(); err != nil {
		t.Fatalf("stopping the agent: %v", err)
	}
	agent.Start()
	// The new agent has settled: the driver registered again, its node
	// information written (or found written), the volume taken back as
	// mounted, nothing left to do.
	e2eutil.Poll(t, 60*time.Second, "the restarted agent settled", func(context.Context) (bool, string) {
		drivers, err := agent.Drivers()
		if err != nil {
			return false, err.Error()
		}
		if st := drivers.NodeInfoState(driverName); st != string(nodeinfo.StateInstalled) {
			return false, "node info " + st
		}
		ops, err := agent.Operations()
		if err != nil {
			return false, err.Error()
		}
		if len(ops.Operations) > 0 {
			return false, fmt.Sprintf("operations %+v", ops.Operations)
		}
		asw, err := agent.ASW()
		if err != nil {
			return false, err.Error()
		}
		v := asw.Volume(uniqueName)
		if v == nil {
			return false, "volume not in the actual state"
		}
		for _, p := range v.Pods {
			if p.UID == string(pod.UID) && p.MountState == "Mounted" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("volume %+v", *v)
	})

	var changed []string
	drain := func(what string, w watch.Interface, check func(watch.Event) string) {
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					changed = append(changed, what+": watch closed")
					return
				}
				if why := check(ev); why != "" {
					changed = append(changed, fmt.Sprintf("%s %s: %s", what, ev.Type, why))
				}
			default:
				return
			}
		}
	}
	drain("CSINode", watches["CSINode"], func(ev watch.Event) string {
		n, ok := ev.Object.(*storagev1.CSINode)
		if ev.Type != watch.Modified || !ok || !reflect.DeepEqual(n.Spec, csiNode.Spec) || !reflect.DeepEqual(n.OwnerReferences, csiNode.OwnerReferences) {
			return fmt.Sprintf("%+v", ev.Object)
		}
		return ""
	})
	drain("Node", watches["Node"], func(ev watch.Event) string {
		n, ok := ev.Object.(*corev1.Node)
		if ev.Type != watch.Modified || !ok {
			return fmt.Sprintf("%+v", ev.Object)
		}
		for _, k := range []string{nodeinfo.AnnotationNodeID, nodeinfo.AnnotationControllerAttachDetach} {
			if n.Annotations[k] != node.Annotations[k] {
				return fmt.Sprintf("annotation %s: %q, was %q", k, n.Annotations[k], node.Annotations[k])
			}
		}
		if !slices.Contains(n.Status.VolumesInUse, corev1.UniqueVolumeName(uniqueName)) {
			return fmt.Sprintf("volumesInUse %v lacks %s", n.Status.VolumesInUse, uniqueName)
		}
		return ""
	})
	drain("VolumeAttachment", watches["VolumeAttachment"], func(ev watch.Event) string {
		v, ok := ev.Object.(*storagev1.VolumeAttachment)
		if ev.Type != watch.Modified || !ok || v.DeletionTimestamp != nil || !v.Status.Attached {
			return fmt.Sprintf("%+v", ev.Object)
		}
		return ""
	})
	drain("Pod", watches["Pod"], func(ev watch.Event) string {
		p, ok := ev.Object.(*corev1.Pod)
		if ev.Type != watch.Modified || !ok {
			return fmt.Sprintf("%+v", ev.Object)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == podstatus.ConditionType && c.Status != corev1.ConditionTrue {
				return fmt.Sprintf("VolumesReady %s: %s", c.Status, c.Message)
			}
		}
		return ""
	})
	if len(changed) > 0 {
		t.Errorf("the agent's restart showed in the cluster:\n%v", changed)
	}
	after := driver.CallCounts(t)
	for _, m := range []string{"ControllerUnpublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume", "NodeStageVolume", "NodePublishVolume"} {
		if after[m] != before[m] {
			t.Errorf("the driver was called %s %d times during the restart", m, after[m]-before[m])
		}
	}
}
