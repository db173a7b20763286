// Package podstatus publishes, for every pod on the node, the condition
// volume-agent.io/VolumesReady on the pod's status: True once every volume of
// the pod is mounted, False with a reason and a message naming the volumes
// otherwise. Pods can list it in spec.readinessGates.
//
// Conditions are computed from the reconciler's snapshots after every pass
// (no extra work) and patched only when they change, from a queue of pods
// (never of patches: a pod waiting in it gets one patch with its latest
// condition) served by parallel workers, so a slow or unreachable API server
// never blocks the reconciler. Pods whose readiness changes go first: a
// burst of "still waiting" messages never holds back a pod that is ready.
package podstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler"
	"github.com/volume-agent/volume-agent/volume"
)

// ConditionType is the pod condition the agent owns.
const ConditionType v1.PodConditionType = "volume-agent.io/VolumesReady"

// Reasons of the condition.
const (
	ReasonMounted      = "VolumesMounted"
	ReasonWaiting      = "WaitingForVolumes"
	ReasonVolumeErrors = "VolumeErrors"
	ReasonMountFailed  = "MountFailed"
	// ReasonOverLimit: True, every volume mounted, but the pod uses more
	// local storage than its limits allow (explain's warnings). The
	// condition stays True: the kubelet would evict the pod, not make it
	// unready, and a node without a kubelet only reports.
	ReasonOverLimit = "LocalStorageOverLimit"
)

// notReadyDelay holds back a False condition in case it turns True at once.
const notReadyDelay = 200 * time.Millisecond

// Condition is the computed state of the condition for one pod.
type Condition struct {
	Status  v1.ConditionStatus
	Reason  string
	Message string
}

// Patcher writes pod status patches.
type Patcher interface {
	PatchPodStatus(ctx context.Context, namespace, name string, patch []byte) error
}

// PodGetter reads the pod as the API server last told us, to skip patches
// that would change nothing (after a restart, for example).
type PodGetter func(namespace, name string) (*v1.Pod, bool)

// Errors gives the last error of an operation key, if it is in backoff.
type Errors interface {
	LastError(key operations.Key) error
}

// Options configure a Reporter.
type Options struct {
	Patcher Patcher
	GetPod  PodGetter
	Errors  Errors
	Log     *zap.Logger
	// Clock times the delays (not-ready hold-back, retries); default real.
	Clock clock.WithDelayedExecution
}

// Reporter computes and publishes the condition.
type Reporter struct {
	patcher Patcher
	getPod  PodGetter
	errs    Errors
	log     *zap.Logger
	clock   clock.WithDelayedExecution
	queue   *queue
	// retry spaces the attempts of a pod whose patches fail.
	retry workqueue.TypedRateLimiter[types.UID]

	mu      sync.Mutex
	want    map[types.UID]podCondition
	written map[types.UID]Condition
}

type podCondition struct {
	pod  volume.PodRef
	cond Condition
}

// New returns a Reporter; Run publishes.
func New(o Options) *Reporter {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Reporter{
		patcher: o.Patcher, getPod: o.GetPod, errs: o.Errors, log: o.Log, clock: o.Clock,
		queue:   newQueue(),
		retry:   workqueue.DefaultTypedControllerRateLimiter[types.UID](),
		want:    map[types.UID]podCondition{},
		written: map[types.UID]Condition{},
	}
}

// Compute derives the condition of a pod from the snapshots: the pod's
// explanation (explain.Explain) in the condition's words. It is True
// exactly when the explanation says ready; its reason is the explanation's
// worst state.
func Compute(p *cache.DesiredPod, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, errs Errors) Condition {
	ex := explain.Explain(p, dsw, asw, errs)
	var msgs []string
	for _, e := range ex.Problems {
		msgs = append(msgs, e.Err.Error())
	}
	for _, v := range ex.NotReady() {
		if v.Status != ex.Status {
			continue
		}
		switch v.Status {
		case explain.NeedsChange:
			msgs = append(msgs, fmt.Sprintf("volume %q: %s", v.Name, v.Message))
		case explain.Failing:
			msgs = append(msgs, volumeLabel(v)+": "+v.Message)
		default:
			msgs = append(msgs, volumeLabel(v))
		}
	}
	sort.Strings(msgs)
	switch ex.Status {
	case explain.NeedsChange:
		return Condition{Status: v1.ConditionFalse, Reason: ReasonVolumeErrors, Message: strings.Join(msgs, "; ")}
	case explain.Failing:
		return Condition{Status: v1.ConditionFalse, Reason: ReasonMountFailed, Message: strings.Join(msgs, "; ")}
	case explain.Waiting:
		return Condition{Status: v1.ConditionFalse, Reason: ReasonWaiting, Message: "waiting for volumes to be mounted: " + strings.Join(msgs, ", ")}
	}
	if len(ex.Warnings) > 0 {
		msgs = msgs[:0]
		for _, w := range ex.Warnings {
			msgs = append(msgs, w.Message)
		}
		return Condition{Status: v1.ConditionTrue, Reason: ReasonOverLimit, Message: "all volumes are mounted; " + strings.Join(msgs, " ")}
	}
	return Condition{Status: v1.ConditionTrue, Reason: ReasonMounted, Message: "all volumes are mounted"}
}

