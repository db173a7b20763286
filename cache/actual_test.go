package cache

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/volume"
)

func newASW() (*ActualStateOfWorld, *clocktesting.FakeClock) {
	clk := clocktesting.NewFakeClock(t0)
	return NewActualStateOfWorld(clk), clk
}

var (
	perPodID = VolumeIdentity{
		Name: volume.PodScopedName(emptyDirPlugin, "p1", "scratch"), Plugin: emptyDirPlugin,
		Spec: &volume.Spec{Name: "scratch"},
	}
	deviceID = VolumeIdentity{
		Name: "test/disk", Plugin: "test", Attributes: volume.Attributes{Identity: "disk", DeviceMountable: true, Attachable: true},
		Spec: &volume.Spec{Name: "pv-disk"},
	}
	remountID = VolumeIdentity{
		Name: "test/remount", Plugin: "test", Attributes: volume.Attributes{RequiresRemount: true},
		Spec: &volume.Spec{Name: "cfg"},
	}
)

func mountOf(uid string, state MountState) ActualPodMount {
	return ActualPodMount{
		Pod: testPod(uid).PodRef, SpecName: "spec", MountPath: "/pods/" + uid + "/volumes/x/spec", State: state,
	}
}

func TestActualPodMountLifecycle(t *testing.T) {
	a, _ := newASW()
	a.SetPodMount(perPodID, mountOf("p1", Mounted))
	v, ok := a.Volume(perPodID.Name)
	if !ok {
		t.Fatal("volume not recorded")
	}
	if v.Name != perPodID.Name || v.Plugin != emptyDirPlugin || v.Spec != perPodID.Spec || v.DeviceState != DeviceNotMounted {
		t.Errorf("volume = %+v", v)
	}
	m := v.Pods.At("p1")
	if m == nil || m.State != Mounted || m.MountPath != "/pods/p1/volumes/x/spec" || !m.Since.Equal(t0) {
		t.Errorf("mount = %+v", m)
	}
	if got, ok := a.Snapshot().PodMount(perPodID.Name, "p1"); !ok || got != m {
		t.Errorf("snapshot PodMount = %v, %v", got, ok)
	}
	if _, ok := a.Snapshot().PodMount(perPodID.Name, "p2"); ok {
		t.Error("PodMount(p2) found")
	}
	if _, ok := a.Snapshot().PodMount("nope", "p1"); ok {
		t.Error("PodMount of unknown volume found")
	}

	// Uncertain replaces Mounted.
	a.SetPodMount(perPodID, mountOf("p1", MountUncertain))
	if v, _ := a.Volume(perPodID.Name); v.Pods.At("p1").State != MountUncertain {
		t.Errorf("state = %s", v.Pods.At("p1").State)
	}

	// The last pod gone, nothing else left: the entry disappears.
	a.DeletePodMount(perPodID.Name, "p1")
	if _, ok := a.Volume(perPodID.Name); ok {
		t.Error("entry kept with nothing left to undo")
	}
	if a.Snapshot().VolumesLen() != 0 {
		t.Error("snapshot still lists the volume")
	}
}

func TestActualTwoPodsOnOneVolume(t *testing.T) {
	a, _ := newASW()
	id := VolumeIdentity{Name: "local/pv1", Plugin: "local", Attributes: volume.Attributes{Identity: "pv1"}, Spec: &volume.Spec{Name: "pv1"}}
	a.SetPodMount(id, mountOf("p1", Mounted))
	a.SetPodMount(id, mountOf("p2", MountUncertain))
	v, _ := a.Volume(id.Name)
	if v.Pods.Len() != 2 || v.Pods.At("p1").State != Mounted || v.Pods.At("p2").State != MountUncertain {
		t.Fatalf("pods = %v", v.Pods)
	}
	a.DeletePodMount(id.Name, "p1")
	v, ok := a.Volume(id.Name)
	if !ok || v.Pods.Len() != 1 || v.Pods.At("p2") == nil {
		t.Fatalf("after deleting p1: %+v, %v", v, ok)
	}
	a.DeletePodMount(id.Name, "p2")
	if _, ok := a.Volume(id.Name); ok {
		t.Error("entry kept after its last pod")
	}
}

