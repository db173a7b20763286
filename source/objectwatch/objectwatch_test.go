package objectwatch

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// fakeAPI serves ConfigMaps to per-key list+watches and records them.
type fakeAPI struct {
	mu       sync.Mutex
	objects  map[string]*v1.ConfigMap // by namespace/name
	rv       int
	lists    map[Key]int
	watchers map[Key][]*watch.RaceFreeFakeWatcher
	gate     chan struct{} // when set, List waits for it
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{objects: map[string]*v1.ConfigMap{}, lists: map[Key]int{}, watchers: map[Key][]*watch.RaceFreeFakeWatcher{}}
}

// listOnly makes informers list then watch, as they do against API servers
// without streaming lists: the fake has no initial-events bookmark.
type listOnly struct{ *cache.ListWatch }

func (listOnly) IsWatchListSemanticsUnSupported() bool { return true }

func (f *fakeAPI) listWatch(k Key) cache.ListerWatcher {
	return listOnly{&cache.ListWatch{
		ListWithContextFunc: func(_ context.Context, _ metav1.ListOptions) (runtime.Object, error) {
			if f.gate != nil {
				<-f.gate
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			f.lists[k]++
			list := &v1.ConfigMapList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(f.rv)}}
			if o, ok := f.objects[k.Namespace+"/"+k.Name]; ok {
				list.Items = append(list.Items, *o.DeepCopy())
			}
			return list, nil
		},
		WatchFuncWithContext: func(_ context.Context, _ metav1.ListOptions) (watch.Interface, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			w := watch.NewRaceFreeFake()
			f.watchers[k] = append(f.watchers[k], w)
			return w, nil
		},
	}}
}

func (f *fakeAPI) put(ns, name, value string, immutable bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	key := ns + "/" + name
	_, existed := f.objects[key]
	o := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: strconv.Itoa(f.rv)}, Data: map[string]string{"k": value}}
	if immutable {
		o.Immutable = ptr.To(true)
	}
	f.objects[key] = o
	ev := watch.Modified
	if !existed {
		ev = watch.Added
	}
	for _, w := range f.watchers[Key{Namespace: ns, Name: name}] {
		if !w.IsStopped() {
			w.Action(ev, o.DeepCopy())
		}
	}
}

// running counts the key's watches that have not been stopped.
func (f *fakeAPI) running(k Key) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.watchers[k] {
		if !w.IsStopped() {
			n++
		}
	}
	return n
}

type changes struct {
	mu   sync.Mutex
	keys []Key
	ch   chan Key
}

func (c *changes) record(k Key) {
	c.mu.Lock()
	c.keys = append(c.keys, k)
	c.mu.Unlock()
	c.ch <- k
}

