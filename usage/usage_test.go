package usage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

// world is a node's caches with pods and their volumes.
type world struct {
	dsw *cache.DesiredStateOfWorld
	asw *cache.ActualStateOfWorld
	dir string
}

func newWorld(t testing.TB) *world {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	return &world{dsw: cache.NewDesiredStateOfWorld(clk), asw: cache.NewActualStateOfWorld(clk), dir: t.TempDir()}
}

type vol struct {
	name, plugin string
	medium       v1.StorageMedium
	limit        string
	state        cache.MountState // "": not mounted
}

// pod adds a pod with its volumes, each with a directory of its own.
func (w *world) pod(t testing.TB, name string, ephemeral string, vols ...vol) {
	t.Helper()
	info := volume.PodInfo{PodRef: volume.PodRef{UID: types.UID("uid-" + name), Namespace: "ns", Name: name}}
	if ephemeral != "" {
		q := resource.MustParse(ephemeral)
		info.EphemeralStorageLimit = &q
	}
	var pvs []cache.PodVolume
	for _, v := range vols {
		src := v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/srv"}}
		if v.plugin == emptydir.Name {
			ed := &v1.EmptyDirVolumeSource{Medium: v.medium}
			if v.limit != "" {
				q := resource.MustParse(v.limit)
				ed.SizeLimit = &q
			}
			src = v1.VolumeSource{EmptyDir: ed}
		}
		spec := &volume.Spec{Name: v.name, Volume: &v1.Volume{Name: v.name, VolumeSource: src}, Mode: v1.PersistentVolumeFilesystem}
		un := volume.PodScopedName(v.plugin, info.UID, v.name)
		pvs = append(pvs, cache.PodVolume{Name: un, Plugin: v.plugin, OuterName: v.name, Spec: spec})
		if v.state != "" {
			path := filepath.Join(w.dir, name, v.name)
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
			w.asw.SetPodMount(cache.VolumeIdentity{Name: un, Plugin: v.plugin, Spec: spec},
				cache.ActualPodMount{Pod: info.PodRef, SpecName: v.name, MountPath: path, State: v.state})
		}
	}
	w.dsw.SetPod(info, pvs, nil, nil)
}

func (w *world) path(pod, vol string) string { return filepath.Join(w.dir, pod, vol) }

func TestTargets(t *testing.T) {
	w := newWorld(t)
	w.pod(t, "a", "", vol{name: "data", plugin: emptydir.Name, limit: "16Mi", state: cache.Mounted},
		vol{name: "mem", plugin: emptydir.Name, medium: v1.StorageMediumMemory, state: cache.Mounted},
		vol{name: "host", plugin: hostpath.Name, state: cache.Mounted},
		vol{name: "late", plugin: emptydir.Name},
		vol{name: "odd", plugin: emptydir.Name, state: cache.MountUncertain})
	tests := []struct {
		name     string
		hostPath bool
		want     []string
	}{
		{"emptyDirs mounted", false, []string{"data emptyDir 16777216", "mem emptyDir (Memory) 0"}},
		{"and hostPath when asked", true, []string{"data emptyDir 16777216", "host hostPath 0", "mem emptyDir (Memory) 0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, tg := range Targets(w.dsw.Snapshot(), w.asw.Snapshot(), tc.hostPath) {
				got = append(got, tg.Volume+" "+string(tg.Kind)+" "+itoa(tg.Limit))
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("targets %q, want %q", got, tc.want)
			}
		})
	}
}

func itoa(n int64) string { return resource.NewQuantity(n, resource.DecimalSI).String() }

func TestSchedule(t *testing.T) {
	tg := func(n string) Target { return Target{Pod: volume.PodRef{UID: "u"}, Volume: n} }
	t0 := time.Unix(100, 0)
	last := map[key]time.Time{tg("a").key(): t0.Add(2 * time.Second), tg("b").key(): t0}
	var got []string
	for _, x := range schedule([]Target{tg("a"), tg("b"), tg("c")}, last) {
		got = append(got, x.Volume)
	}
	if strings.Join(got, "") != "cba" {
		t.Errorf("order %v, want never measured first, then oldest: c b a", got)
	}
}

