package operations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// The operator's bodies against a fake plugin and the real ASW and DSW: for
// every body, each prior state of the volume × each outcome of the plugin
// call gives a resulting ASW and a returned error. The tests look only at
// what the operator does (the ASW, the error, what the plugin was asked),
// not at how it decides.

const (
	// opFakeName implements Plugin, DeviceMounter and Attacher.
	opFakeName = "test/operator-fake"
	// opPlainName implements Plugin only.
	opPlainName = "test/operator-plain"

	opPod      types.UID = "uid-1"
	opOtherPod types.UID = "uid-2"
	opDevice             = "/dev/fake0"
)

// opOutcome is what the fake plugin's call returns.
type opOutcome string

const (
	opSucceeds  opOutcome = "succeeds"
	opUncertain opOutcome = "uncertain"
	opFinal     opOutcome = "final"
)

var (
	errOpFinal   = errors.New("injected final error")
	errOpTimeout = errors.New("injected timeout")
)

func (o opOutcome) err() error {
	switch o {
	case opUncertain:
		return volume.Uncertain(errOpTimeout)
	case opFinal:
		return errOpFinal
	}
	return nil
}

// opCall is one call of the fake plugin.
type opCall struct {
	method string
	req    any // a copy of the request
}

// opFakePlugin returns the outcome it is set to from every call and records
// the requests.
type opFakePlugin struct {
	name string

	mu      sync.Mutex
	outcome opOutcome
	calls   []opCall
}

var (
	_ plugins.Plugin        = (*opFakePlugin)(nil)
	_ plugins.DeviceMounter = (*opFakePlugin)(nil)
	_ plugins.Attacher      = (*opFakePlugin)(nil)
)

func (p *opFakePlugin) record(method string, req any) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, opCall{method: method, req: req})
	return p.outcome.err()
}

func (p *opFakePlugin) methods() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, c := range p.calls {
		out = append(out, c.method)
	}
	return out
}

// last returns the request of the last call of method.
func (p *opFakePlugin) last(t *testing.T, method string) any {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.calls) - 1; i >= 0; i-- {
		if p.calls[i].method == method {
			return p.calls[i].req
		}
	}
	t.Fatalf("plugin's %s was not called (calls: %v)", method, p.calls)
	return nil
}

func (p *opFakePlugin) Name() string                 { return p.name }
func (p *opFakePlugin) CanSupport(*volume.Spec) bool { return false }
func (p *opFakePlugin) Attributes(*volume.Spec) (volume.Attributes, error) {
	return volume.Attributes{}, errors.New("not used")
}
func (p *opFakePlugin) SetUp(_ context.Context, req *plugins.SetUpRequest) error {
	return p.record("SetUp", *req)
}

