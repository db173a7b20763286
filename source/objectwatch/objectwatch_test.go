package objectwatch

import (
	"context"
	"errors"
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
	// blocked keys' lists wait for their channel (or their context).
	blocked  map[Key]chan struct{}
	inFlight int // lists in progress
	maxLists int // most lists in progress at once
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
		ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
			f.mu.Lock()
			f.inFlight++
			f.maxLists = max(f.maxLists, f.inFlight)
			block := f.blocked[k]
			f.mu.Unlock()
			defer func() {
				f.mu.Lock()
				f.inFlight--
				f.mu.Unlock()
			}()
			if f.gate != nil {
				<-f.gate
			}
			if block != nil {
				select {
				case <-block:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
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

// listing reports the lists in progress and the most at once so far.
func (f *fakeAPI) listing() (now, most int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inFlight, f.maxLists
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

// Cached never waits: "not read yet" until the first list, then the
// object or NotFound; OnSynced announces the first list, also when it
// found nothing.
func TestCachedAndOnSynced(t *testing.T) {
	api := newFakeAPI()
	api.put("ns", "there", "v1", false)
	api.gate = make(chan struct{})
	synced := make(chan Key, 10)
	m := New(Kind[*v1.ConfigMap]{Resource: v1.Resource("configmaps"), ListWatch: api.listWatch},
		Options{OnSynced: func(k Key) { synced <- k }})
	t.Cleanup(m.Stop)
	there, missing := Key{Namespace: "ns", Name: "there"}, Key{Namespace: "ns", Name: "missing"}
	if _, err := m.CachedGet(there); !errors.Is(err, ErrNotSynced) {
		t.Fatalf("unregistered: %v, want ErrNotSynced", err)
	}
	m.SetOwner("pod", []Key{there, missing})
	for _, k := range []Key{there, missing} {
		if _, err := m.CachedGet(k); !errors.Is(err, ErrNotSynced) || apierrors.IsNotFound(err) {
			t.Fatalf("%v before its list: %v, want ErrNotSynced", k, err)
		}
	}
	close(api.gate)
	got := map[Key]bool{}
	for len(got) < 2 {
		select {
		case k := <-synced:
			if got[k] {
				t.Fatalf("OnSynced twice for %v", k)
			}
			got[k] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("OnSynced for %v only", got)
		}
	}
	if cm, err := m.CachedGet(there); err != nil || cm.Data["k"] != "v1" {
		t.Errorf("CachedGet(there) = %v, %v", cm, err)
	}
	if _, err := m.CachedGet(missing); !apierrors.IsNotFound(err) {
		t.Errorf("CachedGet(missing) = %v, want NotFound", err)
	}
	for _, s := range m.Status() {
		if !s.Synced || s.Since.IsZero() {
			t.Errorf("status %+v: want synced, with its start", s)
		}
	}
	m.ForgetOwner("pod")
	if _, err := m.CachedGet(there); !errors.Is(err, ErrNotSynced) {
		t.Errorf("released: %v, want ErrNotSynced", err)
	}
	select {
	case k := <-synced:
		t.Errorf("OnSynced again for %v", k)
	default:
	}
}

// A Limiter shared by two managers lets only its number of watches list
// at once; the others list as slots free up.
func TestLimiterBoundsListing(t *testing.T) {
	api := newFakeAPI()
	api.gate = make(chan struct{})
	lim := NewLimiter(2)
	kind := Kind[*v1.ConfigMap]{Resource: v1.Resource("configmaps"), ListWatch: api.listWatch}
	a, b := New(kind, Options{Limiter: lim}), New(kind, Options{Limiter: lim})
	t.Cleanup(a.Stop)
	t.Cleanup(b.Stop)
	var keys []Key
	for i := range 6 {
		k := Key{Namespace: "ns", Name: "cm" + strconv.Itoa(i)}
		api.put(k.Namespace, k.Name, "v", false)
		keys = append(keys, k)
	}
	a.SetOwner("pod-a", keys[:3])
	b.SetOwner("pod-b", keys[3:])
	waitFor(t, "two lists in progress", func() bool { now, _ := api.listing(); return now == 2 })
	if s := a.Stats().Listing + b.Stats().Listing; s != 6 {
		t.Errorf("%d watches listing, want all 6 (waiting for a slot counts)", s)
	}
	close(api.gate)
	waitFor(t, "every watch listed", func() bool { return a.Stats().Listing+b.Stats().Listing == 0 })
	if _, most := api.listing(); most != 2 {
		t.Errorf("at most %d lists at once, want 2", most)
	}
	for i, k := range keys {
		m := a
		if i >= 3 {
			m = b
		}
		if _, err := m.CachedGet(k); err != nil {
			t.Errorf("%v: %v", k, err)
		}
	}
}

// A watch that cannot list gives its slot up after the Limiter's hold; a
// watch stopped while waiting for a slot takes none.
func TestLimiterSlotNotHeldForever(t *testing.T) {
	api := newFakeAPI()
	stuck, waiting, next := Key{Namespace: "ns", Name: "stuck"}, Key{Namespace: "ns", Name: "waiting"}, Key{Namespace: "ns", Name: "next"}
	api.blocked = map[Key]chan struct{}{stuck: make(chan struct{})}
	for _, k := range []Key{stuck, waiting, next} {
		api.put(k.Namespace, k.Name, "v", false)
	}
	lim := NewLimiter(1)
	lim.hold = time.Second
	m := New(Kind[*v1.ConfigMap]{Resource: v1.Resource("configmaps"), ListWatch: api.listWatch}, Options{Limiter: lim})
	t.Cleanup(m.Stop)

	m.SetOwner("stuck", []Key{stuck})
	waitFor(t, "the stuck list", func() bool { now, _ := api.listing(); return now == 1 })
	m.SetOwner("gone", []Key{waiting})
	m.ForgetOwner("gone") // stopped before it had a slot
	m.SetOwner("next", []Key{next})
	waitFor(t, "the next watch listed after the stuck one's hold", func() bool { _, err := m.CachedGet(next); return err == nil })
	if _, err := m.CachedGet(stuck); !errors.Is(err, ErrNotSynced) {
		t.Errorf("stuck: %v, want ErrNotSynced", err)
	}
	api.mu.Lock()
	lists := api.lists[waiting]
	api.mu.Unlock()
	if lists != 0 {
		t.Errorf("the watch stopped while waiting for a slot listed %d times", lists)
	}
	if now, most := api.listing(); now != 1 || most != 2 {
		t.Errorf("%d lists in progress, at most %d: want the stuck one, and it with the next", now, most)
	}
	close(api.blocked[stuck])
	waitFor(t, "the stuck watch listed once unblocked", func() bool { _, err := m.CachedGet(stuck); return err == nil })
}
