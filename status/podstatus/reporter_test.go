package podstatus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// recorder is a Patcher that records patches. It can fail the next ones
// (fail) or a pod's (failPods), and hold every patch until the test lets
// it through: hold is the API client's rate limiter, each patch takes a
// token from it (closing it lets everything through).
type recorder struct {
	mu       sync.Mutex
	patches  []patch
	fail     int
	failPods map[string]bool
	// attempts counts PatchPodStatus calls per pod, failed or not.
	attempts map[string]int
	// inFlight are the pods whose patch is being sent (or waits in hold).
	inFlight    map[string]bool
	maxInFlight int
	hold        chan struct{}
	sent        chan patch
}

func newRecorder() *recorder {
	return &recorder{sent: make(chan patch, 1000), failPods: map[string]bool{}, attempts: map[string]int{}, inFlight: map[string]bool{}}
}

func (r *recorder) PatchPodStatus(ctx context.Context, namespace, name string, data []byte) error {
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
	r.inFlight[p.pod] = true
	r.maxInFlight = max(r.maxInFlight, len(r.inFlight))
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.inFlight, p.pod)
		r.mu.Unlock()
	}()
	if r.hold != nil {
		select {
		case <-r.hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	r.attempts[p.pod]++
	if r.fail > 0 || r.failPods[p.pod] {
		if r.fail > 0 {
			r.fail--
		}
		r.mu.Unlock()
		return errors.New("the server is currently unable to handle the request")
	}
	r.patches = append(r.patches, p)
	r.mu.Unlock()
	r.sent <- p
	return nil
}

func (r *recorder) setFailing(pod string, failing bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failPods[pod] = failing
}

func (r *recorder) attemptsOf(pod string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[pod]
}

// inFlightNow is the pods whose patch is on its way, and the most there
// have been at once.
func (r *recorder) inFlightNow() (pods map[string]bool, most int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.inFlight), r.maxInFlight
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
	pods, dvols := map[types.UID]*cache.DesiredPod{}, map[volume.UniqueName]*cache.DesiredVolume{}
	avols := map[volume.UniqueName]*cache.ActualVolume{}
	for name, mounted := range w {
		ref := volume.PodRef{UID: types.UID("uid-" + name), Namespace: "ns", Name: name}
		vol := volume.PodScopedName(plugin, ref.UID, "data")
		pods[ref.UID] = &cache.DesiredPod{Pod: volume.PodInfo{PodRef: ref}, Volumes: []volume.UniqueName{vol}}
		dvols[vol] = &cache.DesiredVolume{Name: vol, Plugin: plugin, SpecName: "data",
			Pods: cache.PodSetOf(map[types.UID]*cache.DesiredPodVolume{ref.UID: {OuterNames: []string{"data"}}})}
		if mounted {
			avols[vol] = &cache.ActualVolume{Name: vol, Pods: cache.PodSetOf(map[types.UID]*cache.ActualPodMount{
				ref.UID: {Pod: ref, SpecName: "data", State: cache.Mounted},
			})}
		}
	}
	return cache.NewDesiredSnapshot(dvols, pods, 0), cache.NewActualSnapshot(avols, 0)
}

type reporterEnv struct {
	t        *testing.T
	clock    *clocktesting.FakeClock
	patches  *recorder
	reporter *podstatus.Reporter
	// apiUIDs are pods the API server has, by name, with their UID (the
	// informer's view); set before the reporter runs.
	apiUIDs map[string]types.UID
}

func newReporterEnv(t *testing.T) *reporterEnv {
	e := &reporterEnv{t: t, clock: clocktesting.NewFakeClock(time.Unix(1e9, 0)), patches: newRecorder(), apiUIDs: map[string]types.UID{}}
	e.reporter = podstatus.New(podstatus.Options{
		Patcher: e.patches, Errors: lastErrors{}, Log: zap.NewNop(), Clock: e.clock,
		GetPod: func(namespace, name string) (*v1.Pod, bool) {
			uid, ok := e.apiUIDs[name]
			if !ok {
				return nil, false
			}
			return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uid}}, true
		},
	})
	return e
}

// waitUntil polls cond until it holds, failing the test after a deadline.
func (e *reporterEnv) waitUntil(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting until %s (patches so far: %v)", what, e.patches.all())
		}
		time.Sleep(time.Millisecond)
	}
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

// A pod whose patches keep failing waits in its own backoff: it holds no
// worker, and every other pod is patched meanwhile, however few workers
// there are and whichever priority the others have.
func TestFailingPodDoesNotBlockOthers(t *testing.T) {
	cases := []struct {
		name    string
		workers int
		// othersReady: the other pods turn ready (high priority, as the
		// failing one), or only wait (low priority, behind it).
		othersReady bool
	}{
		{name: "one worker, others ready", workers: 1, othersReady: true},
		{name: "one worker, others waiting", workers: 1, othersReady: false},
		{name: "16 workers, others ready", workers: 16, othersReady: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newReporterEnv(t)
			e.patches.setFailing("ns/bad", true)
			// bad is queued first.
			w := world{"bad": true}
			e.reconciled(w)
			for i := range 20 {
				w[fmt.Sprintf("other-%02d", i)] = tc.othersReady
			}
			e.reconciled(w)
			e.clock.Step(time.Second) // the others' "not ready" come due
			e.run(tc.workers)
			for range 20 {
				if p := e.patches.next(t); p.pod == "ns/bad" {
					t.Fatalf("patch %+v while its patches fail", p)
				}
			}
			e.waitUntil("the failing pod was tried", func() bool { return e.patches.attemptsOf("ns/bad") > 0 })
			// The API server recovers: bad's retry comes due.
			e.patches.setFailing("ns/bad", false)
			e.waitUntil("the failing pod is patched", func() bool {
				e.clock.Step(100 * time.Millisecond)
				select {
				case p := <-e.patches.sent:
					if p.pod != "ns/bad" || p.status != v1.ConditionTrue {
						t.Fatalf("patch %+v, want ns/bad True", p)
					}
					return true
				default:
					return false
				}
			})
			e.waitQueued(0)
			seen := map[string]int{}
			for _, p := range e.patches.all() {
				seen[p.pod]++
			}
			for pod, n := range seen {
				if n != 1 {
					t.Errorf("%s patched %d times, want once", pod, n)
				}
			}
			if len(seen) != 21 {
				t.Errorf("%d pods patched, want 21", len(seen))
			}
		})
	}
}

