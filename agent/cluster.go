package agent

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/nodecert"
	"github.com/volume-agent/volume-agent/localpv"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/populator"
	"github.com/volume-agent/volume-agent/source/kube"
	"github.com/volume-agent/volume-agent/source/objectwatch"
	"github.com/volume-agent/volume-agent/status/events"
)

// clusterParts are what cluster mode adds to the agent.
type clusterParts struct {
	client *kubeclient.Client
	// statusClient patches pods' conditions: the same identity and
	// connection as client, with a rate limiter of its own (see
	// newClusterParts).
	statusClient *kubeclient.Client
	// nodeClient has the node's own identity (--node-kubeconfig or
	// --bootstrap-kubeconfig), nil without it: see objectsClient.
	nodeClient *kubeclient.Client
	// nodeCert obtains and renews the certificate nodeClient uses with
	// --bootstrap-kubeconfig; nil otherwise.
	nodeCert     *nodecert.Manager
	stopNodeCert context.CancelFunc
	source       *kube.Source
	broadcaster  record.EventBroadcaster
	recorder     record.EventRecorder
	// attachmentChanged is told about VolumeAttachment changes; set by
	// the CSI part, which is built after the source.
	attachmentChanged atomic.Pointer[func(name string)]
	// listing bounds the per-object watches (claims, volumes,
	// attachments, API objects) listing at once.
	listing *objectwatch.Limiter
}

// concurrentLists is how many per-object watches list at once: enough to
// read hundreds of objects in a second or two, few enough that the API
// server's priority and fairness does not refuse them (429) and send the
// watches into backoff.
const concurrentLists = 16

// newCluster watches the API server for this node's pods and what they
// reference; events go to the API server and the node's labels are read
// from its Node object.
func newCluster(cfg Config) (*mode, error) {
	p, err := newClusterParts(cfg, cfg.Log)
	if err != nil {
		return nil, err
	}
	configured := configuredNodeLabels(cfg)
	total, _ := memTotal() // 0 if unreadable
	return &mode{
		source:       p.source,
		sink:         p,
		isTerminated: kube.PodTerminated,
		node: func() populator.Node {
			if n, ok := p.source.Node(); ok {
				return populator.Node{Name: cfg.NodeName, Labels: n.Labels, HostIPs: nodeHostIPs(n)}
			}
			return populator.Node{Name: cfg.NodeName, Labels: configured}
		},
		// The Node's allocatable memory, as the kubelet reports it (its
		// reservations taken off); the node's memory until it is read.
		nodeMemory: func() int64 {
			if n, ok := p.source.Node(); ok {
				if m := allocatableMemory(n); m > 0 {
					return m
				}
			}
			return total
		},
		cluster: p,
	}, nil
}