func TestActualEntryKeptWhileSomethingIsLeft(t *testing.T) {
	tests := []struct {
		name     string
		setup    func(a *ActualStateOfWorld)
		wantKept bool
	}{
		{"nothing", func(a *ActualStateOfWorld) {}, false},
		{"pod mount removed", func(a *ActualStateOfWorld) {
			a.SetPodMount(deviceID, mountOf("p1", Mounted))
			a.DeletePodMount(deviceID.Name, "p1")
		}, false},
		{"device mounted", func(a *ActualStateOfWorld) {
			a.SetDeviceState(deviceID, DeviceGloballyMounted, "/dev/sdb", "/global")
		}, true},
		{"device uncertain", func(a *ActualStateOfWorld) {
			a.SetDeviceState(deviceID, DeviceMountUncertain, "", "/global")
		}, true},
		{"device unmounted", func(a *ActualStateOfWorld) {
			a.SetDeviceState(deviceID, DeviceGloballyMounted, "/dev/sdb", "/global")
			a.SetDeviceState(deviceID, DeviceNotMounted, "", "")
		}, false},
		{"device NotMounted recorded for an unknown volume", func(a *ActualStateOfWorld) {
			a.SetDeviceState(deviceID, DeviceNotMounted, "", "")
		}, false},
		{"attached", func(a *ActualStateOfWorld) {
			a.SetAttachState(deviceID, Attached, "/dev/sdb", nil)
		}, true},
		{"attach uncertain", func(a *ActualStateOfWorld) {
			a.SetAttachState(deviceID, AttachUncertain, "", nil)
		}, true},
		{"detached", func(a *ActualStateOfWorld) {
			a.SetAttachState(deviceID, Attached, "/dev/sdb", nil)
			a.SetAttachState(deviceID, NotAttached, "", nil)
		}, false},
		{"attach not needed", func(a *ActualStateOfWorld) {
			a.SetAttachState(deviceID, AttachNotNeeded, "", nil)
		}, false},
		{"device unmounted but still attached", func(a *ActualStateOfWorld) {
			a.SetAttachState(deviceID, Attached, "/dev/sdb", nil)
			a.SetDeviceState(deviceID, DeviceGloballyMounted, "", "/global")
			a.SetDeviceState(deviceID, DeviceNotMounted, "", "")
		}, true},
		{"pod gone, device still mounted", func(a *ActualStateOfWorld) {
			a.SetDeviceState(deviceID, DeviceGloballyMounted, "/dev/sdb", "/global")
			a.SetPodMount(deviceID, mountOf("p1", Mounted))
			a.DeletePodMount(deviceID.Name, "p1")
		}, true},
		{"everything undone in order", func(a *ActualStateOfWorld) {
			a.SetAttachState(deviceID, Attached, "/dev/sdb", nil)
			a.SetDeviceState(deviceID, DeviceGloballyMounted, "", "/global")
			a.SetPodMount(deviceID, mountOf("p1", Mounted))
			a.DeletePodMount(deviceID.Name, "p1")
			a.SetDeviceState(deviceID, DeviceNotMounted, "", "")
			a.SetAttachState(deviceID, NotAttached, "", nil)
		}, false},
		{"size of an unknown volume", func(a *ActualStateOfWorld) {
			q := resource.MustParse("1Gi")
			a.SetSize(deviceID.Name, &q)
			a.SetResizeBlocked(deviceID.Name, "in use")
			a.DeletePodMount(deviceID.Name, "p1")
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := newASW()
			tc.setup(a)
			_, ok := a.Volume(deviceID.Name)
			if ok != tc.wantKept {
				t.Errorf("entry present = %v, want %v", ok, tc.wantKept)
			}
			if inSnap := a.Snapshot().Volume(deviceID.Name) != nil; inSnap != ok {
				t.Errorf("snapshot disagrees with Volume()")
			}
		})
	}
}