// A pod that left the node (or was replaced by a new pod of the same
// name) gets no patch, wherever it was on its way: held back, queued,
// or in backoff after failed patches.
func TestLeftPodDropped(t *testing.T) {
	cases := []struct {
		name string
		// leave runs with the env's single worker started and "web"'s
		// patch held (hold has no token); it leaves "gone" behind.
		leave func(e *reporterEnv)
	}{
		{
			name: "before its not-ready hold-back came due",
			leave: func(e *reporterEnv) {
				e.reconciled(world{"web": true, "gone": false})
				e.reconciled(world{"web": true})
				e.clock.Step(time.Second)
			},
		},
		{
			name: "while queued behind a busy worker",
			leave: func(e *reporterEnv) {
				e.reconciled(world{"web": true})
				e.waitUntil("web's patch is in flight", func() bool { n, _ := e.patches.inFlightNow(); return len(n) == 1 })
				e.reconciled(world{"web": true, "gone": true})
				e.waitQueued(1)
				e.reconciled(world{"web": true})
			},
		},
		{
			name: "while in backoff after failed patches",
			leave: func(e *reporterEnv) {
				e.patches.setFailing("ns/gone", true)
				e.reconciled(world{"gone": true})
				e.patches.hold <- struct{}{}
				e.waitUntil("gone's patch failed", func() bool { return e.patches.attemptsOf("ns/gone") == 1 })
				e.reconciled(world{"web": true})
				e.patches.setFailing("ns/gone", false)
				e.clock.Step(time.Hour) // its retry would have come due
			},
		},
		{
			name: "replaced by a pod of the same name",
			leave: func(e *reporterEnv) {
				e.apiUIDs["gone"] = "uid-of-the-new-gone"
				e.reconciled(world{"web": true, "gone": true})
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newReporterEnv(t)
			e.patches.hold = make(chan struct{})
			e.run(1)
			tc.leave(e)
			attempts := e.patches.attemptsOf("ns/gone")
			// One worker, FIFO within a priority, and "later" is queued last
			// at the lowest: once it is patched, whatever was queued for
			// gone has been handled.
			e.reconciled(world{"web": true, "later": false})
			close(e.patches.hold)
			e.clock.Step(time.Second)
			for _, want := range []string{"ns/web", "ns/later"} {
				if p := e.patches.next(t); p.pod != want {
					t.Fatalf("patch %+v, want %s", p, want)
				}
			}
			e.waitQueued(0)
			if n := e.patches.attemptsOf("ns/gone"); n != attempts {
				t.Fatalf("%d patches of the pod that left after it left", n-attempts)
			}
		})
	}
}

// The reporter sends its patches through the API client's rate limiter and
// never past it: when the limiter lets few through, no more than the
// workers wait in it (no goroutine or patch piles up), a pod that turns
// ready is the next one a worker takes, and every pod gets exactly one
// patch.
func TestRateLimitedPatches(t *testing.T) {
	cases := []struct {
		name          string
		workers, pods int
	}{
		{name: "one worker", workers: 1, pods: 30},
		{name: "4 workers", workers: 4, pods: 30},
		{name: "16 workers", workers: 16, pods: 40},
		{name: "as many workers as pods", workers: 8, pods: 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newReporterEnv(t)
			e.patches.hold = make(chan struct{})
			w := world{}
			for i := range tc.pods {
				w[fmt.Sprintf("slow-%02d", i)] = false
			}
			e.reconciled(w)
			e.clock.Step(time.Second) // every "not ready" is queued
			e.waitQueued(tc.pods)
			e.run(tc.workers)
			busy := tc.workers
			limited := func(pending int) func() bool {
				return func() bool {
					n, _ := e.patches.inFlightNow()
					return len(n) == busy && e.reporter.Pending() == pending
				}
			}
			e.waitUntil("the workers wait in the limiter", limited(tc.pods-busy))
			w["fast"] = true
			e.reconciled(w)
			// The limiter lets one patch through: its worker takes fast
			// next, before the pods queued long before it.
			e.patches.hold <- struct{}{}
			first := e.patches.next(t)
			e.waitUntil("the freed worker waits in the limiter again", limited(tc.pods-busy))
			if inFlight, _ := e.patches.inFlightNow(); !inFlight["ns/fast"] {
				t.Fatalf("after %s, the limiter holds %v, not ns/fast", first.pod, slices.Sorted(maps.Keys(inFlight)))
			}
			close(e.patches.hold)
			for range tc.pods {
				e.patches.next(t)
			}
			e.waitQueued(0)
			if _, most := e.patches.inFlightNow(); most > tc.workers {
				t.Errorf("%d patches waited in the limiter at once, more than the %d workers", most, tc.workers)
			}
			seen := map[string]bool{}
			for _, p := range e.patches.all() {
				if seen[p.pod] {
					t.Errorf("%s patched twice", p.pod)
				}
				seen[p.pod] = true
			}
			if len(seen) != tc.pods+1 {
				t.Errorf("%d pods patched, want %d", len(seen), tc.pods+1)
			}
		})
	}
}