// TearDown and UnmountDevice remove the mount point when they succeed, as
// real plugins do.
func (p *opFakePlugin) TearDown(_ context.Context, req *plugins.TearDownRequest) error {
	if err := p.record("TearDown", *req); err != nil {
		return err
	}
	if err := os.RemoveAll(req.Dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
func (p *opFakePlugin) MountDevice(_ context.Context, req *plugins.DeviceRequest) error {
	return p.record("MountDevice", *req)
}
func (p *opFakePlugin) UnmountDevice(_ context.Context, req *plugins.DeviceRequest) error {
	if err := p.record("UnmountDevice", *req); err != nil {
		return err
	}
	if err := os.Remove(req.DeviceMountPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
func (p *opFakePlugin) Attach(_ context.Context, req *plugins.AttachRequest) (*plugins.AttachResult, error) {
	if err := p.record("Attach", *req); err != nil {
		return nil, err
	}
	return &plugins.AttachResult{DevicePath: opDevice, PublishContext: map[string]string{"from": "attach"}}, nil
}
func (p *opFakePlugin) Detach(_ context.Context, req *plugins.AttachRequest) error {
	return p.record("Detach", *req)
}

// opPlainPlugin has no optional capability.
type opPlainPlugin struct{}

func (opPlainPlugin) Name() string                 { return opPlainName }
func (opPlainPlugin) CanSupport(*volume.Spec) bool { return false }
func (opPlainPlugin) Attributes(*volume.Spec) (volume.Attributes, error) {
	return volume.Attributes{}, nil
}
func (opPlainPlugin) SetUp(context.Context, *plugins.SetUpRequest) error       { return nil }
func (opPlainPlugin) TearDown(context.Context, *plugins.TearDownRequest) error { return nil }

// opKind is the kind of volume a test works on.
type opKind string

const (
	// opAttachable: attached, then device-mounted, then set up per pod
	// (a CSI volume whose driver needs ControllerPublish).
	opAttachable opKind = "attachable"
	// opDeviceMountable: device-mounted, then set up per pod (a local
	// block device).
	opDeviceMountable opKind = "device"
	// opPodScoped: set up per pod only (an emptyDir).
	opPodScoped opKind = "pod"
)

// opWorld is an Operator with the fake plugins, one volume of a kind and a
// pod that may want it.
type opWorld struct {
	op     *Operator
	asw    *cache.ActualStateOfWorld
	dsw    *cache.DesiredStateOfWorld
	plugin *opFakePlugin
	paths  volume.Paths

	pluginName string
	vol        volume.UniqueName
	attrs      volume.Attributes
	spec       *volume.Spec
	pod        volume.PodInfo
	// gen is the content generation the DSW wants for the pod's mount.
	gen uint64
}

func newOpWorld(t *testing.T, kind opKind) *opWorld {
	t.Helper()
	clock := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w := &opWorld{
		asw: cache.NewActualStateOfWorld(clock), dsw: cache.NewDesiredStateOfWorld(clock),
		plugin: &opFakePlugin{name: opFakeName}, paths: volume.Paths{Root: t.TempDir()},
		pluginName: opFakeName,
		pod:        volume.PodInfo{PodRef: volume.PodRef{UID: opPod, Namespace: "ns", Name: "p1"}},
		gen:        1,
	}
	// No Claims or Events: the fake never grows a volume, and these tests
	// stay independent of the expansion tests' fakes.
	w.op = &Operator{
		Plugins: plugins.NewRegistry(w.plugin, opPlainPlugin{}), ASW: w.asw, DSW: w.dsw, Paths: w.paths, Log: zap.NewNop(),
	}
	// RequiresRemount only makes the volumes like those whose content
	// follows their sources; the operator does not look at it.
	switch kind {
	case opAttachable:
		w.attrs = volume.Attributes{Identity: "pv-1", DeviceMountable: true, Attachable: true, RequiresRemount: true}
	case opDeviceMountable:
		w.attrs = volume.Attributes{Identity: "pv-1", DeviceMountable: true, RequiresRemount: true}
	case opPodScoped:
		w.attrs = volume.Attributes{RequiresRemount: true}
	default:
		t.Fatalf("unknown volume kind %q", kind)
	}
	if w.attrs.Shared() {
		pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}}
		w.spec = &volume.Spec{Name: "pv-1", PV: pv, Mode: v1.PersistentVolumeFilesystem}
		w.vol = volume.SharedName(opFakeName, "pv-1")
	} else {
		w.spec = &volume.Spec{Name: "scratch", Volume: &v1.Volume{Name: "scratch"}}
		w.vol = volume.PodScopedName(opFakeName, opPod, "scratch")
	}
	return w
}

func (w *opWorld) id() cache.VolumeIdentity {
	return cache.VolumeIdentity{Name: w.vol, Plugin: w.pluginName, Attributes: w.attrs, Spec: w.spec}
}

// target is what the planner hands a volume-wide operation.
func (w *opWorld) target() *Target {
	return &Target{Volume: w.vol, Plugin: w.pluginName, Attributes: w.attrs, Spec: w.spec, SpecName: w.spec.Name,
		Waiting: []volume.PodRef{w.pod.PodRef}}
}

// podTarget is what the planner hands an operation for the pod.
func (w *opWorld) podTarget() *Target {
	t := w.target()
	t.Pod, t.Waiting, t.ContentGeneration = w.pod, nil, w.gen
	return t
}

// unmountTarget is what the planner hands the pod's unmount.
func (w *opWorld) unmountTarget() *Target {
	t := w.podTarget()
	t.MountPath = w.podDir()
	return t
}

func (w *opWorld) deviceMountPath() string {
	return w.paths.DeviceMountPath(w.pluginName, w.attrs.Identity)
}
func (w *opWorld) podDir() string { return w.paths.PodVolumeDir(opPod, w.pluginName, w.spec.Name) }

// want makes pod (opPod or opOtherPod) want the volume.
func (w *opWorld) want(t *testing.T, pod types.UID) {
	t.Helper()
	info := volume.PodInfo{PodRef: volume.PodRef{UID: pod, Namespace: "ns", Name: "p-" + string(pod)}}
	pv := cache.PodVolume{Name: w.vol, Plugin: w.pluginName, Attributes: w.attrs, OuterName: "vol", Spec: w.spec}
	w.dsw.SetPod(info, []cache.PodVolume{pv}, nil, nil)
}

func (w *opWorld) mount(state cache.MountState) cache.ActualPodMount {
	return cache.ActualPodMount{Pod: w.pod.PodRef, SpecName: w.spec.Name, MountPath: w.podDir(), State: state, Spec: w.spec, ContentGeneration: w.gen}
}

// The prior states of the volume, in the order an agent reaches them. Each
// includes the earlier steps the volume's kind has (an attachable volume
// with a mounted device is attached).
func (w *opWorld) attach(*testing.T) {
	if w.attrs.Attachable {
		w.asw.SetAttachState(w.id(), cache.Attached, opDevice, map[string]string{"from": "attach"})
	}
}

func (w *opWorld) mountDevice(t *testing.T) {
	w.attach(t)
	if w.attrs.DeviceMountable {
		w.makeDir(t, w.deviceMountPath())
		w.asw.SetDeviceState(w.id(), cache.DeviceGloballyMounted, "", w.deviceMountPath())
	}
}

func (w *opWorld) mountPod(t *testing.T) {
	w.mountDevice(t)
	w.makeDir(t, w.podDir())
	w.asw.SetPodMount(w.id(), w.mount(cache.Mounted))
}

func (w *opWorld) makeDir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
}

// reconstructed records what a restart finds on disk: an uncertain device
// mount (and attachment), or an uncertain pod mount, neither matched with a
// pod yet.
func (w *opWorld) reconstructed(t *testing.T, device, pod bool) {
	v := &cache.ActualVolume{Name: w.vol, Plugin: w.pluginName, Attributes: w.attrs, DeviceState: cache.DeviceNotMounted,
		Pods: cache.PodSet[cache.ActualPodMount]{}}
	if device {
		w.makeDir(t, w.deviceMountPath())
		v.DeviceState, v.DeviceReconstructed, v.DeviceMountPath = cache.DeviceMountUncertain, true, w.deviceMountPath()
		if w.attrs.Attachable {
			v.AttachState = cache.AttachUncertain
		}
	}
	if pod {
		w.makeDir(t, w.podDir())
		v.Pods = v.Pods.With(opPod, &cache.ActualPodMount{Pod: volume.PodRef{UID: opPod}, SpecName: w.spec.Name, MountPath: w.podDir(),
			State: cache.MountUncertain, Reconstructed: true})
	}
	w.asw.AddReconstructed([]*cache.ActualVolume{v})
}

var opPriors = map[string]func(w *opWorld, t *testing.T){
	"nothing": func(*opWorld, *testing.T) {},
	"attach uncertain": func(w *opWorld, _ *testing.T) {
		w.asw.SetAttachState(w.id(), cache.AttachUncertain, "", nil)
	},
	"attached": (*opWorld).attach,
	"device uncertain": func(w *opWorld, t *testing.T) {
		w.attach(t)
		w.makeDir(t, w.deviceMountPath())
		w.asw.SetDeviceState(w.id(), cache.DeviceMountUncertain, "", w.deviceMountPath())
	},
	// Found on disk after a restart; the attachment has been verified
	// since (the planner attaches before it mounts a device).
	"device reconstructed": func(w *opWorld, t *testing.T) {
		w.reconstructed(t, true, false)
		w.attach(t)
	},
	"device mounted": (*opWorld).mountDevice,
	"pod uncertain": func(w *opWorld, t *testing.T) {
		w.mountDevice(t)
		w.makeDir(t, w.podDir())
		w.asw.SetPodMount(w.id(), w.mount(cache.MountUncertain))
	},
	// Found on disk after a restart: the device mount was found mounted
	// and adopted, the pod's mount was not found mounted.
	"pod reconstructed": func(w *opWorld, t *testing.T) {
		w.reconstructed(t, w.attrs.DeviceMountable, true)
		w.attach(t)
		w.asw.Adopt(w.id(), true, nil)
	},
	"pod mounted": (*opWorld).mountPod,
	// What the content is built from changed since it was written.
	"pod remount required": func(w *opWorld, t *testing.T) {
		w.mountPod(t)
		w.gen++
	},
}

// state sums up the volume's ASW entry, e.g.
// "attach=Attached device=GloballyMounted uid-1=Mounted"; "none" when the
// ASW has no entry.
func (w *opWorld) state() string {
	av, ok := w.asw.Volume(w.vol)
	if !ok {
		return "none"
	}
	attach := string(av.AttachState)
	if attach == "" {
		attach = "-"
	}
	s := fmt.Sprintf("attach=%s device=%s", attach, av.DeviceState)
	if av.DeviceReconstructed {
		s += "(reconstructed)"
	}
	for _, uid := range slices.Sorted(av.Pods.UIDs()) {
		m := av.Pods.At(uid)
		s += fmt.Sprintf(" %s=%s", uid, m.State)
		if m.Reconstructed {
			s += "(reconstructed)"
		}
		if m.State == cache.Mounted && cache.ContentOutdated(m, w.gen) {
			s += "(remount)"
		}
	}
	return s
}

// opCase is one row of an operator table.
type opCase struct {
	kind  opKind
	prior string
	// wantedBy lists the pods the DSW has wanting the volume.
	wantedBy []types.UID
	outcome  opOutcome
	// wantErr: "" (nil), "stale" (ErrStale), "uncertain" or "final" (the
	// plugin's error, passed on), or a substring of another error.
	wantErr string
	// wantCall: the plugin's method was called (once).
	wantCall bool
	wantASW  string
}

func (c opCase) name() string {
	n := string(c.kind) + "/" + c.prior
	for _, uid := range c.wantedBy {
		n += "/wanted-by-" + string(uid)
	}
	if c.outcome != "" {
		n += "/" + string(c.outcome)
	}
	return n
}

func checkOpErr(t *testing.T, err error, want string) {
	t.Helper()
	ok := false
	switch want {
	case "":
		ok = err == nil
	case "stale":
		ok = errors.Is(err, ErrStale)
	case "uncertain":
		ok = volume.IsUncertain(err) && errors.Is(err, errOpTimeout)
	case "final":
		ok = errors.Is(err, errOpFinal) && !volume.IsUncertain(err)
	default:
		ok = err != nil && !errors.Is(err, ErrStale) && strings.Contains(err.Error(), want)
	}
	if !ok {
		t.Errorf("error %v, want %s", err, want)
	}
}

// runOpCases runs each case: prior state, plugin outcome, then body; it
// checks the error, whether the plugin's method was called and the ASW.
func runOpCases(t *testing.T, method string, cases []opCase, body func(w *opWorld) error) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name(), func(t *testing.T) {
			w := newOpWorld(t, c.kind)
			prior, ok := opPriors[c.prior]
			if !ok {
				t.Fatalf("unknown prior state %q", c.prior)
			}
			prior(w, t)
			for _, uid := range c.wantedBy {
				w.want(t, uid)
			}
			w.plugin.outcome = c.outcome
			before := w.state()

			err := body(w)

			checkOpErr(t, err, c.wantErr)
			calls := w.plugin.methods()
			switch {
			case c.wantCall && !slices.Equal(calls, []string{method}):
				t.Errorf("plugin calls %v, want one %s", calls, method)
			case !c.wantCall && len(calls) > 0:
				t.Errorf("plugin calls %v, want none", calls)
			}
			if got := w.state(); got != c.wantASW {
				t.Errorf("ASW %q → %q, want %q", before, got, c.wantASW)
			}
		})
	}
}

