package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	fcache "k8s.io/client-go/tools/cache/testing"

	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/source/objectwatch"
)

// fakeAPI serves every resource from a fake source of its own and counts
// the lists of each key, so a test sees what was read and how.
type fakeAPI struct {
	mu      sync.Mutex
	sources map[string]*fcache.FakeControllerSource
	lists   map[string]map[objectwatch.Key]int
	// gate, when set for a resource, holds its lists until closed.
	gate map[string]chan struct{}
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{sources: map[string]*fcache.FakeControllerSource{}, lists: map[string]map[objectwatch.Key]int{}, gate: map[string]chan struct{}{}}
}

func (f *fakeAPI) src(resource string) *fcache.FakeControllerSource {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sources[resource]
	if !ok {
		s = fcache.NewFakeControllerSource()
		f.sources[resource] = s
	}
	return s
}

func (f *fakeAPI) listed(resource string, k objectwatch.Key) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lists[resource][k]
}

func (f *fakeAPI) listWatch(resource string) func(objectwatch.Key) cache.ListerWatcher {
	return func(k objectwatch.Key) cache.ListerWatcher {
		return keyLW{api: f, resource: resource, key: k}
	}
}

// keyLW lists and watches what a key selects by name and namespace (the
// fakes ignore other field selectors: tests make only this node's pods).
type keyLW struct {
	api      *fakeAPI
	resource string
	key      objectwatch.Key
}

func (l keyLW) match(obj runtime.Object) bool {
	m, err := meta.Accessor(obj)
	if err != nil {
		return false
	}
	return (l.key.Name == "" || m.GetName() == l.key.Name) && (l.key.Namespace == "" || m.GetNamespace() == l.key.Namespace)
}

func (l keyLW) List(o metav1.ListOptions) (runtime.Object, error) {
	l.api.mu.Lock()
	gate := l.api.gate[l.resource]
	l.api.mu.Unlock()
	if gate != nil {
		<-gate
	}
	l.api.mu.Lock()
	if l.api.lists[l.resource] == nil {
		l.api.lists[l.resource] = map[objectwatch.Key]int{}
	}
	l.api.lists[l.resource][l.key]++
	l.api.mu.Unlock()
	list, err := l.api.src(l.resource).List(o)
	if err != nil {
		return nil, err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	var keep []runtime.Object
	for _, it := range items {
		if l.match(it) {
			keep = append(keep, it)
		}
	}
	if err := meta.SetList(list, keep); err != nil {
		return nil, err
	}
	return list, nil
}

func (l keyLW) Watch(o metav1.ListOptions) (watch.Interface, error) {
	w, err := l.api.src(l.resource).Watch(o)
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) { return e, l.match(e.Object) }), nil
}

// IsWatchListSemanticsUnSupported: the fakes list, then watch.
func (keyLW) IsWatchListSemanticsUnSupported() bool { return true }

const node = "node-1"

func startSource(t *testing.T, api *fakeAPI, attach func(*v1.PersistentVolume) string) (*Source, *sync.Map) {
	t.Helper()
	var attachChanges sync.Map
	s := New(Options{NodeName: node, ListWatch: api.listWatch, AttachmentName: attach,
		OnAttachmentChange: func(name string) { attachChanges.Store(name, true) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	waitFor(t, "the informers to sync", s.HasSynced)
	return s, &attachChanges
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func pod(name string, uid types.UID, claims ...string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: uid}, Spec: v1.PodSpec{NodeName: node}}
	for _, c := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "v-" + c, VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	return p
}

func claim(name, volume string) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec: v1.PersistentVolumeClaimSpec{VolumeName: volume}}
}

func csiVolume(name string) *v1.PersistentVolume {
	return &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d", VolumeHandle: "h-" + name}}}}
}

func watched(s *Source) map[string][]string {
	out := map[string][]string{}
	for _, w := range s.Watches() {
		out[w.Resource] = append(out[w.Resource], w.Key.String())
	}
	return out
}

func keysAre(t *testing.T, s *Source, resource string, want ...string) {
	t.Helper()
	waitFor(t, resource+" watches "+fmtKeys(want), func() bool {
		got := watched(s)[resource]
		if len(got) != len(want) {
			return false
		}
		for i := range got {
			if got[i] != want[i] {
				return false
			}
		}
		return true
	})
}

func fmtKeys(k []string) string { return "[" + joinKeys(k) + "]" }

func joinKeys(k []string) string {
	out := ""
	for i, s := range k {
		if i > 0 {
			out += " "
		}
		out += s
	}
	return out
}