func TestOverLimits(t *testing.T) {
	const mi = 1 << 20
	disk := func(pod, v string, limit int64) Target {
		return Target{Pod: volume.PodRef{UID: types.UID(pod), Name: pod}, Volume: v, Kind: DiskEmptyDir, Limit: limit}
	}
	mem := disk("p", "mem", 0)
	mem.Kind = MemoryEmptyDir
	q := resource.MustParse("10Mi")
	tests := []struct {
		name    string
		targets []Target
		used    map[string]int64 // volume -> bytes; absent: not measured
		limit   *resource.Quantity
		want    []string // reason/volume
	}{
		{"under its sizeLimit", []Target{disk("p", "a", 16*mi)}, map[string]int64{"a": 16 * mi}, nil, nil},
		{"over its sizeLimit", []Target{disk("p", "a", 16*mi)}, map[string]int64{"a": 16*mi + 1}, nil, []string{"EmptyDirOverLimit/a"}},
		{"no sizeLimit", []Target{disk("p", "a", 0)}, map[string]int64{"a": 1 << 40}, nil, nil},
		{"not measured yet", []Target{disk("p", "a", 1)}, map[string]int64{}, nil, nil},
		{"emptyDirs summed over the pod's limit", []Target{disk("p", "a", 0), disk("p", "b", 0)}, map[string]int64{"a": 6 * mi, "b": 5 * mi}, &q,
			[]string{"EphemeralStorageOverLimit/"}},
		{"summed, at the limit", []Target{disk("p", "a", 0), disk("p", "b", 0)}, map[string]int64{"a": 5 * mi, "b": 5 * mi}, &q, nil},
		{"memory emptyDirs are not ephemeral storage", []Target{disk("p", "a", 0), mem}, map[string]int64{"a": 5 * mi, "mem": 50 * mi}, &q, nil},
		{"both", []Target{disk("p", "a", 8*mi), disk("p", "b", 0)}, map[string]int64{"a": 9 * mi, "b": 5 * mi}, &q,
			[]string{"EphemeralStorageOverLimit/", "EmptyDirOverLimit/a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			results := map[key]*Result{}
			for _, tg := range tc.targets {
				if b, ok := tc.used[tg.Volume]; ok {
					results[tg.key()] = &Result{Target: tg, UsedBytes: b, At: time.Unix(1, 0)}
				}
			}
			got := overLimits(tc.targets, results, func(types.UID) *resource.Quantity { return tc.limit })
			var reasons []string
			for _, o := range got["p"] {
				reasons = append(reasons, o.Reason+"/"+o.Volume)
				if o.Used <= o.Limit {
					t.Errorf("%+v: used %d not over limit %d", o, o.Used, o.Limit)
				}
			}
			if strings.Join(reasons, ",") != strings.Join(tc.want, ",") {
				t.Errorf("over %q, want %q", reasons, tc.want)
			}
		})
	}
}