func TestOperatorMountDevice(t *testing.T) {
	const attached = "attach=Attached device="
	cases := []opCase{
		// Never before the attachment is confirmed.
		{kind: opAttachable, prior: "nothing", wantErr: "stale", wantASW: "none"},
		{kind: opAttachable, prior: "attach uncertain", wantErr: "stale", wantASW: "attach=Uncertain device=NotMounted"},

		{kind: opAttachable, prior: "attached", outcome: opSucceeds, wantCall: true, wantASW: attached + "GloballyMounted"},
		{kind: opAttachable, prior: "attached", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: attached + "Uncertain"},
		{kind: opAttachable, prior: "attached", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: attached + "NotMounted"},

		// A final error after an uncertain mount means the plugin left
		// nothing mounted.
		{kind: opAttachable, prior: "device uncertain", outcome: opSucceeds, wantCall: true, wantASW: attached + "GloballyMounted"},
		{kind: opAttachable, prior: "device uncertain", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: attached + "Uncertain"},
		{kind: opAttachable, prior: "device uncertain", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: attached + "NotMounted"},

		// A device mount found on disk: the same, and the mark that it was
		// reconstructed goes, whatever the outcome: the operation's result
		// is what the agent now knows.
		{kind: opAttachable, prior: "device reconstructed", outcome: opSucceeds, wantCall: true, wantASW: attached + "GloballyMounted"},
		{kind: opAttachable, prior: "device reconstructed", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: attached + "Uncertain"},
		{kind: opAttachable, prior: "device reconstructed", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: attached + "NotMounted"},

		// Mounted since the plan was made.
		{kind: opAttachable, prior: "device mounted", wantErr: "stale", wantASW: attached + "GloballyMounted"},
		{kind: opAttachable, prior: "pod mounted", wantErr: "stale", wantASW: attached + "GloballyMounted uid-1=Mounted"},

		// Nothing to wait for when the volume is not attachable.
		{kind: opDeviceMountable, prior: "nothing", outcome: opSucceeds, wantCall: true, wantASW: "attach=- device=GloballyMounted"},
		{kind: opDeviceMountable, prior: "nothing", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: "attach=- device=Uncertain"},
		{kind: opDeviceMountable, prior: "nothing", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "none"},
		{kind: opDeviceMountable, prior: "device uncertain", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "none"},
		{kind: opDeviceMountable, prior: "device mounted", wantErr: "stale", wantASW: "attach=- device=GloballyMounted"},
	}
	runOpCases(t, "MountDevice", cases, func(w *opWorld) error {
		return w.op.MountDevice(t.Context(), w.target())
	})
}

