// Package kubeclient talks to the Kubernetes API server with REST clients for
// exactly the API groups the agent uses (core/v1, storage.k8s.io/v1,
// certificates.k8s.io/v1beta1 for ClusterTrustBundles and
// PodCertificateRequests, and the
// authentication.k8s.io/v1 TokenRequest) and a scheme holding only their
// types.
//
// It deliberately does not use the generated clientset: importing
// k8s.io/client-go/kubernetes registers every API group of Kubernetes at
// start-up, which costs about 9 MiB of resident memory in every agent on every
// node, standalone mode included. The informers, the event broadcaster and
// the request machinery are client-go's own.
package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/metrics"
)

// Scheme knows the agent's API groups, nothing else. It is built on first
// use: standalone mode never needs it, and registering the types touches
// code and data throughout the API packages (resident memory).
var Scheme = sync.OnceValue(func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1.AddToScheme, storagev1.AddToScheme, authenticationv1.AddToScheme, certificatesv1beta1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
})

var codecs = sync.OnceValue(func() serializer.CodecFactory { return serializer.NewCodecFactory(Scheme()) })

// Options configure how the agent reaches the API server.
type Options struct {
	// Kubeconfig is a kubeconfig file; empty means in-cluster configuration.
	Kubeconfig string
	QPS        float32
	Burst      int
	UserAgent  string
}

// Client holds REST clients for the API groups the agent uses.
type Client struct {
	Core         rest.Interface
	Storage      rest.Interface
	Certificates rest.Interface
	Config       *rest.Config
}

// LoadConfig reads a kubeconfig (or the in-cluster configuration).
func LoadConfig(o Options) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if o.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("loading API server configuration: %w", err)
	}
	if o.QPS > 0 {
		cfg.QPS = o.QPS
	}
	if o.Burst > 0 {
		cfg.Burst = o.Burst
	}
	if o.UserAgent != "" {
		cfg.UserAgent = o.UserAgent
	}
	return cfg, nil
}

