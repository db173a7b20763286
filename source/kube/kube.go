// Package kube is cluster mode's Source. What is scoped to the node or small
// is watched through informers: the pods bound to the node (field selector
// spec.nodeName), the Node itself (its labels decide PV node affinity), and
// the StorageClasses and CSIDrivers of the cluster. Claims, volumes and
// VolumeAttachments are watched one by one, by name, exactly those the
// node's pods use (source/objectwatch): a claim from the moment a pod on the
// node references it, the volume the claim is bound to (its
// spec.volumeName) from the moment the claim names it, and the
// VolumeAttachment of a CSI volume on this node from the moment the volume
// is read; each watch stops when the last pod that led to it goes. The
// agent's memory and the API server's watch traffic therefore follow what
// the node uses, not how many claims the cluster holds.
//
// Every lookup the populator makes is served from these caches: API
// traffic does not grow with pods × volumes, and an API server outage leaves
// the last known state in place instead of making pods look deleted. A
// claim or volume whose watch has not listed yet is reported as not read
// (source.ErrNotRead), never as missing.
package kube

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/source/objectwatch"
)

// Options configure a Source.
type Options struct {
	Client   *kubeclient.Client
	NodeName string
	// ResyncPeriod is the informers' resync period (0: none; changes are
	// delivered by watches).
	ResyncPeriod time.Duration
	// AttachmentName names the VolumeAttachment a volume has on this node,
	// "" for none. When set, the attachment of every volume the node's
	// pods use is watched (by name: VolumeAttachments cannot be selected
	// by node).
	AttachmentName func(pv *v1.PersistentVolume) string
	// OnAttachmentChange is told when a watched VolumeAttachment changed or
	// was read for the first time.
	OnAttachmentChange func(name string)
	// ListWatch lists and watches a resource ("pods", "volumeattachments"...)
	// by key: one object by name, or what a field selector selects. Tests
	// replace it. Default: the REST resources of Client.
	ListWatch func(resource string) func(objectwatch.Key) cache.ListerWatcher
	// Limiter bounds the per-object watches listing at once (shared with
	// the API volumes' watches). Nil: no bound.
	Limiter *objectwatch.Limiter
	// WarnAfter is how long a claim, volume or attachment may stay unread
	// before it is logged (default 10s).
	WarnAfter time.Duration
	Log       *zap.Logger
}

// Source watches the API server.
type Source struct {
	opts    Options
	changed *notify.Signal
	synced  atomic.Bool
	// podChanges records, for the populator, what each change concerns.
	podChanges source.PodChangeLog

	pods, nodes, classes, drivers cache.SharedIndexInformer
	// extra informers other parts of the agent registered before Run.
	mu    sync.Mutex
	extra []cache.SharedIndexInformer

	claims      *objectwatch.Manager[*v1.PersistentVolumeClaim]
	volumes     *objectwatch.Manager[*v1.PersistentVolume]
	attachments *objectwatch.Manager[*storagev1.VolumeAttachment] // nil without AttachmentName

	// scope keeps the registrations in step: the claims of each pod (owned
	// by the pod), the volume of each claim (owned by the claim), the
	// attachment of each volume (owned by the volume).
	scope struct {
		sync.Mutex
		podClaims      map[types.UID][]objectwatch.Key
		claimVolume    map[objectwatch.Key]string
		volumeAttaches map[string]string
	}
}

