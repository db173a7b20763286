package explain_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/agent/metrics"
	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/populator"
	"github.com/volume-agent/volume-agent/reconciler/housekeeping"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/runtimeapi/server"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/ui"
	"github.com/volume-agent/volume-agent/ui/model"
	"github.com/volume-agent/volume-agent/ui/statuscmd"
	"github.com/volume-agent/volume-agent/volume"
)

const (
	emptyDir  = "kubernetes.io/empty-dir"
	csiPlugin = "kubernetes.io/csi"
	configMap = "kubernetes.io/configmap"
)

// situation builds one pod's state: what the DSW wants, what the ASW has,
// and the operations in backoff.
type situation struct {
	t     *testing.T
	clk   *clocktesting.FakeClock
	pod   volume.PodInfo
	dsw   *cache.DesiredStateOfWorld
	asw   *cache.ActualStateOfWorld
	vols  []cache.PodVolume
	errs  []*volume.PodVolumeError
	unres []string
	// failures are the operations in backoff with their last error.
	failures map[operations.Key]error
	mounts   []volume.ContainerMount
	// over are the pod's local storage warnings (usage.Measurer).
	over []explain.Warning
}

func newSituation(t *testing.T) *situation {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	return &situation{
		t: t, clk: clk,
		pod:      volume.PodInfo{PodRef: volume.PodRef{UID: "uid-1", Namespace: "shop", Name: "web"}},
		dsw:      cache.NewDesiredStateOfWorld(clk),
		asw:      cache.NewActualStateOfWorld(clk),
		failures: map[operations.Key]error{},
	}
}

// use makes the pod's one container mount the volume, so every surface
// (the runtime API lists only the volumes containers use) shows it.
func (s *situation) use(outer string) {
	s.mounts = append(s.mounts, volume.ContainerMount{Volume: outer, Index: len(s.mounts), MountPath: "/" + outer})
}

// volume adds a resolved volume; attrs decide whether it is shared.
func (s *situation) volume(outer, plugin string, attrs volume.Attributes, subPaths ...volume.SubPath) cache.VolumeIdentity {
	name := volume.PodScopedName(plugin, s.pod.UID, outer)
	if attrs.Shared() {
		name = volume.SharedName(plugin, attrs.Identity)
	}
	spec := &volume.Spec{Name: outer, Mode: v1.PersistentVolumeFilesystem}
	s.vols = append(s.vols, cache.PodVolume{Name: name, Plugin: plugin, Attributes: attrs, OuterName: outer, Spec: spec, SubPaths: subPaths})
	s.use(outer)
	return cache.VolumeIdentity{Name: name, Plugin: plugin, Attributes: attrs, Spec: spec}
}

func (s *situation) mount(id cache.VolumeIdentity, outer string, state cache.MountState) {
	s.asw.SetPodMount(id, cache.ActualPodMount{Pod: s.pod.PodRef, SpecName: outer, MountPath: "/var/lib/volume-agent/pods/uid-1/volumes/" + outer, State: state})
}

func (s *situation) podError(outer, reason string, err error, transient bool) {
	s.errs = append(s.errs, &volume.PodVolumeError{Pod: s.pod.PodRef, Volume: outer, Reason: reason, Err: err, Transient: transient})
	if outer != "" {
		s.use(outer)
	}
}

func (s *situation) fail(id cache.VolumeIdentity, pod bool, err error) {
	k := operations.Key{Volume: id.Name}
	if pod {
		k.Pod = s.pod.UID
	}
	s.failures[k] = err
}

// OverLimit makes the situation's warnings what the usage measurer would
// say (the agent's failures implement explain.Limits too).
func (s *situation) OverLimit(types.UID) []explain.Warning { return s.over }

// LastError makes the situation's failures what the executor would say.
func (s *situation) LastError(k operations.Key) error { return s.failures[k] }

