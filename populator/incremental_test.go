package populator

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/volume"
)

// liveRecorder keeps the pods a PodObserver was told are there.
type liveRecorder struct {
	mu   sync.Mutex
	live map[types.UID]string
}

func (r *liveRecorder) PodUpdated(pod *v1.Pod, used []*v1.Volume) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live == nil {
		r.live = map[types.UID]string{}
	}
	r.live[pod.UID] = fmt.Sprintf("%s/%s %d", pod.Namespace, pod.Name, len(used))
}

func (r *liveRecorder) PodRemoved(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.live, uid)
}

// A populator that follows the source's pod changes leaves the DSW, its
// pod observer and the events as one that looks at every pod on every
// pass does, through random changes: pods added, changed, replaced by
// another pod under the same name, moved to another name, terminated and
// removed, and claims that appear, go or cannot be read yet.
func TestIncrementalSyncMatchesFullSync(t *testing.T) {
	dir := t.TempDir()
	const names, claims = 8, 3
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 0))
		incRec, fullRec := &liveRecorder{}, &liveRecorder{}
		var hostReady atomic.Bool
		inc := newHarness(t, func(o *Options) { o.Pods, o.Plugins = incRec, waitingPlugins(t, &hostReady) })
		full := newHarness(t, func(o *Options) {
			o.Source, o.Pods, o.Plugins = fullSource{inc.src}, fullRec, waitingPlugins(t, &hostReady)
		})
		src := inc.src

		pods := map[string]*v1.Pod{} // by name: the source's pods
		uids := 0
		publish := func() {
			list := make([]*v1.Pod, 0, len(pods))
			for _, p := range pods {
				list = append(list, p)
			}
			slices.SortFunc(list, func(a, b *v1.Pod) int { return strings.Compare(a.Name, b.Name) })
			src.SetPods(list...)
		}
		newVersion := func(name string, uid types.UID) *v1.Pod {
			var opts []podOpt
			for i := range 2 {
				if rng.IntN(2) == 0 {
					opts = append(opts, withVolume(emptyDirVol(fmt.Sprintf("e%d", i))))
				}
			}
			if rng.IntN(2) == 0 {
				opts = append(opts, withVolume(claimVol("data", fmt.Sprintf("c%d", rng.IntN(claims)))))
			}
			if rng.IntN(4) == 0 {
				opts = append(opts, withVolume(hostPathVol("host", dir)))
			}
			if rng.IntN(8) == 0 {
				opts = append(opts, withPhase(v1.PodSucceeded))
			}
			p := newPod(name, opts...)
			p.UID = uid
			return p
		}
		for step := range 200 {
			name := fmt.Sprintf("p%d", rng.IntN(names))
			switch op := rng.IntN(100); {
			case op < 40: // a new version of the pod under the name
				uid := types.UID(fmt.Sprintf("uid-%d", uids))
				if old, ok := pods[name]; ok && rng.IntN(3) > 0 {
					uid = old.UID
				} else {
					uids++
				}
				pods[name] = newVersion(name, uid)
				publish()
			case op < 50: // moved: the same pod under another name
				old, ok := pods[name]
				to := fmt.Sprintf("p%d", rng.IntN(names))
				if !ok || to == name {
					continue
				}
				delete(pods, name)
				pods[to] = newVersion(to, old.UID)
				publish()
			case op < 65:
				delete(pods, name)
				publish()
			case op < 72:
				claim := fmt.Sprintf("c%d", rng.IntN(claims))
				pvc, pv := boundPair(claim, "pv-"+claim, dir)
				src.Add(pvc, pv)
			case op < 77:
				src.DeletePVC(testNS, fmt.Sprintf("c%d", rng.IntN(claims)))
			case op < 82:
				var err error
				if rng.IntN(2) == 0 {
					err = source.NotRead(errors.New("not read yet"))
				}
				src.SetPVCError(testNS, fmt.Sprintf("c%d", rng.IntN(claims)), err)
			case op < 92:
				// The host path plugin's answer comes or goes: no source
				// change, seen by the next pass of the pods waiting for it.
				hostReady.Store(!hostReady.Load())
			}
			inc.pop.Sync(false)
			full.pop.Sync(false)

			a, b := inc.snapshot(), full.snapshot()
			if !reflect.DeepEqual(maps.Collect(a.Pods()), maps.Collect(b.Pods())) || !reflect.DeepEqual(maps.Collect(a.Volumes()), maps.Collect(b.Volumes())) {
				t.Fatalf("seed %d step %d: DSW differs:\nincremental %v\nfull        %v", seed, step, podSummary(maps.Collect(a.Pods())), podSummary(maps.Collect(b.Pods())))
			}
			if !reflect.DeepEqual(incRec.live, fullRec.live) {
				t.Fatalf("seed %d step %d: pod observer differs:\nincremental %v\nfull        %v", seed, step, incRec.live, fullRec.live)
			}
			ea, eb := slices.Sorted(slices.Values(inc.events.list())), slices.Sorted(slices.Values(full.events.list()))
			if !slices.Equal(ea, eb) {
				t.Fatalf("seed %d step %d: events differ:\nincremental %v\nfull        %v", seed, step, ea, eb)
			}
		}
	}
}

