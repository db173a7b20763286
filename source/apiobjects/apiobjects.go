// Package apiobjects serves the objects API volumes are built from
// (ConfigMaps, Secrets, ClusterTrustBundles) to the apivolume plugins and
// tells the refresher when they change: in cluster mode from per-object
// watches of exactly what the node's pods reference (source/objectwatch),
// in standalone mode from the manifest directory.
package apiobjects

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/source/objectwatch"
	"github.com/volume-agent/volume-agent/volume"
)

// Kinds as reported to OnChange (the refresh package's).
const (
	KindConfigMap          = "ConfigMap"
	KindSecret             = "Secret"
	KindClusterTrustBundle = "ClusterTrustBundle"
)

// ClusterOptions configure a Cluster.
type ClusterOptions struct {
	// Client makes the reads: the agent's own credentials, or the node's
	// (--node-kubeconfig), which the Node authorizer limits to what the
	// node's pods reference.
	Client *kubeclient.Client
	// OnChange is told about changed objects (kind, namespace, name).
	OnChange func(kind, namespace, name string)
	// OnRead is told when a ConfigMap's or Secret's first list is in
	// (what a reader that found it not read yet waits for).
	OnRead func(kind, namespace, name string)
	// Limiter bounds the watches listing at once (shared with the
	// source's). Nil: no bound.
	Limiter *objectwatch.Limiter
	Log     *zap.Logger
}

// Cluster serves the objects from per-object watches.
type Cluster struct {
	opts       ClusterOptions
	configMaps *objectwatch.Manager[*v1.ConfigMap]
	secrets    *objectwatch.Manager[*v1.Secret]

	// ClusterTrustBundles (beta, off by default) are looked for on first
	// use; until then the bundles pods reference are only remembered.
	mu          sync.Mutex
	bundles     *objectwatch.Manager[*certificatesv1beta1.ClusterTrustBundle]
	notServed   time.Time // when discovery last said no
	bundleUsers map[types.UID][]objectwatch.Key
}

// rediscover is how long a "not served" answer is trusted.
const rediscover = time.Minute

// NewCluster returns a Cluster; nothing is watched until pods register.
func NewCluster(o ClusterOptions) *Cluster {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	notify := func(kind string) func(objectwatch.Key) {
		return func(k objectwatch.Key) {
			if o.OnChange != nil {
				o.OnChange(kind, k.Namespace, k.Name)
			}
		}
	}
	read := func(kind string) func(objectwatch.Key) {
		return func(k objectwatch.Key) {
			if o.OnRead != nil {
				o.OnRead(kind, k.Namespace, k.Name)
			}
		}
	}
	c := &Cluster{
		opts: o,
		configMaps: objectwatch.New(objectwatch.Kind[*v1.ConfigMap]{
			Resource:  v1.Resource("configmaps"),
			ListWatch: objectwatch.RESTListWatch(o.Client.Core, "configmaps"),
			Immutable: func(cm *v1.ConfigMap) bool { return cm.Immutable != nil && *cm.Immutable },
		}, objectwatch.Options{OnChange: notify(KindConfigMap), OnSynced: read(KindConfigMap), Limiter: o.Limiter, Log: o.Log.Named("configmaps")}),
		secrets: objectwatch.New(objectwatch.Kind[*v1.Secret]{
			Resource:  v1.Resource("secrets"),
			ListWatch: objectwatch.RESTListWatch(o.Client.Core, "secrets"),
			Immutable: func(s *v1.Secret) bool { return s.Immutable != nil && *s.Immutable },
		}, objectwatch.Options{OnChange: notify(KindSecret), OnSynced: read(KindSecret), Limiter: o.Limiter, Log: o.Log.Named("secrets")}),
		bundleUsers: map[types.UID][]objectwatch.Key{},
	}
	return c
}