func TestActualPathsKept(t *testing.T) {
	a, _ := newASW()
	a.SetAttachState(deviceID, Attached, "/dev/sdb", nil)
	a.SetAttachState(deviceID, Attached, "", nil) // verify again, path unknown
	a.SetDeviceState(deviceID, DeviceGloballyMounted, "", "/global/disk")
	v, _ := a.Volume(deviceID.Name)
	if v.DevicePath != "/dev/sdb" || v.DeviceMountPath != "/global/disk" || v.AttachState != Attached {
		t.Fatalf("volume = %+v", v)
	}
	// Unmounting must not forget where the device was mounted or is.
	a.SetDeviceState(deviceID, DeviceMountUncertain, "", "")
	a.SetDeviceState(deviceID, DeviceNotMounted, "", "")
	v, _ = a.Volume(deviceID.Name)
	if v.DeviceState != DeviceNotMounted || v.DevicePath != "/dev/sdb" || v.DeviceMountPath != "/global/disk" {
		t.Errorf("after unmount: %+v", v)
	}
	// New paths replace old ones.
	a.SetDeviceState(deviceID, DeviceGloballyMounted, "/dev/sdc", "/global/other")
	v, _ = a.Volume(deviceID.Name)
	if v.DevicePath != "/dev/sdc" || v.DeviceMountPath != "/global/other" {
		t.Errorf("new paths not recorded: %+v", v)
	}
	a.SetAttachState(deviceID, AttachUncertain, "/dev/sdd", nil)
	v, _ = a.Volume(deviceID.Name)
	if v.DevicePath != "/dev/sdd" || v.AttachState != AttachUncertain || v.DeviceMountPath != "/global/other" {
		t.Errorf("after attach uncertain: %+v", v)
	}
}

func TestActualIdentityRecordedOnce(t *testing.T) {
	a, _ := newASW()
	// Found on disk after a restart: no spec yet.
	reconstructed := deviceID
	reconstructed.Spec = nil
	a.SetDeviceState(reconstructed, DeviceMountUncertain, "", "/global/disk")
	v, _ := a.Volume(deviceID.Name)
	if v.Spec != nil || v.Attributes != deviceID.Attributes {
		t.Fatalf("volume = %+v", v)
	}
	// A later operation that knows the spec fills it in...
	a.SetDeviceState(deviceID, DeviceGloballyMounted, "", "")
	v, _ = a.Volume(deviceID.Name)
	if v.Spec != deviceID.Spec {
		t.Errorf("spec not filled in: %+v", v.Spec)
	}
	// ...but never replaces it.
	other := deviceID
	other.Spec = &volume.Spec{Name: "other"}
	other.Plugin = "other-plugin"
	a.SetPodMount(other, mountOf("p1", Mounted))
	v, _ = a.Volume(deviceID.Name)
	if v.Spec != deviceID.Spec || v.Plugin != "test" {
		t.Errorf("identity replaced: plugin %q spec %+v", v.Plugin, v.Spec)
	}
	// Calls that carry only a name do not create entries.
	a.DeletePodMount("unknown", "p1")
	a.SetResizeBlocked("unknown", "x")
	if _, ok := a.Volume("unknown"); ok {
		t.Error("entry created from a name alone")
	}
}

// TestActualContentGeneration: a mount records the content generation its
// set up wrote; a new set up replaces it, and an earlier snapshot keeps the
// old one.
func TestActualContentGeneration(t *testing.T) {
	a, _ := newASW()
	m := mountOf("p1", Mounted)
	m.ContentGeneration = 3
	a.SetPodMount(remountID, m)
	before := a.Snapshot()
	m.ContentGeneration = 5
	a.SetPodMount(remountID, m)
	if got, _ := a.Snapshot().PodMount(remountID.Name, "p1"); got.ContentGeneration != 5 {
		t.Errorf("generation %d, want 5", got.ContentGeneration)
	}
	if got, _ := before.PodMount(remountID.Name, "p1"); got.ContentGeneration != 3 {
		t.Errorf("earlier snapshot sees generation %d, want 3", got.ContentGeneration)
	}
}

