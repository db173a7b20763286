package agent

import (
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/agent/burst"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/populator"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/source/manifest"
	"github.com/volume-agent/volume-agent/status/claimstatus"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/status/podstatus"
)

// mode is what differs between standalone mode (a manifest directory) and
// cluster mode (the API server): where pods come from, where events go, when
// a pod counts as terminated, the node's labels and memory, and the status
// reporters.
// Everything else is built the same way from it (see build).
type mode struct {
	source source.Source
	// sink receives the agent's events besides its own log (nil: none).
	sink         events.Sink
	isTerminated func(*v1.Pod) bool
	node         func() populator.Node
	// nodeMemory is the node's allocatable memory in bytes (0: unknown),
	// the most a Memory emptyDir holds.
	nodeMemory func() int64
	// manifest is standalone mode's source again, as what API volumes
	// read objects from (nil in cluster mode).
	manifest manifestObjects
	// cluster is nil in standalone mode.
	cluster *clusterParts
	// gc is the burst tuning of the GC when a mode's source tells it of
	// large reads (standalone; nil: the reconciler's passes alone).
	gc *burst.GC
}

func newMode(cfg Config) (*mode, error) {
	if cfg.standalone() {
		return newStandalone(cfg)
	}
	return newCluster(cfg)
}

// newStandalone reads pods and what they reference from a directory; events
// stay in the agent's log and the node's labels are the configured ones.
func newStandalone(cfg Config) (*mode, error) {
	var gc *burst.GC
	if cfg.BurstGC {
		gc = burst.NewGC(burst.GCOptions{})
	}
	src, err := manifest.New(manifest.Options{Dir: cfg.PodManifestPath, NodeName: cfg.NodeName, Logger: cfg.Log.Named("source"), Procs: cfg.Procs, Reads: gc})
	if err != nil {
		return nil, err
	}
	// Without a Node, status.hostIP comes from --node-ip, else from the
	// pod's status in its manifest.
	node := populator.Node{Name: cfg.NodeName, Labels: configuredNodeLabels(cfg), HostIPs: cfg.NodeIPs}
	// Without a Node object, the node's memory is all pods may have.
	mem, _ := memTotal() // 0 if unreadable
	return &mode{
		source:       src,
		manifest:     src,
		gc:           gc,
		isTerminated: populator.PodTerminated,
		node:         func() populator.Node { return node },
		nodeMemory:   func() int64 { return mem },
	}, nil
}

// configuredNodeLabels are the node's labels from the configuration, with
// kubernetes.io/hostname.
func configuredNodeLabels(cfg Config) map[string]string {
	labels := map[string]string{"kubernetes.io/hostname": cfg.NodeName}
	for k, v := range cfg.NodeLabels {
		labels[k] = v
	}
	return labels
}

// claims reports volume expansion on PersistentVolumeClaims (cluster mode).
func (m *mode) claims() operations.ClaimStatus {
	if m.cluster == nil {
		return claimstatus.None{}
	}
	return claimstatus.New(m.cluster.client, m.cluster.source.PVC)
}

// podStatus publishes pods' volume conditions (cluster mode; nil in
// standalone mode).
func (m *mode) podStatus(errs podstatus.Errors, log *zap.Logger) *podstatus.Reporter {
	if m.cluster == nil {
		return nil
	}
	return podstatus.New(podstatus.Options{
		Patcher: m.cluster.statusClient, GetPod: m.cluster.source.Pod, Errors: errs, Log: log.Named("podstatus"),
	})
}

// startEvents starts sending events to the sink.
func (m *mode) startEvents() {
	if m.cluster != nil {
		m.cluster.startEvents()
	}
}

// close releases what the mode holds (the event broadcaster); events sent
// after it are dropped.
func (m *mode) close() {
	if m.cluster != nil {
		m.cluster.close()
	}
}