// New builds the informers and watch managers; Run starts them.
func New(o Options) *Source {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.WarnAfter <= 0 {
		o.WarnAfter = 10 * time.Second
	}
	s := &Source{opts: o, changed: notify.New()}
	s.scope.podClaims = map[types.UID][]objectwatch.Key{}
	s.scope.claimVolume = map[objectwatch.Key]string{}
	s.scope.volumeAttaches = map[string]string{}
	if o.ListWatch == nil {
		o.ListWatch = restListWatch(o.Client)
	}
	s.pods = s.informer(o.ListWatch("pods")(objectwatch.Key{Fields: fields.OneTermEqualSelector("spec.nodeName", o.NodeName).String()}), &v1.Pod{})
	s.nodes = s.informer(o.ListWatch("nodes")(objectwatch.Key{Name: o.NodeName}), &v1.Node{})
	s.classes = s.informer(o.ListWatch("storageclasses")(objectwatch.Key{}), &storagev1.StorageClass{})
	s.drivers = s.informer(o.ListWatch("csidrivers")(objectwatch.Key{}), &storagev1.CSIDriver{})
	_, _ = s.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.podChanged(obj) },
		UpdateFunc: func(_, obj any) { s.podChanged(obj) },
		DeleteFunc: func(obj any) { s.podChanged(obj) },
	})

	s.claims = objectwatch.New(objectwatch.Kind[*v1.PersistentVolumeClaim]{
		Resource: v1.Resource("persistentvolumeclaims"), ListWatch: o.ListWatch("persistentvolumeclaims"),
	}, objectwatch.Options{OnChange: s.claimChanged, OnSynced: s.claimChanged, Limiter: o.Limiter, Log: o.Log.Named("claims")})
	s.volumes = objectwatch.New(objectwatch.Kind[*v1.PersistentVolume]{
		Resource: v1.Resource("persistentvolumes"), ListWatch: o.ListWatch("persistentvolumes"),
	}, objectwatch.Options{OnChange: s.volumeChanged, OnSynced: s.volumeChanged, Limiter: o.Limiter, Log: o.Log.Named("volumes")})
	if o.AttachmentName != nil {
		attached := func(k objectwatch.Key) {
			if o.OnAttachmentChange != nil {
				o.OnAttachmentChange(k.Name)
			}
		}
		s.attachments = objectwatch.New(objectwatch.Kind[*storagev1.VolumeAttachment]{
			Resource: storagev1.Resource("volumeattachments"), ListWatch: o.ListWatch("volumeattachments"),
		}, objectwatch.Options{OnChange: attached, OnSynced: attached, Limiter: o.Limiter, Log: o.Log.Named("attachments")})
	}
	return s
}

// restListWatch lists and watches the agent's resources on the API server.
func restListWatch(c *kubeclient.Client) func(resource string) func(objectwatch.Key) cache.ListerWatcher {
	return func(resource string) func(objectwatch.Key) cache.ListerWatcher {
		switch resource {
		case "storageclasses", "csidrivers", "volumeattachments":
			return objectwatch.RESTListWatch(c.Storage, resource)
		}
		return objectwatch.RESTListWatch(c.Core, resource)
	}
}

// informer builds a shared informer whose changes wake the populator.
// Managed fields are dropped on the way in: the agent never reads them and
// they are often the largest part of an object.
func (s *Source) informer(lw cache.ListerWatcher, obj runtime.Object) cache.SharedIndexInformer {
	inf := cache.NewSharedIndexInformer(lw, obj, s.opts.ResyncPeriod, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	_ = inf.SetTransform(func(o any) (any, error) {
		if m, err := meta.Accessor(o); err == nil {
			m.SetManagedFields(nil)
		}
		return o, nil
	})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: s.objectChanged,
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(metav1Object), newObj.(metav1Object)
			if o.GetResourceVersion() != n.GetResourceVersion() {
				s.objectChanged(newObj)
			}
		},
		DeleteFunc: s.objectChanged,
	})
	return inf
}

type metav1Object interface{ GetResourceVersion() string }

// objectChanged records what changed for the populator and wakes it: a
// pod by its key, anything else as a change that may concern every pod.
// The informer's store has the change by now.
func (s *Source) objectChanged(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if pod, ok := obj.(*v1.Pod); ok {
		s.podChanges.Mark(source.KeyOf(pod))
	} else {
		s.podChanges.MarkAll()
	}
	s.changed.Notify()
}

var _ source.Source = (*Source)(nil)

