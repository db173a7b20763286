package csi_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// The kubelet's volume stats, as its /metrics shows them: name, help text
// (stability prefix included) and type.
var kubeletVolumeStats = map[string]string{
	"kubelet_volume_stats_capacity_bytes":         "[ALPHA] Capacity in bytes of the volume",
	"kubelet_volume_stats_available_bytes":        "[ALPHA] Number of available bytes in the volume",
	"kubelet_volume_stats_used_bytes":             "[ALPHA] Number of used bytes in the volume",
	"kubelet_volume_stats_inodes":                 "[ALPHA] Maximum number of inodes in the volume",
	"kubelet_volume_stats_inodes_free":            "[ALPHA] Number of free inodes in the volume",
	"kubelet_volume_stats_inodes_used":            "[ALPHA] Number of used inodes in the volume",
	"kubelet_volume_stats_health_status_abnormal": "[ALPHA] Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy",
}

// volumeStats is one scrape of the kubelet_volume_stats_* series: value by
// metric name (without the prefix) and claim (namespace/name).
type volumeStats map[string]map[string]float64

func (s volumeStats) get(metric, claim string) (float64, bool) {
	v, ok := s[metric][claim]
	return v, ok
}

// scrapeVolumeStats reads the agent's /metrics with the Prometheus text
// parser and returns its kubelet_volume_stats_* series, checking each
// family's help text, type and label names against the kubelet's.
func scrapeVolumeStats(t *testing.T, a *e2eutil.Agent) (volumeStats, error) {
	t.Helper()
	resp, err := http.Get(a.MetricsURL() + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parsing /metrics: %w", err)
	}
	out := volumeStats{}
	for name, mf := range families {
		if !strings.HasPrefix(name, "kubelet_") {
			continue
		}
		help, ok := kubeletVolumeStats[name]
		if !ok {
			t.Errorf("/metrics has %s, which the kubelet does not export", name)
			continue
		}
		if mf.GetHelp() != help || mf.GetType() != dto.MetricType_GAUGE {
			t.Errorf("%s: help %q, type %v; the kubelet's: %q, gauge", name, mf.GetHelp(), mf.GetType(), help)
		}
		short := strings.TrimPrefix(name, "kubelet_volume_stats_")
		out[short] = map[string]float64{}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if len(labels) != 2 || labels["namespace"] == "" || labels["persistentvolumeclaim"] == "" {
				t.Errorf("%s: labels %v, want namespace and persistentvolumeclaim only", name, labels)
			}
			claim := labels["namespace"] + "/" + labels["persistentvolumeclaim"]
			if _, dup := out[short][claim]; dup {
				t.Errorf("%s: two series for %s", name, claim)
			}
			out[short][claim] = m.GetGauge().GetValue()
		}
	}
	return out, nil
}

// statfsUsage is the kubelet's arithmetic on statfs(path).
func statfsUsage(t *testing.T, path string) map[string]float64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	bs := float64(st.Bsize)
	return map[string]float64{
		"capacity_bytes":  float64(st.Blocks) * bs,
		"available_bytes": float64(st.Bavail) * bs,
		"used_bytes":      float64(st.Blocks-st.Bfree) * bs,
		"inodes":          float64(st.Files),
		"inodes_free":     float64(st.Ffree),
		"inodes_used":     float64(st.Files - st.Ffree),
	}
}

// localClaim creates a local PV on a tmpfs of its own (size=16m,
// nr_inodes=4096, so its numbers move only when the test writes), with
// node affinity to the test's node, pre-bound to a claim of the same name,
// and the claim; it returns the tmpfs's path.
func (e *env) localClaim(name string) string {
	e.t.Helper()
	dir := filepath.Join(e.data, "local-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=16m,nr_inodes=4096"); err != nil {
		e.t.Fatal(err)
	}
	ctx := e.t.Context()
	pv := e2eutil.PreBoundPV(e.pvName(name), "16Mi", storageClass, e.ns, name, corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}})
	pv.Spec.NodeAffinity = e2eutil.NodeAffinity(corev1.LabelHostname, e.node)
	if _, err := suite.Admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PV %s: %v", pv.Name, err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(storageClass),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *pv.Spec.Capacity.Storage()}},
		},
	}
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PVC %s: %v", name, err)
	}
	suite.WaitBound(e.t, e.ns, name, pv.Name)
	return dir
}

