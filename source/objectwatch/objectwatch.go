// Package objectwatch keeps a watch on exactly the API objects the node's
// pods use, for any kind: one list+watch per object (field selector
// metadata.name=<name>, as the kubelet's watch-based managers do), shared by
// every pod that uses the object, started when the first such pod registers
// and stopped when the last one goes. Nothing is listed or watched beyond
// what is registered, so the agent's memory and watch traffic follow its
// node's pods rather than the size of the cluster.
//
// Subscribers are told when a watched object changes (that drives the
// refresh of volumes built from it). An object marked immutable stops its
// watch once read: it can no longer change.
//
// A key can also be a selector (labels and fields, no name) for kinds whose
// users select several objects, e.g. ClusterTrustBundles by signer.
package objectwatch

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Key names what to watch: one object (Name set), or the objects a
// selector matches (Name empty; Labels and Fields in selector syntax).
// Namespace is empty for cluster-scoped kinds.
type Key struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	Labels    string `json:"labels,omitempty"`
	Fields    string `json:"fields,omitempty"`
}

func (k Key) String() string {
	s := k.Name
	if k.Namespace != "" {
		s = k.Namespace + "/" + s
	}
	if k.Labels != "" || k.Fields != "" {
		s += fmt.Sprintf("{labels %q, fields %q}", k.Labels, k.Fields)
	}
	return s
}

// fieldSelector is what the watch of k selects by field.
func (k Key) fieldSelector() string {
	var sel []fields.Selector
	if k.Name != "" {
		sel = append(sel, fields.OneTermEqualSelector("metadata.name", k.Name))
	}
	if k.Fields != "" {
		if s, err := fields.ParseSelector(k.Fields); err == nil {
			sel = append(sel, s)
		}
	}
	return fields.AndSelectors(sel...).String()
}

// Kind describes one kind of object.
type Kind[T runtime.Object] struct {
	// Resource names the kind in errors (NotFound) and metrics.
	Resource schema.GroupResource
	// ListWatch lists and watches what a key selects.
	ListWatch func(Key) cache.ListerWatcher
	// Immutable reports that an object can never change again.
	Immutable func(T) bool
}

// RESTListWatch is a Kind.ListWatch for a REST resource: the key's
// namespace, metadata.name=<name> (plus its fields) and its labels.
func RESTListWatch(c rest.Interface, resource string) func(Key) cache.ListerWatcher {
	return func(k Key) cache.ListerWatcher {
		opts := func(o *metav1.ListOptions) {
			o.FieldSelector = k.fieldSelector()
			o.LabelSelector = k.Labels
		}
		return cache.NewFilteredListWatchFromClient(c, resource, k.Namespace, opts)
	}
}

// Options configure a Manager.
type Options struct {
	// OnChange is called (from the watch's goroutine, so quickly) after an
	// object a key selects was added, changed or deleted, except for the
	// objects of the key's first list.
	OnChange func(Key)
	// SyncTimeout bounds how long Get waits for a new watch's first list
	// (default 10s).
	SyncTimeout time.Duration
	Log         *zap.Logger
}

// Manager watches the registered keys of one kind. It is safe for
// concurrent use.
type Manager[T runtime.Object] struct {
	kind Kind[T]
	opts Options

	mu      sync.Mutex
	watches map[Key]*keyWatch[T]
	owners  map[types.UID]map[Key]struct{}
	stopped bool
}

// keyWatch is one key's informer and the owners that need it.
type keyWatch[T runtime.Object] struct {
	key    Key
	owners map[types.UID]struct{}
	store  cache.Store
	ctrl   cache.Controller
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	immutable []T // the objects, once immutable and the watch stopped
	changed   time.Time
	changes   int
}

// New returns a Manager for kind.
func New[T runtime.Object](kind Kind[T], o Options) *Manager[T] {
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return &Manager[T]{kind: kind, opts: o, watches: map[Key]*keyWatch[T]{}, owners: map[types.UID]map[Key]struct{}{}}
}