// InputErrors implements source.ErrorReporter: the API server validates
// objects before the informers see them, so there are none.
func (s *Source) InputErrors() []source.InputError { return nil }

// UnreadInputs implements source.Completeness: an object not read yet is
// answered ErrNotRead on lookup, and nothing is decided on it.
func (s *Source) UnreadInputs() []string { return nil }

// TakePodChanges implements source.PodChanges.
func (s *Source) TakePodChanges() (all bool, keys map[source.PodKey]struct{}) {
	return s.podChanges.Take()
}

// podChanged registers the claims a pod on the node uses, and releases
// them when it terminates or goes. The pod is in the informer's cache
// before this runs, so the populator may meet a claim that is not
// registered yet: it is not read yet, and the claim's first list wakes
// the populator again.
func (s *Source) podChanged(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	var keys []objectwatch.Key
	if _, exists, _ := s.pods.GetStore().Get(pod); exists && !PodTerminated(pod) {
		keys = ClaimKeys(pod)
	}
	s.scope.Lock()
	defer s.scope.Unlock()
	old := s.scope.podClaims[pod.UID]
	if slices.Equal(old, keys) {
		return
	}
	s.claims.SetOwner(pod.UID, keys)
	if len(keys) == 0 {
		delete(s.scope.podClaims, pod.UID)
	} else {
		s.scope.podClaims[pod.UID] = keys
	}
	for _, k := range old {
		if !slices.Contains(keys, k) {
			s.claimChangedLocked(k)
		}
	}
}

// ClaimKeys are the claims a pod references: persistentVolumeClaim
// volumes and the claims of generic ephemeral volumes (<pod>-<volume>),
// sorted and without duplicates.
func ClaimKeys(pod *v1.Pod) []objectwatch.Key {
	var keys []objectwatch.Key
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		switch {
		case v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName != "":
			keys = append(keys, objectwatch.Key{Namespace: pod.Namespace, Name: v.PersistentVolumeClaim.ClaimName})
		case v.Ephemeral != nil:
			keys = append(keys, objectwatch.Key{Namespace: pod.Namespace, Name: pod.Name + "-" + v.Name})
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Name < keys[j].Name })
	return slices.Compact(keys)
}

// claimChanged: a claim's watch listed, or the claim changed.
func (s *Source) claimChanged(k objectwatch.Key) {
	s.scope.Lock()
	s.claimChangedLocked(k)
	s.scope.Unlock()
	s.podChanges.MarkAll()
	s.changed.Notify()
}

// claimChangedLocked watches the volume the claim names, moving the
// registration when the name changes and dropping it when the claim is no
// longer watched, names no volume or is gone.
func (s *Source) claimChangedLocked(k objectwatch.Key) {
	owner := types.UID("claim:" + k.Namespace + "/" + k.Name)
	name := ""
	if pvc, err := s.claims.CachedGet(k); err == nil {
		name = pvc.Spec.VolumeName
	}
	old := s.scope.claimVolume[k]
	if name == old {
		return
	}
	if name == "" {
		s.volumes.ForgetOwner(owner)
		delete(s.scope.claimVolume, k)
	} else {
		s.volumes.SetOwner(owner, []objectwatch.Key{{Name: name}})
		s.scope.claimVolume[k] = name
	}
	if old != "" {
		s.volumeChangedLocked(old)
	}
}

// volumeChanged: a volume's watch listed, or the volume changed.
func (s *Source) volumeChanged(k objectwatch.Key) {
	s.scope.Lock()
	s.volumeChangedLocked(k.Name)
	s.scope.Unlock()
	s.podChanges.MarkAll()
	s.changed.Notify()
}