// bundleManager returns the ClusterTrustBundle watches, discovering first
// whether the API server serves them.
func (c *Cluster) bundleManager(ctx context.Context) (*objectwatch.Manager[*certificatesv1beta1.ClusterTrustBundle], error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bundles != nil {
		return c.bundles, nil
	}
	if !c.notServed.IsZero() && time.Since(c.notServed) < rediscover {
		return nil, errNotServed
	}
	served, err := c.opts.Client.ServesClusterTrustBundles(ctx)
	if err != nil {
		return nil, fmt.Errorf("looking for ClusterTrustBundles on the API server: %w", err)
	}
	if !served {
		c.notServed = time.Now()
		return nil, errNotServed
	}
	c.bundles = objectwatch.New(objectwatch.Kind[*certificatesv1beta1.ClusterTrustBundle]{
		Resource:  certificatesv1beta1.Resource("clustertrustbundles"),
		ListWatch: objectwatch.RESTListWatch(c.opts.Client.Certificates, "clustertrustbundles"),
	}, objectwatch.Options{OnChange: func(k objectwatch.Key) {
		if c.opts.OnChange != nil {
			c.opts.OnChange(KindClusterTrustBundle, k.Namespace, k.Name)
		}
	}, Limiter: c.opts.Limiter, Log: c.opts.Log.Named("clustertrustbundles")})
	for pod, keys := range c.bundleUsers {
		c.bundles.SetOwner(pod, keys)
	}
	return c.bundles, nil
}

var errNotServed = errors.New("the API server does not serve ClusterTrustBundles (certificates.k8s.io/v1beta1; feature gate ClusterTrustBundle)")

// ConfigMap implements apivolume.Objects.
func (c *Cluster) ConfigMap(ctx context.Context, namespace, name string) (*v1.ConfigMap, error) {
	return c.configMaps.Get(ctx, objectwatch.Key{Namespace: namespace, Name: name})
}

// Secret implements apivolume.Objects.
func (c *Cluster) Secret(ctx context.Context, namespace, name string) (*v1.Secret, error) {
	return c.secrets.Get(ctx, objectwatch.Key{Namespace: namespace, Name: name})
}

// CachedConfigMap returns a ConfigMap as its watch has it now, never
// waiting: a volume.IsWaiting error while it is not read yet, NotFound
// when it does not exist (what subPathExpr expansion reads,
// populator.EnvObjects).
func (c *Cluster) CachedConfigMap(namespace, name string) (*v1.ConfigMap, error) {
	return cached(c.configMaps, namespace, name)
}

// CachedSecret is CachedConfigMap for Secrets.
func (c *Cluster) CachedSecret(namespace, name string) (*v1.Secret, error) {
	return cached(c.secrets, namespace, name)
}

func cached[T runtime.Object](m *objectwatch.Manager[T], namespace, name string) (T, error) {
	o, err := m.CachedGet(objectwatch.Key{Namespace: namespace, Name: name})
	if errors.Is(err, objectwatch.ErrNotSynced) {
		return o, volume.Waiting(err)
	}
	return o, err
}