// SetOwner makes owner (a pod) use exactly keys: watches of new keys
// start, keys it no longer uses lose it as an owner, and watches without
// owners stop.
func (m *Manager[T]) SetOwner(owner types.UID, keys []Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return
	}
	want := make(map[Key]struct{}, len(keys))
	for _, k := range keys {
		want[k] = struct{}{}
	}
	old := m.owners[owner]
	for k := range old {
		if _, keep := want[k]; !keep {
			m.release(owner, k)
		}
	}
	for k := range want {
		if _, had := old[k]; had {
			continue
		}
		w, ok := m.watches[k]
		if !ok {
			w = m.start(k)
			m.watches[k] = w
		}
		w.owners[owner] = struct{}{}
	}
	if len(want) == 0 {
		delete(m.owners, owner)
	} else {
		m.owners[owner] = want
	}
}

// ForgetOwner releases everything owner used.
func (m *Manager[T]) ForgetOwner(owner types.UID) { m.SetOwner(owner, nil) }

// release drops owner from k's watch, stopping it when it was the last.
func (m *Manager[T]) release(owner types.UID, k Key) {
	w, ok := m.watches[k]
	if !ok {
		return
	}
	delete(w.owners, owner)
	if len(w.owners) == 0 {
		w.cancel()
		delete(m.watches, k)
	}
}

// start begins a watch of k.
func (m *Manager[T]) start(k Key) *keyWatch[T] {
	ctx, cancel := context.WithCancel(context.Background())
	w := &keyWatch[T]{key: k, owners: map[types.UID]struct{}{}, cancel: cancel, done: make(chan struct{})}
	w.store, w.ctrl = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: m.kind.ListWatch(k),
		ObjectType:    newObject[T](),
		// As the kubelet's watch-based managers: fewer re-watches of many
		// single-object watches.
		MinWatchTimeout: 30 * time.Minute,
		Transform:       dropManagedFields,
		Handler: cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				m.observe(w, obj, !initial)
			},
			UpdateFunc: func(oldObj, newObj any) {
				m.observe(w, newObj, resourceVersion(oldObj) != resourceVersion(newObj))
			},
			DeleteFunc: func(any) { m.observe(w, nil, true) },
		},
	})
	go func() {
		defer close(w.done)
		w.ctrl.RunWithContext(ctx)
	}()
	m.opts.Log.Debug("watching", zap.String("resource", m.kind.Resource.String()), zap.Stringer("key", k))
	return w
}

// newObject returns an empty object of T's type (a pointer to a struct)
// for the informer.
func newObject[T runtime.Object]() runtime.Object {
	var zero T
	return reflect.New(reflect.TypeOf(zero).Elem()).Interface().(runtime.Object)
}

// dropManagedFields: never read, and often the largest part of an object.
func dropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

func resourceVersion(obj any) string {
	if m, err := meta.Accessor(obj); err == nil {
		return m.GetResourceVersion()
	}
	return ""
}

// observe handles one event of w: notify, and stop the watch for good
// once every object it selects is immutable.
func (m *Manager[T]) observe(w *keyWatch[T], obj any, changed bool) {
	now := time.Now()
	w.mu.Lock()
	if changed {
		w.changed = now
		w.changes++
	}
	w.mu.Unlock()
	if t, ok := obj.(T); ok && m.kind.Immutable != nil && w.key.Name != "" && m.kind.Immutable(t) {
		w.mu.Lock()
		w.immutable = []T{t}
		w.mu.Unlock()
		m.opts.Log.Debug("object is immutable: watch stopped", zap.String("resource", m.kind.Resource.String()), zap.Stringer("key", w.key))
		w.cancel()
	}
	if changed && m.opts.OnChange != nil {
		m.opts.OnChange(w.key)
	}
}

// lookup returns k's watch, or an error if k is not registered.
func (m *Manager[T]) lookup(k Key) (*keyWatch[T], error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w, ok := m.watches[k]
	if !ok {
		return nil, fmt.Errorf("%s %s is not registered for any pod", m.kind.Resource.String(), k)
	}
	return w, nil
}

