package model_test

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/ui/internal/fixture"
	"github.com/volume-agent/volume-agent/ui/model"
	"github.com/volume-agent/volume-agent/volume"
)

func findPod(t *testing.T, p *model.Page, ref volume.PodRef) model.Pod {
	t.Helper()
	for _, pod := range p.Pods {
		if pod.UID == ref.UID {
			return pod
		}
	}
	t.Fatalf("pod %s not on the page", ref)
	return model.Pod{}
}

func findVolume(t *testing.T, p model.Pod, name string) model.PodVolume {
	t.Helper()
	for _, v := range p.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("pod %s has no volume %q: %+v", p.PodRef, name, p.Volumes)
	return model.PodVolume{}
}

func TestBuildVolumeStates(t *testing.T) {
	page := model.Build(fixture.Input())
	at := func(d time.Duration) time.Time { return fixture.Start.Add(d) }
	tests := []struct {
		pod        volume.PodRef
		volume     string
		state      model.State
		since      time.Time
		reason     string // contained in the reason
		operation  string
		hasRetryAt bool
	}{
		{fixture.Web, "cache", model.Mounted, at(time.Minute + 300*time.Millisecond), "", "", false},
		{fixture.Web, "content", model.Mounted, at(time.Minute + 300*time.Millisecond), "", "", false},
		{fixture.Worker, "tmp", model.Desired, at(time.Minute), "WaitingForMount: mount_volume running", "mount_volume running", false},
		{fixture.Waiting, "data", model.Error, at(time.Minute), "PVCNotFound: PVC default/does-not-exist not found", "", false},
		{fixture.Waiting, "scratch", model.Mounted, at(time.Minute + 300*time.Millisecond), "", "", false},
		// The first failure in a row, from the timeline (not the last one).
		{fixture.DB, "data", model.Error, at(5*time.Minute + 31*time.Second + 300*time.Millisecond), "MountFailed: rpc error", "mount_device backoff", true},
		{fixture.Old, "scratch", model.Error, at(2*time.Minute + 300*time.Millisecond), "device or resource busy", "unmount_volume backoff", true},
	}
	for _, tc := range tests {
		t.Run(tc.pod.Name+"/"+tc.volume, func(t *testing.T) {
			v := findVolume(t, findPod(t, page, tc.pod), tc.volume)
			if v.State != tc.state {
				t.Errorf("state %s, want %s (reason %q)", v.State, tc.state, v.Reason)
			}
			if !v.Since.Equal(tc.since) {
				t.Errorf("since %s, want %s", v.Since, tc.since)
			}
			if !strings.Contains(v.Reason, tc.reason) || (tc.reason == "" && v.Reason != "") {
				t.Errorf("reason %q, want %q", v.Reason, tc.reason)
			}
			if v.Operation != tc.operation || (v.RetryAt != nil) != tc.hasRetryAt {
				t.Errorf("operation %q retryAt %v, want %q (retry: %v)", v.Operation, v.RetryAt, tc.operation, tc.hasRetryAt)
			}
		})
	}
}

func TestBuildPodStates(t *testing.T) {
	page := model.Build(fixture.Input())
	tests := []struct {
		pod    volume.PodRef
		state  model.PodState
		reason string
	}{
		{fixture.Web, model.PodReady, ""},
		{fixture.Worker, model.PodWaiting, "tmp: WaitingForMount: mount_volume running"},
		{fixture.Waiting, model.PodError, "data: PVCNotFound"},
		{fixture.DB, model.PodError, "data: MountFailed: rpc error"},
		{fixture.Old, model.PodTerminating, "scratch: unmount_volume failed"},
	}
	for _, tc := range tests {
		p := findPod(t, page, tc.pod)
		if p.State != tc.state || !strings.HasPrefix(p.Reason, tc.reason) || (tc.reason == "" && p.Reason != "") {
			t.Errorf("%s: %s %q, want %s %q", tc.pod, p.State, p.Reason, tc.state, tc.reason)
		}
	}
	var order []string
	for _, p := range page.Pods {
		order = append(order, p.Namespace+"/"+p.Name)
	}
	if got, want := strings.Join(order, " "), "default/waiting-for-claim default/web default/worker team-b/db team-b/old-job"; got != want {
		t.Errorf("pods in order %s, want %s", got, want)
	}
}

