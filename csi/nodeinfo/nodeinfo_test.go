package nodeinfo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fakeAPI keeps one Node and one CSINode with resource versions, and
// refuses stale writes with a conflict, as the API server does.
type fakeAPI struct {
	mu      sync.Mutex
	rv      int
	node    *v1.Node
	csiNode *storagev1.CSINode
	// conflicts makes the next N writes fail with a conflict (another
	// writer got there first: the stored object's version moves on).
	conflicts int
	fail      error
	writes    int
	deletes   int
}

func newFakeAPI(n *v1.Node) *fakeAPI {
	f := &fakeAPI{node: n.DeepCopy()}
	f.bump(&f.node.ObjectMeta)
	return f
}

func (f *fakeAPI) bump(m *metav1.ObjectMeta) {
	f.rv++
	m.ResourceVersion = strconv.Itoa(f.rv)
}

func (f *fakeAPI) conflict() error {
	if f.conflicts > 0 {
		f.conflicts--
		f.bump(&f.node.ObjectMeta)
		if f.csiNode != nil {
			f.bump(&f.csiNode.ObjectMeta)
		}
		return apierrors.NewConflict(storagev1.Resource("csinodes"), "n1", errors.New("someone else wrote"))
	}
	return f.fail
}

func (f *fakeAPI) GetNode(_ context.Context, name string) (*v1.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.node == nil || f.node.Name != name {
		return nil, apierrors.NewNotFound(v1.Resource("nodes"), name)
	}
	return f.node.DeepCopy(), nil
}