func newManager(t *testing.T, api *fakeAPI) (*Manager[*v1.ConfigMap], *changes) {
	ch := &changes{ch: make(chan Key, 100)}
	m := New(Kind[*v1.ConfigMap]{
		Resource:  v1.Resource("configmaps"),
		ListWatch: api.listWatch,
		Immutable: func(cm *v1.ConfigMap) bool { return cm.Immutable != nil && *cm.Immutable },
	}, Options{OnChange: ch.record, SyncTimeout: 5 * time.Second})
	t.Cleanup(m.Stop)
	return m, ch
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

func expectChange(t *testing.T, c *changes, k Key) {
	t.Helper()
	select {
	case got := <-c.ch:
		if got != k {
			t.Fatalf("change of %v, want %v", got, k)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no change notified for %v", k)
	}
}

func value(t *testing.T, m *Manager[*v1.ConfigMap], k Key) string {
	t.Helper()
	cm, err := m.Get(context.Background(), k)
	if err != nil {
		t.Fatalf("Get %v: %v", k, err)
	}
	return cm.Data["k"]
}

func TestSharedWatchFollowsOwners(t *testing.T) {
	api := newFakeAPI()
	api.put("ns", "cm", "v1", false)
	m, ch := newManager(t, api)
	k := Key{Namespace: "ns", Name: "cm"}
	m.SetOwner("pod-a", []Key{k})
	m.SetOwner("pod-b", []Key{k})
	if got := value(t, m, k); got != "v1" {
		t.Fatalf("value %q", got)
	}
	waitFor(t, "one watch", func() bool { return api.running(k) == 1 })
	if api.lists[k] != 1 {
		t.Errorf("%d lists for two owners of one object, want 1", api.lists[k])
	}
	if s := m.Stats(); s.Keys != 1 || s.Watching != 1 || s.Owners != 2 {
		t.Errorf("stats %+v", s)
	}

	api.put("ns", "cm", "v2", false)
	expectChange(t, ch, k)
	if got := value(t, m, k); got != "v2" {
		t.Fatalf("after the change: %q", got)
	}

	m.ForgetOwner("pod-a")
	if api.running(k) != 1 {
		t.Fatal("the watch stopped while pod-b still uses the object")
	}
	m.ForgetOwner("pod-b")
	waitFor(t, "the watch to stop", func() bool { return api.running(k) == 0 })
	if s := m.Stats(); s != (Stats{}) {
		t.Errorf("stats after the last owner left: %+v", s)
	}
	if _, err := m.Get(context.Background(), k); err == nil {
		t.Error("Get of an unregistered key must fail")
	}
	select {
	case extra := <-ch.ch:
		t.Errorf("unexpected change notification %v (the initial list must not notify)", extra)
	default:
	}
}

func TestObjectCreatedLater(t *testing.T) {
	api := newFakeAPI()
	m, ch := newManager(t, api)
	k := Key{Namespace: "ns", Name: "late"}
	m.SetOwner("pod", []Key{k})
	if _, err := m.Get(context.Background(), k); !apierrors.IsNotFound(err) {
		t.Fatalf("err = %v, want NotFound", err)
	}
	waitFor(t, "the watch", func() bool { return api.running(k) == 1 })
	api.put("ns", "late", "here", false)
	expectChange(t, ch, k)
	if got := value(t, m, k); got != "here" {
		t.Fatalf("value %q", got)
	}
}

func TestImmutableStopsWatch(t *testing.T) {
	api := newFakeAPI()
	api.put("ns", "frozen", "v1", true)
	m, _ := newManager(t, api)
	k := Key{Namespace: "ns", Name: "frozen"}
	m.SetOwner("pod", []Key{k})
	if got := value(t, m, k); got != "v1" {
		t.Fatalf("value %q", got)
	}
	waitFor(t, "the watch of an immutable object to stop", func() bool { return m.Stats().Watching == 0 })
	waitFor(t, "no running watch", func() bool { return api.running(k) == 0 })
	if got := value(t, m, k); got != "v1" {
		t.Fatalf("value after the watch stopped: %q", got)
	}
	if s := m.Stats(); s.Keys != 1 || s.Owners != 1 {
		t.Errorf("stats %+v", s)
	}
	if st := m.Status(); len(st) != 1 || !st[0].Immutable || st[0].Objects != 1 {
		t.Errorf("status %+v", st)
	}
}

func TestSetOwnerReplacesKeys(t *testing.T) {
	api := newFakeAPI()
	m, _ := newManager(t, api)
	a, b := Key{Namespace: "ns", Name: "a"}, Key{Namespace: "ns", Name: "b"}
	m.SetOwner("pod", []Key{a})
	waitFor(t, "watch of a", func() bool { return api.running(a) == 1 })
	m.SetOwner("pod", []Key{b})
	waitFor(t, "watch of a to stop and b to start", func() bool { return api.running(a) == 0 && api.running(b) == 1 })
	if s := m.Stats(); s.Keys != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestGetWaitsForFirstList(t *testing.T) {
	api := newFakeAPI()
	api.put("ns", "cm", "v1", false)
	api.gate = make(chan struct{})
	m, _ := newManager(t, api)
	k := Key{Namespace: "ns", Name: "cm"}
	m.SetOwner("pod", []Key{k})
	got := make(chan string, 1)
	go func() {
		cm, err := m.Get(context.Background(), k)
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- cm.Data["k"]
	}()
	select {
	case v := <-got:
		t.Fatalf("Get returned %q before the first list", v)
	case <-time.After(50 * time.Millisecond):
	}
	close(api.gate)
	if v := <-got; v != "v1" {
		t.Fatalf("Get = %q", v)
	}
}

func TestGetTimesOutWithoutList(t *testing.T) {
	api := newFakeAPI()
	api.gate = make(chan struct{})
	defer close(api.gate)
	m, _ := newManager(t, api)
	k := Key{Namespace: "ns", Name: "cm"}
	m.SetOwner("pod", []Key{k})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := m.Get(ctx, k); err == nil {
		t.Fatal("Get succeeded without a list")
	}
}

func TestFieldSelector(t *testing.T) {
	tests := []struct {
		k    Key
		want string
	}{
		{Key{Namespace: "ns", Name: "x"}, "metadata.name=x"},
		{Key{Fields: "spec.signerName=example.com/s"}, "spec.signerName=example.com/s"},
		{Key{Name: "x", Fields: "spec.signerName=s"}, "metadata.name=x,spec.signerName=s"},
	}
	for _, tt := range tests {
		if got := tt.k.fieldSelector(); got != tt.want {
			t.Errorf("%v: %q, want %q", tt.k, got, tt.want)
		}
	}
}
