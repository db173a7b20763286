package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// The attack of issue 28 in miniature: a pod mounts a 1 MB Secret many
// times (as volumes of their own and repeated in one projected volume).
// The agent writes that content itself, so its pages are charged to the
// agent's memory; without a budget it runs out of memory. With one, the
// greedy pod's volumes over its budget fail with a clear error (event,
// runtime API reason, metric), nothing is written for them, another pod's
// API volumes are set up, and what the agent holds stays within the
// budget. Where a memory cgroup can be made, the agent runs in one with a
// limit, and stays alive.
func TestAPIVolumeBudget(t *testing.T) {
	t.Parallel()
	const podBudget, nodeBudget = 8 << 20, 24 << 20
	requireE2E(t)
	// Made first, so that it is removed after the agent has stopped.
	cg := memoryCgroup(t, 160<<20)
	a := newAgent(t, func(args *[]string) {
		*args = append(*args, "--api-volume-pod-bytes", "8Mi", "--api-volume-node-bytes", "24Mi")
	})
	big := strings.Repeat("x", 1_000_000)
	a.Write("objects.yaml", secret("big", map[string]string{"blob": big}),
		secret("small", map[string]string{"password": "hunter2"}),
		configMap("conf", map[string]string{"app.conf": "x=1"}))
	victim := newPod("victim",
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "small"}}},
		corev1.Volume{Name: "conf", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}}}},
		corev1.Volume{Name: "all", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "small"}}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}}},
		}}}})
	a.Write("victim.yaml", victim)
	a.Start()

	if cg != "" {
		if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(a.Process().PID())), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	const copies = 40
	var vols []corev1.Volume
	for i := range copies {
		vols = append(vols, corev1.Volume{Name: fmt.Sprintf("s%02d", i), VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "big"}}})
	}
	var repeated []corev1.VolumeProjection
	for i := range 20 {
		repeated = append(repeated, corev1.VolumeProjection{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "big"},
			Items: []corev1.KeyToPath{{Key: "blob", Path: fmt.Sprintf("copy%02d", i)}}}})
	}
	vols = append(vols, corev1.Volume{Name: "repeated", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: repeated}}})
	a.Write("greedy.yaml", newPod("greedy", vols...))

	uid := a.waitReady("victim")["victim"]
	waitContent(t, a.volumeDir(uid, e2eutil.SecretPlugin, "creds"), map[string]string{"password": "hunter2"})
	waitContent(t, a.volumeDir(uid, e2eutil.ProjectedPlugin, "all"), map[string]string{"password": "hunter2", "app.conf": "x=1"})

	// The projected volume alone is over the pod's budget: refused, with
	// an event naming pod, volume, size and budget.
	greedy := a.podUID("greedy")
	e2eutil.PollErr(t, settleTimeout, "FailedMount events of the greedy pod's volumes over budget", func() error {
		evs, err := a.Events()
		if err != nil {
			return err
		}
		over := map[string]bool{}
		for _, e := range evs.Events {
			if e.Object.Name == "greedy" && e.Reason == "FailedMount" && strings.Contains(e.Message, "over the per-pod API-volume budget of 8388608 bytes") &&
				strings.Contains(e.Message, "pod default/greedy") {
				_, rest, _ := strings.Cut(e.Message, "pod default/greedy volume ")
				name, _, _ := strings.Cut(rest, ":")
				over[name] = true
			}
		}
		if len(over) < copies+1-8 {
			return fmt.Errorf("%d volumes refused so far, want at least %d: %v", len(over), copies+1-8, over)
		}
		return nil
	})
	// The runtime API (explain) says why, per volume.
	e2eutil.PollErr(t, settleTimeout, "the runtime API's reason for the repeated volume", func() error {
		p, err := a.RuntimeClient().Pod(context.Background(), greedy)
		if err != nil {
			return err
		}
		for _, v := range p.Volumes {
			if v.Name == "repeated" {
				if v.Ready || v.Reason != "MountFailed" || !strings.Contains(v.Message, "--api-volume-pod-bytes") {
					return fmt.Errorf("volume repeated: %+v", v)
				}
				return nil
			}
		}
		return fmt.Errorf("no volume repeated in %+v", p.Volumes)
	})
	if _, err := os.Stat(a.volumeDir(greedy, e2eutil.ProjectedPlugin, "repeated")); !os.IsNotExist(err) {
		t.Errorf("the refused projected volume's directory: %v; want none (nothing written)", err)
	}

	// What the agent holds, by its count and by the kernel's.
	ms, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if n := ms[`volume_agent_api_volume_over_budget_total{scope="pod"}`]; n < copies+1-8 {
		t.Errorf("volume_agent_api_volume_over_budget_total{scope=pod} = %v, want at least %d", n, copies+1-8)
	}
	if held := ms["volume_agent_api_volume_bytes"]; held > nodeBudget || held < 8*1_000_000 {
		t.Errorf("volume_agent_api_volume_bytes = %v, want the greedy pod's 8 copies and at most %d", held, nodeBudget)
	}
	var used int64
	set := 0
	for i := range copies {
		var st unix.Statfs_t
		dir := a.volumeDir(greedy, e2eutil.SecretPlugin, fmt.Sprintf("s%02d", i))
		if unix.Statfs(dir, &st) != nil || st.Type != unix.TMPFS_MAGIC {
			continue
		}
		set++
		used += int64(st.Blocks-st.Bfree) * st.Bsize
	}
	if set == 0 || set > 8 || used > podBudget {
		t.Errorf("the greedy pod has %d secret tmpfs holding %d bytes; want 1 to 8, at most %d", set, used, podBudget)
	}
	t.Logf("greedy pod: %d of %d copies set up, %d bytes on tmpfs; agent holds %v bytes", set, copies, used, ms["volume_agent_api_volume_bytes"])

	if cg != "" {
		if a.Process().Exited() {
			t.Fatalf("the agent died in its memory cgroup: %v", a.Process().Tail(20))
		}
		peak, _ := os.ReadFile(filepath.Join(cg, "memory.max_usage_in_bytes"))
		failcnt, _ := os.ReadFile(filepath.Join(cg, "memory.failcnt"))
		t.Logf("memory cgroup (limit 160 MiB): peak %s bytes, failcnt %s", strings.TrimSpace(string(peak)), strings.TrimSpace(string(failcnt)))
	}
	if _, _, err := a.Readyz(); err != nil {
		t.Errorf("the agent stopped answering: %v", err)
	}
}

// memoryCgroup makes a cgroup v1 memory cgroup with a limit and returns
// its directory, or "" (saying why) where none can be made. It is removed
// when the test ends, after the agent in it has stopped.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	base := "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(base, "memory.limit_in_bytes")); err != nil {
		t.Logf("no cgroup v1 memory controller at %s (%v): the agent runs without a memory limit", base, err)
		return ""
	}
	dir := filepath.Join(base, fmt.Sprintf("volume-agent-e2e-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Logf("cannot make a memory cgroup: %v", err)
		return ""
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		_ = os.Remove(dir)
		t.Logf("cannot set the cgroup's memory limit: %v", err)
		return ""
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("removing the memory cgroup: %v", err)
		}
	})
	return dir
}