// operations lists the failures as the executor's status does.
func (s *situation) operations() []operations.OperationStatus {
	var out []operations.OperationStatus
	for k, err := range s.failures {
		o := operations.OperationStatus{Volume: k.Volume, Operation: string(operations.OpMountVolume), State: "backoff",
			Since: s.clk.Now(), LastError: err.Error(), Waiting: volume.IsWaiting(err)}
		if k.Pod != "" {
			ref := s.pod.PodRef
			o.Pod = &ref
		} else {
			o.Operation = string(operations.OpMountDevice)
		}
		at := s.clk.Now().Add(time.Minute)
		o.RetryAt = &at
		out = append(out, o)
	}
	return out
}

func (s *situation) snapshots() (*cache.DesiredPod, *cache.DesiredSnapshot, *cache.ActualSnapshot) {
	containers := []volume.Container{{Name: "app", Type: volume.RegularContainer, Mounts: s.mounts}}
	s.dsw.SetPodWithContainers(s.pod, s.vols, s.errs, s.unres, containers)
	dsw := s.dsw.Snapshot()
	return dsw.Pod(s.pod.UID), dsw, s.asw.Snapshot()
}

var (
	logs   = volume.SubPath{Container: "app", Index: 0, MountPath: "/var/log/app", Path: "logs"}
	shared = volume.Attributes{Identity: "csi.example.com^vol-1", DeviceMountable: true, Attachable: true}
)