// volumeChangedLocked watches the attachment of a watched volume.
func (s *Source) volumeChangedLocked(pvName string) {
	if s.attachments == nil {
		return
	}
	owner := types.UID("volume:" + pvName)
	name := ""
	if pv, err := s.volumes.CachedGet(objectwatch.Key{Name: pvName}); err == nil {
		name = s.opts.AttachmentName(pv)
	}
	if name == s.scope.volumeAttaches[pvName] {
		return
	}
	if name == "" {
		s.attachments.ForgetOwner(owner)
		delete(s.scope.volumeAttaches, pvName)
		return
	}
	s.attachments.SetOwner(owner, []objectwatch.Key{{Name: name}})
	s.scope.volumeAttaches[pvName] = name
}

// AddInformer registers another informer to run (and to wait for) with the
// source's own. Call before Run.
func (s *Source) AddInformer(inf cache.SharedIndexInformer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.extra = append(s.extra, inf)
}

func (s *Source) all() []cache.SharedIndexInformer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]cache.SharedIndexInformer{s.pods, s.nodes, s.classes, s.drivers}, s.extra...)
}

// Run starts the informers and waits until ctx ends, then until they and
// every per-object watch have stopped. Until every informer has listed
// once, HasSynced is false and the agent tears nothing down; the wait is
// logged so an unreachable API server is obvious. Later, claims, volumes
// and attachments that stay unread are logged the same way.
func (s *Source) Run(ctx context.Context) error {
	infs := s.all()
	var running sync.WaitGroup
	defer running.Wait()
	defer s.stopWatches()
	for _, inf := range infs {
		running.Go(func() { inf.Run(ctx.Done()) })
	}
	start := time.Now()
	tick := time.NewTicker(s.opts.WarnAfter)
	defer tick.Stop()
	for {
		synced := true
		for _, inf := range infs {
			if !inf.HasSynced() {
				synced = false
				break
			}
		}
		if synced {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			s.opts.Log.Warn("still waiting for the API server: nothing will be torn down until every watch has listed once",
				zap.Duration("waited", time.Since(start).Round(time.Second)))
		case <-time.After(50 * time.Millisecond):
		}
	}
	s.opts.Log.Info("API server caches synced", zap.Duration("took", time.Since(start)))
	s.synced.Store(true)
	s.changed.Notify()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			s.warnUnread()
		}
	}
}

// warnUnread logs the per-object watches that have not listed for
// WarnAfter: the pods that use them wait (their volumes are neither
// mounted nor torn down). The first few are named one by one, the rest
// counted in one line: a node with thousands of claims waiting on an
// overloaded API server must not flood its log.
func (s *Source) warnUnread() {
	const named = 5
	unread := 0
	for _, w := range s.Watches() {
		if w.Synced || time.Since(w.Since) < s.opts.WarnAfter {
			continue
		}
		if unread++; unread <= named {
			s.opts.Log.Warn("still waiting for the API server to list an object the node's pods use; their volumes wait",
				zap.String("resource", w.Resource), zap.Stringer("key", w.Key), zap.Duration("waited", time.Since(w.Since).Round(time.Second)))
		}
	}
	if unread > named {
		s.opts.Log.Warn("still waiting for the API server to list more objects the node's pods use; their volumes wait",
			zap.Int("more", unread-named), zap.Int("unread", unread))
	}
}

func (s *Source) stopWatches() {
	s.claims.Stop()
	s.volumes.Stop()
	if s.attachments != nil {
		s.attachments.Stop()
	}
}

// HasSynced implements source.Source: the informers have listed. Claims
// and volumes are read as pods need them; until then lookups answer
// source.ErrNotRead.
func (s *Source) HasSynced() bool { return s.synced.Load() }

// Changed implements source.Source.
func (s *Source) Changed() <-chan struct{} { return s.changed.C() }