func newClusterParts(cfg Config, log *zap.Logger) (*clusterParts, error) {
	restCfg, err := kubeclient.LoadConfig(kubeclient.Options{
		Kubeconfig: cfg.Kubeconfig, QPS: cfg.KubeAPIQPS, Burst: cfg.KubeAPIBurst,
		UserAgent: "volume-agent/" + cfg.NodeName,
	})
	if err != nil {
		return nil, err
	}
	client, err := kubeclient.New(restCfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	// Pod condition patches get their own token bucket (kubeclient.New
	// makes one per client): a pod is ready only once its volumes are set
	// up, which may take a TokenRequest, and its condition is patched, and
	// with one bucket for both, a node starting N pods waits for 2N
	// requests at --kube-api-qps. Each stream alone stays within the
	// limits, and the API server's Priority and Fairness sees one user.
	statusClient, err := kubeclient.New(restCfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	p := &clusterParts{client: client, statusClient: statusClient, listing: objectwatch.NewLimiter(concurrentLists)}
	if cfg.NodeKubeconfig != "" {
		nodeCfg, err := kubeclient.LoadConfig(kubeclient.Options{
			Kubeconfig: cfg.NodeKubeconfig, QPS: cfg.KubeAPIQPS, Burst: cfg.KubeAPIBurst,
			UserAgent: "volume-agent/" + cfg.NodeName + " (node credentials)",
		})
		if err != nil {
			return nil, fmt.Errorf("--node-kubeconfig: %w", err)
		}
		if p.nodeClient, err = kubeclient.New(nodeCfg); err != nil {
			return nil, fmt.Errorf("--node-kubeconfig: %w", err)
		}
	}
	if cfg.BootstrapKubeconfig != "" {
		if err := p.startNodeCert(cfg, log); err != nil {
			return nil, err
		}
	}
	// Claims, volumes and attachments are read with the agent's own
	// credentials even with --node-kubeconfig: the Node authorizer lets a
	// node only GET them, never list or watch (docs/cluster-mode.md).
	p.source = kube.New(kube.Options{
		Client: client, NodeName: cfg.NodeName, Log: log.Named("source"), Limiter: p.listing,
		AttachmentName: p.attachmentName(cfg.NodeName),
		OnAttachmentChange: func(name string) {
			if f := p.attachmentChanged.Load(); f != nil {
				(*f)(name)
			}
		},
	})
	// The broadcaster's correlator aggregates repeated events and rate
	// limits them per object, so a volume stuck in a retry loop cannot flood
	// the API server.
	p.broadcaster = record.NewBroadcaster(record.WithContext(context.Background()))
	p.recorder = p.broadcaster.NewRecorder(kubeclient.Scheme(), v1.EventSource{Component: "volume-agent", Host: cfg.NodeName})
	return p, nil
}

// attachmentName names the VolumeAttachment a CSI volume has on this node,
// unless its CSIDriver says it needs none.
func (p *clusterParts) attachmentName(node string) func(pv *v1.PersistentVolume) string {
	return func(pv *v1.PersistentVolume) string {
		csi := pv.Spec.CSI
		if csi == nil {
			return ""
		}
		if d, err := p.source.CSIDriver(csi.Driver); err == nil && d.Spec.AttachRequired != nil && !*d.Spec.AttachRequired {
			return ""
		}
		return csiplugin.AttachmentName(csi.VolumeHandle, csi.Driver, node)
	}
}

// objectsClient reads Secrets and ConfigMaps and requests tokens: with the
// node's identity when configured, so that the API server's Node
// authorizer limits the agent to what the node's pods reference.
func (p *clusterParts) objectsClient() *kubeclient.Client {
	if p.nodeClient != nil {
		return p.nodeClient
	}
	return p.client
}

// startEvents also starts renewing the node's certificate: like the
// events, only once the agent runs (its client metrics are registered by
// then).
func (p *clusterParts) startEvents() {
	if p.nodeCert != nil {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		p.stopNodeCert = func() { cancel(); <-done }
		go func() {
			defer close(done)
			p.nodeCert.Run(ctx)
		}()
	}
	p.broadcaster.StartRecordingToSink(kubeclient.EventSink{Client: p.client.Core})
}

// startNodeCert makes the node's identity a certificate of its own
// (--bootstrap-kubeconfig); startEvents starts renewing it: at once when
// there is none yet. Until it is issued, requests made with the node's
// identity fail saying so and are retried, as any failed read is.
func (p *clusterParts) startNodeCert(cfg Config, log *zap.Logger) error {
	m, err := nodecert.New(nodecert.Options{
		BootstrapKubeconfig: cfg.BootstrapKubeconfig, Dir: cfg.NodeCertDir, NodeName: cfg.NodeName,
		UserAgent: "volume-agent/" + cfg.NodeName + " (node credentials)", Log: log.Named("nodecert"),
	})
	if err != nil {
		return fmt.Errorf("--bootstrap-kubeconfig: %w", err)
	}
	nodeCfg := m.Config()
	nodeCfg.QPS, nodeCfg.Burst = cfg.KubeAPIQPS, cfg.KubeAPIBurst
	if p.nodeClient, err = kubeclient.New(nodeCfg); err != nil {
		return fmt.Errorf("--bootstrap-kubeconfig: %w", err)
	}
	p.nodeCert = m
	return nil
}

func (p *clusterParts) close() {
	if p.stopNodeCert != nil {
		p.stopNodeCert()
	}
	p.broadcaster.Shutdown()
}

// newLocalPV builds the local volume provisioner; it shares the source's
// StorageClass and Node informers and watches its own PVs (by label).
func (p *clusterParts) newLocalPV(cfg Config, recorder events.Recorder) (*localpv.Provisioner, error) {
	return localpv.New(localpv.Options{
		Client: p.client, NodeName: cfg.NodeName, ConfigFile: cfg.LocalVolumesConfig, HostRoot: cfg.HostRoot,
		Recorder: recorder, Log: cfg.Log.Named("localpv"),
		ClassInformer: p.source.StorageClassInformer(),
		NodeInformer:  p.source.NodeInformer(),
	})
}

// Event implements events.Sink: events reach the API server attached to the
// object they are about.
func (p *clusterParts) Event(obj events.Object, eventType, reason, message string) {
	ref := &v1.ObjectReference{Kind: obj.Kind, APIVersion: "v1", Namespace: obj.Namespace, Name: obj.Name, UID: types.UID(obj.UID)}
	p.recorder.Event(ref, eventType, reason, message)
}

// nodeHostIPs are the node's IPs as the kubelet picks them for pods'
// status.hostIPs: the first InternalIP (else ExternalIP), and the first
// address of the other family if there is one.
func nodeHostIPs(n *v1.Node) []string {
	var all []net.IP
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if ip := net.ParseIP(a.Address); a.Type == typ && ip != nil {
				all = append(all, ip)
			}
		}
	}
	if len(all) == 0 {
		return nil
	}
	out := []string{all[0].String()}
	for _, ip := range all[1:] {
		if (ip.To4() == nil) != (all[0].To4() == nil) {
			return append(out, ip.String())
		}
	}
	return out
}
