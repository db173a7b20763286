package populator

import (
	"errors"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/volume"
)

type harness struct {
	src     *fakeSource
	dsw     *cache.DesiredStateOfWorld
	pop     *Populator
	events  *recorder
	obs     *observer
	resolve *atomic.Int64 // plugin Attributes calls: one per volume resolution
	node    atomic.Pointer[Node]
}

func newHarness(t *testing.T, opts ...func(*Options)) *harness {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h := &harness{
		src:     newFakeSource(),
		dsw:     cache.NewDesiredStateOfWorld(clk),
		events:  &recorder{},
		obs:     &observer{},
		resolve: &atomic.Int64{},
	}
	n := testNodeInfo
	h.node.Store(&n)
	o := Options{
		Source:   h.src,
		DSW:      h.dsw,
		Plugins:  testPlugins(t, h.resolve),
		Node:     func() Node { return *h.node.Load() },
		Events:   h.events,
		Observer: h.obs,
		Clock:    clk,
	}
	for _, f := range opts {
		f(&o)
	}
	h.pop = New(o)
	return h
}

func (h *harness) snapshot() *cache.DesiredSnapshot { return h.dsw.Snapshot() }

func (h *harness) pod(t *testing.T, pod *v1.Pod) *cache.DesiredPod {
	t.Helper()
	p := h.snapshot().Pod(pod.UID)
	ok := p != nil
	if !ok {
		t.Fatalf("pod %s not in the DSW", pod.Name)
	}
	return p
}

func reasons(errs []*volume.PodVolumeError) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Volume+":"+e.Reason)
	}
	return out
}

func TestSyncAddsRunningPods(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	pvc, pv := boundPair("claim", "pv-1", dir)
	web := newPod("web", withVolume(emptyDirVol("scratch")), withVolume(claimVol("data", "claim")))
	pending := newPod("pending", withPhase(v1.PodPending), withVolume(emptyDirVol("scratch")))
	noVolumes := newPod("plain")
	h.src.Add(pvc, pv, web, pending, noVolumes)
	h.pop.Sync(false)

	s := h.snapshot()
	if s.PodsLen() != 3 {
		t.Fatalf("DSW has %d pods, want 3", s.PodsLen())
	}
	wantNames := []volume.UniqueName{
		volume.PodScopedName(emptydir.Name, web.UID, "scratch"),
		volume.SharedName(local.Name, "pv-1"),
	}
	slices.Sort(wantNames)
	if got := s.Pod(web.UID).Volumes; !slices.Equal(got, wantNames) {
		t.Errorf("web volumes = %v, want %v", got, wantNames)
	}
	if got := s.Pod(noVolumes.UID); got == nil || len(got.Volumes) != 0 || len(got.Errors) != 0 {
		t.Errorf("pod without volumes = %+v", got)
	}
	if s.VolumesLen() != 3 {
		t.Errorf("DSW has %d volumes, want 3", s.VolumesLen())
	}
	dv := s.Volume(volume.SharedName(local.Name, "pv-1"))
	if dv == nil || dv.Pods.At(web.UID) == nil || !slices.Equal(dv.Pods.At(web.UID).OuterNames, []string{"data"}) || dv.Spec.PV != pv {
		t.Errorf("PV volume = %+v", dv)
	}
	if len(h.events.list()) != 0 {
		t.Errorf("events for healthy pods: %v", h.events.list())
	}
	if h.obs.passes[len(h.obs.passes)-1] != 3 {
		t.Errorf("observer saw %v pods", h.obs.passes)
	}
}

