package cache

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/volume"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newDSW() (*DesiredStateOfWorld, *clocktesting.FakeClock) {
	clk := clocktesting.NewFakeClock(t0)
	return NewDesiredStateOfWorld(clk), clk
}

func testPod(uid string) volume.PodInfo {
	return volume.PodInfo{PodRef: volume.PodRef{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid}}
}

const (
	emptyDirPlugin = "kubernetes.io/empty-dir"
	localPlugin    = "kubernetes.io/local-volume"
)

// emptyDir is a per-pod volume of pod uid named outer.
func emptyDir(uid, outer string) PodVolume {
	vol := &v1.Volume{Name: outer, VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}
	return PodVolume{
		Name:      volume.PodScopedName(emptyDirPlugin, types.UID(uid), outer),
		Plugin:    emptyDirPlugin,
		OuterName: outer,
		Spec:      &volume.Spec{Name: outer, Volume: vol, Mode: v1.PersistentVolumeFilesystem},
	}
}

// localPV is a shared volume backed by the PV pv, used under outer.
func localPV(pv *v1.PersistentVolume, outer string) PodVolume {
	return PodVolume{
		Name:       volume.SharedName(localPlugin, pv.Name),
		Plugin:     localPlugin,
		Attributes: volume.Attributes{Identity: pv.Name},
		OuterName:  outer,
		Spec:       &volume.Spec{Name: pv.Name, PV: pv, Mode: v1.PersistentVolumeFilesystem},
	}
}

func newPV(name, size string) *v1.PersistentVolume {
	pv := &v1.PersistentVolume{}
	pv.Name = name
	pv.Spec.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)}
	pv.Spec.Local = &v1.LocalVolumeSource{Path: "/mnt/" + name}
	return pv
}

func sized(pv PodVolume, size string) PodVolume {
	q := resource.MustParse(size)
	pv.DesiredSize = &q
	return pv
}

func pvErr(uid, vol, reason string) *volume.PodVolumeError {
	return &volume.PodVolumeError{Pod: testPod(uid).PodRef, Volume: vol, Reason: reason, Err: errors.New(reason + " happened")}
}

// signalled reports whether the DSW's Changed channel has a pending signal,
// consuming it.
func signalled(d *DesiredStateOfWorld) bool {
	select {
	case <-d.Changed():
		return true
	default:
		return false
	}
}

func TestDesiredSetPodAdd(t *testing.T) {
	d, _ := newDSW()
	pod := testPod("p1")
	data := sized(localPV(newPV("pv1", "5Gi"), "data"), "5Gi")
	scratch := emptyDir("p1", "scratch")
	errs := []*volume.PodVolumeError{pvErr("p1", "claim", "PVCNotFound")}

	if !d.SetPod(pod, []PodVolume{scratch, data}, errs, []string{"claim"}) {
		t.Fatal("SetPod of a new pod = false, want true")
	}
	if !signalled(d) {
		t.Error("Changed not signalled")
	}
	s := d.Snapshot()
	if s.VolumesLen() != 2 || s.PodsLen() != 1 {
		t.Fatalf("snapshot has %d volumes and %d pods, want 2 and 1", s.VolumesLen(), s.PodsLen())
	}
	dv := s.Volume(data.Name)
	if dv == nil {
		t.Fatalf("volume %s missing", data.Name)
	}
	if dv.Name != data.Name || dv.Plugin != localPlugin || dv.Attributes != data.Attributes || dv.SpecName != "pv1" ||
		dv.Spec != data.Spec || dv.DesiredSize == nil || dv.DesiredSize.Cmp(resource.MustParse("5Gi")) != 0 {
		t.Errorf("volume = %+v", dv)
	}
	pv := dv.Pods.At("p1")
	if pv == nil || pv.Pod != pod || !slices.Equal(pv.OuterNames, []string{"data"}) || pv.Spec != data.Spec || !pv.Since.Equal(t0) {
		t.Errorf("pod volume = %+v", pv)
	}
	if sv := s.Volume(scratch.Name); sv == nil || sv.SpecName != "scratch" || sv.DesiredSize != nil || sv.Attributes.Shared() {
		t.Errorf("emptyDir volume = %+v", sv)
	}
	dp := s.Pod("p1")
	wantNames := []volume.UniqueName{scratch.Name, data.Name}
	slices.Sort(wantNames)
	if dp == nil || dp.Pod != pod || !slices.Equal(dp.Volumes, wantNames) || !dp.Since.Equal(t0) {
		t.Errorf("pod = %+v, want volumes %v", dp, wantNames)
	}
	if len(dp.Errors) != 1 || dp.Errors[0] != errs[0] || !slices.Equal(dp.Unresolved, []string{"claim"}) {
		t.Errorf("pod errors %v, unresolved %v", dp.Errors, dp.Unresolved)
	}

	for _, name := range wantNames {
		if !d.HasPodVolume(name, "p1") || !s.HasPodVolume(name, "p1") || !d.HasVolume(name) {
			t.Errorf("HasPodVolume/HasVolume(%s) = false", name)
		}
		if d.HasPodVolume(name, "p2") || s.HasPodVolume(name, "p2") {
			t.Errorf("HasPodVolume(%s, p2) = true", name)
		}
	}
	if d.HasVolume("nope") || d.HasPodVolume("nope", "p1") || s.HasPodVolume("nope", "p1") {
		t.Error("unknown volume reported present")
	}
	if got, ok := d.Pod("p1"); !ok || got != dp {
		t.Errorf("Pod(p1) = %v, %v", got, ok)
	}
	if _, ok := d.Pod("p2"); ok {
		t.Error("Pod(p2) found")
	}
	if uids := d.PodUIDs(); !slices.Equal(uids, []types.UID{"p1"}) {
		t.Errorf("PodUIDs = %v", uids)
	}
}