func TestOperatorMountVolume(t *testing.T) {
	const mounted = "attach=Attached device=GloballyMounted"
	cases := []opCase{
		// Never before the device is mounted.
		{kind: opAttachable, prior: "nothing", wantErr: "stale", wantASW: "none"},
		{kind: opAttachable, prior: "attached", wantErr: "stale", wantASW: "attach=Attached device=NotMounted"},
		{kind: opAttachable, prior: "device uncertain", wantErr: "stale", wantASW: "attach=Attached device=Uncertain"},

		{kind: opAttachable, prior: "device mounted", outcome: opSucceeds, wantCall: true, wantASW: mounted + " uid-1=Mounted"},
		{kind: opAttachable, prior: "device mounted", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: mounted + " uid-1=Uncertain"},
		{kind: opAttachable, prior: "device mounted", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: mounted},

		// A final error after an uncertain mount means the plugin left
		// nothing mounted.
		{kind: opAttachable, prior: "pod uncertain", outcome: opSucceeds, wantCall: true, wantASW: mounted + " uid-1=Mounted"},
		{kind: opAttachable, prior: "pod uncertain", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: mounted + " uid-1=Uncertain"},
		{kind: opAttachable, prior: "pod uncertain", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: mounted},

		// ...except for a mount found on disk: it stays uncertain, to be
		// torn down properly.
		{kind: opAttachable, prior: "pod reconstructed", outcome: opSucceeds, wantCall: true, wantASW: mounted + " uid-1=Mounted"},
		{kind: opAttachable, prior: "pod reconstructed", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: mounted + " uid-1=Uncertain"},
		{kind: opAttachable, prior: "pod reconstructed", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: mounted + " uid-1=Uncertain(reconstructed)"},

		// Mounted since the plan was made...
		{kind: opAttachable, prior: "pod mounted", wantErr: "stale", wantASW: mounted + " uid-1=Mounted"},
		// ...unless it must be set up again; a failure leaves it mounted.
		{kind: opAttachable, prior: "pod remount required", outcome: opSucceeds, wantCall: true, wantASW: mounted + " uid-1=Mounted"},
		{kind: opAttachable, prior: "pod remount required", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: mounted + " uid-1=Uncertain"},
		{kind: opAttachable, prior: "pod remount required", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: mounted + " uid-1=Mounted(remount)"},

		// A volume without a device mount.
		{kind: opPodScoped, prior: "nothing", outcome: opSucceeds, wantCall: true, wantASW: "attach=- device=NotMounted uid-1=Mounted"},
		{kind: opPodScoped, prior: "nothing", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: "attach=- device=NotMounted uid-1=Uncertain"},
		{kind: opPodScoped, prior: "nothing", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "none"},
		{kind: opPodScoped, prior: "pod uncertain", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "none"},
		{kind: opPodScoped, prior: "pod reconstructed", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "attach=- device=NotMounted uid-1=Uncertain(reconstructed)"},
		{kind: opPodScoped, prior: "pod mounted", wantErr: "stale", wantASW: "attach=- device=NotMounted uid-1=Mounted"},
	}
	runOpCases(t, "SetUp", cases, func(w *opWorld) error {
		return w.op.MountVolume(t.Context(), w.podTarget())
	})
}