// The kubelet's volume stats for a CSI claim (NodeGetVolumeStats of the
// real test driver, playing one built with CSI 1.12 that reports volume
// health), a raw block CSI claim and a local claim (statfs), read from
// /metrics with the Prometheus text parser: names, help texts, types and
// labels as the kubelet's, one series per claim although two pods use the
// CSI one, values as statfs (and the device's size) says; the CSI claims
// have a health series, the local one none. The driver says the volume is abnormal: the series goes to 1 and
// both pods get the kubelet's Warning event naming the volume as each pod
// does; healthy again: 0. The pods go: the series go.
func TestVolumeStatsAndHealth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "vstats")
	d := e.newDriver("health", driverOptions{}, "--volume-condition")
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	csiClaim := e.claimPV(d, "data")
	blockClaim := e.blockPV(d, "disk")
	localDir := e.localClaim("scratch")
	a := e.startAgent(agentOptions{args: []string{d.flag(), "--volume-stats-agg-period=1s"}})

	// The driver's capabilities by name, VOLUME_CONDITION (4) included.
	e2eutil.Poll(t, 30*time.Second, "the driver on /debug/drivers", func(context.Context) (bool, string) {
		drivers := e2eutil.Must(t, a.Drivers).Drivers
		return len(drivers) == 1 && slices.Contains(drivers[0].NodeCapabilities, "VOLUME_CONDITION") &&
			!slices.Contains(drivers[0].NodeCapabilities, "4"), fmt.Sprintf("%+v", drivers)
	})

	app := e.createPod(e.pod("app", e2eutil.ClaimVolume("vol-data", csiClaim.claim), e2eutil.ClaimVolume("vol-scratch", "scratch")))
	app2 := e.createPod(e.pod("app2", e2eutil.ClaimVolume("shared", csiClaim.claim)))
	raw := e.createPod(e2eutil.DevicePod(e.ns, e.node, "raw", e2eutil.ClaimVolume("disk", blockClaim.claim)))
	target := e.publishPath(app.UID, csiClaim.pv)
	localMount := e2eutil.VolumeDir(e.root, string(app.UID), "kubernetes.io/local-volume", e.pvName("scratch"))
	access := e.accessPoint(raw.UID, blockClaim.pv)
	e.waitMounted(target, e.publishPath(app2.UID, csiClaim.pv), localMount, access)
	write := func(path string, size int) {
		if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(target, "data"), 2<<20)
	write(filepath.Join(localMount, "data"), 3<<20)

	csiKey, localKey, blockKey := e.ns+"/data", e.ns+"/scratch", e.ns+"/disk"
	var stats volumeStats
	// The collector stores each volume's answer as it arrives: wait for
	// all three claims, not only the two whose data the test wrote, or a
	// scrape in the middle of a round can lack the block claim.
	e2eutil.Poll(t, 60*time.Second, "volume stats of the three claims, with the data written", func(context.Context) (bool, string) {
		s, err := scrapeVolumeStats(t, a)
		if err != nil {
			return false, err.Error()
		}
		stats = s
		csiUsed, _ := s.get("used_bytes", csiKey)
		localUsed, _ := s.get("used_bytes", localKey)
		_, block := s.get("capacity_bytes", blockKey)
		return csiUsed >= 2<<20 && localUsed >= 3<<20 && block, fmt.Sprintf("%v", s)
	})
	for metric := range kubeletVolumeStats {
		short := strings.TrimPrefix(metric, "kubelet_volume_stats_")
		claims := make([]string, 0, len(stats[short]))
		for c := range stats[short] {
			claims = append(claims, c)
		}
		sort.Strings(claims)
		want := []string{csiKey, blockKey, localKey}
		if short == "health_status_abnormal" {
			want = []string{csiKey, blockKey} // only where the driver reports health
		}
		if !slices.Equal(claims, want) {
			t.Errorf("%s: series for %v, want %v", metric, claims, want)
		}
	}
	// Local: exactly statfs (nothing else writes to the tmpfs).
	for metric, want := range statfsUsage(t, localDir) {
		if got, _ := stats.get(metric, localKey); got != want {
			t.Errorf("local %s = %v, statfs says %v", metric, got, want)
		}
	}
	// CSI: what the driver says, statfs of the published ext4; capacity
	// and inode count exactly, the rest within what ext4 may do between
	// the two reads.
	tolerance := map[string]float64{"available_bytes": 1 << 20, "used_bytes": 1 << 20, "inodes_free": 2, "inodes_used": 2}
	for metric, want := range statfsUsage(t, target) {
		if got, _ := stats.get(metric, csiKey); math.Abs(got-want) > tolerance[metric] {
			t.Errorf("CSI %s = %v, statfs says %v", metric, got, want)
		}
	}
	// Block: the driver reports the device's size only; the rest is 0.
	for metric := range kubeletVolumeStats {
		short, want := strings.TrimPrefix(metric, "kubelet_volume_stats_"), 0.0
		if short == "capacity_bytes" {
			want = 32 << 20
		}
		if got, _ := stats.get(short, blockKey); got != want {
			t.Errorf("Block %s = %v, want %v", short, got, want)
		}
	}
	if v, _ := stats.get("health_status_abnormal", csiKey); v != 0 {
		t.Errorf("health_status_abnormal = %v for a healthy volume", v)
	}

	health := func(want float64) {
		t.Helper()
		e2eutil.Poll(t, 30*time.Second, fmt.Sprintf("health_status_abnormal %v", want), func(context.Context) (bool, string) {
			s, err := scrapeVolumeStats(t, a)
			if err != nil {
				return false, err.Error()
			}
			v, ok := s.get("health_status_abnormal", csiKey)
			return ok && v == want, fmt.Sprintf("%v (present %v)", v, ok)
		})
	}
	if err := d.Control.SetVolumeCondition(csiClaim.handle, true, "disk on fire"); err != nil {
		t.Fatal(err)
	}
	health(1)
	for pod, volume := range map[string]string{"app": "vol-data", "app2": "shared"} {
		ev := suite.WaitEvent(t, e.ns, fields.Set{"involvedObject.name": pod, "reason": "VolumeConditionAbnormal"}, nil,
			"Volume "+volume+": disk on fire")
		if ev.Type != corev1.EventTypeWarning || ev.Message != "Volume "+volume+": disk on fire" || ev.InvolvedObject.Kind != "Pod" {
			t.Errorf("event on %s: %s %s %q", pod, ev.Type, ev.InvolvedObject.Kind, ev.Message)
		}
	}
	if err := d.Control.SetVolumeCondition(csiClaim.handle, false, ""); err != nil {
		t.Fatal(err)
	}
	health(0)
	evs, _, err := suite.FindEvents(t.Context(), e.ns, fields.Set{"reason": "VolumeConditionAbnormal"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 {
		t.Errorf("%d VolumeConditionAbnormal events, want one per pod", len(evs))
	}

	e.deletePod("app")
	e.deletePod("app2")
	e.deletePod("raw")
	e2eutil.Poll(t, 60*time.Second, "no volume stats once the pods are gone", func(context.Context) (bool, string) {
		s, err := scrapeVolumeStats(t, a)
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, byClaim := range s {
			n += len(byClaim)
		}
		return n == 0, fmt.Sprintf("%v", s)
	})
	e.waitGone(target, localMount, access)
	d.waitCalls("NodeUnstageVolume", 2)
	d.waitNoLoopDevices()
	if err := unix.Unmount(localDir, 0); err != nil {
		t.Errorf("unmounting the local volume's tmpfs: %v", err)
	}
}
