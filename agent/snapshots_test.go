package agent

import (
	"encoding/json"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/agent/debug"
	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler/planner"
	runtimeserver "github.com/volume-agent/volume-agent/runtimeapi/server"
	"github.com/volume-agent/volume-agent/status/nodestatus"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/ui/model"
	"github.com/volume-agent/volume-agent/volume"
)

// snapshotWorld fills a DSW and an ASW with one of most things the readers
// look at: shared and per-pod volumes, sizes to grow to and grown to (made
// from byte counts, so formatting one with Quantity.String would cache the
// text inside it), sub-paths wanted and prepared, errors, unresolved
// volumes, containers, a remount, a blocked resize, and a pod gone from the
// DSW whose volume is still mounted. Built twice, it gives two equal
// worlds that share nothing.
func snapshotWorld() (*cache.DesiredSnapshot, *cache.ActualSnapshot) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	const csiPlugin, emptyDir = "kubernetes.io/csi", "kubernetes.io/empty-dir"
	ref := func(uid string) volume.PodRef {
		return volume.PodRef{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid}
	}
	info := func(uid string) volume.PodInfo {
		return volume.PodInfo{PodRef: ref(uid), MemoryLimit: resource.NewQuantity(256<<20, resource.BinarySI)}
	}
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-1"},
		Spec:       v1.PersistentVolumeSpec{Capacity: v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(2<<30, resource.BinarySI)}},
	}
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data"},
		Status:     v1.PersistentVolumeClaimStatus{Capacity: v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(1<<30, resource.BinarySI)}},
	}
	disk := volume.Attributes{Identity: "pv-1", DeviceMountable: true, Attachable: true}
	diskName := volume.SharedName(csiPlugin, "pv-1")
	diskSpec := &volume.Spec{Name: "pv-1", PV: pv, PVC: pvc, Mode: v1.PersistentVolumeFilesystem}
	subPaths := []volume.SubPath{{Container: "app", Index: 0, MountPath: "/logs", Path: "logs/a"}, {Container: "app", Index: 1, MountPath: "/conf", Path: "conf", ReadOnly: true}}
	containers := []volume.Container{{Name: "app", Type: volume.RegularContainer, Mounts: []volume.ContainerMount{
		{Volume: "data", Index: 0, MountPath: "/logs", SubPath: "logs/a"}, {Volume: "data", Index: 1, MountPath: "/conf", SubPath: "conf", ReadOnly: true},
		{Volume: "scratch", Index: 2, MountPath: "/tmp"},
	}}}
	for _, uid := range []string{"a", "b"} {
		scratch := volume.PodScopedName(emptyDir, types.UID(uid), "scratch")
		dsw.SetPodWithContainers(info(uid), []cache.PodVolume{
			{Name: diskName, Plugin: csiPlugin, Attributes: disk, OuterName: "data", Spec: diskSpec,
				DesiredSize: resource.NewQuantity(2<<30, resource.BinarySI), SubPaths: subPaths},
			{Name: scratch, Plugin: emptyDir, Attributes: volume.Attributes{RequiresRemount: true}, OuterName: "scratch",
				Spec: &volume.Spec{Name: "scratch", Volume: &v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(64<<20, resource.BinarySI)}}}}},
		}, []*volume.PodVolumeError{{Pod: ref(uid), Volume: "missing", Reason: "ClaimNotFound", Err: errors.New(`persistentvolumeclaim "missing" not found`)}},
			[]string{"later"}, containers)
	}
	diskID := cache.VolumeIdentity{Name: diskName, Plugin: csiPlugin, Attributes: disk, Spec: diskSpec}
	asw.SetAttachState(diskID, cache.Attached, "/dev/loop7", map[string]string{"lun": "7"})
	asw.SetDeviceState(diskID, cache.DeviceGloballyMounted, "/dev/loop7", "/var/lib/volume-agent/plugins/pv-1/globalmount")
	asw.SetSize(diskName, resource.NewQuantity(1<<30, resource.BinarySI))
	asw.SetResizeBlocked(diskName, "the driver refused while in use")
	for _, uid := range []string{"a", "gone"} {
		asw.SetPodMount(diskID, cache.ActualPodMount{Pod: ref(uid), SpecName: "pv-1", MountPath: "/pods/" + uid + "/volumes/pv-1", State: cache.Mounted, Spec: diskSpec})
	}
	asw.SetSubPaths(diskName, "a", subPaths[:1])
	scratch := volume.PodScopedName(emptyDir, "a", "scratch")
	asw.SetPodMount(cache.VolumeIdentity{Name: scratch, Plugin: emptyDir, Attributes: volume.Attributes{RequiresRemount: true}},
		cache.ActualPodMount{Pod: ref("a"), SpecName: "scratch", MountPath: "/pods/a/volumes/scratch", State: cache.Mounted})
	dsw.RefreshPodVolume(diskName, "a") // a content generation the mount has not written
	return dsw.Snapshot(), asw.Snapshot()
}