// Every reason the agent gives for a pod's volume, each driven through the
// pod condition, the page, `volume-agent status`, the runtime API and the
// pods metric: they must all say what the explanation says. (Pod events of
// resolution errors follow explain.ErrorStatus: populator's tests.)
func TestSurfacesAgree(t *testing.T) {
	tests := []struct {
		name  string
		setup func(s *situation)
		// want is the explanation of volume "data" (every situation has
		// one), and of the pod.
		wantStatus explain.Status
		wantReason string
		podStatus  explain.Status
	}{
		{"mounted", func(s *situation) {
			s.mount(s.volume("data", emptyDir, volume.Attributes{}), "data", cache.Mounted)
		}, explain.Ready, "", explain.Ready},
		{"mounted, sub-paths pending", func(s *situation) {
			s.mount(s.volume("data", emptyDir, volume.Attributes{}, logs), "data", cache.Mounted)
		}, explain.Waiting, explain.ReasonWaitingForSubPaths, explain.Waiting},
		{"sub-paths failed", func(s *situation) {
			id := s.volume("data", emptyDir, volume.Attributes{}, logs)
			s.mount(id, "data", cache.Mounted)
			s.fail(id, true, errors.New("sub-path logs: symlink leaves the volume"))
		}, explain.Failing, explain.ReasonSubPathFailed, explain.Failing},
		{"waiting for the attach/detach controller", func(s *situation) {
			id := s.volume("data", csiPlugin, shared)
			s.fail(id, false, volume.Waitingf("waiting for VolumeAttachment csi-1 to be attached"))
		}, explain.Waiting, explain.ReasonWaitingForAttach, explain.Waiting},
		{"attached, device not staged", func(s *situation) {
			id := s.volume("data", csiPlugin, shared)
			s.asw.SetAttachState(id, cache.Attached, "/dev/vdb", nil)
		}, explain.Waiting, explain.ReasonWaitingForDevice, explain.Waiting},
		{"not mounted yet", func(s *situation) {
			s.volume("data", emptyDir, volume.Attributes{})
		}, explain.Waiting, explain.ReasonWaitingForMount, explain.Waiting},
		{"mount uncertain", func(s *situation) {
			s.mount(s.volume("data", emptyDir, volume.Attributes{}), "data", cache.MountUncertain)
		}, explain.Waiting, explain.ReasonWaitingForMount, explain.Waiting},
		{"the pod's mount failed", func(s *situation) {
			id := s.volume("data", emptyDir, volume.Attributes{})
			s.fail(id, true, errors.New("mount: no space left on device"))
		}, explain.Failing, explain.ReasonMountFailed, explain.Failing},
		{"the volume's device mount failed", func(s *situation) {
			id := s.volume("data", csiPlugin, shared)
			s.asw.SetAttachState(id, cache.Attached, "/dev/vdb", nil)
			s.fail(id, false, errors.New("NodeStageVolume: driver not registered"))
		}, explain.Failing, explain.ReasonMountFailed, explain.Failing},
		{"claim not read yet", func(s *situation) {
			s.podError("data", populator.ReasonNotRead, volume.Waitingf("PVC shop/db is not read from the API server yet"), true)
		}, explain.Waiting, populator.ReasonNotRead, explain.Waiting},
		{"claim lookup failed", func(s *situation) {
			s.podError("data", populator.ReasonLookupFailed, errors.New("reading PVC shop/db: connection refused"), true)
		}, explain.Failing, populator.ReasonLookupFailed, explain.Failing},
		{"claim not found", func(s *situation) {
			s.podError("data", populator.ReasonPVCNotFound, errors.New("PVC shop/db not found"), false)
		}, explain.NeedsChange, populator.ReasonPVCNotFound, explain.NeedsChange},
		{"invalid sub-path", func(s *situation) {
			s.podError("data", populator.ReasonInvalidSubPath, errors.New(`container "app" volumeMount at /x: missing value for POD`), false)
		}, explain.NeedsChange, populator.ReasonInvalidSubPath, explain.NeedsChange},
		{"unsupported volume", func(s *situation) {
			s.podError("data", populator.ReasonUnsupported, errors.New("no plugin supports gitRepo volumes"), false)
		}, explain.NeedsChange, populator.ReasonUnsupported, explain.NeedsChange},
		{"resolved once, failing now", func(s *situation) {
			s.mount(s.volume("data", emptyDir, volume.Attributes{}), "data", cache.Mounted)
			s.podError("data", populator.ReasonPVCBeingDeleted, errors.New("PVC shop/db is being deleted"), false)
		}, explain.NeedsChange, populator.ReasonPVCBeingDeleted, explain.NeedsChange},
		{"not resolved yet", func(s *situation) {
			s.unres = append(s.unres, "data")
			s.use("data")
		}, explain.Waiting, explain.ReasonWaitingForMount, explain.Waiting},
		{"the worst volume decides", func(s *situation) {
			s.mount(s.volume("data", emptyDir, volume.Attributes{}), "data", cache.Mounted)
			s.volume("cache", emptyDir, volume.Attributes{})
			s.podError("claim", populator.ReasonPVCNotFound, errors.New("PVC shop/db not found"), false)
		}, explain.Ready, "", explain.NeedsChange},
		{"the pod's own problem", func(s *situation) {
			s.mount(s.volume("data", emptyDir, volume.Attributes{}), "data", cache.Mounted)
			s.podError("", populator.ReasonPodUIDUnusable, errors.New("pod UID is not usable as a directory name"), false)
		}, explain.Ready, "", explain.NeedsChange},
		{"over its emptyDir sizeLimit: ready, with a warning", func(s *situation) {
			s.mount(s.volume("data", emptyDir, volume.Attributes{}), "data", cache.Mounted)
			s.over = []explain.Warning{{Volume: "data", Reason: explain.ReasonEmptyDirOverLimit, Message: `Usage of EmptyDir volume "data" exceeds the limit "16Mi".`}}
		}, explain.Ready, "", explain.Ready},
		{"over its ephemeral-storage limit, a volume waiting", func(s *situation) {
			s.mount(s.volume("data", emptyDir, volume.Attributes{}), "data", cache.Mounted)
			s.volume("cache", emptyDir, volume.Attributes{})
			s.over = []explain.Warning{{Reason: explain.ReasonEphemeralStorageOverLimit, Message: "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi."}}
		}, explain.Ready, "", explain.Waiting},
		{"read-only for containers", func(s *situation) {
			s.mount(s.volume("data", configMap, volume.Attributes{RequiresRemount: true, ReadOnlyForContainers: true}), "data", cache.Mounted)
		}, explain.Ready, "", explain.Ready},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSituation(t)
			tc.setup(s)
			p, dsw, asw := s.snapshots()
			ex := explain.Explain(p, dsw, asw, s)
			data, ok := ex.Volume("data")
			if !ok {
				t.Fatalf("no explanation of volume data: %+v", ex)
			}
			if data.Status != tc.wantStatus || data.Reason != tc.wantReason || ex.Status != tc.podStatus || ex.Ready != (tc.podStatus == explain.Ready) {
				t.Fatalf("explained %s %q (pod %s, ready %v), want %s %q (pod %s)", data.Status, data.Reason, ex.Status, ex.Ready, tc.wantStatus, tc.wantReason, tc.podStatus)
			}
			if explain.PodReady(p, dsw, asw) != ex.Ready {
				t.Errorf("explain.PodReady = %v, the explanation says ready=%v", !ex.Ready, ex.Ready)
			}
			checkCondition(t, &ex, podstatus.Compute(p, dsw, asw, s))
			checkRuntimeAPI(t, &ex, server.View(p, dsw, asw, s, volume.Paths{Root: "/var/lib/volume-agent"}))
			if got := len(ex.Warnings); got != len(s.over) {
				t.Fatalf("explanation has %d warnings, want %d", got, len(s.over))
			}
			in := model.Input{Now: s.clk.Now(), Node: "node-1", Mode: "standalone", SourcesReady: true, DSW: dsw, ASW: asw, Operations: s.operations(),
				OverLimit: map[types.UID][]explain.Warning{s.pod.UID: s.over}}
			page := model.Build(in)
			checkPage(t, &ex, page)
			checkStatusCommand(t, &ex, in, page)
			checkMetrics(t, &ex, s, dsw, asw)
		})
	}
}