func TestBuildSummaryAndLists(t *testing.T) {
	page := model.Build(fixture.Input())
	s := page.Summary
	if s.Pods != 5 || s.PodsReady != 1 || s.PodsError != 2 || s.Volumes != 9 {
		t.Errorf("summary %+v", s)
	}
	if s.OperationsRunning != 1 || s.OperationsBackoff != 2 || s.Drivers != 2 || s.DriversUnhealthy != 1 || s.Orphans != 1 {
		t.Errorf("summary %+v", s)
	}
	states, _ := json.Marshal(s.VolumeStates)
	if got, want := string(states), `[{"state":"error","count":3},{"state":"desired","count":1},{"state":"mounted","count":5}]`; got != want {
		t.Errorf("volume states %s, want %s", got, want)
	}
	if page.Drivers[0].Health != "unresponsive" || page.Drivers[1].Health != "healthy" {
		t.Errorf("driver health %s %s, want unresponsive (last probe 2m ago, period 30s) and healthy", page.Drivers[0].Health, page.Drivers[1].Health)
	}
	if len(page.Sockets) != 1 || page.LocalVolumes == nil || len(page.LocalVolumes.Volumes) != 3 || len(page.InputErrors) != 1 {
		t.Errorf("sockets %d, local volumes %+v, input errors %d", len(page.Sockets), page.LocalVolumes, len(page.InputErrors))
	}
	if len(page.Events) != 3 || page.Events[0].Object.Name != "db" {
		t.Errorf("events are not newest first: %+v", page.Events)
	}
	if strings.Join(page.Namespaces, ",") != "default,team-b" {
		t.Errorf("namespaces %v", page.Namespaces)
	}
}

func TestBuildEmpty(t *testing.T) {
	page := model.Build(model.Input{Now: fixture.Now, Node: "n"})
	b, err := json.Marshal(page)
	if err != nil {
		t.Fatal(err)
	}
	// Lists are empty, never null, for JSON consumers.
	for _, field := range []string{`"pods":[]`, `"operations":[]`, `"drivers":[]`, `"orphans":[]`, `"events":[]`} {
		if !strings.Contains(string(b), field) {
			t.Errorf("empty page %s lacks %s", b, field)
		}
	}
}

func TestFiltered(t *testing.T) {
	page := model.Build(fixture.Input())
	tests := []struct {
		filter model.Filter
		pods   string
		ops    int
		events int
	}{
		{model.Filter{}, "waiting-for-claim web worker db old-job", 3, 3},
		{model.Filter{Namespace: "team-b"}, "db old-job", 2, 1},
		{model.Filter{Pod: "w"}, "waiting-for-claim web worker", 1, 2},
		{model.Filter{State: "error"}, "waiting-for-claim db old-job", 2, 2},
		{model.Filter{State: model.NotReady}, "waiting-for-claim worker db old-job", 3, 2},
		{model.Filter{State: "ready"}, "web", 0, 1},
		{model.Filter{Namespace: "default", State: "mounted"}, "waiting-for-claim web worker", 1, 2},
		{model.Filter{Namespace: "nope"}, "", 0, 0},
	}
	for _, tc := range tests {
		got := page.Filtered(tc.filter)
		var names []string
		for _, p := range got.Pods {
			names = append(names, p.Name)
		}
		if strings.Join(names, " ") != tc.pods || len(got.Operations) != tc.ops || len(got.Events) != tc.events {
			t.Errorf("%+v: pods %v, %d operations, %d events; want %s, %d, %d", tc.filter, names, len(got.Operations), len(got.Events), tc.pods, tc.ops, tc.events)
		}
	}
	if len(page.Pods) != 5 {
		t.Errorf("filtering changed the page: %d pods", len(page.Pods))
	}
}