func TestActualAdoptedRemountVolumesAreSetUpAgain(t *testing.T) {
	a, _ := newASW()
	found := &ActualVolume{Name: remountID.Name, Plugin: "test", Attributes: remountID.Attributes, DeviceState: DeviceNotMounted,
		Pods: PodSetOf(map[types.UID]*ActualPodMount{"p1": {Pod: volume.PodRef{UID: "p1"}, State: MountUncertain, Reconstructed: true, FoundMounted: true}})}
	a.AddReconstructed([]*ActualVolume{found})
	a.Adopt(remountID, false, map[types.UID]ActualPodMount{"p1": {Pod: testPod("p1").PodRef, Spec: remountID.Spec}})
	m, _ := a.Snapshot().PodMount(remountID.Name, "p1")
	if m.State != Mounted || m.ContentGeneration != 0 || !PodMountNeeded(m, 1) {
		t.Errorf("adopted mount %+v: want Mounted at generation 0, set up again for any content the DSW wants (its content may be stale)", m)
	}
}

func TestActualSinceKeptWhileStateUnchanged(t *testing.T) {
	a, clk := newASW()
	since := func() time.Time {
		m, ok := a.Snapshot().PodMount(perPodID.Name, "p1")
		if !ok {
			t.Fatal("mount missing")
		}
		return m.Since
	}
	a.SetPodMount(perPodID, mountOf("p1", Mounted))
	clk.Step(time.Minute)
	a.SetPodMount(perPodID, mountOf("p1", Mounted))
	if got := since(); !got.Equal(t0) {
		t.Errorf("Since after re-mount in the same state = %v, want %v", got, t0)
	}
	clk.Step(time.Minute)
	a.SetPodMount(perPodID, mountOf("p1", MountUncertain))
	if got, want := since(), t0.Add(2*time.Minute); !got.Equal(want) {
		t.Errorf("Since after state change = %v, want %v", got, want)
	}
	clk.Step(time.Minute)
	a.SetPodMount(perPodID, mountOf("p1", MountUncertain))
	if got, want := since(), t0.Add(2*time.Minute); !got.Equal(want) {
		t.Errorf("Since after same uncertain state = %v, want %v", got, want)
	}
	clk.Step(time.Minute)
	a.SetPodMount(perPodID, mountOf("p1", Mounted))
	if got, want := since(), t0.Add(4*time.Minute); !got.Equal(want) {
		t.Errorf("Since back to Mounted = %v, want %v", got, want)
	}
	// A given Since is ignored: the ASW's clock decides.
	m := mountOf("p1", MountUncertain)
	m.Since = t0.Add(-time.Hour)
	a.SetPodMount(perPodID, m)
	if got := since(); !got.Equal(clk.Now()) {
		t.Errorf("Since = %v, want the clock's %v", got, clk.Now())
	}
}

func TestActualSizeAndResizeBlocked(t *testing.T) {
	a, _ := newASW()
	a.SetPodMount(perPodID, mountOf("p1", Mounted))
	q := resource.MustParse("1Gi")
	a.SetSize(perPodID.Name, &q)
	q.Add(resource.MustParse("1Gi")) // the caller's copy is not the ASW's
	v, _ := a.Volume(perPodID.Name)
	if v.Size == nil || v.Size.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("size = %v, want 1Gi", v.Size)
	}
	a.SetSize(perPodID.Name, nil)
	if v, _ := a.Volume(perPodID.Name); v.Size == nil || v.Size.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("nil size replaced the recorded one: %v", v.Size)
	}
	a.SetResizeBlocked(perPodID.Name, "volume in use")
	if v, _ := a.Volume(perPodID.Name); v.ResizeBlocked != "volume in use" {
		t.Errorf("ResizeBlocked = %q", v.ResizeBlocked)
	}
	a.SetResizeBlocked(perPodID.Name, "")
	if v, _ := a.Volume(perPodID.Name); v.ResizeBlocked != "" {
		t.Errorf("ResizeBlocked not cleared: %q", v.ResizeBlocked)
	}
}