func TestOperatorUnmountVolume(t *testing.T) {
	const mounted = "attach=Attached device=GloballyMounted"
	cases := []opCase{
		{kind: opAttachable, prior: "nothing", wantErr: "stale", wantASW: "none"},
		{kind: opAttachable, prior: "device mounted", wantErr: "stale", wantASW: mounted},
		// The pod wants it again since the plan was made.
		{kind: opAttachable, prior: "pod mounted", wantedBy: []types.UID{opPod}, wantErr: "stale", wantASW: mounted + " uid-1=Mounted"},

		// Any failure leaves the mount uncertain: it may be half torn
		// down.
		{kind: opAttachable, prior: "pod mounted", outcome: opSucceeds, wantCall: true, wantASW: mounted},
		{kind: opAttachable, prior: "pod mounted", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: mounted + " uid-1=Uncertain"},
		{kind: opAttachable, prior: "pod mounted", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: mounted + " uid-1=Uncertain"},
		// Another pod wanting the volume does not keep this pod's mount.
		{kind: opAttachable, prior: "pod mounted", wantedBy: []types.UID{opOtherPod}, outcome: opSucceeds, wantCall: true, wantASW: mounted},

		{kind: opAttachable, prior: "pod uncertain", outcome: opSucceeds, wantCall: true, wantASW: mounted},
		{kind: opAttachable, prior: "pod uncertain", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: mounted + " uid-1=Uncertain"},
		{kind: opAttachable, prior: "pod reconstructed", outcome: opSucceeds, wantCall: true, wantASW: mounted},
		{kind: opAttachable, prior: "pod reconstructed", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: mounted + " uid-1=Uncertain(reconstructed)"},
		{kind: opAttachable, prior: "pod remount required", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: mounted + " uid-1=Uncertain"},

		{kind: opPodScoped, prior: "pod mounted", outcome: opSucceeds, wantCall: true, wantASW: "none"},
		{kind: opPodScoped, prior: "pod mounted", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "attach=- device=NotMounted uid-1=Uncertain"},
		{kind: opPodScoped, prior: "pod reconstructed", outcome: opSucceeds, wantCall: true, wantASW: "none"},
	}
	runOpCases(t, "TearDown", cases, func(w *opWorld) error {
		podDir := w.paths.PodDir(opPod)
		existed := dirExists(podDir)
		err := w.op.UnmountVolume(t.Context(), w.unmountTarget())
		// The pod's directories go with its last volume, and only then.
		switch gone := existed && !dirExists(podDir); {
		case err == nil && existed && !gone:
			t.Errorf("pod directory %s left after the volume was torn down", podDir)
		case err != nil && gone:
			t.Errorf("pod directory %s removed although tearing down failed", podDir)
		}
		return err
	})
}