func TestSyncSkipsVolumesNoContainerUses(t *testing.T) {
	h := newHarness(t)
	pod := newPod("web",
		withVolume(emptyDirVol("used")),
		withUnusedVolume(emptyDirVol("init")),
		withUnusedVolume(emptyDirVol("debug")),
		withUnusedVolume(emptyDirVol("unused")),
		// Broken volumes nobody uses are not even looked at.
		withUnusedVolume(v1.Volume{Name: "nfs", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/"}}}),
		withUnusedVolume(claimVol("claim", "missing")),
	)
	pod.Spec.InitContainers = []v1.Container{{Name: "init", VolumeMounts: []v1.VolumeMount{{Name: "init", MountPath: "/i"}}}}
	pod.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{
		Name: "debug", VolumeMounts: []v1.VolumeMount{{Name: "debug", MountPath: "/d"}},
	}}}
	h.src.Add(pod)
	h.pop.Sync(false)

	p := h.pod(t, pod)
	var got []string
	for _, name := range p.Volumes {
		got = append(got, h.snapshot().Volume(name).SpecName)
	}
	slices.Sort(got)
	if want := []string{"debug", "init", "used"}; !slices.Equal(got, want) {
		t.Errorf("desired volumes = %v, want %v", got, want)
	}
	if len(p.Errors) != 0 || len(p.Unresolved) != 0 {
		t.Errorf("errors %v, unresolved %v for unused volumes", reasons(p.Errors), p.Unresolved)
	}
	if n := h.resolve.Load(); n != 3 {
		t.Errorf("%d resolutions, want 3", n)
	}
}

func TestSyncRemovesTerminatedAndMissingPods(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(h *harness, pod *v1.Pod)
	}{
		{"succeeded", func(h *harness, pod *v1.Pod) { h.src.Add(withPhaseCopy(pod, v1.PodSucceeded)) }},
		{"failed", func(h *harness, pod *v1.Pod) { h.src.Add(withPhaseCopy(pod, v1.PodFailed)) }},
		{"gone", func(h *harness, pod *v1.Pod) { h.src.SetPods() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			dir := t.TempDir()
			pvc, pv := boundPair("claim", "pv-1", dir)
			pod := newPod("web", withVolume(emptyDirVol("scratch")), withVolume(claimVol("data", "claim")))
			other := newPod("other", withVolume(claimVol("data", "claim")))
			h.src.Add(pvc, pv, pod, other)
			h.pop.Sync(false)
			if h.snapshot().PodsLen() != 2 {
				t.Fatal("pods not added")
			}
			tc.change(h, pod)
			if tc.name == "gone" {
				h.src.Add(other)
			}
			h.pop.Sync(false)
			s := h.snapshot()
			if s.Pod(pod.UID) != nil {
				t.Errorf("pod still desired")
			}
			if s.Volume(volume.PodScopedName(emptydir.Name, pod.UID, "scratch")) != nil {
				t.Errorf("its emptyDir still desired")
			}
			shared := s.Volume(volume.SharedName(local.Name, "pv-1"))
			if shared == nil || shared.Pods.Len() != 1 || shared.Pods.At(other.UID) == nil {
				t.Errorf("shared volume = %+v, want only the other pod", shared)
			}
			if _, ok := h.pop.state[pod.UID]; ok {
				t.Error("populator still remembers the pod")
			}
		})
	}
}

func withPhaseCopy(pod *v1.Pod, phase v1.PodPhase) *v1.Pod {
	p := pod.DeepCopy()
	p.Status.Phase = phase
	return p
}

func TestSyncIsTerminatedOption(t *testing.T) {
	h := newHarness(t, func(o *Options) {
		o.IsTerminated = func(p *v1.Pod) bool { return p.DeletionTimestamp != nil }
	})
	pod := newPod("web", withPhase(v1.PodSucceeded), withVolume(emptyDirVol("scratch")))
	h.src.Add(pod)
	h.pop.Sync(false)
	if h.snapshot().Pod(pod.UID) == nil {
		t.Error("custom IsTerminated ignored: Succeeded pod dropped")
	}
}