func TestDesiredSetPodReplace(t *testing.T) {
	d, clk := newDSW()
	pod := testPod("p1")
	a, b, c := emptyDir("p1", "a"), emptyDir("p1", "b"), emptyDir("p1", "c")
	d.SetPod(pod, []PodVolume{a, b}, nil, nil)
	clk.Step(time.Minute)
	t1 := clk.Now()
	if !d.SetPod(pod, []PodVolume{c, b}, nil, nil) {
		t.Fatal("SetPod with another volume set = false")
	}
	s := d.Snapshot()
	if ok := s.Volume(a.Name) != nil; ok || d.HasVolume(a.Name) || d.HasPodVolume(a.Name, "p1") {
		t.Errorf("volume %s still desired", a.Name)
	}
	if v := s.Volume(b.Name); v == nil || !v.Pods.At("p1").Since.Equal(t0) {
		t.Errorf("kept volume %s = %+v, want Since %v", b.Name, v, t0)
	}
	if v := s.Volume(c.Name); v == nil || !v.Pods.At("p1").Since.Equal(t1) {
		t.Errorf("new volume %s = %+v, want Since %v", c.Name, v, t1)
	}
	if got := s.Pod("p1").Volumes; !slices.Equal(got, []volume.UniqueName{b.Name, c.Name}) {
		t.Errorf("pod volumes = %v", got)
	}
	if !s.Pod("p1").Since.Equal(t0) {
		t.Errorf("pod Since = %v, want %v", s.Pod("p1").Since, t0)
	}

	// Wanting nothing keeps the pod, without volumes.
	if !d.SetPod(pod, nil, nil, nil) {
		t.Fatal("SetPod with no volumes = false")
	}
	s = d.Snapshot()
	if s.VolumesLen() != 0 {
		t.Errorf("volumes left: %v", maps.Collect(s.Volumes()))
	}
	if p := s.Pod("p1"); p == nil || len(p.Volumes) != 0 {
		t.Errorf("pod = %+v; want present with no volumes", p)
	}
	if d.SetPod(pod, nil, nil, nil) {
		t.Error("SetPod with no volumes again = true")
	}
}

