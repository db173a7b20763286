package volumestats

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/registry"
)

const (
	capacityName   = "volume_agent_volume_stats_capacity_bytes"
	availableName  = "volume_agent_volume_stats_available_bytes"
	usedName       = "volume_agent_volume_stats_used_bytes"
	inodesName     = "volume_agent_volume_stats_inodes"
	inodesFreeName = "volume_agent_volume_stats_inodes_free"
	inodesUsedName = "volume_agent_volume_stats_inodes_used"
	errorsName     = "volume_agent_volume_stats_errors_total"
)

// A volume created, staged and published through the test CSI driver gets
// gauges for its claim that match statfs of the published path; a second
// pod of the same volume does not cause a second call; the gauges go away
// with the volume.
func TestGaugesMatchStatfsOfPublishedVolume(t *testing.T) {
	requireLoopDevices(t)
	dir := shortDir(t)
	reg := registry.New(testLogger(t).Named("registry"))
	d, drv := startDriver(t, reg, dir, "real.stats.test")
	handle, staging, target := provision(t, drv, dir, "pvc-data", 64<<20)

	// Some data, so "used" is more than the filesystem's own overhead.
	data := make([]byte, 4<<20)
	f, err := os.Create(filepath.Join(target, "data"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	w := newASW()
	v := csiVolume(claimSpec(d.Name(), handle, "team-a", "data"), staging, "pod-1", target, cache.Mounted)
	// A second pod of the same volume, whose path does not exist: if the
	// collector asked with it, the driver would fail the call.
	addPod(v, "pod-2", filepath.Join(dir, "no-such-mount"), cache.Mounted)
	w.put(v)
	c := New(Options{Registry: reg, ASW: w.snapshot, CallTimeout: 5 * time.Second, Log: testLogger(t)})

	start := time.Now()
	c.Refresh(testCtx(t))
	t.Logf("one round took %v", time.Since(start))

	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		t.Fatal(err)
	}
	bs := float64(st.Bsize)
	want := map[string]float64{
		capacityName:   float64(st.Blocks) * bs,
		availableName:  float64(st.Bavail) * bs,
		usedName:       float64(st.Blocks-st.Bfree) * bs,
		inodesName:     float64(st.Files),
		inodesFreeName: float64(st.Ffree),
		inodesUsedName: float64(st.Files - st.Ffree),
	}
	tolerance := map[string]float64{
		capacityName: 64 << 10, availableName: 1 << 20, usedName: 1 << 20, inodesName: 0, inodesFreeName: 2, inodesUsedName: 2,
	}
	for name, w := range want {
		got, ok := gauge(t, c, name, "team-a", "data")
		if !ok {
			t.Errorf("no %s for team-a/data", name)
			continue
		}
		if math.Abs(got-w) > tolerance[name] {
			t.Errorf("%s = %v, statfs says %v", name, got, w)
		}
	}
	// Capacity and inode count do not move while the volume is in use:
	// exactly what statfs says.
	exact := fmt.Sprintf(`
# HELP volume_agent_volume_stats_capacity_bytes Capacity in bytes of the volume, as its CSI driver reports it.
# TYPE volume_agent_volume_stats_capacity_bytes gauge
volume_agent_volume_stats_capacity_bytes{namespace="team-a",persistentvolumeclaim="data"} %d
# HELP volume_agent_volume_stats_inodes Maximum number of inodes in the volume, as its CSI driver reports it.
# TYPE volume_agent_volume_stats_inodes gauge
volume_agent_volume_stats_inodes{namespace="team-a",persistentvolumeclaim="data"} %d
`, int64(st.Blocks)*st.Bsize, st.Files)
	if err := testutil.CollectAndCompare(c, strings.NewReader(exact), capacityName, inodesName); err != nil {
		t.Error(err)
	}
	if got, _ := gauge(t, c, capacityName, "team-a", "data"); got < 50<<20 || got > 64<<20 {
		t.Errorf("capacity %v of a 64 MiB volume", got)
	}
	if got, _ := gauge(t, c, usedName, "team-a", "data"); got < 4<<20 {
		t.Errorf("used %v after writing 4 MiB", got)
	}
	if n := testutil.CollectAndCount(c, capacityName); n != 1 {
		t.Errorf("%d capacity series, want 1", n)
	}
	if n := d.CallCount("NodeGetVolumeStats"); n != 1 {
		t.Errorf("NodeGetVolumeStats called %d times for one volume with two pods, want 1", n)
	}
	if n := testutil.CollectAndCount(c, errorsName); n != 0 {
		t.Errorf("%d error series after a clean round", n)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}

	// The volume goes away: its gauges disappear at the next round.
	w.remove(v.Name)
	c.Refresh(testCtx(t))
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("%d series after the volume went away, want 0", n)
	}
}