func TestActualPodMounts(t *testing.T) {
	a, _ := newASW()
	for i, id := range []VolumeIdentity{remountID, perPodID, deviceID} {
		m := mountOf("p1", Mounted)
		m.MountPath = fmt.Sprintf("/pods/p1/volumes/%d", 2-i)
		a.SetPodMount(id, m)
	}
	a.SetPodMount(deviceID, mountOf("p2", Mounted))
	got := a.PodMounts("p1")
	var paths []string
	for _, m := range got {
		paths = append(paths, m.MountPath)
	}
	if want := []string{"/pods/p1/volumes/0", "/pods/p1/volumes/1", "/pods/p1/volumes/2"}; !slices.Equal(paths, want) {
		t.Errorf("PodMounts(p1) paths = %v, want %v", paths, want)
	}
	if got := a.PodMounts("p2"); len(got) != 1 {
		t.Errorf("PodMounts(p2) = %v", got)
	}
	if got := a.PodMounts("p3"); len(got) != 0 {
		t.Errorf("PodMounts(p3) = %v", got)
	}
}

// TestActualSnapshotImmutable: a snapshot never changes, whatever is
// recorded after it was taken. The ASW is built twice the same way; the
// snapshot of one must stay deeply equal to the other's (every field, the
// values behind pointers included) while the first records every kind of
// change.
func TestActualSnapshotImmutable(t *testing.T) {
	build := func() *ActualStateOfWorld {
		a, _ := newASW()
		a.SetAttachState(deviceID, Attached, "/dev/sdb", map[string]string{"k": "v"})
		a.SetDeviceState(deviceID, DeviceGloballyMounted, "", "/g")
		a.SetPodMount(deviceID, mountOf("p1", Mounted))
		a.SetPodMount(perPodID, mountOf("p1", MountUncertain))
		a.SetPodMount(remountID, mountOf("p1", Mounted))
		q := resource.MustParse("1Gi")
		a.SetSize(deviceID.Name, &q)
		reconstructed := &ActualVolume{
			Name: "test/found", Plugin: "test", DeviceState: DeviceGloballyMounted, DeviceReconstructed: true,
			Pods: PodSetOf(map[types.UID]*ActualPodMount{"p3": {Pod: testPod("p3").PodRef, State: MountUncertain, Reconstructed: true}}),
		}
		a.AddReconstructed([]*ActualVolume{reconstructed})
		return a
	}
	a := build()
	s1 := a.Snapshot()
	want := build().Snapshot()
	if !reflect.DeepEqual(s1, want) {
		t.Fatal("two ASWs built the same way differ")
	}
	if a.Snapshot() != s1 {
		t.Error("snapshot of an unchanged ASW rebuilt")
	}

	q := resource.MustParse("5Gi")
	a.SetPodMount(deviceID, mountOf("p2", MountUncertain))
	a.SetPodMount(deviceID, mountOf("p1", MountUncertain))
	a.DeletePodMount(perPodID.Name, "p1")
	a.SetDeviceState(deviceID, DeviceMountUncertain, "/dev/sdc", "/g2")
	a.SetAttachState(deviceID, AttachUncertain, "", map[string]string{"k": "other"})
	a.SetSize(deviceID.Name, &q)
	a.SetResizeBlocked(deviceID.Name, "busy")
	a.SetExpandAfterPublish(deviceID.Name)
	a.Adopt(VolumeIdentity{Name: "test/found", Plugin: "test", Spec: &volume.Spec{Name: "found"}}, true,
		map[types.UID]ActualPodMount{"p3": {Pod: testPod("p3").PodRef}})

	if !reflect.DeepEqual(s1, want) {
		t.Errorf("old snapshot changed:\nbefore: %s\nafter:  %s", dumpActual(want), dumpActual(s1))
	}
	s2 := a.Snapshot()
	if s2 == s1 || s2.Generation <= s1.Generation {
		t.Errorf("generation %d -> %d", s1.Generation, s2.Generation)
	}
	if s2.Volume(perPodID.Name) != nil {
		t.Error("new snapshot still has the deleted mount's volume")
	}
	if v := s2.Volume(deviceID.Name); v.DeviceState != DeviceMountUncertain || v.Pods.Len() != 2 || v.Size.Cmp(q) != 0 || !v.ExpandAfterPublish {
		t.Errorf("new snapshot volume = %+v", v)
	}
	if m, _ := s2.PodMount("test/found", "p3"); m == nil || m.State != Mounted || m.Reconstructed {
		t.Errorf("new snapshot: adopted mount = %+v", m)
	}
}

