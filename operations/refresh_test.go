package operations

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// contentPlugin is a per-pod plugin whose content follows its sources: its
// SetUp reports a refresh time, and a hook runs during SetUp.
type contentPlugin struct {
	refreshAt time.Time
	during    func()
	err       error
}

func (p *contentPlugin) Name() string                 { return "test/content" }
func (p *contentPlugin) CanSupport(*volume.Spec) bool { return true }
func (p *contentPlugin) Attributes(*volume.Spec) (volume.Attributes, error) {
	return volume.Attributes{RequiresRemount: true}, nil
}
func (p *contentPlugin) SetUp(_ context.Context, req *plugins.SetUpRequest) error {
	if p.during != nil {
		p.during()
	}
	req.RefreshAt = p.refreshAt
	return p.err
}
func (p *contentPlugin) TearDown(context.Context, *plugins.TearDownRequest) error { return nil }

type refreshCall struct {
	name      volume.UniqueName
	pod       types.UID
	gen       uint64
	refreshAt time.Time
}

type fakeRefresh struct {
	gen   uint64
	calls []refreshCall
}

func (f *fakeRefresh) Generation(volume.UniqueName, types.UID) uint64 { return f.gen }
func (f *fakeRefresh) MountDone(name volume.UniqueName, pod types.UID, gen uint64, at time.Time) {
	f.calls = append(f.calls, refreshCall{name, pod, gen, at})
}

func TestMountVolumeTellsRefresh(t *testing.T) {
	at := time.Date(2026, 11, 22, 11, 0, 0, 0, time.UTC)
	p := &contentPlugin{refreshAt: at}
	ref := &fakeRefresh{gen: 3}
	asw := cache.NewActualStateOfWorld(clocktesting.NewFakeClock(at))
	o := &Operator{Plugins: plugins.NewRegistry(p), ASW: asw, DSW: cache.NewDesiredStateOfWorld(clocktesting.NewFakeClock(at)),
		Paths: volume.Paths{Root: t.TempDir()}, Log: zap.NewNop(), Refresh: ref}
	pod := volume.PodInfo{PodRef: volume.PodRef{UID: "p1", Namespace: "ns", Name: "p"}}
	target := &Target{Volume: "test/content/p1-v", Plugin: p.Name(), Attributes: volume.Attributes{RequiresRemount: true},
		Spec: &volume.Spec{Name: "v"}, Pod: pod, SpecName: "v"}

	// The generation is read before SetUp: a change that comes in while
	// SetUp runs must not count as written.
	p.during = func() { ref.gen = 4 }
	if err := o.MountVolume(context.Background(), target); err != nil {
		t.Fatal(err)
	}
	if len(ref.calls) != 1 || ref.calls[0] != (refreshCall{target.Volume, "p1", 3, at}) {
		t.Fatalf("MountDone calls %+v", ref.calls)
	}

	// A remount that fails tells nothing (the volume stays remount-required).
	asw.MarkPodVolumeRemountRequired(target.Volume, "p1")
	p.err = errors.New("source unreachable")
	if err := o.MountVolume(context.Background(), target); err == nil {
		t.Fatal("want the plugin's error")
	}
	if len(ref.calls) != 1 {
		t.Errorf("MountDone after a failure: %+v", ref.calls)
	}
	if m, _ := asw.Snapshot().PodMount(target.Volume, "p1"); m.State != cache.Mounted || !m.RemountRequired {
		t.Errorf("after a failed remount the mount is %+v: want still mounted, still remount-required", m)
	}
}