func TestDesiredDeletePod(t *testing.T) {
	d, _ := newDSW()
	if d.DeletePod("p1") {
		t.Error("DeletePod of an unknown pod = true")
	}
	gen := d.Snapshot().Generation
	if signalled(d) {
		t.Error("Changed signalled by a no-op")
	}
	a := emptyDir("p1", "a")
	d.SetPod(testPod("p1"), []PodVolume{a}, nil, nil)
	signalled(d)
	if !d.DeletePod("p1") {
		t.Fatal("DeletePod = false")
	}
	if !signalled(d) {
		t.Error("Changed not signalled by DeletePod")
	}
	s := d.Snapshot()
	if s.VolumesLen() != 0 || s.PodsLen() != 0 || d.HasVolume(a.Name) || len(d.PodUIDs()) != 0 {
		t.Errorf("after DeletePod: %d volumes, %d pods", s.VolumesLen(), s.PodsLen())
	}
	if s.Generation != gen+2 {
		t.Errorf("generation %d, want %d", s.Generation, gen+2)
	}
	if d.DeletePod("p1") {
		t.Error("second DeletePod = true")
	}
}

func TestDesiredMultipleOuterNames(t *testing.T) {
	d, _ := newDSW()
	pod := testPod("p1")
	pv := newPV("pv1", "1Gi")
	first, second := localPV(pv, "data"), localPV(pv, "data-again")
	other := emptyDir("p1", "other")
	d.SetPod(pod, []PodVolume{first, other, second}, nil, nil)
	s := d.Snapshot()
	if s.VolumesLen() != 2 {
		t.Fatalf("%d volumes, want 2", s.VolumesLen())
	}
	got := s.Volume(first.Name).Pods.At("p1").OuterNames
	if !slices.Equal(got, []string{"data", "data-again"}) {
		t.Errorf("outer names = %v", got)
	}
	wantNames := []volume.UniqueName{first.Name, other.Name}
	slices.Sort(wantNames)
	if names := s.Pod("p1").Volumes; !slices.Equal(names, wantNames) {
		t.Errorf("pod volumes = %v, want %v (each once)", names, wantNames)
	}
	if d.SetPod(pod, []PodVolume{first, other, second}, nil, nil) {
		t.Error("SetPod with the same outer names = true")
	}
	// Dropping one outer name is a change.
	if !d.SetPod(pod, []PodVolume{first, other}, nil, nil) {
		t.Fatal("SetPod without the second outer name = false")
	}
	if got := d.Snapshot().Volume(first.Name).Pods.At("p1").OuterNames; !slices.Equal(got, []string{"data"}) {
		t.Errorf("outer names = %v, want [data]", got)
	}
}

func TestDesiredSharedVolume(t *testing.T) {
	d, clk := newDSW()
	pv := newPV("pv1", "1Gi")
	volA, volB := localPV(pv, "a"), localPV(pv, "b")
	d.SetPod(testPod("A"), []PodVolume{volA}, nil, nil)
	clk.Step(time.Second)
	d.SetPod(testPod("B"), []PodVolume{volB}, nil, nil)
	name := volA.Name
	if volB.Name != name {
		t.Fatal("fixture: different names")
	}
	s := d.Snapshot()
	v := s.Volume(name)
	if s.VolumesLen() != 1 || v.Pods.Len() != 2 {
		t.Fatalf("volumes %v", maps.Collect(s.Volumes()))
	}
	if !slices.Equal(v.Pods.At("A").OuterNames, []string{"a"}) || !slices.Equal(v.Pods.At("B").OuterNames, []string{"b"}) {
		t.Errorf("outer names A %v, B %v", v.Pods.At("A").OuterNames, v.Pods.At("B").OuterNames)
	}
	if !v.Pods.At("A").Since.Equal(t0) || !v.Pods.At("B").Since.Equal(t0.Add(time.Second)) {
		t.Errorf("Since A %v, B %v", v.Pods.At("A").Since, v.Pods.At("B").Since)
	}
	if v.Spec != volA.Spec && v.Spec != volB.Spec {
		t.Errorf("volume spec %p is neither pod's spec", v.Spec)
	}

	if !d.DeletePod("A") {
		t.Fatal("DeletePod(A) = false")
	}
	s = d.Snapshot()
	v = s.Volume(name)
	if v == nil || v.Pods.Len() != 1 || v.Pods.At("B") == nil {
		t.Fatalf("after DeletePod(A): %+v", v)
	}
	if v.Spec != volB.Spec {
		t.Errorf("volume spec %+v, want B's (the only pod left)", v.Spec)
	}
	if d.HasPodVolume(name, "A") || !d.HasPodVolume(name, "B") || !d.HasVolume(name) {
		t.Error("HasPodVolume after DeletePod(A) wrong")
	}
	if s.Pod("A") != nil {
		t.Error("pod A still in DSW")
	}

	// A pod that stops wanting the volume (SetPod without it) also leaves
	// the other pod's use alone.
	d.SetPod(testPod("A"), []PodVolume{volA}, nil, nil)
	d.SetPod(testPod("B"), nil, nil, nil)
	if v := d.Snapshot().Volume(name); v == nil || v.Pods.Len() != 1 || v.Pods.At("A") == nil || v.Spec != volA.Spec {
		t.Fatalf("after B dropped the volume: %+v", v)
	}
	d.DeletePod("A")
	if d.HasVolume(name) {
		t.Error("volume still desired after its last pod left")
	}
}