// dumpActual shows a snapshot for failure messages.
func dumpActual(s *ActualSnapshot) string {
	var out []string
	for name, v := range s.Volumes() {
		out = append(out, fmt.Sprintf("V %s %+v", name, *v))
		for uid, p := range v.Pods.All() {
			out = append(out, fmt.Sprintf("VP %s %s %+v", name, uid, *p))
		}
	}
	slices.Sort(out)
	return fmt.Sprint(s.Generation, out)
}

// TestActualConcurrent exercises the ASW from several goroutines; run with
// -race.
func TestActualConcurrent(t *testing.T) {
	a, _ := newASW()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				uid := types.UID(fmt.Sprintf("w%d-p%d", w, i%5))
				switch i % 4 {
				case 0:
					a.SetPodMount(deviceID, ActualPodMount{Pod: volume.PodRef{UID: uid}, State: Mounted})
				case 1:
					a.SetSubPaths(deviceID.Name, uid, nil)
				case 2:
					a.SetDeviceState(deviceID, DeviceGloballyMounted, "", "/g")
				case 3:
					a.DeletePodMount(deviceID.Name, uid)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 200 {
			s := a.Snapshot()
			for _, v := range s.Volumes() {
				for _, m := range v.Pods.All() {
					_ = m.State
				}
			}
			a.PodMounts("w0-p0")
		}
	}()
	wg.Wait()

	// No update was lost: each pod is mounted exactly when its worker's
	// last word on it was a mount.
	want := map[types.UID]bool{}
	for w := range 4 {
		for i := range 200 {
			uid := types.UID(fmt.Sprintf("w%d-p%d", w, i%5))
			switch i % 4 {
			case 0:
				want[uid] = true
			case 3:
				delete(want, uid)
			}
		}
	}
	v, ok := a.Volume(deviceID.Name)
	if !ok || v.DeviceState != DeviceGloballyMounted {
		t.Fatalf("volume = %+v, want its device mounted", v)
	}
	got := map[types.UID]bool{}
	for uid, m := range v.Pods.All() {
		got[uid] = m.State == Mounted
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mounted pods %v, want %v", got, want)
	}
}

// The count behind ActualSnapshot.HasReconstructed follows every way
// reconstructed state comes and goes; each step is checked against a walk
// of the volumes.
func TestActualHasReconstructedCount(t *testing.T) {
	a, _ := newASW()
	found := func() []*ActualVolume {
		return []*ActualVolume{
			{Name: deviceID.Name, Plugin: "test", Attributes: deviceID.Attributes, DeviceState: DeviceMountUncertain, DeviceReconstructed: true,
				Pods: PodSetOf(map[types.UID]*ActualPodMount{"p1": {Pod: volume.PodRef{UID: "p1"}, State: MountUncertain, Reconstructed: true}})},
			{Name: remountID.Name, Plugin: "test", Attributes: remountID.Attributes, DeviceState: DeviceNotMounted,
				Pods: PodSetOf(map[types.UID]*ActualPodMount{"p2": {Pod: volume.PodRef{UID: "p2"}, State: MountUncertain, Reconstructed: true}})},
		}
	}
	steps := []struct {
		name string
		do   func()
		want bool
	}{
		{"empty", func() {}, false},
		{"unrelated mount", func() { a.SetPodMount(perPodID, mountOf("p9", Mounted)) }, false},
		{"reconstructed", func() { a.AddReconstructed(found()) }, true},
		{"reconstructed again (known volumes kept)", func() { a.AddReconstructed(found()) }, true},
		{"sub-paths recorded", func() { a.SetSubPaths(remountID.Name, "p2", nil) }, true},
		{"second volume adopted", func() {
			a.Adopt(remountID, false, map[types.UID]ActualPodMount{"p2": {Pod: testPod("p2").PodRef, Spec: remountID.Spec}})
		}, true},
		{"pod mount of the first confirmed, device not yet", func() { a.SetPodMount(deviceID, mountOf("p1", Mounted)) }, true},
		{"device acted on", func() { a.SetDeviceState(deviceID, DeviceGloballyMounted, "", "") }, false},
		{"reconstructed once more", func() {
			a.AddReconstructed([]*ActualVolume{{Name: "test/other", Plugin: "test", DeviceState: DeviceNotMounted,
				Pods: PodSetOf(map[types.UID]*ActualPodMount{"p3": {Pod: volume.PodRef{UID: "p3"}, State: MountUncertain, Reconstructed: true}})}})
		}, true},
		{"its mount deleted, volume gone", func() { a.DeletePodMount("test/other", "p3") }, false},
	}
	for _, st := range steps {
		st.do()
		s := a.Snapshot()
		walked := NewActualSnapshot(maps.Collect(s.Volumes()), 0).HasReconstructed()
		if got := s.HasReconstructed(); got != st.want || walked != st.want {
			t.Errorf("after %q: counted %v, walked %v; want %v", st.name, got, walked, st.want)
		}
	}
}