// The condition is True exactly when the pod is ready; its reason is the
// pod's state; its message names every volume in that state.
func checkCondition(t *testing.T, ex *explain.Pod, c podstatus.Condition) {
	t.Helper()
	want := map[explain.Status]string{
		explain.Ready: podstatus.ReasonMounted, explain.Waiting: podstatus.ReasonWaiting,
		explain.Failing: podstatus.ReasonMountFailed, explain.NeedsChange: podstatus.ReasonVolumeErrors,
	}[ex.Status]
	// A ready pod's warnings are its condition's reason; a pod not ready
	// has a reason for that, which comes first.
	if ex.Ready && len(ex.Warnings) > 0 {
		want = podstatus.ReasonOverLimit
		for _, w := range ex.Warnings {
			if !strings.Contains(c.Message, w.Message) {
				t.Errorf("condition message %q does not say %q", c.Message, w.Message)
			}
		}
	}
	if (c.Status == v1.ConditionTrue) != ex.Ready || c.Reason != want {
		t.Errorf("condition %s %s (%s), want ready=%v reason %s", c.Status, c.Reason, c.Message, ex.Ready, want)
	}
	for _, v := range ex.NotReady() {
		if v.Status == ex.Status && !strings.Contains(c.Message, v.Name) {
			t.Errorf("condition message %q does not name volume %s (%s)", c.Message, v.Name, v.Reason)
		}
	}
}

// The runtime API says ready as the explanation does, with each volume's
// reason and message, whether it needs a change, and whether it is
// read-only, and the pod's warnings.
func checkRuntimeAPI(t *testing.T, ex *explain.Pod, got *runtimeapi.Pod) {
	t.Helper()
	if got.Ready != ex.Ready {
		t.Errorf("runtime API: ready=%v, explained ready=%v (%s)", got.Ready, ex.Ready, got.Message)
	}
	if !ex.Ready && !strings.Contains(got.Message, worst(ex)) {
		t.Errorf("runtime API: message %q does not say %q", got.Message, worst(ex))
	}
	for _, v := range got.Volumes {
		e, ok := ex.Volume(v.Name)
		if !ok {
			t.Errorf("runtime API shows volume %s the explanation does not have", v.Name)
			continue
		}
		if v.Ready != e.Ready() || v.Reason != e.Reason || v.Message != e.Message || v.NeedsChange != (e.Status == explain.NeedsChange) || v.ReadOnly != e.ReadOnly {
			t.Errorf("runtime API: volume %+v, explained %+v", v, *e)
		}
	}
	if len(got.Warnings) != len(ex.Warnings) {
		t.Errorf("runtime API: warnings %+v, explained %+v", got.Warnings, ex.Warnings)
	}
	for i, w := range got.Warnings {
		if i < len(ex.Warnings) && (w.Volume != ex.Warnings[i].Volume || w.Reason != ex.Warnings[i].Reason || w.Message != ex.Warnings[i].Message) {
			t.Errorf("runtime API: warning %+v, explained %+v", w, ex.Warnings[i])
		}
	}
	for _, m := range got.Containers[0].Mounts {
		if e, _ := ex.Volume(m.Volume); e != nil && e.ReadOnly && !m.ReadOnly {
			t.Errorf("runtime API: container mount of %s is writable, explained read-only", m.Volume)
		}
	}
}