// A driver hung on NodeGetVolumeStats delays another driver's volume by at
// most one call timeout, even with a single slot and several hung volumes;
// with the default concurrency it does not delay it at all, and a scrape
// during the hung round answers at once.
func TestHungDriverDoesNotBlockOthers(t *testing.T) {
	requireLoopDevices(t)
	dir := shortDir(t)
	reg := registry.New(testLogger(t).Named("registry"))
	// "a-hung" sorts first, so it gets the first slot.
	hung, _ := startDriver(t, reg, dir, "a-hung.stats.test")
	real, drv := startDriver(t, reg, dir, "b-real.stats.test")
	handle, staging, target := provision(t, drv, dir, "pvc-ok", 32<<20)
	if err := hung.SetHang("NodeGetVolumeStats", true); err != nil {
		t.Fatal(err)
	}

	w := newASW()
	w.put(csiVolume(claimSpec(real.Name(), handle, "ns", "ok"), staging, "pod-ok", target, cache.Mounted))
	// The hung driver hangs before looking at the request, so its volumes
	// need not exist.
	for _, n := range []string{"h1", "h2", "h3"} {
		w.put(csiVolume(claimSpec(hung.Name(), "vol-"+n, "ns", n), filepath.Join(dir, n, "staging"), types.UID("pod-"+n), filepath.Join(dir, n, "target"), cache.Mounted))
	}

	t.Run("one slot", func(t *testing.T) {
		const timeout = time.Second
		c := New(Options{Registry: reg, ASW: w.snapshot, Concurrency: 1, CallTimeout: timeout, Log: testLogger(t)})
		hung.ResetCallCounts()
		start := time.Now()
		c.Refresh(testCtx(t))
		took := time.Since(start)
		t.Logf("round with one slot and three hung volumes took %v (call timeout %v)", took, timeout)
		if took < timeout || took > 2*timeout {
			t.Errorf("round took %v; want one call timeout (%v), not one per hung volume", took, timeout)
		}
		if _, ok := gauge(t, c, capacityName, "ns", "ok"); !ok {
			t.Error("no stats for the healthy driver's volume")
		}
		if n := testutil.CollectAndCount(c, capacityName); n != 1 {
			t.Errorf("%d capacity series, want only the healthy volume's", n)
		}
		if n := hung.CallCount("NodeGetVolumeStats"); n != 1 {
			t.Errorf("hung driver called %d times, want 1 (its other volumes skipped after the timeout)", n)
		}
		if v := testutil.ToFloat64(c.errors.WithLabelValues(hung.Name())); v != 1 {
			t.Errorf("errors_total{driver=hung} = %v, want 1", v)
		}
	})

	t.Run("default concurrency", func(t *testing.T) {
		const timeout = 3 * time.Second
		c := New(Options{Registry: reg, ASW: w.snapshot, CallTimeout: timeout, Log: testLogger(t)})
		roundDone := make(chan struct{})
		start := time.Now()
		go func() {
			defer close(roundDone)
			c.Refresh(context.Background())
		}()
		// The healthy volume's stats are stored while the hung calls are
		// still hanging.
		for {
			if _, ok := gauge(t, c, capacityName, "ns", "ok"); ok {
				break
			}
			select {
			case <-roundDone:
				t.Fatalf("round ended after %v without stats for the healthy volume", time.Since(start))
			case <-time.After(5 * time.Millisecond):
			}
		}
		t.Logf("healthy volume's stats stored %v into the round", time.Since(start))
		scrape := time.Now()
		n := testutil.CollectAndCount(c, capacityName)
		scrapeTook := time.Since(scrape)
		select {
		case <-roundDone:
			t.Fatalf("the round ended (after %v) before the scrape could be checked against it", time.Since(start))
		default:
		}
		t.Logf("scrape during the hung round took %v", scrapeTook)
		if n != 1 || scrapeTook > 500*time.Millisecond {
			t.Errorf("scrape during a hung round: %d series in %v", n, scrapeTook)
		}
		<-roundDone
		took := time.Since(start)
		if took < timeout || took > timeout+2*time.Second {
			t.Errorf("round took %v with call timeout %v", took, timeout)
		}
		if v := testutil.ToFloat64(c.errors.WithLabelValues(hung.Name())); v < 1 {
			t.Errorf("errors_total{driver=hung} = %v", v)
		}
		if v := testutil.ToFloat64(c.errors.WithLabelValues(real.Name())); v != 0 {
			t.Errorf("errors_total{driver=real} = %v", v)
		}
	})
}