// The budget grants a second's worth at once, then makes each Take wait
// for the clock: no time passes in the test but the fake clock's.
func TestBudget(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	b := NewBudget(100, clk)
	ctx := context.Background()
	if err := b.Take(ctx, 100); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Take(ctx, 50) }()
	waitForWaiter(t, clk)
	select {
	case <-done:
		t.Fatal("Take returned on an empty bucket")
	default:
	}
	clk.Step(250 * time.Millisecond) // 25 entries: not enough
	waitForWaiter(t, clk)
	select {
	case <-done:
		t.Fatal("Take returned with 25 of 50 entries")
	default:
	}
	clk.Step(250 * time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A cancelled wait returns the context's error.
	cctx, cancel := context.WithCancel(ctx)
	go func() { done <- b.Take(cctx, 100) }()
	waitForWaiter(t, clk)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

func waitForWaiter(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("nobody waits on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

// fakeSource backs the volumes it has figures for.
type fakeSource struct {
	mu    sync.Mutex
	usage map[string][2]int64
	asked int
}

func (f *fakeSource) Usage(dir string) (int64, int64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	u, ok := f.usage[dir]
	return u[0], u[1], ok, nil
}

type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) Event(obj events.Object, typ, reason, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, obj.Name+" "+typ+" "+reason+": "+msg)
}

// A round measures from the source what it backs and walks the rest; a
// pod over its sizeLimit gets one event however many rounds find it so,
// a warning in its explanation, and OnChange is called when that changes.
func TestMeasurer(t *testing.T) {
	w := newWorld(t)
	w.pod(t, "big", "", vol{name: "data", plugin: emptydir.Name, limit: "1Mi", state: cache.Mounted},
		vol{name: "quota", plugin: emptydir.Name, limit: "1Gi", state: cache.Mounted})
	w.pod(t, "small", "", vol{name: "data", plugin: emptydir.Name, limit: "1Mi", state: cache.Mounted})
	if err := os.WriteFile(filepath.Join(w.path("big", "data"), "f"), make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{usage: map[string][2]int64{w.path("big", "quota"): {4096, 3}}}
	rec := &recorder{}
	changes := 0
	m := New(Options{DSW: w.dsw.Snapshot, ASW: w.asw.Snapshot, Source: src, Events: rec, OnChange: func() { changes++ }})
	for range 2 {
		m.Refresh(context.Background())
	}
	got := map[string]Result{}
	for _, r := range m.Results() {
		got[r.Pod.Name+"/"+r.Volume] = r
	}
	if r := got["big/data"]; r.Method != MethodWalk || r.UsedBytes < 2<<20 || r.InodesUsed != 2 {
		t.Errorf("big/data: %+v, want a walk of 2 MiB and 2 inodes", r)
	}
	if r := got["big/quota"]; r.Method != MethodSource || r.UsedBytes != 4096 || r.InodesUsed != 3 {
		t.Errorf("big/quota: %+v, want the source's figures", r)
	}
	if r := got["small/data"]; r.Method != MethodWalk || r.UsedBytes > 1<<20 {
		t.Errorf("small/data: %+v", r)
	}
	if len(rec.events) != 1 || !strings.Contains(rec.events[0], `big Warning EmptyDirOverLimit: Usage of EmptyDir volume "data" exceeds the limit "1Mi".`) {
		t.Errorf("events %q, want one EmptyDirOverLimit for big", rec.events)
	}
	if changes != 1 {
		t.Errorf("OnChange called %d times, want once", changes)
	}
	ws := m.OverLimit("uid-big")
	if len(ws) != 1 || ws[0].Reason != explain.ReasonEmptyDirOverLimit || ws[0].Volume != "data" || m.OverLimit("uid-small") != nil {
		t.Errorf("OverLimit: big %+v, small %+v", ws, m.OverLimit("uid-small"))
	}
	// The pod cleans up: the warning goes, and a new overage warns again.
	if err := os.Remove(filepath.Join(w.path("big", "data"), "f")); err != nil {
		t.Fatal(err)
	}
	m.Refresh(context.Background())
	if m.OverLimit("uid-big") != nil || changes != 2 {
		t.Errorf("after cleanup: %+v, %d changes", m.OverLimit("uid-big"), changes)
	}
	// A pod that is gone leaves no result.
	w.dsw.DeletePod("uid-small")
	m.Refresh(context.Background())
	for _, r := range m.Results() {
		if r.Pod.Name == "small" {
			t.Errorf("result of a gone pod kept: %+v", r)
		}
	}
}

// A walk that fails keeps the volume's last figures and says why.
func TestMeasurerKeepsLastFigures(t *testing.T) {
	w := newWorld(t)
	w.pod(t, "p", "", vol{name: "data", plugin: emptydir.Name, state: cache.Mounted})
	m := New(Options{DSW: w.dsw.Snapshot, ASW: w.asw.Snapshot})
	m.Refresh(context.Background())
	before := m.Results()[0]
	if err := os.RemoveAll(w.path("p", "data")); err != nil {
		t.Fatal(err)
	}
	m.Refresh(context.Background())
	after := m.Results()[0]
	if after.Err == "" || after.At != before.At || after.UsedBytes != before.UsedBytes || !after.Measured() {
		t.Errorf("after a failed walk %+v, before %+v", after, before)
	}
}