func TestSyncReadyAfterSourceSynced(t *testing.T) {
	h := newHarness(t)
	h.src.SetSynced(false)
	// A claim that is merely not read yet must not produce errors.
	pod := newPod("web", withVolume(emptyDirVol("scratch")), withVolume(claimVol("data", "claim")))
	h.src.Add(pod)
	if h.pop.Ready() {
		t.Fatal("ready before any Sync")
	}
	h.pop.Sync(false)
	if h.pop.Ready() {
		t.Error("ready before the source synced")
	}
	if s := h.snapshot(); s.PodsLen() != 0 || s.VolumesLen() != 0 {
		t.Errorf("DSW filled from a partial read: %d pods", s.PodsLen())
	}
	if evs := h.events.list(); len(evs) != 0 {
		t.Errorf("events from a partial read: %v", evs)
	}
	h.src.SetSynced(true)
	if h.pop.Ready() {
		t.Error("ready before a Sync saw the source synced")
	}
	pvc, pv := boundPair("claim", "pv-1", t.TempDir())
	h.src.Add(pvc, pv)
	h.pop.Sync(false)
	if !h.pop.Ready() {
		t.Error("not ready after a Sync of a synced source")
	}
	if p := h.pod(t, pod); len(p.Volumes) != 2 || len(p.Errors) != 0 {
		t.Errorf("pod = %+v", p)
	}
	h.src.SetSynced(false) // stays ready: the DSW reflected a complete read once
	h.pop.Sync(false)
	if !h.pop.Ready() {
		t.Error("ready flag dropped")
	}
}

// TestSyncStickyRule: a volume that resolved once stays desired, with its
// last good spec, when its claim later disappears; the error is recorded.
func TestSyncStickyRule(t *testing.T) {
	for _, tc := range []struct {
		name       string
		break_     func(h *harness)
		wantReason string
	}{
		{"PVC deleted", func(h *harness) { h.src.DeletePVC(testNS, "claim") }, ReasonPVCNotFound},
		{"PV deleted", func(h *harness) { h.src.DeletePV("pv-1") }, ReasonPVNotFound},
		{"API error", func(h *harness) { h.src.SetPVCError(testNS, "claim", errors.New("timeout")) }, ReasonLookupFailed},
		{"PVC unbound", func(h *harness) {
			pvc, _ := boundPair("claim", "pv-1", "")
			pvc.Status.Phase = v1.ClaimLost
			h.src.Add(pvc)
		}, ReasonPVCNotBound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			dir := t.TempDir()
			pvc, pv := boundPair("claim", "pv-1", dir)
			pod := newPod("web", withVolume(claimVol("data", "claim")))
			h.src.Add(pvc, pv, pod)
			h.pop.Sync(false)
			name := volume.SharedName(local.Name, "pv-1")
			before := h.snapshot().Volume(name)
			if before == nil {
				t.Fatal("volume not desired")
			}

			tc.break_(h)
			h.pop.Sync(false)
			p := h.pod(t, pod)
			if got := reasons(p.Errors); !slices.Equal(got, []string{"data:" + tc.wantReason}) {
				t.Errorf("errors = %v, want data:%s", got, tc.wantReason)
			}
			if len(p.Unresolved) != 0 {
				t.Errorf("unresolved = %v: a volume that resolved before must not be listed", p.Unresolved)
			}
			after := h.snapshot().Volume(name)
			if after == nil || after.Pods.At(pod.UID) == nil {
				t.Fatal("volume dropped from the DSW")
			}
			if after.Pods.At(pod.UID).Spec != before.Pods.At(pod.UID).Spec || after.Spec.PV != pv || after.Spec.PVC != pvc {
				t.Errorf("volume spec changed: %+v", after.Spec)
			}
			if !slices.Equal(p.Volumes, []volume.UniqueName{name}) {
				t.Errorf("pod volumes = %v", p.Volumes)
			}

			// The claim comes back: the error goes away.
			h.src.SetPVCError(testNS, "claim", nil)
			h.src.Add(pvc, pv)
			h.pop.Sync(false)
			if p := h.pod(t, pod); len(p.Errors) != 0 || !h.dsw.HasPodVolume(name, pod.UID) {
				t.Errorf("after repair: errors %v", reasons(p.Errors))
			}
		})
	}
}

