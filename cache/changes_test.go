package cache

import (
	"fmt"
	"slices"
	"testing"

	"github.com/volume-agent/volume-agent/volume"
)

func changedNames(c Changes) []string {
	var out []string
	c.Each(func(n volume.UniqueName) { out = append(out, string(n)) })
	slices.Sort(out)
	return out
}

// TestDesiredTakeChanges: the DSW lists the volumes whose entries changed
// since the last take; the first take, and a change of whether a pod's
// mounts are protected, say All.
func TestDesiredTakeChanges(t *testing.T) {
	d, _ := newDSW()
	a, b := emptyDir("a", "v"), emptyDir("b", "v")
	d.SetPod(testPod("a"), []PodVolume{a}, nil, nil) // before the first take: not listed
	steps := []struct {
		name    string
		change  func()
		wantAll bool
		want    []string
	}{
		{"first take", func() {}, true, nil},
		{"nothing", func() {}, false, nil},
		{"pod added", func() { d.SetPod(testPod("b"), []PodVolume{b}, nil, nil) }, false, []string{string(b.Name)}},
		{"same pod again", func() { d.SetPod(testPod("b"), []PodVolume{b}, nil, nil) }, false, nil},
		{"pod deleted", func() { d.DeletePod("a") }, false, []string{string(a.Name)}},
		{"pod becomes protected", func() { d.SetPod(testPod("b"), []PodVolume{b}, nil, []string{"data"}) }, true, nil},
		{"protected pod deleted", func() { d.DeletePod("b") }, true, nil},
	}
	for _, s := range steps {
		s.change()
		c := d.TakeChanges()
		if got := changedNames(c); c.All != s.wantAll || !slices.Equal(got, s.want) {
			t.Fatalf("%s: All=%v %v, want All=%v %v", s.name, c.All, got, s.wantAll, s.want)
		}
	}
}

// TestActualTakeChanges: the ASW lists every volume an operation touched,
// across its shards, and collapses into All past its limit.
func TestActualTakeChanges(t *testing.T) {
	a, _ := newASW()
	if c := a.TakeChanges(); !c.All {
		t.Fatalf("first take: All=false, want true")
	}
	a.SetPodMount(perPodID, ActualPodMount{Pod: volume.PodRef{UID: "p1"}, State: Mounted})
	a.SetDeviceState(deviceID, DeviceGloballyMounted, "/dev/x", "/g")
	a.MarkPodVolumeRemountRequired(perPodID.Name, "p1")
	c := a.TakeChanges()
	want := []string{string(deviceID.Name), string(perPodID.Name)}
	slices.Sort(want)
	if got := changedNames(c); c.All || !slices.Equal(got, want) {
		t.Fatalf("All=%v %v, want %v", c.All, got, want)
	}
	if !c.Has(deviceID.Name) || c.Has("other") {
		t.Fatalf("Has: %v %v, want true false", c.Has(deviceID.Name), c.Has("other"))
	}
	if c := a.TakeChanges(); c.All || c.Len() != 0 {
		t.Fatalf("nothing changed: All=%v, %d names", c.All, c.Len())
	}
	// Volumes that come and go (pod churn) leave no entries behind but
	// their names: past the limit the list becomes All.
	for i := range 32 * (changeLimit(0) + 2) {
		id := VolumeIdentity{Name: volume.UniqueName(fmt.Sprintf("p/v%d", i)), Plugin: "p"}
		a.SetPodMount(id, ActualPodMount{Pod: volume.PodRef{UID: "p1"}, State: Mounted})
		a.DeletePodMount(id.Name, "p1")
	}
	if c := a.TakeChanges(); !c.All {
		t.Fatalf("%d names listed, want All", c.Len())
	}
}