func checkPage(t *testing.T, ex *explain.Pod, page *model.Page) {
	t.Helper()
	if len(page.Pods) != 1 {
		t.Fatalf("page has %d pods, want 1", len(page.Pods))
	}
	p := page.Pods[0]
	want := map[explain.Status]model.PodState{
		explain.Ready: model.PodReady, explain.Waiting: model.PodWaiting, explain.Failing: model.PodError, explain.NeedsChange: model.PodError,
	}[ex.Status]
	if p.State != want {
		t.Errorf("page: pod %s (%s), want %s", p.State, p.Reason, want)
	}
	for _, pv := range p.Volumes {
		for _, name := range strings.Split(pv.Name, ", ") {
			e, ok := ex.Volume(name)
			if !ok {
				t.Errorf("page shows volume %s the explanation does not have", name)
				continue
			}
			if pv.Ready != e.Ready() || pv.Status != e.Status || pv.ReadOnly != e.ReadOnly || !strings.HasPrefix(pv.Reason, e.Reason) {
				t.Errorf("page: volume %s ready=%v %s %q read-only=%v, explained %s %q read-only=%v",
					name, pv.Ready, pv.Status, pv.Reason, pv.ReadOnly, e.Status, e.Reason, e.ReadOnly)
			}
		}
	}
	if !ex.Ready && !strings.Contains(p.Reason, worst(ex)) {
		t.Errorf("page: pod reason %q does not say %q", p.Reason, worst(ex))
	}
	if ex.Ready && len(ex.Warnings) > 0 && !strings.Contains(p.Reason, ex.Warnings[0].Reason) {
		t.Errorf("page: ready pod's reason %q does not give its warning %s", p.Reason, ex.Warnings[0].Reason)
	}
	if len(p.Warnings) != len(ex.Warnings) {
		t.Errorf("page: %d warnings, explained %d", len(p.Warnings), len(ex.Warnings))
	}
}

// worst is what a pod that is not ready is not ready for: the reason of
// its first volume in its state, or its own problem.
func worst(ex *explain.Pod) string {
	if len(ex.Problems) > 0 {
		return ex.Problems[0].Err.Error()
	}
	for _, v := range ex.NotReady() {
		if v.Status == ex.Status {
			return v.Reason
		}
	}
	return ""
}

// The pods gauge counts the pod under the explanation's state, and under
// no other.
func checkMetrics(t *testing.T, ex *explain.Pod, s *situation, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot) {
	t.Helper()
	m := metrics.New()
	m.RegisterState(metrics.State{
		DSW: snapshotOf[*cache.DesiredSnapshot]{dsw}, ASW: snapshotOf[*cache.ActualSnapshot]{asw},
		Operations: s, Source: noInputErrors{}, SourcesReady: func() bool { return true },
		Drivers: noDrivers{}, Orphans: noOrphans{},
	})
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "volume_agent_pods" {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "status" {
					got[l.GetValue()] = mt.GetGauge().GetValue()
				}
			}
		}
	}
	for _, st := range []explain.Status{explain.Ready, explain.Waiting, explain.Failing, explain.NeedsChange} {
		want := 0.0
		if st == ex.Status {
			want = 1
		}
		if got[string(st)] != want {
			t.Errorf("volume_agent_pods{status=%q} = %v, want %v (all: %v)", st, got[string(st)], want, got)
		}
	}
}

type snapshotOf[T any] struct{ s T }

func (s snapshotOf[T]) Snapshot() T { return s.s }