// TestSyncStickyAcrossPodUpdate: the sticky rule survives re-resolution for
// other reasons (a new pod object) while the claim is still missing.
func TestSyncStickyAcrossPodUpdate(t *testing.T) {
	h := newHarness(t)
	pvc, pv := boundPair("claim", "pv-1", t.TempDir())
	pod := newPod("web", withVolume(claimVol("data", "claim")))
	h.src.Add(pvc, pv, pod)
	h.pop.Sync(false)
	h.src.DeletePVC(testNS, "claim")
	h.pop.Sync(false)
	h.src.Add(pod.DeepCopy()) // status update: a new object
	h.pop.Sync(true)
	h.pop.Sync(false)
	name := volume.SharedName(local.Name, "pv-1")
	if !h.dsw.HasPodVolume(name, pod.UID) {
		t.Fatal("volume dropped after the pod was re-resolved")
	}
	if got := reasons(h.pod(t, pod).Errors); !slices.Equal(got, []string{"data:" + ReasonPVCNotFound}) {
		t.Errorf("errors = %v", got)
	}

	// Sub-paths follow the pod's mounts, not the last resolution's: a
	// pod that mounted a sub-path and no longer does wants none.
	sub := pod.DeepCopy()
	sub.Spec.Containers[0].VolumeMounts[0].SubPath = "a"
	h.src.Add(sub)
	h.pop.Sync(true)
	if got := h.snapshot().PodSubPaths(name, pod.UID); len(got) != 1 || got[0].Path != "a" {
		t.Fatalf("sub-paths = %+v, want a", got)
	}
	h.src.Add(pod.DeepCopy())
	h.pop.Sync(true)
	if got := h.snapshot().PodSubPaths(name, pod.UID); len(got) != 0 {
		t.Errorf("sub-paths = %+v after the pod's sub-path mount went, want none", got)
	}
}