// Which volumes are asked about, and with what: only CSI volumes with a
// Mounted pod that came through a claim, whose driver is registered and
// serves stats; the staging path only for drivers that stage; one call per
// claim. Failures count per driver and drop the claim's gauges. Needs no
// root: the drivers are fakes.
func TestSelectionRequestsAndErrors(t *testing.T) {
	dir := shortDir(t)
	reg := registry.New(zap.NewNop())
	staged := &fakeDriver{name: "staged.fake", stats: true, staging: true}
	plain := &fakeDriver{name: "plain.fake", stats: true}
	nostats := &fakeDriver{name: "nostats.fake", staging: true}
	staged.serve(t, reg, dir)
	plain.serve(t, reg, dir)
	nostats.serve(t, reg, dir)

	w := newASW()
	w.put(csiVolume(claimSpec("staged.fake", "s1", "ns1", "c1"), "/stage/s1", "pod-a", "/pods/a/s1", cache.Mounted))
	staged.set("s1", usage(1000, 600, 400, 100, 90, 10), nil)
	// A second volume of the same claim (cannot happen in a cluster, but
	// the gauges are keyed by claim): asked about once.
	w.put(csiVolume(claimSpec("staged.fake", "s1-dup", "ns1", "c1"), "/stage/s1-dup", "pod-b", "/pods/b/s1", cache.Mounted))
	staged.set("s1-dup", usage(1, 1, 1, 1, 1, 1), nil)
	w.put(csiVolume(claimSpec("plain.fake", "p1", "ns2", "c2"), "/stage/p1", "pod-c", "/pods/c/p1", cache.Mounted))
	plain.set("p1", usage(2000, 1500, 500, 0, 0, 0), nil)
	// Not asked about:
	w.put(csiVolume(claimSpec("staged.fake", "uncertain", "ns1", "c3"), "/stage/u", "pod-d", "/pods/d/u", cache.MountUncertain))
	w.put(csiVolume(claimSpec("staged.fake", "inline", "", ""), "/stage/i", "pod-e", "/pods/e/i", cache.Mounted))
	w.put(csiVolume(claimSpec("nostats.fake", "n1", "ns1", "c4"), "/stage/n1", "pod-f", "/pods/f/n1", cache.Mounted))
	w.put(csiVolume(claimSpec("gone.fake", "g1", "ns1", "c5"), "/stage/g1", "pod-g", "/pods/g/g1", cache.Mounted))
	other := csiVolume(claimSpec("staged.fake", "o1", "ns1", "c6"), "", "pod-h", "/pods/h/o1", cache.Mounted)
	other.Plugin, other.Name = "kubernetes.io/local-volume", "kubernetes.io/local-volume/o1"
	w.put(other)

	c := New(Options{Registry: reg, ASW: w.snapshot, Log: testLogger(t)})
	c.Refresh(testCtx(t))

	sc := staged.calls()
	if len(sc) != 1 || sc[0].GetVolumeId() != "s1" || sc[0].GetVolumePath() != "/pods/a/s1" || sc[0].GetStagingTargetPath() != "/stage/s1" {
		t.Errorf("staged driver requests %v", sc)
	}
	pc := plain.calls()
	if len(pc) != 1 || pc[0].GetVolumeId() != "p1" || pc[0].GetVolumePath() != "/pods/c/p1" || pc[0].GetStagingTargetPath() != "" {
		t.Errorf("publish-only driver requests %v", pc)
	}
	if n := len(nostats.calls()); n != 0 {
		t.Errorf("driver without GET_VOLUME_STATS called %d times", n)
	}
	expected := `
# HELP volume_agent_volume_stats_capacity_bytes Capacity in bytes of the volume, as its CSI driver reports it.
# TYPE volume_agent_volume_stats_capacity_bytes gauge
volume_agent_volume_stats_capacity_bytes{namespace="ns1",persistentvolumeclaim="c1"} 1000
volume_agent_volume_stats_capacity_bytes{namespace="ns2",persistentvolumeclaim="c2"} 2000
# HELP volume_agent_volume_stats_used_bytes Number of used bytes in the volume, as its CSI driver reports it.
# TYPE volume_agent_volume_stats_used_bytes gauge
volume_agent_volume_stats_used_bytes{namespace="ns1",persistentvolumeclaim="c1"} 400
volume_agent_volume_stats_used_bytes{namespace="ns2",persistentvolumeclaim="c2"} 500
# HELP volume_agent_volume_stats_inodes_free Number of free inodes in the volume, as its CSI driver reports it.
# TYPE volume_agent_volume_stats_inodes_free gauge
volume_agent_volume_stats_inodes_free{namespace="ns1",persistentvolumeclaim="c1"} 90
volume_agent_volume_stats_inodes_free{namespace="ns2",persistentvolumeclaim="c2"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(expected), capacityName, usedName, inodesFreeName); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c); n != 12 {
		t.Errorf("%d series, want 6 gauges for each of 2 claims", n)
	}

	// The publish-only driver starts failing: its claim's gauges go, the
	// error is counted for the driver, the other claim is untouched.
	plain.set("p1", nil, status.Error(codes.Internal, "disk on fire"))
	c.Refresh(testCtx(t))
	if _, ok := gauge(t, c, capacityName, "ns2", "c2"); ok {
		t.Error("failing volume still has gauges")
	}
	if _, ok := gauge(t, c, capacityName, "ns1", "c1"); !ok {
		t.Error("healthy volume lost its gauges")
	}
	expectedErrors := `
# HELP volume_agent_volume_stats_errors_total NodeGetVolumeStats calls that failed or timed out, by CSI driver.
# TYPE volume_agent_volume_stats_errors_total counter
volume_agent_volume_stats_errors_total{driver="plain.fake"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(expectedErrors), errorsName); err != nil {
		t.Error(err)
	}
	plain.set("p1", usage(2000, 1000, 1000, 0, 0, 0), nil)
	c.Refresh(testCtx(t))
	if v, ok := gauge(t, c, usedName, "ns2", "c2"); !ok || v != 1000 {
		t.Errorf("recovered volume used = %v, %v", v, ok)
	}

	// The driver goes away: its claims' gauges go at the next round.
	reg.Deregister("staged.fake", "", "test")
	c.Refresh(testCtx(t))
	if _, ok := gauge(t, c, capacityName, "ns1", "c1"); ok {
		t.Error("claim of a deregistered driver still has gauges")
	}
	res := c.Results()
	if len(res) != 1 || res[0].Claim != "c2" || res[0].Driver != "plain.fake" {
		t.Errorf("results %+v", res)
	}
}

// Run polls at once and then every period, and stops with its context.
func TestRunPollsPeriodically(t *testing.T) {
	dir := shortDir(t)
	reg := registry.New(zap.NewNop())
	f := &fakeDriver{name: "periodic.fake", stats: true}
	f.serve(t, reg, dir)
	f.set("v", usage(10, 5, 5, 1, 1, 0), nil)
	w := newASW()
	w.put(csiVolume(claimSpec("periodic.fake", "v", "ns", "c"), "", "pod", "/pods/p/v", cache.Mounted))
	c := New(Options{Registry: reg, ASW: w.snapshot, Period: 20 * time.Millisecond, Log: testLogger(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	deadline := time.After(10 * time.Second)
	for len(f.calls()) < 3 {
		select {
		case <-deadline:
			t.Fatalf("%d rounds in 10 s with a 20 ms period", len(f.calls()))
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
}