func TestBuildPod(t *testing.T) {
	in := fixture.Input()
	d, ok := model.BuildPod(in, "default", "web")
	if !ok {
		t.Fatal("web not found")
	}
	var content *model.MountTree
	for i := range d.Mounts {
		if d.Mounts[i].Name == "content" {
			content = &d.Mounts[i]
		}
	}
	if content == nil || content.Origin != "/mnt/disks/content" || !strings.HasSuffix(content.GlobalMount, "/local-content/globalmount") {
		t.Fatalf("content's mount tree %+v: want origin /mnt/disks/content and its global mount", content)
	}
	if len(content.Mounts) != 2 || !content.Mounts[0].This || content.Mounts[0].Pod != fixture.Web || content.Mounts[1].Pod != fixture.Worker {
		t.Errorf("content's pod mounts %+v: want web (this pod) first, then worker", content.Mounts)
	}
	// web's timeline: the device mount of the shared volume, then its
	// three mounts; not worker's.
	var ops []string
	for _, e := range d.Timeline {
		ops = append(ops, e.Name+":"+string(e.Op))
	}
	if got, want := strings.Join(ops, " "), "content:mount_device cache:mount_volume scratch:mount_volume content:mount_volume"; got != want {
		t.Errorf("timeline %s, want %s", got, want)
	}
	if len(d.Events) != 1 || d.Events[0].Object.Name != "web" {
		t.Errorf("events %+v, want web's one", d.Events)
	}

	db, _ := model.BuildPod(in, "team-b", "db")
	if len(db.Operations) != 1 || db.Operations[0].Operation != "mount_device" || db.Mounts[0].Origin != "/dev/vdb" {
		t.Errorf("db: operations %+v, mounts %+v", db.Operations, db.Mounts)
	}
	if _, ok := model.BuildPod(in, "default", "nope"); ok {
		t.Error("an unknown pod was found")
	}
}

func TestDescribe(t *testing.T) {
	in := fixture.Input()
	page := model.Build(in)
	tests := []struct {
		pod    volume.PodRef
		volume string
		want   string
	}{
		{fixture.Web, "cache", "emptyDir (Memory)"},
		{fixture.Web, "scratch", "emptyDir"},
		{fixture.Web, "content", "PVC default/content → PV local-content (local /mnt/disks/content)"},
		{fixture.DB, "data", "PVC team-b/data → PV pvc-db (CSI csi.example.com)"},
		{fixture.Waiting, "data", ""},
	}
	for _, tc := range tests {
		if got := findVolume(t, findPod(t, page, tc.pod), tc.volume).Source; got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.pod, tc.volume, got, tc.want)
		}
	}
}

// A normal wait (the attach/detach controller's attachment) is no error:
// the volume stays desired and says what it waits for, and its pod waits.
func TestBuildWaitIsNoError(t *testing.T) {
	in := fixture.Input()
	vols := maps.Collect(in.ASW.Volumes())
	delete(vols, fixture.DBData) // not attached yet
	in.ASW = cache.NewActualSnapshot(vols, in.ASW.Generation)
	const wait = "waiting for VolumeAttachment csi-1 (driver csi.example.com, volume vol-1) to be attached"
	for i := range in.Operations {
		if o := &in.Operations[i]; o.Volume == fixture.DBData {
			o.Operation, o.LastError, o.Waiting = "verify_attached", wait, true
		}
	}
	page := model.Build(in)
	p := findPod(t, page, fixture.DB)
	v := findVolume(t, p, "data")
	if v.State != model.Desired || v.Reason != "WaitingForAttach: "+wait {
		t.Errorf("volume %s %q, want no error and the reason %q", v.State, v.Reason, wait)
	}
	if p.State != model.PodWaiting {
		t.Errorf("pod %s %q, want waiting", p.State, p.Reason)
	}
}