// TestContentPredicates: a mount is set up again, and its sub-paths wait,
// while its content is older than the DSW's.
func TestContentPredicates(t *testing.T) {
	at := func(gen uint64) *ActualPodMount {
		return &ActualPodMount{State: Mounted, ContentGeneration: gen, SubPathsOutdated: true}
	}
	for _, tc := range []struct {
		name           string
		m              *ActualPodMount
		want           uint64
		mount, subPath bool
	}{
		{"not mounted", nil, 1, true, false},
		{"current", at(4), 4, false, true},
		{"newer than wanted (a later set up)", at(5), 4, false, true},
		{"outdated", at(3), 4, true, false},
		{"found after a restart", at(0), 1, true, false},
		{"content does not follow sources", at(0), 0, false, true},
	} {
		if got := PodMountNeeded(tc.m, tc.want); got != tc.mount {
			t.Errorf("%s: PodMountNeeded = %v, want %v", tc.name, got, tc.mount)
		}
		if got := SubPathsNeeded(nil, tc.m, tc.want); got != tc.subPath {
			t.Errorf("%s: SubPathsNeeded = %v, want %v", tc.name, got, tc.subPath)
		}
	}
}

// DeletePodMount copies the Pods map only when pods are left: what a
// snapshot taken before holds never changes, and an entry kept for its
// device has an empty map, not none.
func TestActualDeletePodMountLeavesSnapshotsAlone(t *testing.T) {
	tests := []struct {
		name     string
		pods     []types.UID
		device   bool
		delete   types.UID
		wantPods []types.UID // nil: the entry is gone
	}{
		{"one of two", []types.UID{"p1", "p2"}, false, "p1", []types.UID{"p2"}},
		{"the last", []types.UID{"p1"}, false, "p1", nil},
		{"the last, device mounted", []types.UID{"p1"}, true, "p1", []types.UID{}},
		{"not there", []types.UID{"p1"}, false, "p9", []types.UID{"p1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _ := newASW()
			if tt.device {
				a.SetDeviceState(deviceID, DeviceGloballyMounted, "/dev/sdb", "/global")
			}
			for _, uid := range tt.pods {
				a.SetPodMount(deviceID, mountOf(string(uid), Mounted))
			}
			before := a.Snapshot()
			a.DeletePodMount(deviceID.Name, tt.delete)
			if got := before.Volume(deviceID.Name).Pods.Len(); got != len(tt.pods) {
				t.Errorf("snapshot taken before has %d pods, want %d", got, len(tt.pods))
			}
			v := a.Snapshot().Volume(deviceID.Name)
			ok := v != nil
			if tt.wantPods == nil {
				if ok {
					t.Fatalf("entry kept: %+v", v)
				}
				return
			}
			if !ok || v.Pods.Len() != len(tt.wantPods) {
				t.Fatalf("entry = %+v, %v; want pods %v", v, ok, tt.wantPods)
			}
			for _, uid := range tt.wantPods {
				if v.Pods.At(uid) == nil {
					t.Errorf("pod %s lost", uid)
				}
			}
		})
	}
}
