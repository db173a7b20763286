package operations

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/blockpin"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

const blockFakeName = "test/block-fake"

// blockFake is a BlockMapper that records its calls in a log shared with the
// pinner's, so tests can check the order of pins and plugin calls.
type blockFake struct {
	mu   sync.Mutex
	log  *[]string
	fail map[string]error // by call name
}

func (f *blockFake) call(name, path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	*f.log = append(*f.log, name+" "+path)
	return f.fail[name]
}

func (f *blockFake) Name() string                 { return blockFakeName }
func (f *blockFake) CanSupport(*volume.Spec) bool { return true }
func (f *blockFake) SetUp(context.Context, *plugins.SetUpRequest) error {
	return errors.New("SetUp called for a block volume")
}
func (f *blockFake) TearDown(context.Context, *plugins.TearDownRequest) error {
	return errors.New("TearDown called for a block volume")
}
func (f *blockFake) Attributes(*volume.Spec) (volume.Attributes, error) {
	return volume.Attributes{}, nil
}
func (f *blockFake) MapDevice(_ context.Context, r *plugins.DeviceRequest) error {
	return f.call("MapDevice", r.DeviceMountPath)
}
func (f *blockFake) UnmapDevice(_ context.Context, r *plugins.DeviceRequest) error {
	return f.call("UnmapDevice", r.DeviceMountPath)
}
func (f *blockFake) MapPodDevice(_ context.Context, r *plugins.SetUpRequest) error {
	if _, err := os.Stat(filepath.Dir(r.Dir)); err != nil {
		return err // the operator makes the parent
	}
	return f.call("MapPodDevice", r.Dir)
}
func (f *blockFake) UnmapPodDevice(_ context.Context, r *plugins.TearDownRequest) error {
	return f.call("UnmapPodDevice", r.Dir)
}

// loggingPins is blockpin.Memory writing into the shared log.
type loggingPins struct {
	blockpin.Memory
	log *[]string
	mu  *sync.Mutex
}

func (p *loggingPins) Pin(path string) error {
	p.mu.Lock()
	*p.log = append(*p.log, "pin "+path)
	p.mu.Unlock()
	return p.Memory.Pin(path)
}

func (p *loggingPins) Unpin(path string) error {
	p.mu.Lock()
	*p.log = append(*p.log, "unpin "+path)
	p.mu.Unlock()
	return p.Memory.Unpin(path)
}

type blockWorld struct {
	op     *Operator
	asw    *cache.ActualStateOfWorld
	dsw    *cache.DesiredStateOfWorld
	plugin *blockFake
	pins   *loggingPins
	log    []string
	paths  volume.Paths
	t      *Target
}

func newBlockWorld(t *testing.T, staged bool) *blockWorld {
	t.Helper()
	clock := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w := &blockWorld{asw: cache.NewActualStateOfWorld(clock), dsw: cache.NewDesiredStateOfWorld(clock), paths: volume.Paths{Root: t.TempDir()}}
	var mu sync.Mutex
	w.plugin = &blockFake{log: &w.log, fail: map[string]error{}}
	w.pins = &loggingPins{log: &w.log, mu: &mu, Memory: blockpin.Memory{Fail: map[string]error{}}}
	w.op = &Operator{Plugins: plugins.NewRegistry(w.plugin, opPlainPlugin{}), ASW: w.asw, DSW: w.dsw, Paths: w.paths, Log: zap.NewNop(), Pins: w.pins}
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}}
	spec := &volume.Spec{Name: "pv-1", PV: pv, Mode: v1.PersistentVolumeBlock}
	attrs := volume.Attributes{Identity: "pv-1", Block: true, DeviceMountable: staged}
	w.t = &Target{Volume: volume.SharedName(blockFakeName, "pv-1"), Plugin: blockFakeName, Attributes: attrs, Spec: spec, SpecName: "pv-1",
		Pod: volume.PodInfo{PodRef: volume.PodRef{UID: opPod, Namespace: "ns", Name: "p1"}}}
	return w
}

func (w *blockWorld) id() cache.VolumeIdentity {
	return cache.VolumeIdentity{Name: w.t.Volume, Plugin: w.t.Plugin, Attributes: w.t.Attributes, Spec: w.t.Spec}
}

