package agent

import (
	"context"
	"fmt"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/source/kube"
	"github.com/volume-agent/volume-agent/status/events"
)

// clusterParts are what cluster mode adds to the agent.
type clusterParts struct {
	client      *kubeclient.Client
	source      *kube.Source
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
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
	p := &clusterParts{client: client}
	p.source = kube.New(kube.Options{Client: client, NodeName: cfg.NodeName, Log: log.Named("source")})
	// The broadcaster's correlator aggregates repeated events and rate
	// limits them per object, so a volume stuck in a retry loop cannot flood
	// the API server.
	p.broadcaster = record.NewBroadcaster(record.WithContext(context.Background()))
	p.recorder = p.broadcaster.NewRecorder(kubeclient.Scheme, v1.EventSource{Component: "volume-agent", Host: cfg.NodeName})
	return p, nil
}

func (p *clusterParts) start() {
	p.broadcaster.StartRecordingToSink(kubeclient.EventSink{Client: p.client.Core})
}

func (p *clusterParts) stop() { p.broadcaster.Shutdown() }

// Event implements events.Sink: events reach the API server attached to the
// object they are about.
func (p *clusterParts) Event(obj events.Object, eventType, reason, message string) {
	ref := &v1.ObjectReference{Kind: obj.Kind, APIVersion: "v1", Namespace: obj.Namespace, Name: obj.Name, UID: types.UID(obj.UID)}
	p.recorder.Event(ref, eventType, reason, message)
}
