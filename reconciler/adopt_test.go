package reconciler

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/volume"
)

// rcHandler records the actions the reconciler dispatches and runs none,
// and adopts through the ASW, as the operator does.
type rcHandler struct {
	asw     *cache.ActualStateOfWorld
	ops     []string
	adopted []string
}

func (h *rcHandler) Operation(op operations.Op, t operations.Target) *operations.Operation {
	h.ops = append(h.ops, rcActs([]Action{{Op: op, Target: t}})[0])
	return nil
}

// AdoptVolume records "<volume>[ device] [<pods>]".
func (h *rcHandler) AdoptVolume(id cache.VolumeIdentity, device bool, pods map[types.UID]cache.ActualPodMount) {
	s := string(id.Name)
	if device {
		s += " device"
	}
	var uids []string
	for uid, m := range pods {
		if m.Pod != rcRef(uid) {
			s += " (wrong pod " + string(m.Pod.UID) + ")"
		}
		uids = append(uids, string(uid))
	}
	slices.Sort(uids)
	h.adopted = append(h.adopted, s+" ["+strings.Join(uids, " ")+"]")
	h.asw.Adopt(id, device, pods)
}

func rcRef(uid types.UID) volume.PodRef {
	return volume.PodRef{UID: uid, Namespace: "ns", Name: "name-" + string(uid)}
}

// rcFound is a volume found on disk after a restart; found maps each pod to
// whether its mount was in place.
func rcFound(name volume.UniqueName, plugin string, attrs volume.Attributes, found map[types.UID]bool) *cache.ActualVolume {
	v := &cache.ActualVolume{Name: name, Plugin: plugin, Attributes: attrs, DeviceState: cache.DeviceNotMounted,
		Pods: cache.PodSet[cache.ActualPodMount]{}}
	for uid, mounted := range found {
		v.Pods = v.Pods.With(uid, &cache.ActualPodMount{Pod: volume.PodRef{UID: uid}, SpecName: "spec", MountPath: "/root/pods/" + string(uid),
			State: cache.MountUncertain, Reconstructed: true, FoundMounted: mounted})
	}
	return v
}

func withDevice(v *cache.ActualVolume, found bool) *cache.ActualVolume {
	v.DeviceState, v.DeviceMountPath, v.DeviceReconstructed, v.DeviceFoundMounted = cache.DeviceMountUncertain, "/global", true, found
	return v
}

// rcSetUpWithoutMount is the agent's: it asks the plugin.
func rcSetUpWithoutMount(plugin string, spec *volume.Spec) bool {
	if plugin != emptydir.Name || spec == nil {
		return false
	}
	return (&emptydir.Plugin{}).SetUpWithoutMount(spec)
}

func emptyDirSpec(name string, medium v1.StorageMedium) *volume.Spec {
	vol := &v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: medium}}}
	return &volume.Spec{Name: name, Volume: vol, Mode: v1.PersistentVolumeFilesystem}
}

func localSpec(pv, path string) *volume.Spec {
	p := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv}, Spec: v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: path}},
	}}
	return &volume.Spec{Name: pv, PV: p, Mode: v1.PersistentVolumeFilesystem}
}

// The reconciler's passes after a restart: before the sources are ready
// nothing reconstructed is touched; the first ready pass adopts what pods
// want without dispatching any operation for it; what no pod wants waits for
// complete sources.
func TestReconcilerAdoptsAtFirstReadyPass(t *testing.T) {
	clk := clock.RealClock{}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	memName := volume.PodScopedName(emptydir.Name, "p1", "mem")
	diskName := volume.PodScopedName(emptydir.Name, "p1", "disk")
	goneName := volume.PodScopedName(emptydir.Name, "gone", "mem")
	localName := volume.SharedName(local.Name, "pv")
	device := volume.Attributes{Identity: "pv", DeviceMountable: true}
	asw.AddReconstructed([]*cache.ActualVolume{
		rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true}),
		rcFound(diskName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false}),
		rcFound(goneName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"gone": true}),
		withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), true),
	})
	pod := volume.PodInfo{PodRef: rcRef("p1")}
	dsw.SetPod(pod, []cache.PodVolume{
		{Name: memName, Plugin: emptydir.Name, OuterName: "mem", Spec: emptyDirSpec("mem", v1.StorageMediumMemory)},
		{Name: diskName, Plugin: emptydir.Name, OuterName: "disk", Spec: emptyDirSpec("disk", v1.StorageMediumDefault)},
		{Name: localName, Plugin: local.Name, Attributes: device, OuterName: "pv", Spec: localSpec("pv", "/dev/x")},
	}, nil, nil)

	ready, complete := false, false
	h := &rcHandler{asw: asw}
	r := New(Options{
		DSW: dsw, ASW: asw, Executor: operations.NewExecutor(operations.ExecutorOptions{}),
		Handler: h, SetUpWithoutMount: rcSetUpWithoutMount,
		SourcesReady: func() bool { return ready }, SourcesComplete: func() bool { return complete },
		Clock: clk,
	})

	r.ReconcileOnce()
	if len(h.ops) != 0 || len(h.adopted) != 0 {
		t.Fatalf("before the sources are ready: dispatched %q, adopted %v", h.ops, h.adopted)
	}

	ready = true
	r.ReconcileOnce()
	if len(h.ops) != 0 {
		t.Errorf("first ready pass dispatched %q, want nothing (adopt, and orphans wait for complete sources)", h.ops)
	}
	want := []string{string(diskName) + " [p1]", string(memName) + " [p1]", string(localName) + " device [p1]"}
	if !reflect.DeepEqual(h.adopted, want) {
		t.Errorf("adopted %q, want %q", h.adopted, want)
	}
	mounts := asw.PodMounts("p1")
	if len(mounts) != 3 {
		t.Errorf("after adoption, p1 has %d mounts, want 3", len(mounts))
	}
	for _, m := range mounts {
		if m.State != cache.Mounted || m.Reconstructed {
			t.Errorf("after adoption: %+v", m)
		}
	}
	complete = true
	r.ReconcileOnce()
	if want := []string{"unmount_volume " + string(goneName) + " gone"}; !reflect.DeepEqual(h.ops, want) {
		t.Errorf("with complete sources: dispatched %q, want %q", h.ops, want)
	}
	if len(h.adopted) != 3 {
		t.Errorf("adopted again: %v", h.adopted)
	}
}

func rcActs(actions []Action) []string {
	out := []string{}
	for _, a := range actions {
		s := string(a.Op) + " " + string(a.Volume)
		if a.Pod.UID != "" {
			s += " " + string(a.Pod.UID)
		}
		out = append(out, s)
	}
	return out
}