func TestOperatorUnmountDevice(t *testing.T) {
	cases := []opCase{
		{kind: opAttachable, prior: "nothing", wantErr: "stale", wantASW: "none"},
		{kind: opAttachable, prior: "attached", wantErr: "stale", wantASW: "attach=Attached device=NotMounted"},
		// A pod wants it again, or still has it mounted.
		{kind: opAttachable, prior: "device mounted", wantedBy: []types.UID{opOtherPod}, wantErr: "stale", wantASW: "attach=Attached device=GloballyMounted"},
		{kind: opAttachable, prior: "pod mounted", wantErr: "stale", wantASW: "attach=Attached device=GloballyMounted uid-1=Mounted"},
		{kind: opAttachable, prior: "pod reconstructed", wantErr: "stale", wantASW: "attach=Attached device=GloballyMounted uid-1=Uncertain(reconstructed)"},

		// Any failure leaves the device mount uncertain.
		{kind: opAttachable, prior: "device mounted", outcome: opSucceeds, wantCall: true, wantASW: "attach=Attached device=NotMounted"},
		{kind: opAttachable, prior: "device mounted", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: "attach=Attached device=Uncertain"},
		{kind: opAttachable, prior: "device mounted", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "attach=Attached device=Uncertain"},
		{kind: opAttachable, prior: "device uncertain", outcome: opSucceeds, wantCall: true, wantASW: "attach=Attached device=NotMounted"},
		{kind: opAttachable, prior: "device uncertain", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "attach=Attached device=Uncertain"},
		{kind: opAttachable, prior: "device reconstructed", outcome: opSucceeds, wantCall: true, wantASW: "attach=Attached device=NotMounted"},
		{kind: opAttachable, prior: "device reconstructed", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "attach=Attached device=Uncertain(reconstructed)"},

		// Nothing is left of a volume that is not attachable.
		{kind: opDeviceMountable, prior: "device mounted", outcome: opSucceeds, wantCall: true, wantASW: "none"},
		{kind: opDeviceMountable, prior: "device mounted", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "attach=- device=Uncertain"},
	}
	runOpCases(t, "UnmountDevice", cases, func(w *opWorld) error {
		dir := w.paths.VolumeDir(w.pluginName, w.attrs.Identity)
		existed := dirExists(dir)
		err := w.op.UnmountDevice(t.Context(), w.target())
		// The volume's directory goes once the device is unmounted (the
		// plugin removed what it had in it), and only then.
		switch gone := existed && !dirExists(dir); {
		case err == nil && existed && !gone:
			t.Errorf("volume directory %s left after the device was unmounted", dir)
		case err != nil && gone:
			t.Errorf("volume directory %s removed although unmounting failed", dir)
		}
		return err
	})
}

func TestOperatorVerifyAttached(t *testing.T) {
	cases := []opCase{
		{kind: opAttachable, prior: "nothing", outcome: opSucceeds, wantCall: true, wantASW: "attach=Attached device=NotMounted"},
		{kind: opAttachable, prior: "nothing", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: "attach=Uncertain device=NotMounted"},
		{kind: opAttachable, prior: "nothing", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "none"},
		// A final error does not make an uncertain attachment certain
		// either way: it is still detached when no pod wants it.
		{kind: opAttachable, prior: "attach uncertain", outcome: opSucceeds, wantCall: true, wantASW: "attach=Attached device=NotMounted"},
		{kind: opAttachable, prior: "attach uncertain", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: "attach=Uncertain device=NotMounted"},
		{kind: opAttachable, prior: "attach uncertain", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "attach=Uncertain device=NotMounted"},
		{kind: opAttachable, prior: "attached", wantErr: "stale", wantASW: "attach=Attached device=NotMounted"},
		{kind: opAttachable, prior: "device mounted", wantErr: "stale", wantASW: "attach=Attached device=GloballyMounted"},
	}
	runOpCases(t, "Attach", cases, func(w *opWorld) error {
		return w.op.VerifyAttached(t.Context(), w.target())
	})
}