// A pod's claim is watched from the moment the pod is seen, its volume
// from the moment the claim names it, and a CSI volume's attachment from
// the moment the volume is read; nothing else is ever listed.
func TestWatchesFollowPodsClaimsAndVolumes(t *testing.T) {
	api := newFakeAPI()
	api.src("persistentvolumeclaims").Add(claim("data", "pv-1"))
	api.src("persistentvolumeclaims").Add(claim("other", "pv-other"))
	api.src("persistentvolumes").Add(csiVolume("pv-1"))
	api.src("persistentvolumes").Add(csiVolume("pv-other"))
	s, attachChanges := startSource(t, api, func(pv *v1.PersistentVolume) string { return "va-" + pv.Name })

	if _, err := s.PVC("ns", "data"); !errors.Is(err, source.ErrNotRead) {
		t.Fatalf("PVC of no pod: %v, want not read", err)
	}
	api.src("pods").Add(pod("app", "uid-app", "data"))
	waitFor(t, "the claim to be read", func() bool { _, err := s.PVC("ns", "data"); return err == nil })
	waitFor(t, "the volume to be read", func() bool { _, err := s.PV("pv-1"); return err == nil })
	keysAre(t, s, "persistentvolumeclaims", "ns/data")
	keysAre(t, s, "persistentvolumes", "pv-1")
	keysAre(t, s, "volumeattachments.storage.k8s.io", "va-pv-1")
	waitFor(t, "the attachment's first read to be announced", func() bool { _, ok := attachChanges.Load("va-pv-1"); return ok })
	if _, err := s.PV("pv-other"); !errors.Is(err, source.ErrNotRead) {
		t.Errorf("PV no pod uses: %v, want not read", err)
	}
	if n := api.listed("persistentvolumeclaims", objectwatch.Key{}); n != 0 {
		t.Errorf("claims listed without a key %d times", n)
	}
	if n := api.listed("persistentvolumes", objectwatch.Key{Name: "pv-other"}); n != 0 {
		t.Errorf("a volume no pod uses was listed %d times", n)
	}

	// The claim moves to another volume: the registration moves with it.
	api.src("persistentvolumes").Add(csiVolume("pv-2"))
	api.src("persistentvolumeclaims").Modify(claim("data", "pv-2"))
	keysAre(t, s, "persistentvolumes", "pv-2")
	keysAre(t, s, "volumeattachments.storage.k8s.io", "va-pv-2")
	waitFor(t, "the new volume", func() bool { _, err := s.PV("pv-2"); return err == nil })

	// A second pod shares the claim; the first goes: still watched.
	api.src("pods").Add(pod("app2", "uid-app2", "data"))
	api.src("pods").Delete(pod("app", "uid-app", "data"))
	waitFor(t, "app to be gone", func() bool { _, ok := s.Pod("ns", "app"); return !ok })
	keysAre(t, s, "persistentvolumeclaims", "ns/data")
	// The last pod terminates: everything it led to is released.
	done := pod("app2", "uid-app2", "data")
	done.Status.Phase = v1.PodSucceeded
	api.src("pods").Modify(done)
	keysAre(t, s, "persistentvolumeclaims")
	keysAre(t, s, "persistentvolumes")
	keysAre(t, s, "volumeattachments.storage.k8s.io")
	if _, err := s.PVC("ns", "data"); !errors.Is(err, source.ErrNotRead) {
		t.Errorf("PVC of no pod: %v, want not read", err)
	}
}

// A claim that does not exist is NotFound once its watch has listed, and
// not read (never NotFound) before: the populator must not act on a claim
// that merely was not read yet.
func TestMissingClaimIsNotFoundOnlyOnceListed(t *testing.T) {
	api := newFakeAPI()
	gate := make(chan struct{})
	api.gate["persistentvolumeclaims"] = gate
	s, _ := startSource(t, api, nil)
	changed := s.Changed()
	api.src("pods").Add(pod("app", "uid-app", "missing"))
	waitFor(t, "the pod", func() bool { _, ok := s.Pod("ns", "app"); return ok })
	keysAre(t, s, "persistentvolumeclaims", "ns/missing")
	if _, err := s.PVC("ns", "missing"); !errors.Is(err, source.ErrNotRead) || apierrors.IsNotFound(err) {
		t.Fatalf("before the list: %v, want not read", err)
	}
	for len(changed) > 0 {
		<-changed
	}
	close(gate)
	waitFor(t, "the list", func() bool { _, err := s.PVC("ns", "missing"); return apierrors.IsNotFound(err) })
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Error("the claim's first list did not wake the populator")
	}
	// Created later: seen, and the populator is woken.
	api.src("persistentvolumeclaims").Add(claim("missing", ""))
	waitFor(t, "the new claim", func() bool { _, err := s.PVC("ns", "missing"); return err == nil })
	keysAre(t, s, "persistentvolumes")
}