type noInputErrors struct{}

func (noInputErrors) InputErrors() []source.InputError { return nil }

type noDrivers struct{}

func (noDrivers) List() []registry.Driver { return nil }

type noOrphans struct{}

func (noOrphans) List() []housekeeping.OrphanStatus { return nil }

// Status implements metrics.Operations.
func (s *situation) Status() []operations.OperationStatus { return s.operations() }

// `volume-agent status --pod` says the pod's state and every volume's
// reason, from the page the agent serves.
func checkStatusCommand(t *testing.T, ex *explain.Pod, in model.Input, page *model.Page) {
	t.Helper()
	srv := ui.New(ui.Options{Gather: func() model.Input { return in }, MinInterval: time.Millisecond})
	mux := http.NewServeMux()
	srv.Register(mux)
	hs := httptest.NewServer(mux)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; hs.Close() }()
	var out, errOut bytes.Buffer
	if err := statuscmd.Main(t.Context(), []string{"--address", hs.URL, "--pod", "shop/web"}, &out, &errOut); err != nil {
		t.Fatalf("status: %v (%s)", err, errOut.String())
	}
	text := out.String()
	wantState := string(page.Pods[0].State)
	if !strings.Contains(text, "shop/web (uid uid-1) on node node-1: "+wantState) {
		t.Errorf("status does not say the pod is %s:\n%s", wantState, text)
	}
	for _, v := range ex.NotReady() {
		if !strings.Contains(text, v.Reason) {
			t.Errorf("status does not give volume %s's reason %s:\n%s", v.Name, v.Reason, text)
		}
	}
	if ex.Ready {
		for _, w := range ex.Warnings {
			if !strings.Contains(text, w.Reason) {
				t.Errorf("status does not give the warning %s:\n%s", w.Reason, text)
			}
		}
	}
}

// PodReady, the fast answer asked after every pass, is the explanation's
// on random pods.
func TestPodReadyIsExplainReady(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	states := []cache.MountState{"", cache.Mounted, cache.MountUncertain}
	ready := 0
	for i := range 2000 {
		s := newSituation(t)
		s.pod.UID = types.UID(fmt.Sprintf("uid-%d", i))
		for v := range r.IntN(4) + 1 {
			outer := fmt.Sprintf("v%d", v)
			var subs []volume.SubPath
			if r.IntN(3) == 0 {
				subs = []volume.SubPath{{Container: "app", Index: v, MountPath: "/" + outer, Path: "s"}}
			}
			id := s.volume(outer, emptyDir, volume.Attributes{}, subs...)
			if st := states[r.IntN(len(states))]; st != "" {
				s.mount(id, outer, st)
				if r.IntN(2) == 0 {
					s.asw.SetSubPaths(id.Name, s.pod.UID, subs)
				}
			}
		}
		switch r.IntN(8) {
		case 0:
			s.podError("v0", populator.ReasonNotRead, volume.Waitingf("not read yet"), true)
		case 1:
			s.unres = append(s.unres, "late")
		}
		p, dsw, asw := s.snapshots()
		ex := explain.Explain(p, dsw, asw, nil)
		got, want := explain.PodReady(p, dsw, asw), ex.Ready
		if got != want {
			t.Fatalf("pod %d: PodReady = %v, Explain says ready=%v", i, got, want)
		}
		// The blocker is a volume Explain says is not ready, or none
		// when the pod's own entry stops it.
		blocker, _ := explain.PodReadyBlocker(p, dsw, asw)
		podStops := len(p.Errors) > 0 || len(p.Unresolved) > 0
		if blocker != "" && (got || podStops || !slices.ContainsFunc(ex.Volumes, func(v explain.Volume) bool { return v.Unique == blocker && v.Status != explain.Ready })) ||
			blocker == "" && !got && !podStops {
			t.Fatalf("pod %d (ready %v): blocked by %q; Explain says %+v", i, got, blocker, ex.Volumes)
		}
		if got {
			ready++
		}
	}
	if ready == 0 || ready == 2000 {
		t.Errorf("%d of 2000 pods ready: the test does not cover both", ready)
	}
}