// waitingPlugins are the test plugins with a host path plugin that cannot
// answer (plugins.ErrNotReady) until ready.
func waitingPlugins(t *testing.T, ready *atomic.Bool) *plugins.Registry {
	return testPluginsWrappingHostPath(t, nil, func(p plugins.Plugin) plugins.Plugin { return notReadyPlugin{p, ready} })
}

type notReadyPlugin struct {
	plugins.Plugin
	ready *atomic.Bool
}

func (p notReadyPlugin) Attributes(spec *volume.Spec) (volume.Attributes, error) {
	if !p.ready.Load() {
		return volume.Attributes{}, fmt.Errorf("looking at the host: %w", plugins.ErrNotReady)
	}
	return p.Plugin.Attributes(spec)
}

func podSummary[P any](pods map[types.UID]P) []string {
	var out []string
	for uid, p := range pods {
		out = append(out, fmt.Sprintf("%s:%+v", uid, p))
	}
	slices.Sort(out)
	return out
}

// BenchmarkSyncOnePodArrives: a node with 1,000 pods of four volumes; one
// pod arrives and the populator syncs, then it goes and the populator
// syncs again. "changed" follows the source's pod changes, "every-pod"
// looks at every pod as it did before them.
func BenchmarkSyncOnePodArrives(b *testing.B) {
	for _, mode := range []string{"changed", "every-pod"} {
		b.Run(mode, func(b *testing.B) {
			t := &testing.T{}
			h := newHarness(t, func(o *Options) {
				if mode == "every-pod" {
					o.Source = fullSource{o.Source}
				}
			})
			four := func(name string) *v1.Pod {
				var opts []podOpt
				for i := range 4 {
					opts = append(opts, withVolume(emptyDirVol(fmt.Sprintf("v%d", i))))
				}
				return newPod(name, opts...)
			}
			pods := make([]*v1.Pod, 0, 1001)
			for i := range 1000 {
				pods = append(pods, four(fmt.Sprintf("p%04d", i)))
			}
			h.src.SetPods(pods...)
			h.pop.Sync(false)
			arriving := four("new")
			b.ReportAllocs()
			for b.Loop() {
				h.src.Add(arriving)
				h.pop.Sync(false)
				h.src.Delete(arriving)
				h.pop.Sync(false)
			}
			if h.snapshot().PodsLen() != 1000 {
				b.Fatalf("%d pods desired", h.snapshot().PodsLen())
			}
		})
	}
}

// BenchmarkSyncStorm: 1,000 pods of four Memory emptyDirs (the storm of
// issue 30) arrive in batches of 50, the populator syncing after each;
// then they all go. One op is the whole storm; the source's own work is
// not timed.
func BenchmarkSyncStorm(b *testing.B) {
	const pods, batch = 1000, 50
	h := newHarness(&testing.T{})
	all := make([]*v1.Pod, 0, pods)
	for i := range pods {
		var opts []podOpt
		for j := range 4 {
			vol := emptyDirVol(fmt.Sprintf("v%d", j))
			vol.EmptyDir.Medium = v1.StorageMediumMemory
			opts = append(opts, withVolume(vol))
		}
		p := newPod(fmt.Sprintf("p%04d", i), opts...)
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
		all = append(all, p)
	}
	h.pop.Sync(false)
	b.ReportAllocs()
	for b.Loop() {
		for i := batch; i <= pods; i += batch {
			b.StopTimer()
			h.src.SetPods(all[:i]...)
			b.StartTimer()
			h.pop.Sync(false)
		}
		if n := h.snapshot().PodsLen(); n != pods {
			b.Fatalf("%d pods desired, want %d", n, pods)
		}
		b.StopTimer()
		h.src.SetPods()
		b.StartTimer()
		h.pop.Sync(false)
		if n := h.snapshot().PodsLen(); n != 0 {
			b.Fatalf("%d pods desired, want none", n)
		}
	}
}