func (w *blockWorld) accessPoint() string { return w.paths.PodDevicePath(opPod, blockFakeName, "pv-1") }

func (w *blockWorld) want() {
	pv := cache.PodVolume{Name: w.t.Volume, Plugin: w.t.Plugin, Attributes: w.t.Attributes, OuterName: "vol", Spec: w.t.Spec}
	w.dsw.SetPod(w.t.Pod, []cache.PodVolume{pv}, nil, nil)
}

func (w *blockWorld) podState() cache.MountState {
	v, ok := w.asw.Volume(w.t.Volume)
	if !ok || v.Pods.At(opPod) == nil {
		return ""
	}
	return v.Pods.At(opPod).State
}

func TestMapVolume(t *testing.T) {
	errBoom := errors.New("boom")
	cases := []struct {
		name      string
		pluginErr error
		pinErr    error
		wantState cache.MountState
		wantLog   []string
		wantErr   string
		wantPin   bool
	}{
		{name: "mapped and pinned", wantState: cache.Mounted, wantLog: []string{"MapPodDevice AP", "pin AP"}, wantPin: true},
		{name: "pin fails: uncertain", pinErr: errBoom, wantState: cache.MountUncertain,
			wantLog: []string{"MapPodDevice AP", "pin AP"}, wantErr: "boom"},
		{name: "plugin fails for good: nothing recorded, nothing pinned", pluginErr: errBoom,
			wantLog: []string{"MapPodDevice AP"}, wantErr: "boom"},
		{name: "plugin uncertain: uncertain, not pinned", pluginErr: volume.Uncertain(errBoom), wantState: cache.MountUncertain,
			wantLog: []string{"MapPodDevice AP"}, wantErr: "boom"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newBlockWorld(t, false)
			w.plugin.fail["MapPodDevice"] = tc.pluginErr
			w.pins.Fail[w.accessPoint()] = tc.pinErr
			err := w.op.MapVolume(context.Background(), w.t)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("MapVolume = %v, want error %q", err, tc.wantErr)
			}
			if tc.pinErr != nil && !volume.IsUncertain(err) {
				t.Errorf("a failed pin is not uncertain: %v", err)
			}
			var want []string
			for _, l := range tc.wantLog {
				want = append(want, strings.ReplaceAll(l, "AP", w.accessPoint()))
			}
			if !slices.Equal(w.log, want) {
				t.Errorf("calls %q, want %q", w.log, want)
			}
			if got := w.podState(); got != tc.wantState {
				t.Errorf("pod mount state %q, want %q", got, tc.wantState)
			}
			if ok, _ := w.pins.Pinned(w.accessPoint()); ok != tc.wantPin {
				t.Errorf("pinned = %v, want %v", ok, tc.wantPin)
			}
			if tc.wantState != "" {
				v, _ := w.asw.Volume(w.t.Volume)
				if m := v.Pods.At(opPod); m.MountPath != w.accessPoint() || !v.Attributes.Block {
					t.Errorf("ASW records %+v (block %v), want the access point %s", m, v.Attributes.Block, w.accessPoint())
				}
			}
		})
	}
}