// TestDesiredSharedVolumeSpecFollowsPods: the volume-wide spec (used for
// attach, device mount and expansion) is always the spec of a pod that
// currently wants the volume, also when that pod's spec changes.
func TestDesiredSharedVolumeSpecFollowsPods(t *testing.T) {
	d, _ := newDSW()
	pv1 := newPV("pv1", "1Gi")
	d.SetPod(testPod("A"), []PodVolume{sized(localPV(pv1, "a"), "1Gi")}, nil, nil)
	d.SetPod(testPod("B"), []PodVolume{sized(localPV(pv1, "b"), "1Gi")}, nil, nil)

	// The PV was resized: both pods resolve to the new PV object.
	pv2 := newPV("pv1", "2Gi")
	newA, newB := sized(localPV(pv2, "a"), "2Gi"), sized(localPV(pv2, "b"), "2Gi")
	if !d.SetPod(testPod("A"), []PodVolume{newA}, nil, nil) || !d.SetPod(testPod("B"), []PodVolume{newB}, nil, nil) {
		t.Fatal("SetPod with a new PV = false")
	}
	v := d.Snapshot().Volume(newA.Name)
	if v.Spec != newA.Spec && v.Spec != newB.Spec {
		t.Errorf("volume spec has PV capacity %v, want the current spec of a pod", v.Spec.PV.Spec.Capacity.Storage())
	}
	if v.DesiredSize.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("desired size %v, want 2Gi", v.DesiredSize)
	}

	// Single pod whose spec changes.
	d2, _ := newDSW()
	d2.SetPod(testPod("A"), []PodVolume{localPV(pv1, "a")}, nil, nil)
	d2.SetPod(testPod("A"), []PodVolume{localPV(pv2, "a")}, nil, nil)
	v = d2.Snapshot().Volume(newA.Name)
	if v.Spec != v.Pods.At("A").Spec {
		t.Errorf("volume spec (PV %p) is not the only pod's spec (PV %p)", v.Spec.PV, v.Pods.At("A").Spec.PV)
	}
}

func TestDesiredSincePreserved(t *testing.T) {
	d, clk := newDSW()
	pod := testPod("p1")
	a := emptyDir("p1", "a")
	d.SetPod(pod, []PodVolume{a}, nil, nil)

	clk.Step(time.Hour)
	// A change of the pod (new error, renamed pod) keeps both Since.
	pod2 := pod
	pod2.Name = "renamed"
	if !d.SetPod(pod2, []PodVolume{a}, []*volume.PodVolumeError{pvErr("p1", "x", "PVCNotFound")}, nil) {
		t.Fatal("SetPod with a change = false")
	}
	s := d.Snapshot()
	if p := s.Pod("p1"); !p.Since.Equal(t0) || p.Pod.Name != "renamed" {
		t.Errorf("pod = %+v, want Since %v", p, t0)
	}
	if pv := s.Volume(a.Name).Pods.At("p1"); !pv.Since.Equal(t0) || pv.Pod.Name != "renamed" {
		t.Errorf("pod volume = %+v, want Since %v", pv, t0)
	}

	// Gone and back: a new Since.
	d.DeletePod("p1")
	clk.Step(time.Hour)
	d.SetPod(pod, []PodVolume{a}, nil, nil)
	s = d.Snapshot()
	if want := t0.Add(2 * time.Hour); !s.Pod("p1").Since.Equal(want) || !s.Volume(a.Name).Pods.At("p1").Since.Equal(want) {
		t.Errorf("after re-adding: pod Since %v, volume Since %v, want %v", s.Pod("p1").Since, s.Volume(a.Name).Pods.At("p1").Since, want)
	}
}