func TestOperatorDetachVolume(t *testing.T) {
	cases := []opCase{
		{kind: opAttachable, prior: "nothing", wantErr: "stale", wantASW: "none"},
		// A pod wants it again, or its device may still be mounted.
		{kind: opAttachable, prior: "attached", wantedBy: []types.UID{opOtherPod}, wantErr: "stale", wantASW: "attach=Attached device=NotMounted"},
		{kind: opAttachable, prior: "device mounted", wantErr: "stale", wantASW: "attach=Attached device=GloballyMounted"},
		{kind: opAttachable, prior: "device uncertain", wantErr: "stale", wantASW: "attach=Attached device=Uncertain"},
		{kind: opAttachable, prior: "pod mounted", wantErr: "stale", wantASW: "attach=Attached device=GloballyMounted uid-1=Mounted"},

		// A failed detach changes nothing: it is retried.
		{kind: opAttachable, prior: "attached", outcome: opSucceeds, wantCall: true, wantASW: "none"},
		{kind: opAttachable, prior: "attached", outcome: opUncertain, wantErr: "uncertain", wantCall: true, wantASW: "attach=Attached device=NotMounted"},
		{kind: opAttachable, prior: "attached", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "attach=Attached device=NotMounted"},
		{kind: opAttachable, prior: "attach uncertain", outcome: opSucceeds, wantCall: true, wantASW: "none"},
		{kind: opAttachable, prior: "attach uncertain", outcome: opFinal, wantErr: "final", wantCall: true, wantASW: "attach=Uncertain device=NotMounted"},
	}
	runOpCases(t, "Detach", cases, func(w *opWorld) error {
		dir := w.paths.VolumeDir(w.pluginName, w.attrs.Identity)
		w.makeDir(t, dir)
		err := w.op.DetachVolume(t.Context(), w.target())
		if gone := !dirExists(dir); err == nil && !gone {
			t.Errorf("volume directory %s left after detaching", dir)
		} else if err != nil && gone {
			t.Errorf("volume directory %s removed although the volume was not detached", dir)
		}
		return err
	})
}

// A plugin without the capability an operation needs, or a plugin that is
// not there, is a final error; the ASW does not change.
func TestOperatorMissingCapability(t *testing.T) {
	type body func(w *opWorld) error
	mountDevice := func(w *opWorld) error { return w.op.MountDevice(t.Context(), w.target()) }
	unmountDevice := func(w *opWorld) error { return w.op.UnmountDevice(t.Context(), w.target()) }
	attach := func(w *opWorld) error { return w.op.VerifyAttached(t.Context(), w.target()) }
	detach := func(w *opWorld) error { return w.op.DetachVolume(t.Context(), w.target()) }
	mountVolume := func(w *opWorld) error { return w.op.MountVolume(t.Context(), w.podTarget()) }
	unmountVolume := func(w *opWorld) error { return w.op.UnmountVolume(t.Context(), w.unmountTarget()) }
	cases := []struct {
		name    string
		plugin  string
		prior   string
		body    body
		wantErr string
	}{
		{"mount device", opPlainName, "attached", mountDevice, "cannot mount devices"},
		{"unmount device", opPlainName, "device mounted", unmountDevice, "cannot unmount devices"},
		{"attach", opPlainName, "nothing", attach, "cannot attach volumes"},
		{"detach", opPlainName, "attached", detach, "cannot detach volumes"},
		{"mount device, unknown plugin", "test/missing", "attached", mountDevice, `"test/missing" is not available`},
		{"mount volume, unknown plugin", "test/missing", "device mounted", mountVolume, `"test/missing" is not available`},
		{"unmount volume, unknown plugin", "test/missing", "pod mounted", unmountVolume, `"test/missing" is not available`},
		{"unmount device, unknown plugin", "test/missing", "device mounted", unmountDevice, `"test/missing" is not available`},
		{"attach, unknown plugin", "test/missing", "nothing", attach, `"test/missing" is not available`},
		{"detach, unknown plugin", "test/missing", "attached", detach, `"test/missing" is not available`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newOpWorld(t, opAttachable)
			w.pluginName = c.plugin
			opPriors[c.prior](w, t)
			before := w.state()
			checkOpErr(t, c.body(w), c.wantErr)
			if got := w.state(); got != before {
				t.Errorf("ASW %q → %q, want it unchanged", before, got)
			}
		})
	}
}

