package podstatus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/volume"
)

// patch is one pod status patch as the API server would get it.
type patch struct {
	pod    string
	status v1.ConditionStatus
	reason string
}

// recorder is a Patcher that records patches, optionally failing the
// first ones or holding every patch until released.
type recorder struct {
	mu      sync.Mutex
	patches []patch
	fail    int
	hold    chan struct{}
	sent    chan patch
}

func newRecorder() *recorder { return &recorder{sent: make(chan patch, 100)} }

func (r *recorder) PatchPodStatus(ctx context.Context, namespace, name string, data []byte) error {
	if r.hold != nil {
		select {
		case <-r.hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var body struct {
		Status struct {
			Conditions []v1.PodCondition `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(data, &body); err != nil || len(body.Status.Conditions) != 1 {
		return fmt.Errorf("bad patch %s: %v", data, err)
	}
	c := body.Status.Conditions[0]
	p := patch{pod: namespace + "/" + name, status: c.Status, reason: c.Reason}
	r.mu.Lock()
	if r.fail > 0 {
		r.fail--
		r.mu.Unlock()
		return errors.New("the server is currently unable to handle the request")
	}
	r.patches = append(r.patches, p)
	r.mu.Unlock()
	r.sent <- p
	return nil
}

func (r *recorder) all() []patch {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]patch(nil), r.patches...)
}

// next waits for the next patch.
func (r *recorder) next(t *testing.T) patch {
	t.Helper()
	select {
	case p := <-r.sent:
		return p
	case <-time.After(30 * time.Second):
		t.Fatalf("no patch sent; sent so far: %v", r.all())
		return patch{}
	}
}

// world is a node's pods, each with one volume, mounted or not.
type world map[string]bool

func (w world) snapshots() (*cache.DesiredSnapshot, *cache.ActualSnapshot) {
	dsw := &cache.DesiredSnapshot{Pods: map[types.UID]*cache.DesiredPod{}}
	asw := &cache.ActualSnapshot{Volumes: map[volume.UniqueName]*cache.ActualVolume{}}
	for name, mounted := range w {
		ref := volume.PodRef{UID: types.UID("uid-" + name), Namespace: "ns", Name: name}
		vol := volume.PodScopedName(plugin, ref.UID, "data")
		dsw.Pods[ref.UID] = &cache.DesiredPod{Pod: volume.PodInfo{PodRef: ref}, Volumes: []volume.UniqueName{vol}}
		if mounted {
			asw.Volumes[vol] = &cache.ActualVolume{Name: vol, Pods: map[types.UID]*cache.ActualPodMount{
				ref.UID: {Pod: ref, SpecName: "data", State: cache.Mounted},
			}}
		}
	}
	return dsw, asw
}

type reporterEnv struct {
	t        *testing.T
	clock    *clocktesting.FakeClock
	patches  *recorder
	reporter *podstatus.Reporter
}

func newReporterEnv(t *testing.T) *reporterEnv {
	e := &reporterEnv{t: t, clock: clocktesting.NewFakeClock(time.Unix(1e9, 0)), patches: newRecorder()}
	e.reporter = podstatus.New(podstatus.Options{
		Patcher: e.patches, Errors: lastErrors{}, Log: zap.NewNop(), Clock: e.clock,
		GetPod: func(namespace, name string) (*v1.Pod, bool) { return nil, false },
	})
	return e
}

// run starts the workers.
func (e *reporterEnv) run(workers int) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.reporter.Run(ctx, workers)
	}()
	e.t.Cleanup(func() {
		cancel()
		<-done
	})
}

func (e *reporterEnv) reconciled(w world) {
	dsw, asw := w.snapshots()
	e.reporter.Reconciled(dsw, asw, nil, 0)
}

// waitQueued waits until n pods are queued (patches may be running).
func (e *reporterEnv) waitQueued(n int) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for e.reporter.Pending() != n {
		if time.Now().After(deadline) {
			e.t.Fatalf("%d pods queued, want %d", e.reporter.Pending(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestReadyWithinHoldBackIsOnePatch(t *testing.T) {
	e := newReporterEnv(t)
	e.run(4)
	e.reconciled(world{"web": false})
	e.reconciled(world{"web": true})
	if p := e.patches.next(t); p.status != v1.ConditionTrue || p.pod != "ns/web" {
		t.Fatalf("first patch %+v, want ns/web True", p)
	}
	// The held-back "not ready" comes due: nothing more to write.
	e.clock.Step(time.Second)
	e.reconciled(world{"web": true})
	e.waitQueued(0)
	if got := e.patches.all(); len(got) != 1 {
		t.Fatalf("patches %v, want only the True one", got)
	}
}

func TestNotReadyAfterHoldBack(t *testing.T) {
	e := newReporterEnv(t)
	e.run(4)
	e.reconciled(world{"web": false})
	e.clock.Step(time.Second)
	if p := e.patches.next(t); p.status != v1.ConditionFalse || p.reason != podstatus.ReasonWaiting {
		t.Fatalf("patch %+v, want False %s", p, podstatus.ReasonWaiting)
	}
	e.reconciled(world{"web": true})
	if p := e.patches.next(t); p.status != v1.ConditionTrue {
		t.Fatalf("patch %+v, want True", p)
	}
}

// Pods that turn ready are patched before pods that only get a new "not
// ready" message, whatever the order they were queued in.
func TestReadyPodsFirst(t *testing.T) {
	e := newReporterEnv(t)
	waiting := world{}
	for i := range 5 {
		waiting[fmt.Sprintf("slow-%d", i)] = false
	}
	waiting["fast"] = false
	e.reconciled(waiting)
	e.clock.Step(time.Second) // every "not ready" is queued
	e.waitQueued(6)
	waiting["fast"] = true
	e.reconciled(waiting)
	e.run(1)
	if p := e.patches.next(t); p.pod != "ns/fast" || p.status != v1.ConditionTrue {
		t.Fatalf("first patch %+v, want ns/fast True (sent: %v)", p, e.patches.all())
	}
	for range 5 {
		if p := e.patches.next(t); p.status != v1.ConditionFalse {
			t.Fatalf("patch %+v, want a False one", p)
		}
	}
}

// A pod whose condition changes while it waits for a worker gets one
// patch, with its latest condition.
func TestQueuedChangesMerge(t *testing.T) {
	e := newReporterEnv(t)
	e.patches.hold = make(chan struct{})
	e.run(1)
	e.reconciled(world{"a": true, "b": false})
	// The worker holds a's patch; b's "not ready" is queued behind it.
	e.clock.Step(time.Second)
	e.waitQueued(1)
	e.reconciled(world{"a": true, "b": true})
	close(e.patches.hold)
	want := []patch{{pod: "ns/a", status: v1.ConditionTrue, reason: podstatus.ReasonMounted}, {pod: "ns/b", status: v1.ConditionTrue, reason: podstatus.ReasonMounted}}
	for _, w := range want {
		if p := e.patches.next(t); p != w {
			t.Fatalf("patch %+v, want %+v", p, w)
		}
	}
	e.waitQueued(0)
	if got := e.patches.all(); len(got) != 2 {
		t.Fatalf("patches %v, want one per pod", got)
	}
}

func TestFailedPatchRetried(t *testing.T) {
	e := newReporterEnv(t)
	e.patches.fail = 2
	e.run(2)
	e.reconciled(world{"web": true})
	// Retries wait on the fake clock: move it on until the patch lands.
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case p := <-e.patches.sent:
			if p.status != v1.ConditionTrue {
				t.Fatalf("patch %+v, want True", p)
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the failed patch was never retried")
		}
		e.clock.Step(100 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
}

// A pod that left the node before its condition was written gets no patch.
func TestGonePodNotPatched(t *testing.T) {
	e := newReporterEnv(t)
	e.run(2)
	e.reconciled(world{"gone": false, "web": true})
	e.reconciled(world{"web": true})
	e.clock.Step(time.Second)
	if p := e.patches.next(t); p.pod != "ns/web" {
		t.Fatalf("patch %+v, want ns/web", p)
	}
	e.waitQueued(0)
	for _, p := range e.patches.all() {
		if p.pod == "ns/gone" {
			t.Fatalf("patched %s after it left the node", p.pod)
		}
	}
}