// TestDesiredSetPodChanged: SetPod reports (and records, with a new
// generation and a Changed signal) exactly the calls that change something.
// The populator calls it again for every pod it re-resolves, with freshly
// built values, so equal content must count as unchanged.
func TestDesiredSetPodChanged(t *testing.T) {
	pv := newPV("pv1", "1Gi")
	otherPV := newPV("pv1", "1Gi")
	otherPV.ResourceVersion = "2"
	base := func() (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
		pod := testPod("p1")
		pod.FSGroup = ptr.To[int64](1000)
		pod.FSGroupChangePolicy = ptr.To(v1.FSGroupChangeOnRootMismatch)
		q := resource.MustParse("1Gi")
		pod.MemoryLimit = &q
		return pod, []PodVolume{emptyDir("p1", "a"), sized(localPV(pv, "data"), "1Gi")},
			[]*volume.PodVolumeError{pvErr("p1", "claim", "PVCNotFound")}, []string{"claim"}
	}
	tests := []struct {
		name    string
		modify  func(pod *volume.PodInfo, vols []PodVolume, errs []*volume.PodVolumeError, unresolved []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string)
		changed bool
	}{
		{"identical values rebuilt", nil, false},
		{"errors rebuilt with equal text", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			return *p, v, []*volume.PodVolumeError{pvErr("p1", "claim", "PVCNotFound")}, u
		}, false},
		{"nil vs empty unresolved", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			return *p, v, e, append([]string{}, u...)
		}, false},
		{"same quantity written differently", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			q := resource.MustParse("1024Mi")
			p.MemoryLimit = &q
			v[1] = sized(v[1], "1024Mi")
			return *p, v, e, u
		}, false},
		{"another error", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			return *p, v, []*volume.PodVolumeError{pvErr("p1", "claim", "PVCNotBound")}, u
		}, true},
		{"no error", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			return *p, v, nil, u
		}, true},
		{"unresolved cleared", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			return *p, v, e, nil
		}, true},
		{"pod renamed", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			p.Name = "other"
			return *p, v, e, u
		}, true},
		{"fsGroup changed", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			p.FSGroup = ptr.To[int64](2000)
			return *p, v, e, u
		}, true},
		{"fsGroup removed", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			p.FSGroup = nil
			return *p, v, e, u
		}, true},
		{"memory limit changed", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			q := resource.MustParse("2Gi")
			p.MemoryLimit = &q
			return *p, v, e, u
		}, true},
		{"volume added", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			return *p, append(v, emptyDir("p1", "b")), e, u
		}, true},
		{"volume removed", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			return *p, v[:1], e, u
		}, true},
		{"outer name added", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			return *p, append(v, localPV(pv, "data2")), e, u
		}, true},
		{"desired size changed", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			v[1] = sized(v[1], "2Gi")
			return *p, v, e, u
		}, true},
		{"desired size dropped", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			v[1].DesiredSize = nil
			return *p, v, e, u
		}, true},
		{"attributes changed", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			v[1].Attributes.DeviceMountable = true
			return *p, v, e, u
		}, true},
		{"PV object replaced", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			v[1] = sized(localPV(otherPV, "data"), "1Gi")
			return *p, v, e, u
		}, true},
		{"read-only changed", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			v[1].Spec.ReadOnly = true
			return *p, v, e, u
		}, true},
		{"inline volume source changed", func(p *volume.PodInfo, v []PodVolume, e []*volume.PodVolumeError, u []string) (volume.PodInfo, []PodVolume, []*volume.PodVolumeError, []string) {
			v[0].Spec.Volume.EmptyDir.Medium = v1.StorageMediumMemory
			return *p, v, e, u
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newDSW()
			pod, vols, errs, unresolved := base()
			if !d.SetPod(pod, vols, errs, unresolved) {
				t.Fatal("first SetPod = false")
			}
			signalled(d)
			before := d.Snapshot()

			// Everything rebuilt from scratch: new pointers, equal content.
			pod, vols, errs, unresolved = base()
			if tc.modify != nil {
				pod, vols, errs, unresolved = tc.modify(&pod, vols, errs, unresolved)
			}
			got := d.SetPod(pod, vols, errs, unresolved)
			after := d.Snapshot()
			if got != tc.changed {
				t.Errorf("SetPod = %v, want %v", got, tc.changed)
			}
			if sig := signalled(d); sig != tc.changed {
				t.Errorf("Changed signalled = %v, want %v", sig, tc.changed)
			}
			if tc.changed {
				if after.Generation != before.Generation+1 {
					t.Errorf("generation %d -> %d, want +1", before.Generation, after.Generation)
				}
				return
			}
			if after != before {
				t.Errorf("snapshot rebuilt (generation %d -> %d) though nothing changed", before.Generation, after.Generation)
			}
		})
	}
}