// What the ASW recorded reaches the plugin: attaching's device path and
// publish context the device mount and every pod's set up, the device
// mount's path every pod's set up and tear down, each pod mount's spec its
// tear down.
func TestOperatorPassesRecordedState(t *testing.T) {
	w := newOpWorld(t, opAttachable)
	ctx := t.Context()
	wantPC := map[string]string{"from": "attach"}

	if err := w.op.VerifyAttached(ctx, w.target()); err != nil {
		t.Fatal(err)
	}
	if req := w.plugin.last(t, "Attach").(plugins.AttachRequest); req.VolumeName != w.vol || req.Spec != w.spec {
		t.Errorf("Attach request %+v: want the volume and its spec", req)
	}

	if err := w.op.MountDevice(ctx, w.target()); err != nil {
		t.Fatal(err)
	}
	dreq := w.plugin.last(t, "MountDevice").(plugins.DeviceRequest)
	if dreq.DevicePath != opDevice || !maps.Equal(dreq.PublishContext, wantPC) || dreq.DeviceMountPath != w.deviceMountPath() ||
		dreq.Identity != "pv-1" || !dreq.Attachable || dreq.Spec != w.spec {
		t.Errorf("MountDevice request %+v: want device %s, publish context %v, device mount path %s, identity pv-1, attachable, the spec",
			dreq, opDevice, wantPC, w.deviceMountPath())
	}
	if av, _ := w.asw.Volume(w.vol); av.DeviceMountPath != w.deviceMountPath() || av.DevicePath != opDevice {
		t.Errorf("ASW device path %q, device mount path %q: want %s, %s", av.DevicePath, av.DeviceMountPath, opDevice, w.deviceMountPath())
	}

	if err := w.op.MountVolume(ctx, w.podTarget()); err != nil {
		t.Fatal(err)
	}
	sreq := w.plugin.last(t, "SetUp").(plugins.SetUpRequest)
	if sreq.Dir != w.podDir() || sreq.DeviceMountPath != w.deviceMountPath() || sreq.DevicePath != opDevice ||
		!maps.Equal(sreq.PublishContext, wantPC) || sreq.Pod != w.pod || sreq.Spec != w.spec {
		t.Errorf("SetUp request %+v: want dir %s, device mount path %s, device %s, publish context %v, the pod and its spec",
			sreq, w.podDir(), w.deviceMountPath(), opDevice, wantPC)
	}
	if m := w.asw.PodMounts(opPod); len(m) != 1 || m[0].MountPath != w.podDir() || m[0].SpecName != "pv-1" || m[0].Spec != w.spec {
		t.Errorf("ASW pod mounts %+v: want one at %s for spec pv-1", m, w.podDir())
	}

	// The pod goes away: the planner's target for it no longer has a spec.
	gone := w.unmountTarget()
	gone.Spec = nil
	gone.Attributes.NoSizeLimit = true // the hint travels from the target's attributes
	if err := w.op.UnmountVolume(ctx, gone); err != nil {
		t.Fatal(err)
	}
	treq := w.plugin.last(t, "TearDown").(plugins.TearDownRequest)
	if treq.Dir != w.podDir() || treq.DeviceMountPath != w.deviceMountPath() || treq.Spec != w.spec || treq.Pod != w.pod.PodRef || !treq.NoSizeLimit {
		t.Errorf("TearDown request %+v: want dir %s, device mount path %s, the mount's spec and pod, the no-size-limit hint", treq, w.podDir(), w.deviceMountPath())
	}

	if err := w.op.UnmountDevice(ctx, w.target()); err != nil {
		t.Fatal(err)
	}
	ureq := w.plugin.last(t, "UnmountDevice").(plugins.DeviceRequest)
	if ureq.DeviceMountPath != w.deviceMountPath() || ureq.DevicePath != opDevice || ureq.Identity != "pv-1" || ureq.Spec != w.spec {
		t.Errorf("UnmountDevice request %+v: want device mount path %s, device %s, identity pv-1, the spec", ureq, w.deviceMountPath(), opDevice)
	}

	if err := w.op.DetachVolume(ctx, w.target()); err != nil {
		t.Fatal(err)
	}
	if req := w.plugin.last(t, "Detach").(plugins.AttachRequest); req.VolumeName != w.vol || req.Spec != w.spec {
		t.Errorf("Detach request %+v: want the volume and its spec", req)
	}
	if got := w.state(); got != "none" {
		t.Errorf("ASW after the whole cycle: %s, want none", got)
	}
}

// A device mount found on disk whose path was not recorded is unmounted at
// the plugin's device mount path, without a spec.
func TestOperatorUnmountReconstructedDeviceWithoutPath(t *testing.T) {
	w := newOpWorld(t, opDeviceMountable)
	w.asw.AddReconstructed([]*cache.ActualVolume{{
		Name: w.vol, Plugin: w.pluginName, Attributes: w.attrs, DeviceState: cache.DeviceMountUncertain, DeviceReconstructed: true,
		Pods: cache.PodSet[cache.ActualPodMount]{},
	}})
	target := w.target()
	target.Spec = nil
	if err := w.op.UnmountDevice(t.Context(), target); err != nil {
		t.Fatal(err)
	}
	req := w.plugin.last(t, "UnmountDevice").(plugins.DeviceRequest)
	if req.DeviceMountPath != w.deviceMountPath() || req.Spec != nil || req.Identity != "pv-1" {
		t.Errorf("UnmountDevice request %+v: want device mount path %s, identity pv-1 and no spec", req, w.deviceMountPath())
	}
	if got := w.state(); got != "none" {
		t.Errorf("ASW %s, want none", got)
	}
}

func dirExists(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.IsDir()
}
