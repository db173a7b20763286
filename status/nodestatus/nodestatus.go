// Package nodestatus reports the node's volumesInUse: the attachable volumes
// the node's pods want or still have attached or mounted. The attach/detach
// controller never detaches a volume the node reports in use, and the agent
// relies on a controller's attachment only once the volume is reported — so a
// volume cannot be detached under a mount. The kubelet reports this every 10
// seconds; the agent patches the node as soon as the set changes.
package nodestatus

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/reconciler"
	"github.com/volume-agent/volume-agent/volume"
)

// Patcher writes a JSON merge patch to the node's status.
type Patcher interface {
	PatchNodeStatus(ctx context.Context, name string, patch []byte) error
}

// Reporter keeps node.status.volumesInUse current.
type Reporter struct {
	node    string
	patcher Patcher
	getNode func() (*v1.Node, bool)
	ready   func() bool
	log     *zap.Logger
	wake    *notify.Signal

	mu   sync.Mutex
	want []v1.UniqueVolumeName
	// known: want was computed from a pass that planned with the sources
	// read completely (and the state found on disk at start).
	known bool
}

// New returns a Reporter; Run publishes. sourcesReady tells whether the
// desired state has been read completely: until then what a pass sees in
// use is not the whole truth (a restarted agent knows its pods only once
// its sources are read), and nothing is reported, so that the node's
// volumesInUse of a previous run stays until it is replaced by the whole
// truth. The kubelet waits the same way (ReconcilerStatesHasBeenSynced).
func New(node string, p Patcher, getNode func() (*v1.Node, bool), sourcesReady func() bool, log *zap.Logger) *Reporter {
	r := &Reporter{node: node, patcher: p, getNode: getNode, ready: sourcesReady, log: log, wake: notify.New()}
	return r
}

// InUse computes the volumes to report: attachable volumes that a pod wants
// or that are still attached or mounted.
func InUse(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot) []v1.UniqueVolumeName {
	set := map[volume.UniqueName]bool{}
	for name, v := range dsw.Volumes() {
		if v.Attributes.Attachable {
			set[name] = true
		}
	}
	for name, v := range asw.Volumes() {
		if v.Attributes.Attachable {
			set[name] = true
		}
	}
	out := make([]v1.UniqueVolumeName, 0, len(set))
	for name := range set {
		out = append(out, v1.UniqueVolumeName(name))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Reconciled implements reconciler.Observer.
func (r *Reporter) Reconciled(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, _ []reconciler.Action, _ time.Duration) {
	if r.ready != nil && !r.ready() {
		return
	}
	want := InUse(dsw, asw)
	r.mu.Lock()
	changed := !r.known || !slices.Equal(want, r.want)
	r.want, r.known = want, true
	r.mu.Unlock()
	if changed {
		r.wake.Notify()
	}
}

// ReportedInUse tells whether the node object lists the volume.
func (r *Reporter) ReportedInUse(name volume.UniqueName) bool {
	n, ok := r.getNode()
	return ok && slices.Contains(n.Status.VolumesInUse, v1.UniqueVolumeName(name))
}

// Run patches the node whenever the set changes, retrying failures, until
// ctx ends.
func (r *Reporter) Run(ctx context.Context) {
	retry := time.Duration(0)
	for {
		var timer <-chan time.Time
		if retry > 0 {
			timer = time.After(retry)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.wake.C():
		case <-timer:
		}
		r.mu.Lock()
		want, known := r.want, r.known
		r.mu.Unlock()
		if !known {
			continue
		}
		if n, ok := r.getNode(); ok && slices.Equal(n.Status.VolumesInUse, want) {
			retry = 0
			continue
		}
		if want == nil {
			want = []v1.UniqueVolumeName{}
		}
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"volumesInUse": want}})
		if err := r.patcher.PatchNodeStatus(ctx, r.node, patch); err != nil {
			retry = min(max(2*retry, 500*time.Millisecond), 30*time.Second)
			r.log.Warn("updating node volumesInUse failed; will retry", zap.Duration("retryIn", retry), zap.Error(err))
			continue
		}
		retry = 0
		r.log.Info("node volumesInUse updated", zap.Int("volumes", len(want)))
	}
}
