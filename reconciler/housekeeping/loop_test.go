package housekeeping

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/volume"
)

// loopWorld is a Loop on real caches and a real root directory: a pod the
// DSW wants, whose volume directory holds data, and the empty tree of a
// pod that is gone.
type loopWorld struct {
	*hkWorld
	dsw      *cache.DesiredStateOfWorld
	asw      *cache.ActualStateOfWorld
	clk      *clocktesting.FakeClock
	complete bool
	busy     bool
	data     string
	loop     *Loop
}

func newLoopWorld(t *testing.T) *loopWorld {
	w := &loopWorld{hkWorld: newHKWorld(t), clk: clocktesting.NewFakeClock(time.Unix(1e9, 0)), complete: true}
	w.dsw, w.asw = cache.NewDesiredStateOfWorld(w.clk), cache.NewActualStateOfWorld(w.clk)
	name := volume.PodScopedName("kubernetes.io/empty-dir", "live", "scratch")
	w.dsw.SetPod(volume.PodInfo{PodRef: volume.PodRef{UID: "live"}}, []cache.PodVolume{
		{Name: name, Plugin: "kubernetes.io/empty-dir", OuterName: "scratch", Spec: &volume.Spec{Name: "scratch"}},
	}, nil, nil)
	w.data = w.file("live/volumes/kubernetes.io~empty-dir/scratch/data", "tenant data")
	w.mkdir("gone/volumes/kubernetes.io~empty-dir/scratch")
	idle := make(chan struct{})
	close(idle)
	w.loop = NewLoop(LoopOptions{
		DSW: w.dsw, ASW: w.asw, Paths: w.paths, IsMountPoint: w.isMountPoint,
		SourcesComplete: func() bool { return w.complete },
		Idle: func() <-chan struct{} {
			if w.busy {
				return make(chan struct{})
			}
			return idle
		},
		Orphans: NewOrphans(zap.NewNop()), Period: time.Minute, Clock: w.clk,
	})
	return w
}

func (w *loopWorld) gone() bool { return !w.exists(filepath.Join(w.paths.PodsDir(), "gone")) }

// The loop cleans only once the agent is idle: the sources complete, no
// operation running, nothing found after a restart left unmatched; and it
// never removes a pod's data.
func TestLoopCleansOnlyWhenIdle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(w *loopWorld)
		clean bool
	}{
		{name: "idle", setup: func(*loopWorld) {}, clean: true},
		{name: "sources incomplete", setup: func(w *loopWorld) { w.complete = false }},
		{name: "operation running", setup: func(w *loopWorld) { w.busy = true }},
		{name: "reconstructed state left", setup: func(w *loopWorld) {
			name := volume.PodScopedName("kubernetes.io/empty-dir", "found", "v")
			w.asw.AddReconstructed([]*cache.ActualVolume{{Name: name, Plugin: "kubernetes.io/empty-dir", DeviceState: cache.DeviceNotMounted,
				Pods: cache.PodSetOf(map[types.UID]*cache.ActualPodMount{"found": {Pod: volume.PodRef{UID: "found"}, State: cache.MountUncertain, Reconstructed: true}})}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newLoopWorld(t)
			tc.setup(w)
			if got := w.loop.Once(); got != tc.clean {
				t.Errorf("Once() = %v, want %v", got, tc.clean)
			}
			if w.gone() != tc.clean {
				t.Errorf("gone pod's tree removed: %v, want %v", w.gone(), tc.clean)
			}
			if !w.exists(w.data) {
				t.Error("the data of a pod the DSW wants was removed")
			}
		})
	}
}

// At most one cleanup per period.
func TestLoopCleansOncePerPeriod(t *testing.T) {
	w := newLoopWorld(t)
	if !w.loop.Once() {
		t.Fatal("first cleanup did not run")
	}
	w.mkdir("gone/volumes")
	w.clk.Step(time.Minute - time.Second)
	if w.loop.Once() || w.gone() {
		t.Error("cleaned again within the period")
	}
	w.clk.Step(time.Second)
	if !w.loop.Once() || !w.gone() {
		t.Error("did not clean once the period was over")
	}
}

// Run cleans in its own goroutine when a reconciler pass wakes it.
func TestLoopRunsAfterPasses(t *testing.T) {
	w := newLoopWorld(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.loop.Run(ctx) }()
	defer func() { cancel(); <-done }()
	w.loop.Reconciled(w.dsw.Snapshot(), w.asw.Snapshot(), nil, 0)
	for deadline := time.Now().Add(10 * time.Second); !w.gone(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the gone pod's tree is still there 10s after a pass")
		}
	}
	if !w.exists(w.data) {
		t.Error("the data of a pod the DSW wants was removed")
	}
}
