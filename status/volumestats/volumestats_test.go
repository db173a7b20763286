package volumestats

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

const (
	capacityName   = "kubelet_volume_stats_capacity_bytes"
	availableName  = "kubelet_volume_stats_available_bytes"
	usedName       = "kubelet_volume_stats_used_bytes"
	inodesName     = "kubelet_volume_stats_inodes"
	inodesFreeName = "kubelet_volume_stats_inodes_free"
	inodesUsedName = "kubelet_volume_stats_inodes_used"
	abnormalName   = "kubelet_volume_stats_health_status_abnormal"
	errorsName     = "volume_agent_volume_stats_errors_total"
	hungName       = "volume_agent_volume_stats_hung_calls"
)

// kubeletNames are the names of the kubelet's volume stats.
var kubeletNames = []string{capacityName, availableName, usedName, inodesName, inodesFreeName, inodesUsedName, abnormalName}

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
# HELP kubelet_volume_stats_capacity_bytes [ALPHA] Capacity in bytes of the volume
# TYPE kubelet_volume_stats_capacity_bytes gauge
kubelet_volume_stats_capacity_bytes{namespace="team-a",persistentvolumeclaim="data"} %d
# HELP kubelet_volume_stats_inodes [ALPHA] Maximum number of inodes in the volume
# TYPE kubelet_volume_stats_inodes gauge
kubelet_volume_stats_inodes{namespace="team-a",persistentvolumeclaim="data"} %d
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

	// No health without VOLUME_CONDITION.
	if n := testutil.CollectAndCount(c, abnormalName); n != 0 {
		t.Errorf("%d health series from a driver without VOLUME_CONDITION", n)
	}

	// The volume goes away: its gauges disappear at the next round.
	w.remove(v.Name)
	c.Refresh(testCtx(t))
	if n := testutil.CollectAndCount(c, kubeletNames...); n != 0 {
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
# HELP kubelet_volume_stats_capacity_bytes [ALPHA] Capacity in bytes of the volume
# TYPE kubelet_volume_stats_capacity_bytes gauge
kubelet_volume_stats_capacity_bytes{namespace="ns1",persistentvolumeclaim="c1"} 1000
kubelet_volume_stats_capacity_bytes{namespace="ns2",persistentvolumeclaim="c2"} 2000
# HELP kubelet_volume_stats_used_bytes [ALPHA] Number of used bytes in the volume
# TYPE kubelet_volume_stats_used_bytes gauge
kubelet_volume_stats_used_bytes{namespace="ns1",persistentvolumeclaim="c1"} 400
kubelet_volume_stats_used_bytes{namespace="ns2",persistentvolumeclaim="c2"} 500
# HELP kubelet_volume_stats_inodes_free [ALPHA] Number of free inodes in the volume
# TYPE kubelet_volume_stats_inodes_free gauge
kubelet_volume_stats_inodes_free{namespace="ns1",persistentvolumeclaim="c1"} 90
kubelet_volume_stats_inodes_free{namespace="ns2",persistentvolumeclaim="c2"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(expected), capacityName, usedName, inodesFreeName); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, kubeletNames...); n != 12 {
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
# HELP volume_agent_volume_stats_errors_total Volume stats that could not be read, by CSI driver (the plugin, kubernetes.io/local-volume, for local volumes): failed or timed-out calls, and calls not made because an earlier one on the same path hangs.
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

// Local volumes are read as the kubelet reads them: a filesystem volume by
// statfs of the pod's mount (all six figures), a Block volume by the size
// of the device at its access point (capacity only, the rest 0), neither
// with a health series.
func TestLocalVolumes(t *testing.T) {
	mounttest.RequireRoot(t)
	dir := mounttest.TempDir(t)
	fsMount := filepath.Join(dir, "pods", "pod-fs", "volumes", "kubernetes.io~local-volume", "pv-fs")
	if err := os.MkdirAll(fsMount, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", fsMount, "tmpfs", 0, "size=8m,nr_inodes=2000"); err != nil {
		t.Fatal(err)
	}
	mounttest.WriteFile(t, filepath.Join(fsMount, "data"), strings.Repeat("d", 1<<20))
	dev := mounttest.LoopDevice(t, 5<<20)
	access := filepath.Join(dir, "pods", "pod-blk", "volumeDevices", "kubernetes.io~local-volume", "pv-blk")
	if err := os.MkdirAll(filepath.Dir(access), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(access, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev, access, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}

	w := newASW()
	w.put(localVolume("pv-fs", "team-l", "files", false, "pod-fs", fsMount))
	w.put(localVolume("pv-blk", "team-l", "raw", true, "pod-blk", access))
	c := New(Options{ASW: w.snapshot, Log: testLogger(t)})
	c.Refresh(testCtx(t))

	var st unix.Statfs_t
	if err := unix.Statfs(fsMount, &st); err != nil {
		t.Fatal(err)
	}
	bs := st.Bsize
	expected := fmt.Sprintf(`
# HELP kubelet_volume_stats_available_bytes [ALPHA] Number of available bytes in the volume
# TYPE kubelet_volume_stats_available_bytes gauge
kubelet_volume_stats_available_bytes{namespace="team-l",persistentvolumeclaim="files"} %d
kubelet_volume_stats_available_bytes{namespace="team-l",persistentvolumeclaim="raw"} 0
# HELP kubelet_volume_stats_capacity_bytes [ALPHA] Capacity in bytes of the volume
# TYPE kubelet_volume_stats_capacity_bytes gauge
kubelet_volume_stats_capacity_bytes{namespace="team-l",persistentvolumeclaim="files"} %d
kubelet_volume_stats_capacity_bytes{namespace="team-l",persistentvolumeclaim="raw"} %d
# HELP kubelet_volume_stats_inodes [ALPHA] Maximum number of inodes in the volume
# TYPE kubelet_volume_stats_inodes gauge
kubelet_volume_stats_inodes{namespace="team-l",persistentvolumeclaim="files"} 2000
kubelet_volume_stats_inodes{namespace="team-l",persistentvolumeclaim="raw"} 0
# HELP kubelet_volume_stats_inodes_free [ALPHA] Number of free inodes in the volume
# TYPE kubelet_volume_stats_inodes_free gauge
kubelet_volume_stats_inodes_free{namespace="team-l",persistentvolumeclaim="files"} %d
kubelet_volume_stats_inodes_free{namespace="team-l",persistentvolumeclaim="raw"} 0
# HELP kubelet_volume_stats_inodes_used [ALPHA] Number of used inodes in the volume
# TYPE kubelet_volume_stats_inodes_used gauge
kubelet_volume_stats_inodes_used{namespace="team-l",persistentvolumeclaim="files"} %d
kubelet_volume_stats_inodes_used{namespace="team-l",persistentvolumeclaim="raw"} 0
# HELP kubelet_volume_stats_used_bytes [ALPHA] Number of used bytes in the volume
# TYPE kubelet_volume_stats_used_bytes gauge
kubelet_volume_stats_used_bytes{namespace="team-l",persistentvolumeclaim="files"} %d
kubelet_volume_stats_used_bytes{namespace="team-l",persistentvolumeclaim="raw"} 0
`, int64(st.Bavail)*bs, 8<<20, 5<<20, st.Ffree, st.Files-st.Ffree, int64(st.Blocks-st.Bfree)*bs)
	if err := testutil.CollectAndCompare(c, strings.NewReader(expected), kubeletNames...); err != nil {
		t.Error(err)
	}
	if used := int64(st.Blocks-st.Bfree) * bs; used != 1<<20 || st.Files-st.Ffree != 2 {
		t.Errorf("statfs of the tmpfs after writing 1 MiB: %d bytes, %d inodes used", used, st.Files-st.Ffree)
	}
	if n := testutil.CollectAndCount(c, errorsName); n != 0 {
		t.Errorf("%d error series", n)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}

	// The device's bind mount goes away (the access point is an empty
	// file now): an error, not a capacity of 0.
	if err := unix.Unmount(access, 0); err != nil {
		t.Fatal(err)
	}
	c.Refresh(testCtx(t))
	if _, ok := gauge(t, c, capacityName, "team-l", "raw"); ok {
		t.Error("stats for a Block volume whose access point has no device")
	}
	if v := testutil.ToFloat64(c.errors.WithLabelValues(local.Name)); v != 1 {
		t.Errorf("errors_total{driver=%s} = %v, want 1", local.Name, v)
	}
}

// A driver with VOLUME_CONDITION: kubelet_volume_stats_health_status_abnormal
// follows its condition; each pod using the volume gets one Warning event
// per abnormal condition (reason and message as the kubelet's, the volume
// named as the pod names it), a pod arriving later gets its own, a new
// message warns again, and a return to normal is logged. A driver without
// the capability has no health series, whatever it sends.
func TestVolumeHealth(t *testing.T) {
	dir := shortDir(t)
	reg := registry.New(zap.NewNop())
	cond := &fakeDriver{name: "cond.fake", stats: true, condition: true}
	plain := &fakeDriver{name: "plain.fake", stats: true}
	cond.serve(t, reg, dir)
	plain.serve(t, reg, dir)

	w := newASW()
	v := csiVolume(claimSpec("cond.fake", "v1", "ns", "data"), "", "pod-a", "/pods/a/v1", cache.Mounted)
	addPod(v, "pod-b", "/pods/b/v1", cache.Mounted)
	w.put(v)
	w.put(csiVolume(claimSpec("plain.fake", "p1", "ns", "plain"), "", "pod-p", "/pods/p/p1", cache.Mounted))
	plain.set("p1", withCondition(usage(10, 5, 5, 1, 1, 0), true, "ignored"), nil)
	// pod-a calls the volume "data"; pod-b has no DSW entry (named by
	// the PV then).
	dsw := cache.NewDesiredSnapshot(map[volume.UniqueName]*cache.DesiredVolume{v.Name: {
		Name: v.Name, Pods: cache.PodSetOf(map[types.UID]*cache.DesiredPodVolume{"pod-a": {OuterNames: []string{"data"}}}),
	}}, nil, 0)
	rec := &events.Memory{}
	core, logs := observer.New(zap.InfoLevel)
	c := New(Options{Registry: reg, ASW: w.snapshot, DSW: func() *cache.DesiredSnapshot { return dsw }, Events: rec, Log: zap.New(core)})

	type ev struct{ pod, text string }
	steps := []struct {
		name     string
		setup    func()
		resp     *csi.NodeGetVolumeStatsResponse
		err      error
		abnormal float64 // -1: no series
		events   []ev
		log      string
	}{
		{name: "no condition sent: healthy", resp: usage(100, 60, 40, 10, 9, 1), abnormal: 0},
		{name: "healthy", resp: withCondition(usage(100, 60, 40, 10, 9, 1), false, "fine"), abnormal: 0},
		{name: "abnormal", resp: withCondition(usage(100, 60, 40, 10, 9, 1), true, "disk on fire"), abnormal: 1,
			events: []ev{{"pod-a", "Volume data: disk on fire"}, {"pod-b", "Volume pv-v1: disk on fire"}}, log: "volume condition is abnormal"},
		{name: "still abnormal: no new event", resp: withCondition(usage(100, 60, 40, 10, 9, 1), true, "disk on fire"), abnormal: 1},
		{name: "a pod arrives: its own event", setup: func() { addPod(v, "pod-c", "/pods/c/v1", cache.Mounted); w.put(v) },
			resp: withCondition(usage(100, 60, 40, 10, 9, 1), true, "disk on fire"), abnormal: 1,
			events: []ev{{"pod-c", "Volume pv-v1: disk on fire"}}},
		{name: "a new message warns again", resp: withCondition(usage(100, 60, 40, 10, 9, 1), true, "read-only after I/O errors"), abnormal: 1,
			events: []ev{{"pod-a", "Volume data: read-only after I/O errors"}, {"pod-b", "Volume pv-v1: read-only after I/O errors"}, {"pod-c", "Volume pv-v1: read-only after I/O errors"}}},
		{name: "the call fails: no series", err: status.Error(codes.Internal, "boom"), abnormal: -1},
		{name: "back with the same condition: no new event", resp: withCondition(usage(100, 60, 40, 10, 9, 1), true, "read-only after I/O errors"), abnormal: 1},
		{name: "normal again", resp: withCondition(usage(100, 60, 40, 10, 9, 1), false, ""), abnormal: 0, log: "volume condition is normal again"},
		{name: "abnormal again", resp: withCondition(usage(100, 60, 40, 10, 9, 1), true, "read-only after I/O errors"), abnormal: 1,
			events: []ev{{"pod-a", "Volume data: read-only after I/O errors"}, {"pod-b", "Volume pv-v1: read-only after I/O errors"}, {"pod-c", "Volume pv-v1: read-only after I/O errors"}}},
	}
	for _, s := range steps {
		if s.setup != nil {
			s.setup()
		}
		cond.set("v1", s.resp, s.err)
		logs.TakeAll()
		c.Refresh(testCtx(t))
		got, ok := gauge(t, c, abnormalName, "ns", "data")
		if (s.abnormal < 0 && ok) || (s.abnormal >= 0 && (!ok || got != s.abnormal)) {
			t.Errorf("%s: health_status_abnormal = %v (present %v), want %v", s.name, got, ok, s.abnormal)
		}
		var evs []ev
		for _, e := range rec.Take() {
			if e.Object.Kind != "Pod" || e.Object.Namespace != "ns" || e.Type != events.Warning || e.Reason != "VolumeConditionAbnormal" {
				t.Errorf("%s: event %+v", s.name, e)
			}
			evs = append(evs, ev{string(e.Object.UID), e.Message})
		}
		slices.SortFunc(evs, func(a, b ev) int { return strings.Compare(a.pod, b.pod) })
		if !slices.Equal(evs, s.events) {
			t.Errorf("%s: events %v, want %v", s.name, evs, s.events)
		}
		if s.log != "" && logs.FilterMessage(s.log).Len() != 1 {
			t.Errorf("%s: no log line %q (logs: %v)", s.name, s.log, logs.All())
		}
		if _, ok := gauge(t, c, abnormalName, "ns", "plain"); ok {
			t.Errorf("%s: health series for a driver without VOLUME_CONDITION", s.name)
		}
	}
	expected := `
# HELP kubelet_volume_stats_health_status_abnormal [ALPHA] Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy
# TYPE kubelet_volume_stats_health_status_abnormal gauge
kubelet_volume_stats_health_status_abnormal{namespace="ns",persistentvolumeclaim="data"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(expected), abnormalName); err != nil {
		t.Error(err)
	}
	// The volume goes: its health goes with it, and coming back abnormal
	// is news again.
	w.remove(v.Name)
	c.Refresh(testCtx(t))
	if n := testutil.CollectAndCount(c, abnormalName); n != 0 {
		t.Errorf("%d health series after the volume went", n)
	}
	w.put(v)
	c.Refresh(testCtx(t))
	if n := len(rec.Take()); n != 3 {
		t.Errorf("%d events when the abnormal volume came back, want 3", n)
	}
}

// A driver's message is cut to maxMessage bytes in logs and events, at a
// rune boundary.
func TestTruncate(t *testing.T) {
	cases := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"0123456789abc", 10, "0123456789…"},
		{"ääääää", 5, "ää…"}, // ä is 2 bytes: 5 would split the third
		{"", 3, ""},
	}
	for _, c := range cases {
		if got := truncate(c.in, c.n); got != c.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}