// volumeLabel names a volume in a message, saying when only its sub-paths
// are missing.
func volumeLabel(v explain.Volume) string {
	if v.Reason == explain.ReasonWaitingForSubPaths || v.Reason == explain.ReasonSubPathFailed {
		return v.Name + " (sub-paths)"
	}
	return v.Name
}

// Reconciled implements reconciler.Observer.
func (r *Reporter) Reconciled(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, _ []reconciler.Action, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, p := range dsw.Pods() {
		c := Compute(p, dsw, asw, r.errs)
		if old, ok := r.want[uid]; ok && old.cond == c {
			continue
		}
		r.want[uid] = podCondition{pod: p.Pod.PodRef, cond: c}
		if c.Status == v1.ConditionTrue {
			r.queue.add(uid, r.priorityLocked(uid))
		} else {
			// Most pods mount within milliseconds: writing "not ready" first
			// would double the API writes for nothing.
			r.clock.AfterFunc(notReadyDelay, func() { r.enqueue(uid) })
		}
	}
	for uid := range r.want {
		if dsw.Pod(uid) == nil {
			delete(r.want, uid)
			delete(r.written, uid)
			// A pod that leaves while its patches fail would otherwise stay
			// in the retry limiter's map for the agent's lifetime.
			r.retry.Forget(uid)
		}
	}
}

// priorityLocked: high when publishing the pod's wanted condition makes it
// ready or stops it being ready.
func (r *Reporter) priorityLocked(uid types.UID) priority {
	if r.want[uid].cond.Status == v1.ConditionTrue || r.written[uid].Status == v1.ConditionTrue {
		return high
	}
	return low
}

// enqueue queues a pod that is still wanted, at the priority its
// condition has now.
func (r *Reporter) enqueue(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.want[uid]; ok {
		r.queue.add(uid, r.priorityLocked(uid))
	}
}

// Run publishes conditions with the given number of workers until ctx
// ends. Workers beyond what the client's rate limit lets through only wait
// in it; fewer than that leave its burst unused while each patch takes an
// API round trip.
func (r *Reporter) Run(ctx context.Context, workers int) {
	go func() {
		<-ctx.Done()
		r.queue.shutDown()
	}()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for r.processNext(ctx) {
			}
		})
	}
	wg.Wait()
}

func (r *Reporter) processNext(ctx context.Context) bool {
	uid, _, ok := r.queue.get()
	if !ok {
		return false
	}
	defer r.queue.done(uid)
	r.mu.Lock()
	pc, ok := r.want[uid]
	written, wasWritten := r.written[uid]
	r.mu.Unlock()
	if !ok || (wasWritten && written == pc.cond) {
		r.retry.Forget(uid)
		return true
	}
	if err := r.publish(ctx, pc); err != nil {
		if ctx.Err() != nil {
			return true
		}
		// Under mu, so that a pod that left meanwhile (Reconciled forgot
		// it) is not counted in the limiter again.
		r.mu.Lock()
		_, wanted := r.want[uid]
		var delay time.Duration
		if wanted {
			delay = r.retry.When(uid)
		}
		r.mu.Unlock()
		if !wanted {
			return true
		}
		r.log.Warn("updating pod condition failed; will retry", zap.String("pod", pc.pod.String()),
			zap.Duration("retryIn", delay), zap.Error(err))
		r.clock.AfterFunc(delay, func() { r.enqueue(uid) })
		return true
	}
	r.retry.Forget(uid)
	r.mu.Lock()
	if _, ok := r.want[uid]; ok {
		r.written[uid] = pc.cond
	}
	r.mu.Unlock()
	return true
}

// Pending is the number of pods waiting for their condition to be
// published.
func (r *Reporter) Pending() int { return r.queue.len() }

// publish patches the pod's status unless the API server already has the
// condition. The transition time changes only when the status does.
func (r *Reporter) publish(ctx context.Context, pc podCondition) error {
	now := metav1.Now()
	transition := now
	if pod, ok := r.getPod(pc.pod.Namespace, pc.pod.Name); ok {
		if pod.UID != pc.pod.UID {
			return nil // a newer pod of the same name; ours is gone
		}
		for _, c := range pod.Status.Conditions {
			if c.Type != ConditionType {
				continue
			}
			if c.Status == pc.cond.Status && c.Reason == pc.cond.Reason && c.Message == pc.cond.Message {
				return nil
			}
			if c.Status == pc.cond.Status {
				transition = c.LastTransitionTime
			}
		}
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pc.pod.UID}, // fails instead of patching a newer pod of the same name
		"status": map[string]any{"conditions": []v1.PodCondition{{
			Type: ConditionType, Status: pc.cond.Status, Reason: pc.cond.Reason, Message: pc.cond.Message,
			LastProbeTime: now, LastTransitionTime: transition,
		}}},
	})
	if err != nil {
		return err
	}
	if err := r.patcher.PatchPodStatus(ctx, pc.pod.Namespace, pc.pod.Name, patch); err != nil {
		return err
	}
	r.log.Info("pod condition updated", zap.String("pod", pc.pod.String()), zap.String("condition", string(ConditionType)),
		zap.String("status", string(pc.cond.Status)), zap.String("reason", pc.cond.Reason))
	return nil
}