// TestDesiredSetPodStoresChanges: what a changing SetPod records is what
// was handed in.
func TestDesiredSetPodStoresChanges(t *testing.T) {
	d, _ := newDSW()
	pv := newPV("pv1", "1Gi")
	data := localPV(pv, "data")
	d.SetPod(testPod("p1"), []PodVolume{data}, nil, nil)

	data2 := sized(localPV(pv, "data"), "3Gi")
	data2.Attributes.DeviceMountable = true
	errs := []*volume.PodVolumeError{pvErr("p1", "x", "PVNotFound")}
	d.SetPod(testPod("p1"), []PodVolume{data2}, errs, []string{"x"})
	s := d.Snapshot()
	v := s.Volume(data.Name)
	if !v.Attributes.DeviceMountable || v.DesiredSize == nil || v.DesiredSize.Cmp(resource.MustParse("3Gi")) != 0 {
		t.Errorf("volume = %+v, want new attributes and size", v)
	}
	if p := s.Pod("p1"); len(p.Errors) != 1 || p.Errors[0].Reason != "PVNotFound" || !slices.Equal(p.Unresolved, []string{"x"}) {
		t.Errorf("pod = %+v", p)
	}
	d.SetPod(testPod("p1"), []PodVolume{data2}, nil, nil)
	if p := d.Snapshot().Pod("p1"); len(p.Errors) != 0 || len(p.Unresolved) != 0 {
		t.Errorf("errors not cleared: %+v", p)
	}
}

// TestDesiredSnapshotImmutable: a snapshot never changes, whatever is set
// after it was taken. The DSW is built twice the same way; the snapshot of
// one must stay deeply equal to the other's (every field, the values behind
// pointers included) while the first takes every kind of change.
func TestDesiredSnapshotImmutable(t *testing.T) {
	withSecurity := func(uid string, fsGroup int64) volume.PodInfo {
		p := testPod(uid)
		limit := resource.MustParse("64Mi")
		p.FSGroup, p.MemoryLimit = &fsGroup, &limit
		return p
	}
	build := func() *DesiredStateOfWorld {
		d, _ := newDSW()
		pv := newPV("pv1", "1Gi")
		d.SetPod(withSecurity("A", 1000), []PodVolume{localPV(pv, "data"), emptyDir("A", "a")}, nil, nil)
		d.SetPod(testPod("B"), []PodVolume{sized(localPV(pv, "data"), "1Gi")}, []*volume.PodVolumeError{pvErr("B", "y", "PVCNotFound")}, []string{"y"})
		return d
	}
	d := build()
	s1 := d.Snapshot()
	want := build().Snapshot()
	if !reflect.DeepEqual(s1, want) {
		t.Fatal("two DSWs built the same way differ")
	}

	// Every kind of change.
	pv := newPV("pv1", "1Gi")
	shared := localPV(pv, "data")
	d.SetPod(testPod("C"), []PodVolume{shared, emptyDir("C", "c")}, nil, nil)
	d.SetPod(withSecurity("A", 2000), []PodVolume{shared}, []*volume.PodVolumeError{pvErr("A", "x", "PVCNotFound")}, []string{"x"})
	d.DeletePod("B")
	d.SetPod(testPod("C"), []PodVolume{sized(localPV(pv, "renamed"), "9Gi")}, nil, nil)

	if !reflect.DeepEqual(s1, want) {
		t.Errorf("old snapshot changed:\nbefore: %s\nafter:  %s", dumpDesired(want), dumpDesired(s1))
	}
	s2 := d.Snapshot()
	if s2 == s1 || s2.Generation <= s1.Generation {
		t.Errorf("generation %d -> %d", s1.Generation, s2.Generation)
	}
	if s2.Pod("B") != nil {
		t.Error("new snapshot still has pod B")
	}
	if s2.Volume(volume.PodScopedName(emptyDirPlugin, "A", "a")) != nil {
		t.Error("new snapshot still has A's emptyDir")
	}
	if p := s2.Pod("A"); p == nil || p.Pod.FSGroup == nil || *p.Pod.FSGroup != 2000 {
		t.Errorf("new snapshot: pod A = %+v", p)
	}
	if !s1.HasPodVolume(shared.Name, "B") || s2.HasPodVolume(shared.Name, "B") {
		t.Error("HasPodVolume on snapshots does not follow them")
	}
}