// Generic ephemeral volumes' claims (<pod>-<volume>) are watched too.
func TestClaimKeys(t *testing.T) {
	p := pod("web", "u", "b", "a", "b")
	p.Spec.Volumes = append(p.Spec.Volumes,
		v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}},
		v1.Volume{Name: "cache", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}})
	got := ClaimKeys(p)
	want := []objectwatch.Key{{Namespace: "ns", Name: "a"}, {Namespace: "ns", Name: "b"}, {Namespace: "ns", Name: "web-scratch"}}
	if len(got) != len(want) {
		t.Fatalf("ClaimKeys = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("ClaimKeys = %v, want %v", got, want)
		}
	}
}

// Without AttachmentName no attachment is watched; StorageClasses and
// CSIDrivers come from their informers.
func TestNoAttachmentsAndClusterWideInformers(t *testing.T) {
	api := newFakeAPI()
	api.src("storageclasses").Add(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}})
	api.src("persistentvolumeclaims").Add(claim("data", "pv-1"))
	api.src("persistentvolumes").Add(csiVolume("pv-1"))
	s, _ := startSource(t, api, nil)
	if _, err := s.StorageClass("fast"); err != nil {
		t.Error(err)
	}
	api.src("pods").Add(pod("app", "uid-app", "data"))
	waitFor(t, "the volume", func() bool { _, err := s.PV("pv-1"); return err == nil })
	if _, ok := s.VolumeAttachment("anything"); ok {
		t.Error("an attachment without attachment watches")
	}
	if w := watched(s)["volumeattachments.storage.k8s.io"]; len(w) != 0 {
		t.Errorf("attachments watched: %v", w)
	}
}

// Claims that stay unread are logged, the first few by name and the rest
// counted in one line, however many there are.
func TestUnreadClaimsLoggedBounded(t *testing.T) {
	api := newFakeAPI()
	gate := make(chan struct{})
	api.gate["persistentvolumeclaims"] = gate
	core, logs := observer.New(zap.WarnLevel)
	s := New(Options{NodeName: node, ListWatch: api.listWatch, WarnAfter: 20 * time.Millisecond, Log: zap.New(core)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		close(gate)
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	var claims []string
	for i := range 8 {
		claims = append(claims, fmt.Sprintf("c%d", i))
	}
	api.src("pods").Add(pod("app", "uid-app", claims...))
	waitFor(t, "the summary line", func() bool {
		return logs.FilterMessageSnippet("more objects").Len() > 0
	})
	named := 0
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "more objects") {
			if got := e.ContextMap(); got["more"] != int64(3) || got["unread"] != int64(8) {
				t.Errorf("summary %v: want 3 more of 8 unread", got)
			}
			break
		}
		if strings.Contains(e.Message, "to list an object") {
			named++
		}
	}
	if named != 5 {
		t.Errorf("%d claims named before the summary, want 5", named)
	}
}

// Pod changes name the pods that changed, and the informer's store has
// the change by the time its key is taken; a claim's change may concern
// any pod.
func TestPodChanges(t *testing.T) {
	api := newFakeAPI()
	s, _ := startSource(t, api, nil)
	if all, _ := s.TakePodChanges(); !all {
		t.Fatal("the first take must say all")
	}
	// waitKey takes changes until the key is among them, and checks the
	// store then: a key taken before the store has the change would be
	// lost to the populator.
	waitKey := func(key source.PodKey, present bool) {
		t.Helper()
		waitFor(t, fmt.Sprintf("a change of %v", key), func() bool {
			all, keys := s.TakePodChanges()
			if all {
				t.Fatalf("all, waiting for %v", key)
			}
			if _, ok := keys[key]; !ok {
				return false
			}
			if _, ok := s.Pod(key.Namespace, key.Name); ok != present {
				t.Fatalf("%v taken, but the store has it: %v, want %v", key, ok, present)
			}
			return true
		})
	}
	a := pod("a", "uid-a")
	api.src("pods").Add(a)
	waitKey(source.PodKey{Namespace: "ns", Name: "a"}, true)
	api.src("pods").Add(pod("b", "uid-b"))
	waitKey(source.PodKey{Namespace: "ns", Name: "b"}, true)
	changed := a.DeepCopy()
	changed.Labels = map[string]string{"v": "2"}
	api.src("pods").Modify(changed)
	waitKey(source.PodKey{Namespace: "ns", Name: "a"}, true)
	api.src("pods").Delete(changed)
	waitKey(source.PodKey{Namespace: "ns", Name: "a"}, false)

	api.src("pods").Add(pod("c", "uid-c", "data")) // its claim's first list says all
	waitFor(t, "all", func() bool { all, _ := s.TakePodChanges(); return all })
}