// Pods implements source.Store: the pods bound to this node.
func (s *Source) Pods() []*v1.Pod {
	items := s.pods.GetStore().List()
	out := make([]*v1.Pod, 0, len(items))
	for _, o := range items {
		out = append(out, o.(*v1.Pod))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Pod returns a pod of this node by namespace and name.
func (s *Source) Pod(namespace, name string) (*v1.Pod, bool) {
	o, ok, err := s.pods.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	return o.(*v1.Pod), true
}

// Node returns this node's object, if the API server has it.
func (s *Source) Node() (*v1.Node, bool) {
	o, ok, err := s.nodes.GetStore().GetByKey(s.opts.NodeName)
	if err != nil || !ok {
		return nil, false
	}
	return o.(*v1.Node), true
}

func get[T runtime.Object](inf cache.SharedIndexInformer, resource, key, name string) (T, error) {
	var zero T
	o, ok, err := inf.GetStore().GetByKey(key)
	if err != nil {
		return zero, err
	}
	if !ok {
		return zero, apierrors.NewNotFound(v1.Resource(resource), name)
	}
	return o.(T), nil
}

// notRead marks the error of a watch that has not listed as
// source.ErrNotRead.
func notRead[T any](obj T, err error) (T, error) {
	if errors.Is(err, objectwatch.ErrNotSynced) {
		return obj, source.NotRead(err)
	}
	return obj, err
}

// PVC implements source.Store from the claim's own watch.
func (s *Source) PVC(namespace, name string) (*v1.PersistentVolumeClaim, error) {
	return notRead(s.claims.CachedGet(objectwatch.Key{Namespace: namespace, Name: name}))
}

// PV implements source.Store from the volume's own watch.
func (s *Source) PV(name string) (*v1.PersistentVolume, error) {
	return notRead(s.volumes.CachedGet(objectwatch.Key{Name: name}))
}

// VolumeAttachment returns a watched VolumeAttachment; false if it does
// not exist or is not read yet (the change callback follows its first
// read).
func (s *Source) VolumeAttachment(name string) (*storagev1.VolumeAttachment, bool) {
	if s.attachments == nil {
		return nil, false
	}
	va, err := s.attachments.CachedGet(objectwatch.Key{Name: name})
	return va, err == nil
}

// StorageClass implements source.Store.
func (s *Source) StorageClass(name string) (*storagev1.StorageClass, error) {
	return get[*storagev1.StorageClass](s.classes, "storageclasses", name, name)
}

// CSIDriver implements source.Store.
func (s *Source) CSIDriver(name string) (*storagev1.CSIDriver, error) {
	return get[*storagev1.CSIDriver](s.drivers, "csidrivers", name, name)
}

// Watches lists the per-object watches of claims, volumes and
// attachments (never their content).
func (s *Source) Watches() []objectwatch.KeyStatus {
	out := append(s.claims.Status(), s.volumes.Status()...)
	if s.attachments != nil {
		out = append(out, s.attachments.Status()...)
	}
	return out
}

// WatchStats counts the per-object watches by resource.
func (s *Source) WatchStats() map[string]objectwatch.Stats {
	out := map[string]objectwatch.Stats{"persistentvolumeclaims": s.claims.Stats(), "persistentvolumes": s.volumes.Stats()}
	if s.attachments != nil {
		out["volumeattachments"] = s.attachments.Stats()
	}
	return out
}

// PodTerminated says when a pod's volumes can be torn down in cluster mode:
// its phase is final, or it is being deleted and none of its containers runs
// any more (all container statuses terminated; a pod that never started any
// has none). A pod being deleted with containers still running keeps its
// volumes until they stop or the pod object is removed.
func PodTerminated(pod *v1.Pod) bool {
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return true
	}
	if pod.DeletionTimestamp == nil {
		return false
	}
	for _, list := range [][]v1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for i := range list {
			if list[i].State.Terminated == nil {
				return false
			}
		}
	}
	return true
}

// Informers for other parts of the agent that watch the same objects (the
// local volume provisioner), so each object is cached once. They run with
// the source.

// StorageClassInformer returns the StorageClass informer.
func (s *Source) StorageClassInformer() cache.SharedIndexInformer { return s.classes }

// NodeInformer returns the informer of this node.
func (s *Source) NodeInformer() cache.SharedIndexInformer { return s.nodes }