// dumpDesired shows a snapshot for failure messages.
func dumpDesired(s *DesiredSnapshot) string {
	var out []string
	for name, v := range s.Volumes() {
		out = append(out, fmt.Sprintf("V %s %s %+v %s %p %v", name, v.Plugin, v.Attributes, v.SpecName, v.Spec, v.DesiredSize))
		for uid, p := range v.Pods.All() {
			out = append(out, fmt.Sprintf("VP %s %s %+v %v %p %v", name, uid, p.Pod, p.OuterNames, p.Spec, p.Since))
		}
	}
	for uid, p := range s.Pods() {
		out = append(out, fmt.Sprintf("P %s %+v %v %v %v %v", uid, p.Pod, p.Volumes, p.Errors, p.Unresolved, p.Since))
	}
	slices.Sort(out)
	return fmt.Sprint(s.Generation, out)
}

func TestDesiredSnapshotCached(t *testing.T) {
	d, _ := newDSW()
	s0 := d.Snapshot()
	if s0 == nil || s0.VolumesLen() != 0 || s0.PodsLen() != 0 {
		t.Fatalf("empty snapshot = %+v", s0)
	}
	if d.Snapshot() != s0 {
		t.Error("snapshot of an unchanged DSW rebuilt")
	}
	a := emptyDir("p1", "a")
	d.SetPod(testPod("p1"), []PodVolume{a}, nil, nil)
	s1 := d.Snapshot()
	if s1 == s0 || s1.Generation != s0.Generation+1 {
		t.Errorf("after a change: generation %d -> %d", s0.Generation, s1.Generation)
	}
	d.SetPod(testPod("p1"), []PodVolume{a}, nil, nil) // no change
	d.DeletePod("unknown")                            // no change
	if d.Snapshot() != s1 {
		t.Error("snapshot rebuilt after no-op calls")
	}
}

// TestDesiredConcurrent exercises the DSW from several goroutines; run with
// -race.
func TestDesiredConcurrent(t *testing.T) {
	d, _ := newDSW()
	pv := newPV("pv1", "1Gi")
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				uid := fmt.Sprintf("w%d-p%d", w, i%5)
				if i%3 == 2 {
					d.DeletePod(types.UID(uid))
					continue
				}
				d.SetPod(testPod(uid), []PodVolume{localPV(pv, "data"), emptyDir(uid, "e")}, nil, nil)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 200 {
			s := d.Snapshot()
			for _, v := range s.Volumes() {
				for range v.Pods.All() {
				}
			}
			for uid := range s.Pods() {
				d.HasPodVolume(volume.SharedName(localPlugin, "pv1"), uid)
			}
		}
	}()
	wg.Wait()
	// Consistency: every pod's volumes list that pod, and back.
	s := d.Snapshot()
	for uid, p := range s.Pods() {
		for _, name := range p.Volumes {
			if !s.HasPodVolume(name, uid) {
				t.Errorf("pod %s lists %s, which does not list the pod", uid, name)
			}
		}
	}
	for name, v := range s.Volumes() {
		for uid := range v.Pods.All() {
			if p := s.Pod(uid); p == nil || !slices.Contains(p.Volumes, name) {
				t.Errorf("volume %s lists pod %s, which does not list it", name, uid)
			}
		}
	}
}