// SetPodObjects implements refresh.Watches: the pod's objects are watched
// from now on, and those it no longer references are released.
func (c *Cluster) SetPodObjects(pod types.UID, namespace string, configMaps, secrets []string, bundles []*v1.ClusterTrustBundleProjection) {
	keys := func(names []string) []objectwatch.Key {
		out := make([]objectwatch.Key, 0, len(names))
		for _, n := range names {
			out = append(out, objectwatch.Key{Namespace: namespace, Name: n})
		}
		return out
	}
	c.configMaps.SetOwner(pod, keys(configMaps))
	c.secrets.SetOwner(pod, keys(secrets))
	var ks []objectwatch.Key
	for _, p := range bundles {
		if k, ok := bundleKey(p); ok {
			ks = append(ks, k)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(ks) == 0 {
		delete(c.bundleUsers, pod)
	} else {
		c.bundleUsers[pod] = ks
	}
	if c.bundles != nil {
		c.bundles.SetOwner(pod, ks)
	}
}

// ForgetPod implements refresh.Watches.
func (c *Cluster) ForgetPod(pod types.UID) {
	c.configMaps.ForgetOwner(pod)
	c.secrets.ForgetOwner(pod)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.bundleUsers, pod)
	if c.bundles != nil {
		c.bundles.ForgetOwner(pod)
	}
}

// bundleKey is the watch of a projection: the bundle by name, or the
// bundles of a signer that a label selector matches. A nil selector
// matches nothing and needs no watch.
func bundleKey(p *v1.ClusterTrustBundleProjection) (objectwatch.Key, bool) {
	if p.Name != nil {
		return objectwatch.Key{Name: *p.Name}, true
	}
	if p.SignerName == nil || p.LabelSelector == nil {
		return objectwatch.Key{}, false
	}
	sel, err := metav1.LabelSelectorAsSelector(p.LabelSelector)
	if err != nil {
		return objectwatch.Key{}, false
	}
	return objectwatch.Key{Fields: "spec.signerName=" + *p.SignerName, Labels: sel.String()}, true
}

// TrustBundle implements apivolume.TrustBundles: the certificates of the
// selected bundles, decoded, deduplicated and sorted (stable content, so an
// unchanged selection costs no write), as PEM.
func (c *Cluster) TrustBundle(ctx context.Context, p *v1.ClusterTrustBundleProjection) ([]byte, error) {
	bundles, err := c.bundleManager(ctx)
	if err != nil {
		return nil, err
	}
	notFound := apierrors.NewNotFound(certificatesv1beta1.Resource("clustertrustbundles"), describe(p))
	if p.Name != nil && p.SignerName != nil {
		return nil, errors.New("name and signerName are mutually exclusive")
	}
	k, ok := bundleKey(p)
	if !ok {
		if p.SignerName == nil {
			return nil, errors.New("neither name nor signerName is set")
		}
		return nil, notFound // a nil label selector matches nothing
	}
	var pems []string
	if p.Name != nil {
		b, err := bundles.Get(ctx, k)
		if err != nil {
			return nil, err
		}
		pems = append(pems, b.Spec.TrustBundle)
	} else {
		bs, err := bundles.List(ctx, k)
		if err != nil {
			return nil, err
		}
		for _, b := range bs {
			if b.Spec.SignerName == *p.SignerName {
				pems = append(pems, b.Spec.TrustBundle)
			}
		}
		if len(pems) == 0 {
			return nil, notFound
		}
	}
	return NormalizePEM(pems...)
}

func describe(p *v1.ClusterTrustBundleProjection) string {
	switch {
	case p.Name != nil:
		return *p.Name
	case p.SignerName != nil:
		return "signer " + *p.SignerName
	}
	return ""
}

// NormalizePEM decodes every CERTIFICATE block, drops duplicates and
// re-encodes them sorted.
func NormalizePEM(pems ...string) ([]byte, error) {
	seen := map[string]bool{}
	var ders [][]byte
	for _, s := range pems {
		rest := []byte(s)
		for {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			if b.Type != "CERTIFICATE" {
				return nil, fmt.Errorf("trust bundle holds a %q PEM block, not only certificates", b.Type)
			}
			if !seen[string(b.Bytes)] {
				seen[string(b.Bytes)] = true
				ders = append(ders, b.Bytes)
			}
		}
	}
	sort.Slice(ders, func(i, j int) bool { return bytes.Compare(ders[i], ders[j]) < 0 })
	var out bytes.Buffer
	for _, d := range ders {
		_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: d})
	}
	return out.Bytes(), nil
}

// Stop ends every watch.
func (c *Cluster) Stop() {
	c.configMaps.Stop()
	c.secrets.Stop()
	if b := c.bundleWatches(); b != nil {
		b.Stop()
	}
}

func (c *Cluster) bundleWatches() *objectwatch.Manager[*certificatesv1beta1.ClusterTrustBundle] {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bundles
}

// Status lists what is watched, never the objects' content.
func (c *Cluster) Status() []objectwatch.KeyStatus {
	out := append(c.configMaps.Status(), c.secrets.Status()...)
	if b := c.bundleWatches(); b != nil {
		out = append(out, b.Status()...)
	}
	return out
}

// Stats counts the watches by resource.
func (c *Cluster) Stats() map[string]objectwatch.Stats {
	out := map[string]objectwatch.Stats{"configmaps": c.configMaps.Stats(), "secrets": c.secrets.Stats()}
	if b := c.bundleWatches(); b != nil {
		out["clustertrustbundles"] = b.Stats()
	}
	return out
}

// Manifest serves the objects of standalone mode's manifest directory.
type Manifest struct {
	Store interface {
		ConfigMap(namespace, name string) (*v1.ConfigMap, error)
		Secret(namespace, name string) (*v1.Secret, error)
	}
}

// ConfigMap implements apivolume.Objects.
func (m Manifest) ConfigMap(_ context.Context, namespace, name string) (*v1.ConfigMap, error) {
	return m.Store.ConfigMap(namespace, name)
}

// Secret implements apivolume.Objects.
func (m Manifest) Secret(_ context.Context, namespace, name string) (*v1.Secret, error) {
	return m.Store.Secret(namespace, name)
}
