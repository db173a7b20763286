// Package kube is cluster mode's Source: informers on the API server for the
// pods bound to this node (field selector on spec.nodeName), the node itself
// (its labels decide PV node affinity), and the claims, volumes, storage
// classes and CSI drivers they refer to. Every lookup the populator makes is
// served from these caches: API traffic does not grow with pods × volumes, and
// an API server outage leaves the last known state in place instead of making
// pods look deleted.
package kube

import (
	"context"
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
	"k8s.io/client-go/tools/cache"

	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/notify"
)

// Options configure a Source.
type Options struct {
	Client   *kubeclient.Client
	NodeName string
	// ResyncPeriod is the informers' resync period (0: none; changes are
	// delivered by watches).
	ResyncPeriod time.Duration
	Log          *zap.Logger
}

// Source watches the API server.
type Source struct {
	opts    Options
	changed *notify.Signal
	synced  atomic.Bool

	pods, nodes, pvcs, pvs, classes, drivers cache.SharedIndexInformer
	// extra informers other parts of the agent registered before Run.
	mu    sync.Mutex
	extra []cache.SharedIndexInformer
}

// New builds the informers; Run starts them.
func New(o Options) *Source {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	s := &Source{opts: o, changed: notify.New()}
	core, storage := o.Client.Core, o.Client.Storage
	s.pods = s.informer(kubeclient.ListWatch(core, "pods", "", fields.OneTermEqualSelector("spec.nodeName", o.NodeName)), &v1.Pod{})
	s.nodes = s.informer(kubeclient.ListWatch(core, "nodes", "", fields.OneTermEqualSelector("metadata.name", o.NodeName)), &v1.Node{})
	s.pvcs = s.informer(kubeclient.ListWatch(core, "persistentvolumeclaims", "", nil), &v1.PersistentVolumeClaim{})
	s.pvs = s.informer(kubeclient.ListWatch(core, "persistentvolumes", "", nil), &v1.PersistentVolume{})
	s.classes = s.informer(kubeclient.ListWatch(storage, "storageclasses", "", nil), &storagev1.StorageClass{})
	s.drivers = s.informer(kubeclient.ListWatch(storage, "csidrivers", "", nil), &storagev1.CSIDriver{})
	return s
}

// informer builds a shared informer whose changes wake the populator.
// Managed fields are dropped on the way in: the agent never reads them and
// they are often the largest part of an object.
func (s *Source) informer(lw *cache.ListWatch, obj runtime.Object) cache.SharedIndexInformer {
	inf := cache.NewSharedIndexInformer(lw, obj, s.opts.ResyncPeriod, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	_ = inf.SetTransform(func(o any) (any, error) {
		if m, err := meta.Accessor(o); err == nil {
			m.SetManagedFields(nil)
		}
		return o, nil
	})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { s.changed.Notify() },
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(metav1Object), newObj.(metav1Object)
			if o.GetResourceVersion() != n.GetResourceVersion() {
				s.changed.Notify()
			}
		},
		DeleteFunc: func(any) { s.changed.Notify() },
	})
	return inf
}

type metav1Object interface{ GetResourceVersion() string }

// AddInformer registers another informer to run (and to wait for) with the
// source's own, e.g. VolumeAttachments for CSI attach. Call before Run.
func (s *Source) AddInformer(inf cache.SharedIndexInformer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.extra = append(s.extra, inf)
}

func (s *Source) all() []cache.SharedIndexInformer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]cache.SharedIndexInformer{s.pods, s.nodes, s.pvcs, s.pvs, s.classes, s.drivers}, s.extra...)
}

// Run starts the informers and waits until ctx ends, then until they have
// stopped. Until every informer has listed once, HasSynced is false and the
// agent tears nothing down; the wait is logged so an unreachable API server
// is obvious.
func (s *Source) Run(ctx context.Context) error {
	infs := s.all()
	var running sync.WaitGroup
	defer running.Wait()
	for _, inf := range infs {
		running.Go(func() { inf.Run(ctx.Done()) })
	}
	start := time.Now()
	tick := time.NewTicker(10 * time.Second)
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
	<-ctx.Done()
	return nil
}

// HasSynced implements source.Source.
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

// PVC implements source.Store.
func (s *Source) PVC(namespace, name string) (*v1.PersistentVolumeClaim, error) {
	return get[*v1.PersistentVolumeClaim](s.pvcs, "persistentvolumeclaims", namespace+"/"+name, name)
}

// PV implements source.Store.
func (s *Source) PV(name string) (*v1.PersistentVolume, error) {
	return get[*v1.PersistentVolume](s.pvs, "persistentvolumes", name, name)
}

// StorageClass implements source.Store.
func (s *Source) StorageClass(name string) (*storagev1.StorageClass, error) {
	return get[*storagev1.StorageClass](s.classes, "storageclasses", name, name)
}

// CSIDriver implements source.Store.
func (s *Source) CSIDriver(name string) (*storagev1.CSIDriver, error) {
	return get[*storagev1.CSIDriver](s.drivers, "csidrivers", name, name)
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

// PVInformer returns the PersistentVolume informer.
func (s *Source) PVInformer() cache.SharedIndexInformer { return s.pvs }

// StorageClassInformer returns the StorageClass informer.
func (s *Source) StorageClassInformer() cache.SharedIndexInformer { return s.classes }

// NodeInformer returns the informer of this node.
func (s *Source) NodeInformer() cache.SharedIndexInformer { return s.nodes }