// List returns the objects k selects, waiting for the watch's first list
// if it has not finished yet.
func (m *Manager[T]) List(ctx context.Context, k Key) ([]T, error) {
	w, err := m.lookup(k)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	imm := w.immutable
	w.mu.Unlock()
	if imm != nil {
		return imm, nil
	}
	if err := m.waitSynced(ctx, w); err != nil {
		return nil, err
	}
	// An immutable object may have stopped the watch meanwhile.
	w.mu.Lock()
	imm = w.immutable
	w.mu.Unlock()
	if imm != nil {
		return imm, nil
	}
	var out []T
	for _, o := range w.store.List() {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out, nil
}

// Get returns the object k names; NotFound if it does not exist. The
// object is shared: callers must not modify it.
func (m *Manager[T]) Get(ctx context.Context, k Key) (T, error) {
	var zero T
	objs, err := m.List(ctx, k)
	if err != nil {
		return zero, err
	}
	for _, o := range objs {
		if acc, err := meta.Accessor(o); err == nil && acc.GetName() == k.Name {
			return o, nil
		}
	}
	return zero, apierrors.NewNotFound(m.kind.Resource, k.Name)
}

func (m *Manager[T]) waitSynced(ctx context.Context, w *keyWatch[T]) error {
	if w.ctrl.HasSynced() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.SyncTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !w.ctrl.HasSynced() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s %s: not read from the API server yet: %w", m.kind.Resource.String(), w.key, ctx.Err())
		case <-w.done:
			w.mu.Lock()
			imm := w.immutable != nil
			w.mu.Unlock()
			if imm {
				return nil
			}
			return fmt.Errorf("%s %s: watch stopped", m.kind.Resource.String(), w.key)
		case <-tick.C:
		}
	}
	return nil
}

// Stop ends every watch; the Manager is unusable afterwards.
func (m *Manager[T]) Stop() {
	m.mu.Lock()
	m.stopped = true
	ws := make([]*keyWatch[T], 0, len(m.watches))
	for _, w := range m.watches {
		ws = append(ws, w)
	}
	m.watches = map[Key]*keyWatch[T]{}
	m.owners = map[types.UID]map[Key]struct{}{}
	m.mu.Unlock()
	for _, w := range ws {
		w.cancel()
		<-w.done
	}
}

// Stats counts the watches.
type Stats struct {
	// Keys registered by at least one owner.
	Keys int
	// Watching are keys with a running watch (immutable objects have none).
	Watching int
	Owners   int
}

// Stats returns the current counts.
func (m *Manager[T]) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Stats{Keys: len(m.watches), Owners: len(m.owners)}
	for _, w := range m.watches {
		w.mu.Lock()
		if w.immutable == nil {
			s.Watching++
		}
		w.mu.Unlock()
	}
	return s
}

// KeyStatus describes one watched key for the debug endpoint: never the
// object's content.
type KeyStatus struct {
	Resource  string    `json:"resource"`
	Key       Key       `json:"key"`
	Owners    int       `json:"owners"`
	Synced    bool      `json:"synced"`
	Immutable bool      `json:"immutable,omitempty"`
	Objects   int       `json:"objects"`
	Changes   int       `json:"changes"`
	Changed   time.Time `json:"lastChange,omitzero"`
}

// Status lists the watched keys, sorted.
func (m *Manager[T]) Status() []KeyStatus {
	m.mu.Lock()
	out := make([]KeyStatus, 0, len(m.watches))
	for k, w := range m.watches {
		w.mu.Lock()
		s := KeyStatus{Resource: m.kind.Resource.String(), Key: k, Owners: len(w.owners), Synced: w.ctrl.HasSynced() || w.immutable != nil,
			Immutable: w.immutable != nil, Changes: w.changes, Changed: w.changed}
		if w.immutable != nil {
			s.Objects = len(w.immutable)
		} else {
			s.Objects = len(w.store.ListKeys())
		}
		w.mu.Unlock()
		out = append(out, s)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out
}
