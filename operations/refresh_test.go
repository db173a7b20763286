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
// SetUp reports a refresh time.
type contentPlugin struct {
	refreshAt time.Time
	err       error
}

func (p *contentPlugin) Name() string                 { return "test/content" }
func (p *contentPlugin) CanSupport(*volume.Spec) bool { return true }
func (p *contentPlugin) Attributes(*volume.Spec) (volume.Attributes, error) {
	return volume.Attributes{RequiresRemount: true}, nil
}
func (p *contentPlugin) SetUp(_ context.Context, req *plugins.SetUpRequest) error {
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
	calls []refreshCall
}

func (f *fakeRefresh) MountDone(name volume.UniqueName, pod types.UID, gen uint64, at time.Time) {
	f.calls = append(f.calls, refreshCall{name, pod, gen, at})
}

// TestMountVolumeRecordsContentGeneration: a set up records in the ASW the
// content generation it was planned with and tells the refresher; a failed
// one records nothing, so the mount keeps its older content and is planned
// again.
func TestMountVolumeRecordsContentGeneration(t *testing.T) {
	at := time.Date(2026, 11, 22, 11, 0, 0, 0, time.UTC)
	p := &contentPlugin{refreshAt: at}
	ref := &fakeRefresh{}
	asw := cache.NewActualStateOfWorld(clocktesting.NewFakeClock(at))
	o := &Operator{Plugins: plugins.NewRegistry(p), ASW: asw, DSW: cache.NewDesiredStateOfWorld(clocktesting.NewFakeClock(at)),
		Paths: volume.Paths{Root: t.TempDir()}, Log: zap.NewNop(), Refresh: ref}
	pod := volume.PodInfo{PodRef: volume.PodRef{UID: "p1", Namespace: "ns", Name: "p"}}
	target := &Target{Volume: "test/content/p1-v", Plugin: p.Name(), Attributes: volume.Attributes{RequiresRemount: true},
		Spec: &volume.Spec{Name: "v"}, Pod: pod, SpecName: "v", ContentGeneration: 3}

	if err := o.MountVolume(context.Background(), target); err != nil {
		t.Fatal(err)
	}
	if len(ref.calls) != 1 || ref.calls[0] != (refreshCall{target.Volume, "p1", 3, at}) {
		t.Fatalf("MountDone calls %+v", ref.calls)
	}
	if m, _ := asw.Snapshot().PodMount(target.Volume, "p1"); m.State != cache.Mounted || m.ContentGeneration != 3 {
		t.Fatalf("mount %+v: want Mounted at generation 3", m)
	}
	// Planned again for the same generation (a plan from before the
	// mount was recorded): nothing to do.
	if err := o.MountVolume(context.Background(), target); !errors.Is(err, ErrStale) {
		t.Errorf("set up of content already written = %v, want ErrStale", err)
	}

	// The sources changed (generation 4), and the rewrite fails.
	newer := *target
	newer.ContentGeneration = 4
	p.err = errors.New("source unreachable")
	if err := o.MountVolume(context.Background(), &newer); err == nil {
		t.Fatal("want the plugin's error")
	}
	if len(ref.calls) != 1 {
		t.Errorf("MountDone after a failure: %+v", ref.calls)
	}
	if m, _ := asw.Snapshot().PodMount(target.Volume, "p1"); m.State != cache.Mounted || m.ContentGeneration != 3 || !cache.PodMountNeeded(m, 4) {
		t.Errorf("after a failed rewrite the mount is %+v: want still mounted at generation 3, set up again for 4", m)
	}
}