// lastErrors is the executor's last error per operation key.
type lastErrors map[operations.Key]error

func (e lastErrors) LastError(k operations.Key) error { return e[k] }

// No shared value is written after it is published: every surface that
// reads the caches' snapshots (the planner, the page, the runtime API, the
// pod condition, the node status, the debug endpoint) runs on them
// concurrently with the planner, under -race, and must leave them exactly
// as an identical world it never saw, down to unexported fields (a
// resource.Quantity's cached text, a lazily filled cache).
func TestReadersLeaveSnapshotsUnchanged(t *testing.T) {
	paths := volume.Paths{Root: "/var/lib/volume-agent"}
	errs := lastErrors{{Volume: volume.SharedName("kubernetes.io/csi", "pv-1"), Pod: "b"}: errors.New("mount failed")}
	plan := func(ds *cache.DesiredSnapshot, as *cache.ActualSnapshot) {
		planner.Plan(ds, as, planner.Options{SourcesReady: true, OrphanCleanupAllowed: true})
	}
	for _, tc := range []struct {
		name string
		read func(ds *cache.DesiredSnapshot, as *cache.ActualSnapshot)
	}{
		{"planner", plan},
		{"page", func(ds *cache.DesiredSnapshot, as *cache.ActualSnapshot) {
			in := model.Input{Now: time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC), Node: "n", DSW: ds, ASW: as, SourcesReady: true}
			page := model.Build(in)
			for _, p := range page.Pods {
				model.BuildPod(in, p.Namespace, p.Name)
			}
			if _, err := json.Marshal(page); err != nil {
				t.Error(err)
			}
		}},
		{"runtime API", func(ds *cache.DesiredSnapshot, as *cache.ActualSnapshot) {
			runtimeserver.List(ds, as)
			for _, p := range ds.Pods() {
				if _, err := json.Marshal(runtimeserver.View(p, ds, as, errs, paths)); err != nil {
					t.Error(err)
				}
			}
		}},
		{"pod condition", func(ds *cache.DesiredSnapshot, as *cache.ActualSnapshot) {
			for _, p := range ds.Pods() {
				podstatus.Compute(p, ds, as, errs)
				explain.PodReady(p, ds, as)
				explain.Explain(p, ds, as, errs)
			}
		}},
		{"node status", func(ds *cache.DesiredSnapshot, as *cache.ActualSnapshot) { nodestatus.InUse(ds, as) }},
		{"debug endpoint", func(ds *cache.DesiredSnapshot, as *cache.ActualSnapshot) {
			for _, doc := range []any{debug.NewDSWDocument(ds, as, true), debug.NewASWDocument(as, ds), ds, as} {
				if _, err := json.Marshal(doc); err != nil {
					t.Error(err)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, as := snapshotWorld()
			wantDS, wantAS := snapshotWorld()
			if !reflect.DeepEqual(ds, wantDS) || !reflect.DeepEqual(as, wantAS) {
				t.Fatal("two worlds built alike differ before any reader ran")
			}
			var wg sync.WaitGroup
			for range 2 {
				wg.Go(func() { tc.read(ds, as) })
				wg.Go(func() { plan(ds, as) })
			}
			wg.Wait()
			all := cmp.Exporter(func(reflect.Type) bool { return true })
			if !reflect.DeepEqual(ds, wantDS) {
				t.Errorf("the %s wrote into the DSW snapshot (-before +after):\n%s", tc.name, cmp.Diff(wantDS, ds, all))
			}
			if !reflect.DeepEqual(as, wantAS) {
				t.Errorf("the %s wrote into the ASW snapshot (-before +after):\n%s", tc.name, cmp.Diff(wantAS, as, all))
			}
		})
	}
}