func TestSyncUnresolved(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	pod := newPod("web",
		withVolume(emptyDirVol("scratch")),
		withVolume(claimVol("z-data", "claim")),
		withVolume(v1.Volume{Name: "a-nfs", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/"}}}),
	)
	h.src.Add(pod)
	h.pop.Sync(false)
	p := h.pod(t, pod)
	if !slices.Equal(p.Unresolved, []string{"a-nfs", "z-data"}) {
		t.Errorf("unresolved = %v, want [a-nfs z-data] (sorted)", p.Unresolved)
	}
	if got := reasons(p.Errors); !slices.Equal(got, []string{"z-data:" + ReasonPVCNotFound, "a-nfs:" + ReasonUnsupported}) {
		t.Errorf("errors = %v", got)
	}
	if len(p.Volumes) != 1 {
		t.Errorf("volumes = %v, want the emptyDir only", p.Volumes)
	}
	for _, e := range p.Errors {
		if e.Pod.UID != pod.UID || !strings.Contains(e.Error(), "pod ns/web volume \""+e.Volume+"\"") {
			t.Errorf("error %q does not name pod and volume", e.Error())
		}
	}

	// The claim appears: only the nfs volume stays unresolved.
	pvc, pv := boundPair("claim", "pv-1", dir)
	h.src.Add(pvc, pv)
	h.pop.Sync(false)
	p = h.pod(t, pod)
	if !slices.Equal(p.Unresolved, []string{"a-nfs"}) || len(p.Volumes) != 2 {
		t.Errorf("after the claim appeared: unresolved %v, volumes %v", p.Unresolved, p.Volumes)
	}
}

func TestSyncInvalidPodUID(t *testing.T) {
	h := newHarness(t)
	pod := newPod("web", withVolume(emptyDirVol("scratch")))
	pod.UID = types.UID("../escape")
	h.src.Add(pod)
	h.pop.Sync(false)
	p := h.pod(t, pod)
	if got := reasons(p.Errors); !slices.Equal(got, []string{":" + ReasonPodUIDUnusable}) {
		t.Errorf("errors = %v", got)
	}
	if len(p.Volumes) != 0 || h.snapshot().VolumesLen() != 0 {
		t.Errorf("volumes desired for a pod whose UID cannot name a directory")
	}
	if h.resolve.Load() != 0 {
		t.Error("volumes resolved")
	}
}

// TestSyncSkipsUnchangedPods: a pod whose object and claims did not change
// is not resolved again and the DSW does not change.
func TestSyncSkipsUnchangedPods(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	pvc, pv := boundPair("claim", "pv-1", dir)
	pod := newPod("web", withVolume(emptyDirVol("scratch")), withVolume(claimVol("data", "claim")))
	broken := newPod("broken", withVolume(claimVol("data", "missing")))
	h.src.Add(pvc, pv, pod, broken)
	h.pop.Sync(false)
	resolutions := h.resolve.Load()
	if resolutions != 2 {
		t.Fatalf("%d resolutions, want 2", resolutions)
	}
	gen := h.snapshot().Generation
	drain(h.dsw)

	for range 3 {
		h.pop.Sync(false)
	}
	if n := h.resolve.Load(); n != resolutions {
		t.Errorf("unchanged pods resolved again (%d resolutions)", n-resolutions)
	}
	if g := h.snapshot().Generation; g != gen {
		t.Errorf("DSW generation %d -> %d without a change", gen, g)
	}
	if drain(h.dsw) {
		t.Error("DSW signalled a change")
	}

	// An unrelated claim changing does not matter either.
	other, _ := boundPair("unrelated", "pv-9", dir)
	h.src.Add(other)
	h.pop.Sync(false)
	if n := h.resolve.Load(); n != resolutions {
		t.Errorf("unrelated claim caused %d resolutions", n-resolutions)
	}

	// The claim object changing does.
	pvc2 := pvc.DeepCopy()
	pvc2.ResourceVersion = "2"
	h.src.Add(pvc2)
	h.pop.Sync(false)
	// The whole pod is resolved again: its emptyDir and its claim.
	if n := h.resolve.Load(); n != resolutions+2 {
		t.Errorf("%d resolutions after the claim changed, want 2", n-resolutions)
	}
	resolutions = h.resolve.Load()

	// A missing claim appearing does too.
	missing, _ := boundPair("missing", "pv-1", dir)
	missing.Spec.VolumeName = ""
	missing.Status.Phase = v1.ClaimPending
	h.src.Add(missing)
	h.pop.Sync(false)
	if got := reasons(h.pod(t, broken).Errors); !slices.Equal(got, []string{"data:" + ReasonPVCNotBound}) {
		t.Errorf("broken pod errors = %v after its claim appeared", got)
	}
	if n := h.resolve.Load(); n != resolutions {
		t.Errorf("%d plugin resolutions for a pending claim, want 0", n-resolutions)
	}
}

// TestSyncReresolvedButUnchanged: a pod that is resolved again (a forced
// resync, a new pod object after a status update) with the same outcome
// leaves the DSW alone: the reconciler is not woken for nothing.
func TestSyncReresolvedButUnchanged(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	pvc, pv := boundPair("claim", "pv-1", dir)
	pod := newPod("web", withVolume(emptyDirVol("scratch")), withVolume(claimVol("data", "claim")),
		withVolume(hostPathVol("host", dir)))
	pod.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("128Mi")}
	fsGroup := int64(2000)
	pod.Spec.SecurityContext = &v1.PodSecurityContext{FSGroup: &fsGroup}
	broken := newPod("broken", withVolume(claimVol("data", "missing")))
	h.src.Add(pvc, pv, pod, broken)
	h.pop.Sync(false)
	gen := h.snapshot().Generation
	resolutions := h.resolve.Load()
	drain(h.dsw)

	h.pop.Sync(true)
	if h.resolve.Load() == resolutions {
		t.Fatal("forced Sync resolved nothing")
	}
	if g := h.snapshot().Generation; g != gen {
		t.Errorf("forced Sync changed the DSW generation %d -> %d", gen, g)
	}

	updated := pod.DeepCopy()
	updated.Status.Conditions = append(updated.Status.Conditions, v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionTrue})
	h.src.Add(updated)
	h.pop.Sync(false)
	if g := h.snapshot().Generation; g != gen {
		t.Errorf("pod status update changed the DSW generation %d -> %d", gen, g)
	}
	if drain(h.dsw) {
		t.Error("DSW signalled a change")
	}

	// A real change of the pod's spec is recorded.
	changed := updated.DeepCopy()
	changed.Spec.Volumes[0].EmptyDir.Medium = v1.StorageMediumMemory
	h.src.Add(changed)
	h.pop.Sync(false)
	if g := h.snapshot().Generation; g == gen {
		t.Error("a changed volume source did not change the DSW")
	}
	dv := h.snapshot().Volume(volume.PodScopedName(emptydir.Name, pod.UID, "scratch"))
	if dv.Pods.At(pod.UID).Spec.Volume.EmptyDir.Medium != v1.StorageMediumMemory {
		t.Error("DSW keeps the old emptyDir medium")
	}
}