// New returns a Client for cfg. Reads use protobuf, which costs the API
// server and the agent less than JSON.
func New(cfg *rest.Config) (*Client, error) {
	core, err := restClient(cfg, v1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, err
	}
	storage, err := restClient(cfg, storagev1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	certs, err := restClient(cfg, certificatesv1beta1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	return &Client{Core: core, Storage: storage, Certificates: certs, Config: cfg}, nil
}

func restClient(base *rest.Config, gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
	cfg := rest.CopyConfig(base)
	cfg.GroupVersion = &gv
	cfg.APIPath = apiPath
	cfg.NegotiatedSerializer = codecs().WithoutConversion()
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/json"
	return rest.RESTClientFor(cfg)
}

// ListWatch lists and watches one resource, optionally in one namespace and
// restricted by a field selector.
func ListWatch(c rest.Interface, resource, namespace string, selector fields.Selector) *cache.ListWatch {
	if selector == nil {
		selector = fields.Everything()
	}
	return cache.NewListWatchFromClient(c, resource, namespace, selector)
}

// PatchPodStatus applies a strategic merge patch to a pod's status.
func (c *Client) PatchPodStatus(ctx context.Context, namespace, name string, patch []byte) error {
	return c.Core.Patch(types.StrategicMergePatchType).Namespace(namespace).Resource("pods").Name(name).
		SubResource("status").Body(patch).Do(ctx).Error()
}

// PatchPVCStatus applies a patch of the given type to a claim's status.
func (c *Client) PatchPVCStatus(ctx context.Context, namespace, name string, pt types.PatchType, patch []byte) (*v1.PersistentVolumeClaim, error) {
	out := &v1.PersistentVolumeClaim{}
	err := c.Core.Patch(pt).Namespace(namespace).Resource("persistentvolumeclaims").Name(name).
		SubResource("status").Body(patch).Do(ctx).Into(out)
	return out, err
}

// EventSink writes events through the core REST client; it implements
// client-go's record.EventSink.
type EventSink struct{ Client rest.Interface }

func (s EventSink) Create(e *v1.Event) (*v1.Event, error) {
	out := &v1.Event{}
	err := s.Client.Post().Namespace(e.Namespace).Resource("events").Body(e).Do(context.TODO()).Into(out)
	return out, err
}

func (s EventSink) Update(e *v1.Event) (*v1.Event, error) {
	out := &v1.Event{}
	err := s.Client.Put().Namespace(e.Namespace).Resource("events").Name(e.Name).Body(e).Do(context.TODO()).Into(out)
	return out, err
}

func (s EventSink) Patch(e *v1.Event, data []byte) (*v1.Event, error) {
	out := &v1.Event{}
	err := s.Client.Patch(types.StrategicMergePatchType).Namespace(e.Namespace).Resource("events").Name(e.Name).
		Body(data).Do(context.TODO()).Into(out)
	return out, err
}

// RegisterMetrics reports client-go's request counts and latencies as
// volume_agent_api_requests_total and volume_agent_api_request_duration_seconds,
// so the agent's API load can be read off the agent itself.
func RegisterMetrics(reg prometheus.Registerer) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volume_agent_api_requests_total",
		Help: "Requests the agent made to the API server, by HTTP method and response code.",
	}, []string{"method", "code"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "volume_agent_api_request_duration_seconds",
		Help:    "Latency of the agent's API server requests, by verb.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"verb"})
	reg.MustRegister(requests, latency)
	metrics.Register(metrics.RegisterOpts{
		RequestResult:  requestResult{requests},
		RequestLatency: requestLatency{latency},
	})
}

type requestResult struct{ c *prometheus.CounterVec }

func (r requestResult) Increment(_ context.Context, code, method, _ string) {
	r.c.WithLabelValues(method, code).Inc()
}

type requestLatency struct{ h *prometheus.HistogramVec }

func (r requestLatency) Observe(_ context.Context, verb string, _ url.URL, d time.Duration) {
	r.h.WithLabelValues(verb).Observe(d.Seconds())
}

// PatchNodeStatus applies a JSON merge patch to a node's status.
func (c *Client) PatchNodeStatus(ctx context.Context, name string, patch []byte) error {
	return c.Core.Patch(types.MergePatchType).Resource("nodes").Name(name).SubResource("status").Body(patch).Do(ctx).Error()
}

// SecretData reads a secret's data.
func (c *Client) SecretData(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	s := &v1.Secret{}
	if err := c.Core.Get().Namespace(namespace).Resource("secrets").Name(name).Do(ctx).Into(s); err != nil {
		return nil, err
	}
	return s.Data, nil
}

// RequestToken asks for a service-account token (TokenRequest, the
// serviceaccounts/token subresource). The response holds the token: never
// log it.
func (c *Client) RequestToken(ctx context.Context, namespace, serviceAccount string, spec authenticationv1.TokenRequestSpec) (*authenticationv1.TokenRequest, error) {
	out := &authenticationv1.TokenRequest{}
	err := c.Core.Post().Namespace(namespace).Resource("serviceaccounts").Name(serviceAccount).SubResource("token").
		Body(&authenticationv1.TokenRequest{Spec: spec}).Do(ctx).Into(out)
	return out, err
}

// ServesClusterTrustBundles reports whether the API server serves
// certificates.k8s.io/v1beta1 ClusterTrustBundles (beta and off by default
// in Kubernetes 1.36).
func (c *Client) ServesClusterTrustBundles(ctx context.Context) (bool, error) {
	return c.servesCertificates(ctx, "clustertrustbundles")
}

// ServesPodCertificateRequests reports whether the API server serves
// certificates.k8s.io/v1beta1 PodCertificateRequests (beta and off by
// default in Kubernetes 1.36: feature gate PodCertificateRequest).
func (c *Client) ServesPodCertificateRequests(ctx context.Context) (bool, error) {
	return c.servesCertificates(ctx, "podcertificaterequests")
}

// CreatePodCertificateRequest creates a PodCertificateRequest.
func (c *Client) CreatePodCertificateRequest(ctx context.Context, pcr *certificatesv1beta1.PodCertificateRequest) (*certificatesv1beta1.PodCertificateRequest, error) {
	out := &certificatesv1beta1.PodCertificateRequest{}
	err := c.Certificates.Post().Namespace(pcr.Namespace).Resource("podcertificaterequests").Body(pcr).Do(ctx).Into(out)
	return out, err
}

// ServiceAccountUID reads a service account's UID.
func (c *Client) ServiceAccountUID(ctx context.Context, namespace, name string) (types.UID, error) {
	sa := &v1.ServiceAccount{}
	if err := c.Core.Get().Namespace(namespace).Resource("serviceaccounts").Name(name).Do(ctx).Into(sa); err != nil {
		return "", err
	}
	return sa.UID, nil
}

func (c *Client) servesCertificates(ctx context.Context, resource string) (bool, error) {
	raw, err := c.Certificates.Get().AbsPath("/apis/certificates.k8s.io/v1beta1").SetHeader("Accept", "application/json").DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(raw, &list); err != nil {
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true, nil
		}
	}
	return false, nil
}

