package podcerts

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// WatchClient is what Watch needs of the API server.
type WatchClient interface {
	ServesPodCertificateRequests(ctx context.Context) (bool, error)
}

// WatchOptions configure a Watch.
type WatchOptions struct {
	Client WatchClient
	// ListWatch lists and watches the requests the field selector selects.
	ListWatch func(selector fields.Selector) cache.ListerWatcher
	NodeName  string
	// OnChange is told the pod of a request that was added, changed or
	// deleted.
	OnChange func(pod types.UID)
}

// Watch is the Lookup of cluster mode: one list+watch of the node's
// PodCertificateRequests (field selector spec.nodeName=<node>, the only
// list the Node authorizer lets a node make), started on first use so that
// a node without such projections, or an API server without the API,
// costs nothing.
type Watch struct {
	opts WatchOptions

	mu       sync.Mutex
	informer cache.SharedIndexInformer
	stop     context.CancelFunc
	// notServed is when the API server last said it does not serve the
	// API; asked again a minute later.
	notServed time.Time
}

// NewWatch returns a Watch; nothing is listed before Ensure.
func NewWatch(o WatchOptions) *Watch { return &Watch{opts: o} }

const byPodIndex = "podUID"

// ErrNotServed: the API server does not serve PodCertificateRequests.
var ErrNotServed = errors.New("the API server does not serve PodCertificateRequests (certificates.k8s.io/v1beta1; feature gate PodCertificateRequest)")

// Ensure implements Lookup.
func (w *Watch) Ensure(ctx context.Context) error {
	w.mu.Lock()
	inf := w.informer
	if inf == nil {
		if !w.notServed.IsZero() && time.Since(w.notServed) < time.Minute {
			w.mu.Unlock()
			return ErrNotServed
		}
		served, err := w.opts.Client.ServesPodCertificateRequests(ctx)
		if err != nil {
			w.mu.Unlock()
			return fmt.Errorf("looking for PodCertificateRequests on the API server: %w", err)
		}
		if !served {
			w.notServed = time.Now()
			w.mu.Unlock()
			return ErrNotServed
		}
		inf = cache.NewSharedIndexInformer(w.opts.ListWatch(fields.OneTermEqualSelector("spec.nodeName", w.opts.NodeName)),
			&certificatesv1beta1.PodCertificateRequest{}, 0, cache.Indexers{byPodIndex: func(obj any) ([]string, error) {
				if p, ok := obj.(*certificatesv1beta1.PodCertificateRequest); ok {
					return []string{string(p.Spec.PodUID)}, nil
				}
				return nil, nil
			}})
		notify := func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*certificatesv1beta1.PodCertificateRequest); ok && w.opts.OnChange != nil {
				w.opts.OnChange(p.Spec.PodUID)
			}
		}
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    notify,
			UpdateFunc: func(_, n any) { notify(n) },
			DeleteFunc: notify,
		})
		runCtx, cancel := context.WithCancel(context.Background())
		w.informer, w.stop = inf, cancel
		go inf.RunWithContext(runCtx)
	}
	w.mu.Unlock()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("listing the node's PodCertificateRequests: %w", context.Cause(ctx))
	}
	return nil
}

// Get implements Lookup.
func (w *Watch) Get(namespace, name string) (*certificatesv1beta1.PodCertificateRequest, bool) {
	inf := w.current()
	if inf == nil {
		return nil, false
	}
	obj, ok, err := inf.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	p, ok := obj.(*certificatesv1beta1.PodCertificateRequest)
	return p, ok
}

// ByPod implements Lookup.
func (w *Watch) ByPod(uid types.UID) []*certificatesv1beta1.PodCertificateRequest {
	inf := w.current()
	if inf == nil {
		return nil
	}
	objs, _ := inf.GetIndexer().ByIndex(byPodIndex, string(uid))
	out := make([]*certificatesv1beta1.PodCertificateRequest, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*certificatesv1beta1.PodCertificateRequest); ok {
			out = append(out, p)
		}
	}
	return out
}

func (w *Watch) current() cache.SharedIndexInformer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.informer
}

// Stop ends the watch.
func (w *Watch) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop != nil {
		w.stop()
	}
}