// Changes made in a Batch are visible at once but signalled once, when the
// outermost batch ends; a batch that changes nothing signals nothing.
func TestDesiredBatchSignalsOnce(t *testing.T) {
	d, _ := newDSW()
	d.Batch(func() {
		d.Batch(func() {
			d.SetPod(testPod("p1"), []PodVolume{emptyDir("p1", "a")}, nil, nil)
		})
		if signalled(d) {
			t.Error("signalled when an inner batch ended")
		}
		d.SetPod(testPod("p2"), []PodVolume{emptyDir("p2", "a")}, nil, nil)
		if d.Snapshot().PodsLen() != 2 {
			t.Error("changes made in the batch are not visible yet")
		}
		if signalled(d) {
			t.Error("signalled inside the batch")
		}
	})
	if !signalled(d) {
		t.Error("not signalled when the batch ended")
	}
	if signalled(d) {
		t.Error("signalled more than once")
	}
	d.Batch(func() { d.SetPod(testPod("p1"), []PodVolume{emptyDir("p1", "a")}, nil, nil) })
	if signalled(d) {
		t.Error("a batch that changed nothing signalled")
	}
	d.SetPod(testPod("p3"), nil, nil, nil)
	if !signalled(d) {
		t.Error("a change outside any batch was not signalled")
	}
}

// TestDesiredRefreshPodVolume: a pod volume whose content follows its
// sources gets a content generation when first wanted, keeps it while the
// pod is set again, and gets a newer one from RefreshPodVolume (listed as
// a change and signalled); other volumes and absent pods get none.
func TestDesiredRefreshPodVolume(t *testing.T) {
	d, _ := newDSW()
	api := emptyDir("p1", "config")
	api.Attributes.RequiresRemount = true
	plain := emptyDir("p1", "scratch")
	d.SetPod(testPod("p1"), []PodVolume{api, plain}, nil, nil)
	d.TakeChanges()
	signalled(d)
	gen := func() uint64 { return d.Snapshot().Volume(api.Name).Pods.At("p1").ContentGeneration }
	first := gen()
	if first == 0 || d.Snapshot().Volume(plain.Name).Pods.At("p1").ContentGeneration != 0 {
		t.Fatalf("generations %d (content follows sources) and %d (does not): want >0 and 0", first, d.Snapshot().Volume(plain.Name).Pods.At("p1").ContentGeneration)
	}

	before := d.Snapshot()
	g, ok := d.RefreshPodVolume(api.Name, "p1")
	if !ok || g <= first || gen() != g {
		t.Fatalf("RefreshPodVolume = %d, %v; snapshot has %d; want a generation above %d", g, ok, gen(), first)
	}
	if before.Volume(api.Name).Pods.At("p1").ContentGeneration != first {
		t.Error("an earlier snapshot sees the new generation")
	}
	if c := d.TakeChanges(); c.All || !c.Has(api.Name) || c.Has(plain.Name) || !signalled(d) {
		t.Errorf("changes %v (want the refreshed volume only), signalled: want true", changedNames(c))
	}

	// Setting the pod again keeps the generation.
	d.SetPod(testPod("p1"), []PodVolume{api, plain}, nil, nil)
	if gen() != g {
		t.Errorf("SetPod reset the generation to %d, want %d", gen(), g)
	}

	for _, tc := range []struct {
		name volume.UniqueName
		pod  types.UID
	}{{plain.Name, "p1"}, {api.Name, "other"}, {"unknown", "p1"}} {
		if g, ok := d.RefreshPodVolume(tc.name, tc.pod); ok || g != 0 {
			t.Errorf("RefreshPodVolume(%s, %s) = %d, %v: want nothing to refresh", tc.name, tc.pod, g, ok)
		}
	}

	// Gone and back: newer than any generation before, so a mount left
	// from before is written again.
	d.DeletePod("p1")
	d.SetPod(testPod("p1"), []PodVolume{api}, nil, nil)
	if gen() <= g {
		t.Errorf("re-added pod volume at generation %d, want above %d", gen(), g)
	}
}