func TestUnmapVolume(t *testing.T) {
	errBoom := errors.New("boom")
	cases := []struct {
		name      string
		pluginErr error
		pinErr    error
		wantLog   []string
		wantState cache.MountState // after
	}{
		{name: "pin released before the access point is removed", wantLog: []string{"unpin AP", "UnmapPodDevice AP"}},
		{name: "pin cannot be released: plugin not called", pinErr: errBoom, wantLog: []string{"unpin AP"}, wantState: cache.MountUncertain},
		{name: "plugin fails: uncertain", pluginErr: errBoom, wantLog: []string{"unpin AP", "UnmapPodDevice AP"}, wantState: cache.MountUncertain},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newBlockWorld(t, false)
			if err := os.MkdirAll(filepath.Dir(w.accessPoint()), 0o750); err != nil {
				t.Fatal(err)
			}
			w.asw.SetPodMount(w.id(), cache.ActualPodMount{Pod: w.t.Pod.PodRef, SpecName: "pv-1", MountPath: w.accessPoint(), State: cache.Mounted, Spec: w.t.Spec})
			w.plugin.fail["UnmapPodDevice"] = tc.pluginErr
			w.pins.Fail[w.accessPoint()] = tc.pinErr
			w.t.MountPath = w.accessPoint()
			err := w.op.UnmapVolume(context.Background(), w.t)
			if (err != nil) != (tc.wantState != "") {
				t.Fatalf("UnmapVolume = %v", err)
			}
			var want []string
			for _, l := range tc.wantLog {
				want = append(want, strings.ReplaceAll(l, "AP", w.accessPoint()))
			}
			if !slices.Equal(w.log, want) {
				t.Errorf("calls %q, want %q", w.log, want)
			}
			if got := w.podState(); got != tc.wantState {
				t.Errorf("pod mount state %q, want %q", got, tc.wantState)
			}
			if tc.wantState == "" {
				if _, err := os.Stat(w.paths.PodDir(opPod)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("pod directory left: %v", err)
				}
			}
		})
	}
}

func TestBlockOperationsOnlyForTheirKind(t *testing.T) {
	w := newBlockWorld(t, true)
	w.want()
	if err := w.op.MountDevice(context.Background(), w.t); !errors.Is(err, ErrStale) {
		t.Errorf("mount_device of a block volume = %v, want ErrStale", err)
	}
	if err := w.op.MountVolume(context.Background(), w.t); !errors.Is(err, ErrStale) {
		t.Errorf("mount_volume of a block volume = %v, want ErrStale", err)
	}
	fs := *w.t
	fs.Attributes.Block = false
	if err := w.op.MapDevice(context.Background(), &fs); !errors.Is(err, ErrStale) {
		t.Errorf("map_device of a filesystem volume = %v, want ErrStale", err)
	}
	plain := *w.t
	plain.Plugin, plain.Attributes.DeviceMountable = opPlainName, false
	if err := w.op.MapVolume(context.Background(), &plain); err == nil || !strings.Contains(err.Error(), "does not support raw block") {
		t.Errorf("map_volume with a plugin that cannot map = %v", err)
	}
	if len(w.log) != 0 {
		t.Errorf("plugin or pinner called: %q", w.log)
	}
}

func TestMapAndUnmapDevice(t *testing.T) {
	w := newBlockWorld(t, true)
	w.want()
	ctx := context.Background()
	w.plugin.fail["MapDevice"] = volume.Uncertain(errors.New("timeout"))
	if err := w.op.MapDevice(ctx, w.t); !volume.IsUncertain(err) {
		t.Fatalf("MapDevice = %v, want uncertain", err)
	}
	if v, _ := w.asw.Volume(w.t.Volume); v.DeviceState != cache.DeviceMountUncertain {
		t.Errorf("device state %s after an uncertain map", v.DeviceState)
	}
	delete(w.plugin.fail, "MapDevice")
	if err := w.op.MapDevice(ctx, w.t); err != nil {
		t.Fatal(err)
	}
	v, _ := w.asw.Volume(w.t.Volume)
	if v.DeviceState != cache.DeviceGloballyMounted || v.DeviceMountPath != w.paths.DeviceMountPath(blockFakeName, "pv-1") {
		t.Errorf("after map_device: %+v", v)
	}
	if err := w.op.UnmapDevice(ctx, w.t); !errors.Is(err, ErrStale) {
		t.Errorf("unmap_device while a pod wants it = %v, want ErrStale", err)
	}
	w.dsw.DeletePod(opPod)
	w.plugin.fail["UnmapDevice"] = errors.New("busy")
	if err := w.op.UnmapDevice(ctx, w.t); err == nil {
		t.Fatal("UnmapDevice succeeded with a failing plugin")
	}
	if v, _ := w.asw.Volume(w.t.Volume); v.DeviceState != cache.DeviceMountUncertain {
		t.Errorf("device state %s after a failed unmap", v.DeviceState)
	}
	delete(w.plugin.fail, "UnmapDevice")
	if err := w.op.UnmapDevice(ctx, w.t); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.asw.Volume(w.t.Volume); ok {
		t.Error("volume still in the ASW after unmap_device")
	}
}