// TestSyncForcedResyncSeesHostChanges: host state plugins look at is only
// seen by forced passes, once the background check has seen it.
func TestSyncForcedResyncSeesHostChanges(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	path := dir + "/vol"
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	pvc, pv := boundPair("claim", "pv-1", path)
	pod := newPod("web", withVolume(claimVol("data", "claim")))
	h.src.Add(pvc, pv, pod)
	h.pop.Sync(false)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	h.pop.Sync(false)
	if p := h.pod(t, pod); len(p.Errors) != 0 {
		t.Errorf("unforced Sync re-resolved an unchanged pod: %v", reasons(p.Errors))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.pop.Sync(true)
		if len(h.pod(t, pod).Errors) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	p := h.pod(t, pod)
	if got := reasons(p.Errors); !slices.Equal(got, []string{"data:" + ReasonInvalid}) {
		t.Errorf("errors after forced Sync = %v", got)
	}
	// Sticky: still desired.
	if !h.dsw.HasPodVolume(volume.SharedName(local.Name, "pv-1"), pod.UID) {
		t.Error("volume dropped")
	}
}

func drain(d *cache.DesiredStateOfWorld) bool {
	select {
	case <-d.Changed():
		return true
	default:
		return false
	}
}

// TestSyncReportsErrorsOnce: an event and an observation per new error, not
// per pass.
func TestSyncReportsErrorsOnce(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	pod := newPod("web", withVolume(claimVol("data", "claim")))
	h.src.Add(pod)
	for range 3 {
		h.pop.Sync(false)
	}
	h.pop.Sync(true)
	evs := h.events.list()
	if len(evs) != 1 {
		t.Fatalf("events = %v, want 1", evs)
	}
	for _, want := range []string{"Pod ns/web", "Warning", "FailedMount", `pod ns/web volume "data": PVC ns/claim not found`} {
		if !strings.Contains(evs[0], want) {
			t.Errorf("event %q does not contain %q", evs[0], want)
		}
	}
	if errs := h.obs.errors(); len(errs) != 1 || errs[0].Reason != ReasonPVCNotFound {
		t.Errorf("observed errors = %v", reasons(errs))
	}

	// Another error for the same volume is new.
	pvc, pv := boundPair("claim", "pv-1", dir)
	pvc.Status.Phase = v1.ClaimPending
	h.src.Add(pvc, pv)
	h.pop.Sync(false)
	h.pop.Sync(false)
	if evs := h.events.list(); len(evs) != 2 || !strings.Contains(evs[1], "is not bound") {
		t.Errorf("events = %v, want a second one for the pending claim", evs)
	}

	// Fixed, then broken again: reported again.
	pvc2 := pvc.DeepCopy()
	pvc2.Status.Phase = v1.ClaimBound
	h.src.Add(pvc2)
	h.pop.Sync(false)
	h.src.DeletePVC(testNS, "claim")
	h.pop.Sync(false)
	h.pop.Sync(false)
	evs = h.events.list()
	if len(evs) != 3 || !strings.Contains(evs[2], "not found") {
		t.Errorf("events = %v, want a third for the deleted claim", evs)
	}
	if errs := h.obs.errors(); len(errs) != 3 {
		t.Errorf("observed errors = %v, want 3", reasons(errs))
	}

	// The pod going away and coming back is a new pod.
	h.src.SetPods()
	h.pop.Sync(false)
	h.src.Add(pod)
	h.pop.Sync(false)
	if evs := h.events.list(); len(evs) != 4 {
		t.Errorf("events = %v, want a fourth for the returning pod", evs)
	}
}

// TestSyncTwoPodsShareLocalPV: two pods of one claim get one volume; one
// leaving keeps it for the other.
func TestSyncTwoPodsShareLocalPV(t *testing.T) {
	h := newHarness(t)
	pvc, pv := boundPair("claim", "pv-1", t.TempDir())
	a := newPod("a", withVolume(claimVol("data", "claim")), withVolume(emptyDirVol("tmp")))
	b := newPod("b", withVolume(claimVol("other", "claim")), withVolume(emptyDirVol("tmp")))
	h.src.Add(pvc, pv, a, b)
	h.pop.Sync(false)
	s := h.snapshot()
	name := volume.SharedName(local.Name, "pv-1")
	v := s.Volume(name)
	if v == nil || v.Pods.Len() != 2 {
		t.Fatalf("shared volume = %+v", v)
	}
	if s.VolumesLen() != 3 {
		t.Errorf("%d volumes, want 3 (one shared, two emptyDirs)", s.VolumesLen())
	}
	h.src.SetPods(b)
	h.pop.Sync(false)
	if v := h.snapshot().Volume(name); v == nil || v.Pods.Len() != 1 || v.Pods.At(b.UID) == nil {
		t.Errorf("after a left: %+v", v)
	}
}

// TestSyncTwoNamesOneClaim: a pod naming one claim twice wants one volume
// under both names.
func TestSyncTwoNamesOneClaim(t *testing.T) {
	h := newHarness(t)
	pvc, pv := boundPair("claim", "pv-1", t.TempDir())
	pod := newPod("web", withVolume(claimVol("one", "claim")), withVolume(claimVol("two", "claim")))
	h.src.Add(pvc, pv, pod)
	h.pop.Sync(false)
	v := h.snapshot().Volume(volume.SharedName(local.Name, "pv-1"))
	if v == nil || !slices.Equal(v.Pods.At(pod.UID).OuterNames, []string{"one", "two"}) {
		t.Errorf("volume = %+v", v)
	}
	if p := h.pod(t, pod); len(p.Volumes) != 1 {
		t.Errorf("pod volumes = %v", p.Volumes)
	}
}

// TestSyncNodeAffinityUsesCurrentNode: node labels are read on each pass.
func TestSyncNodeAffinityUsesCurrentNode(t *testing.T) {
	h := newHarness(t)
	pvc, pv := boundPair("claim", "pv-1", t.TempDir())
	pv.Spec.NodeAffinity = affinity("zone", v1.NodeSelectorOpIn, "b")
	pod := newPod("web", withVolume(claimVol("data", "claim")))
	h.src.Add(pvc, pv, pod)
	h.pop.Sync(false)
	if got := reasons(h.pod(t, pod).Errors); !slices.Equal(got, []string{"data:" + ReasonNodeAffinity}) {
		t.Fatalf("errors = %v", got)
	}
	n := testNodeInfo
	n.Labels = map[string]string{"zone": "b"}
	h.node.Store(&n)
	h.pop.Sync(true)
	if p := h.pod(t, pod); len(p.Errors) != 0 || len(p.Volumes) != 1 {
		t.Errorf("after relabelling: errors %v, volumes %v", reasons(p.Errors), p.Volumes)
	}
}

// podRecorder is a PodObserver that records its calls.
type podRecorder struct {
	updated []string // "<pod>:<used volumes>"
	removed []types.UID
}

func (r *podRecorder) PodUpdated(pod *v1.Pod, used []*v1.Volume) {
	var names []string
	for _, v := range used {
		names = append(names, v.Name)
	}
	r.updated = append(r.updated, pod.Name+":"+strings.Join(names, ","))
}

func (r *podRecorder) PodRemoved(uid types.UID) { r.removed = append(r.removed, uid) }

func TestSyncTellsPodObserver(t *testing.T) {
	rec := &podRecorder{}
	h := newHarness(t, func(o *Options) { o.Pods = rec })
	pod := newPod("web", withVolume(emptyDirVol("used")), withUnusedVolume(emptyDirVol("unused")))
	h.src.Add(pod)
	h.pop.Sync(false)
	h.pop.Sync(true) // the same pod object: not told again
	if want := []string{"web:used"}; !slices.Equal(rec.updated, want) {
		t.Errorf("updated %v, want %v (used volumes only, once per pod object)", rec.updated, want)
	}
	changed := pod.DeepCopy()
	changed.Labels = map[string]string{"a": "b"}
	h.src.Add(changed)
	h.pop.Sync(false)
	if len(rec.updated) != 2 {
		t.Errorf("a changed pod object must be told again: %v", rec.updated)
	}
	h.src.Add(withPhaseCopy(changed, v1.PodSucceeded))
	h.pop.Sync(false)
	if !slices.Equal(rec.removed, []types.UID{pod.UID}) {
		t.Errorf("removed %v, want the terminated pod", rec.removed)
	}
}

// A claim or volume not read yet (cluster mode starts its watch with the
// first pod that uses it) is a wait: the volume is unresolved (protected,
// never torn down), the reason says so, and nothing is reported as an
// error; a volume that was resolved keeps its last resolution.
func TestSyncNotReadYet(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	pod := newPod("web", withVolume(claimVol("data", "claim")))
	pvc, pv := boundPair("claim", "pv-1", dir)
	h.src.Add(pod, pvc, pv)
	h.src.SetPVCError(testNS, "claim", source.NotRead(errors.New("persistentvolumeclaims ns/claim: not read from the API server yet")))
	h.pop.Sync(false)
	p := h.pod(t, pod)
	if !slices.Equal(p.Unresolved, []string{"data"}) || len(p.Volumes) != 0 {
		t.Errorf("claim not read: unresolved %v, volumes %v; want the volume unresolved", p.Unresolved, p.Volumes)
	}
	if got := reasons(p.Errors); !slices.Equal(got, []string{"data:" + ReasonNotRead}) {
		t.Errorf("errors = %v", got)
	} else if st := explain.ErrorStatus(p.Errors[0]); st != explain.Waiting {
		t.Errorf("a claim not read yet is explained as %s, want %s", st, explain.Waiting)
	}
	// The claim is read; its volume is not yet.
	h.src.SetPVCError(testNS, "claim", nil)
	h.src.SetPVError("pv-1", source.NotRead(errors.New("persistentvolumes pv-1: not read from the API server yet")))
	h.pop.Sync(false)
	p = h.pod(t, pod)
	if got := reasons(p.Errors); !slices.Equal(got, []string{"data:" + ReasonNotRead}) || len(p.Unresolved) != 1 {
		t.Errorf("volume not read: errors %v, unresolved %v", got, p.Unresolved)
	}
	h.src.SetPVError("pv-1", nil)
	h.pop.Sync(false)
	p = h.pod(t, pod)
	if len(p.Errors) != 0 || len(p.Unresolved) != 0 || len(p.Volumes) != 1 {
		t.Fatalf("read: errors %v, unresolved %v, volumes %v", reasons(p.Errors), p.Unresolved, p.Volumes)
	}
	// Not read again (its watch restarted): the resolution sticks.
	h.src.SetPVCError(testNS, "claim", source.NotRead(errors.New("not read")))
	h.pop.Sync(false)
	if p = h.pod(t, pod); len(p.Volumes) != 1 || len(p.Unresolved) != 0 {
		t.Errorf("resolved, then not read: volumes %v, unresolved %v; want the last resolution kept", p.Volumes, p.Unresolved)
	}
	if evs := h.events.list(); len(evs) != 0 {
		t.Errorf("events for a wait: %v", evs)
	}
	if errs := h.obs.errors(); len(errs) != 0 {
		t.Errorf("observed errors for a wait: %v", reasons(errs))
	}
}

// The sizes of the pod's hugepages requests reach the plugins, in the
// kubelet's order, each once.
func TestHugePageSizes(t *testing.T) {
	req := func(names ...string) v1.ResourceRequirements {
		l := v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi")}
		for _, n := range names {
			l[v1.ResourceName(n)] = resource.MustParse("2Gi")
		}
		return v1.ResourceRequirements{Requests: l}
	}
	pod := &v1.Pod{Spec: v1.PodSpec{
		Resources:      &v1.ResourceRequirements{Requests: v1.ResourceList{"hugepages-1Gi": resource.MustParse("2Gi")}},
		Containers:     []v1.Container{{Resources: req("hugepages-2Mi", "hugepages-1Gi")}, {Resources: req()}},
		InitContainers: []v1.Container{{Resources: req("hugepages-64Ki")}},
	}}
	if got := podInfo(pod).HugePageSizes; got != "1Gi,2Mi,64Ki" {
		t.Errorf("HugePageSizes = %q", got)
	}
	if got := podInfo(&v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Resources: req()}}}}).HugePageSizes; got != "" {
		t.Errorf("no hugepages: %q", got)
	}
}