// CreateVolumeAttachment creates a VolumeAttachment; one that exists
// already is fine.
func (c *Client) CreateVolumeAttachment(ctx context.Context, va *storagev1.VolumeAttachment) error {
	err := c.Storage.Post().Resource("volumeattachments").Body(va).Do(ctx).Error()
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// PatchVolumeAttachmentStatus sets a VolumeAttachment's status.
func (c *Client) PatchVolumeAttachmentStatus(ctx context.Context, name string, status storagev1.VolumeAttachmentStatus) error {
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	return c.Storage.Patch(types.MergePatchType).Resource("volumeattachments").Name(name).SubResource("status").
		Body(patch).Do(ctx).Error()
}

// DeleteVolumeAttachment deletes a VolumeAttachment; one that is gone
// already is fine.
func (c *Client) DeleteVolumeAttachment(ctx context.Context, name string) error {
	err := c.Storage.Delete().Resource("volumeattachments").Name(name).Do(ctx).Error()
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// GetNode reads a Node.
func (c *Client) GetNode(ctx context.Context, name string) (*v1.Node, error) {
	out := &v1.Node{}
	err := c.Core.Get().Resource("nodes").Name(name).Do(ctx).Into(out)
	return out, err
}

// PatchNode applies a JSON merge patch to a Node (its metadata: the status
// has PatchNodeStatus).
func (c *Client) PatchNode(ctx context.Context, name string, patch []byte) (*v1.Node, error) {
	out := &v1.Node{}
	err := c.Core.Patch(types.MergePatchType).Resource("nodes").Name(name).Body(patch).Do(ctx).Into(out)
	return out, err
}

// GetCSINode reads a CSINode.
func (c *Client) GetCSINode(ctx context.Context, name string) (*storagev1.CSINode, error) {
	out := &storagev1.CSINode{}
	err := c.Storage.Get().Resource("csinodes").Name(name).Do(ctx).Into(out)
	return out, err
}

// CreateCSINode creates a CSINode.
func (c *Client) CreateCSINode(ctx context.Context, n *storagev1.CSINode) (*storagev1.CSINode, error) {
	out := &storagev1.CSINode{}
	err := c.Storage.Post().Resource("csinodes").Body(n).Do(ctx).Into(out)
	return out, err
}

// UpdateCSINode replaces a CSINode; its resourceVersion makes the update
// fail with a conflict if the object changed since it was read.
func (c *Client) UpdateCSINode(ctx context.Context, n *storagev1.CSINode) (*storagev1.CSINode, error) {
	out := &storagev1.CSINode{}
	err := c.Storage.Put().Resource("csinodes").Name(n.Name).Body(n).Do(ctx).Into(out)
	return out, err
}

// DeleteCSINode deletes a CSINode if it still has the given UID.
func (c *Client) DeleteCSINode(ctx context.Context, name string, uid types.UID) error {
	opts := &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
	return c.Storage.Delete().Resource("csinodes").Name(name).Body(opts).Do(ctx).Error()
}