func (f *fakeAPI) PatchNode(_ context.Context, name string, patch []byte) (*v1.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.conflict(); err != nil {
		return nil, err
	}
	var p struct {
		Metadata struct {
			ResourceVersion string             `json:"resourceVersion"`
			Annotations     map[string]*string `json:"annotations"`
			Labels          map[string]string  `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, err
	}
	if p.Metadata.ResourceVersion != f.node.ResourceVersion {
		return nil, apierrors.NewConflict(v1.Resource("nodes"), name, fmt.Errorf("rv %s is not %s", p.Metadata.ResourceVersion, f.node.ResourceVersion))
	}
	for k, v := range p.Metadata.Annotations {
		if v == nil {
			delete(f.node.Annotations, k)
			continue
		}
		if f.node.Annotations == nil {
			f.node.Annotations = map[string]string{}
		}
		f.node.Annotations[k] = *v
	}
	for k, v := range p.Metadata.Labels {
		if f.node.Labels == nil {
			f.node.Labels = map[string]string{}
		}
		f.node.Labels[k] = v
	}
	f.writes++
	f.bump(&f.node.ObjectMeta)
	return f.node.DeepCopy(), nil
}

func (f *fakeAPI) GetCSINode(_ context.Context, name string) (*storagev1.CSINode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.csiNode == nil {
		return nil, apierrors.NewNotFound(storagev1.Resource("csinodes"), name)
	}
	return f.csiNode.DeepCopy(), nil
}

func (f *fakeAPI) CreateCSINode(_ context.Context, n *storagev1.CSINode) (*storagev1.CSINode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.csiNode != nil {
		return nil, apierrors.NewAlreadyExists(storagev1.Resource("csinodes"), n.Name)
	}
	f.csiNode = n.DeepCopy()
	f.csiNode.UID = types.UID("csinode-" + strconv.Itoa(f.rv))
	f.bump(&f.csiNode.ObjectMeta)
	f.writes++
	return f.csiNode.DeepCopy(), nil
}

func (f *fakeAPI) UpdateCSINode(_ context.Context, n *storagev1.CSINode) (*storagev1.CSINode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.conflict(); err != nil {
		return nil, err
	}
	if f.csiNode == nil {
		return nil, apierrors.NewNotFound(storagev1.Resource("csinodes"), n.Name)
	}
	if n.ResourceVersion != f.csiNode.ResourceVersion {
		return nil, apierrors.NewConflict(storagev1.Resource("csinodes"), n.Name, errors.New("stale"))
	}
	f.csiNode = n.DeepCopy()
	f.bump(&f.csiNode.ObjectMeta)
	f.writes++
	return f.csiNode.DeepCopy(), nil
}

func (f *fakeAPI) DeleteCSINode(_ context.Context, name string, uid types.UID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.csiNode == nil {
		return apierrors.NewNotFound(storagev1.Resource("csinodes"), name)
	}
	if f.csiNode.UID != uid {
		return apierrors.NewConflict(storagev1.Resource("csinodes"), name, errors.New("uid precondition"))
	}
	f.csiNode = nil
	f.deletes++
	return nil
}

func (f *fakeAPI) entries() []storagev1.CSINodeDriver {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.csiNode == nil {
		return nil
	}
	return f.csiNode.Spec.Drivers
}

func (f *fakeAPI) annotation(key string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.node.Annotations[key]
	return v, ok
}

// world is what the sources say.
type world struct {
	registered []Driver
	present    []string
}

func newManager(api API, w *world, events *[]string) *Manager {
	return New(Options{
		NodeName: "n1", API: api, AttachDetach: AttachDetachController,
		Sources: Sources{
			Registered: func() []Driver { return w.registered },
			Present:    func() []string { return w.present },
		},
		Event: func(eventType, reason, message string) {
			if events != nil {
				*events = append(*events, eventType+" "+reason+": "+message)
			}
		},
	})
}

var drvA = Driver{Name: "a.csi", NodeID: "id-a", Topology: map[string]string{"topology.a/zone": "z1"}, MaxVolumes: 3}

func TestManagerInstallsAndRemoves(t *testing.T) {
	ctx := t.Context()
	api := newFakeAPI(node(nil, nil))
	w := &world{}
	m := newManager(api, w, nil)

	// At start, with no driver yet: an empty CSINode owned by the Node, and
	// the attach/detach annotation.
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if api.csiNode == nil || !OwnedBy(api.csiNode, "n1", "uid-1") || len(api.csiNode.Spec.Drivers) != 0 {
		t.Fatalf("CSINode = %+v, want an empty one owned by the Node", api.csiNode)
	}
	if v, _ := api.annotation(AnnotationControllerAttachDetach); v != "true" {
		t.Errorf("attach/detach annotation = %q", v)
	}

	w.registered, w.present = []Driver{drvA}, []string{"a.csi"}
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := api.entries(), []storagev1.CSINodeDriver{Entry(drvA)}; !reflect.DeepEqual(got, want) {
		t.Errorf("entries = %+v, want %+v", got, want)
	}
	if v, _ := api.annotation(AnnotationNodeID); v != `{"a.csi":"id-a"}` {
		t.Errorf("node ID annotation = %q", v)
	}
	if api.node.Labels["topology.a/zone"] != "z1" {
		t.Errorf("labels = %v", api.node.Labels)
	}
	if st := m.Statuses(); len(st) != 1 || st[0].State != StateInstalled {
		t.Errorf("statuses = %+v", st)
	}

	// Nothing changed: nothing written.
	writes := api.writes
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if api.writes != writes {
		t.Errorf("an unchanged sync wrote %d times", api.writes-writes)
	}

	// Probes fail: deregistered, but its socket is still there. The entry
	// stays as it is.
	w.registered = nil
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(api.entries()) != 1 || api.writes != writes {
		t.Errorf("a driver that is still present lost its entry: %+v", api.entries())
	}

	// The socket goes: entry and annotation go, the label stays.
	w.present = nil
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(api.entries()) != 0 {
		t.Errorf("entries = %+v, want none", api.entries())
	}
	if _, ok := api.annotation(AnnotationNodeID); ok {
		t.Error("node ID annotation still there")
	}
	if api.node.Labels["topology.a/zone"] != "z1" {
		t.Error("topology label removed")
	}
	if st := m.Statuses(); len(st) != 0 {
		t.Errorf("statuses = %+v, want none", st)
	}
}

// A restarted agent knows no driver yet: it must leave every entry alone
// until it has seen a driver go.
func TestManagerAfterRestartChangesNothing(t *testing.T) {
	ctx := t.Context()
	api := newFakeAPI(node(nil, nil))
	w := &world{registered: []Driver{drvA}, present: []string{"a.csi"}}
	if err := newManager(api, w, nil).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	writes := api.writes

	restarted := newManager(api, &world{}, nil)
	if err := restarted.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	w2 := &world{registered: []Driver{drvA}, present: []string{"a.csi"}}
	restarted = newManager(api, w2, nil)
	if err := restarted.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if api.writes != writes || len(api.entries()) != 1 {
		t.Errorf("a restart wrote %d times; entries %+v", api.writes-writes, api.entries())
	}
}

func TestManagerRetriesConflicts(t *testing.T) {
	api := newFakeAPI(node(nil, nil))
	api.conflicts = 3
	w := &world{registered: []Driver{drvA}, present: []string{"a.csi"}}
	if err := newManager(api, w, nil).Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(api.entries()) != 1 {
		t.Errorf("entries = %+v", api.entries())
	}
	if v, _ := api.annotation(AnnotationNodeID); v != `{"a.csi":"id-a"}` {
		t.Errorf("annotation = %q", v)
	}
}

// A stale Node from the informer costs a conflict and a fresh read, never
// another writer's change. (The first sync reads the Node itself.)
func TestManagerStaleInformerNode(t *testing.T) {
	api := newFakeAPI(node(nil, nil))
	w := &world{}
	m := newManager(api, w, nil)
	if err := m.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	stale, _ := api.GetNode(t.Context(), "n1")
	api.mu.Lock()
	api.bump(&api.node.ObjectMeta) // someone else writes since
	api.node.Annotations[AnnotationNodeID] = `{"other.csi":"o"}`
	api.mu.Unlock()
	m.opts.Node = func() (*v1.Node, bool) { return stale.DeepCopy(), true }
	w.registered, w.present = []Driver{drvA}, []string{"a.csi"}
	if err := m.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if v, _ := api.annotation(AnnotationNodeID); v != `{"a.csi":"id-a","other.csi":"o"}` {
		t.Errorf("annotation = %q: another writer's key was lost", v)
	}
}

func TestManagerCollisionFailsThatDriverOnly(t *testing.T) {
	api := newFakeAPI(node(nil, map[string]string{"topology.a/zone": "elsewhere"}))
	b := Driver{Name: "b.csi", NodeID: "id-b"}
	w := &world{registered: []Driver{drvA, b}, present: []string{"a.csi", "b.csi"}}
	var events []string
	m := newManager(api, w, &events)
	for range 2 {
		if err := m.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if got := api.entries(); len(got) != 1 || got[0].Name != "b.csi" {
		t.Errorf("entries = %+v, want b.csi only", got)
	}
	st := m.Statuses()
	if len(st) != 2 || st[0].State != StateFailed || st[1].State != StateInstalled {
		t.Fatalf("statuses = %+v", st)
	}
	if len(events) != 1 {
		t.Errorf("events = %q, want one warning (not one per sync)", events)
	}
	if api.node.Labels["topology.a/zone"] != "elsewhere" {
		t.Error("an existing label was overwritten")
	}
}

func TestManagerReplacesCSINodeOfEarlierNode(t *testing.T) {
	api := newFakeAPI(node(nil, nil))
	old := NewCSINode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-0"}})
	old.Spec.Drivers = []storagev1.CSINodeDriver{entry("gone.csi", "x", 0)}
	if _, err := api.CreateCSINode(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	w := &world{registered: []Driver{drvA}, present: []string{"a.csi"}}
	if err := newManager(api, w, nil).Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if api.deletes != 1 || !OwnedBy(api.csiNode, "n1", "uid-1") {
		t.Fatalf("deletes %d, CSINode %+v", api.deletes, api.csiNode)
	}
	if got := api.entries(); len(got) != 1 || got[0].Name != "a.csi" {
		t.Errorf("entries = %+v", got)
	}
}

func TestManagerAPIErrorKeepsInstalledState(t *testing.T) {
	api := newFakeAPI(node(nil, nil))
	w := &world{registered: []Driver{drvA}, present: []string{"a.csi"}}
	m := newManager(api, w, nil)
	if err := m.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	api.fail = errors.New("connection refused")
	api.node.Labels = nil // something to write
	if err := m.Sync(t.Context()); err == nil {
		t.Fatal("no error")
	}
	if st := m.Statuses(); len(st) != 1 || st[0].State != StateInstalled {
		t.Errorf("statuses = %+v: a failed refresh is not an uninstall", st)
	}
}

func TestManagerNoNode(t *testing.T) {
	api := newFakeAPI(node(nil, nil))
	api.node.Name = "other"
	err := newManager(api, &world{}, nil).Sync(t.Context())
	if !apierrors.IsNotFound(err) {
		t.Fatalf("err = %v, want the Node's NotFound", err)
	}
	if api.csiNode != nil {
		t.Error("a CSINode was created for a node that does not exist")
	}
}

// A driver whose CSIDriver asks for periodic updates has its count asked for
// again every period, and at once when an attachment ran out of slots; a
// changed count reaches the CSINode.
func TestManagerRefreshesAllocatable(t *testing.T) {
	api := newFakeAPI(node(nil, nil))
	var mu sync.Mutex
	limit := int64(3)
	refreshes := map[string]int{}
	registered := func() []Driver {
		mu.Lock()
		defer mu.Unlock()
		a, b := drvA, Driver{Name: "b.csi", NodeID: "id-b", MaxVolumes: 5}
		a.MaxVolumes = limit
		return []Driver{a, b}
	}
	m := New(Options{
		NodeName: "n1", API: api,
		Sources: Sources{Registered: registered, Present: func() []string { return []string{"a.csi", "b.csi"} }},
		AllocatablePeriod: func(driver string) time.Duration {
			if driver == "a.csi" {
				return 20 * time.Millisecond
			}
			return 0
		},
		RefreshAllocatable: func(_ context.Context, driver string) error {
			mu.Lock()
			defer mu.Unlock()
			refreshes[driver]++
			limit = 2 // two slots taken by another node's volumes
			return nil
		},
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(10 * time.Second)
	for {
		m.Notify() // the registry's change, as the agent wires it
		var count int32
		for _, e := range api.entries() {
			if e.Name == "a.csi" && e.Allocatable != nil {
				count = *e.Allocatable.Count
			}
		}
		if count == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refreshed count never reached the CSINode: %+v", api.entries())
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if refreshes["b.csi"] != 0 {
		t.Errorf("b.csi, without a period, was refreshed %d times", refreshes["b.csi"])
	}
}
