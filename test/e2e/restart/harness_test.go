package restart_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// --- the agent ---

// agent is the volume-agent of one test: the same root directory and
// arguments for every run, a new process (and new ports) each time.
type agent struct {
	*e2eutil.Agent
	t *testing.T
}

// newAgent prepares an agent on o.Root (whose mounts the caller's cleanup
// unmounts: mounttest.TempDir) with its mode's options (Node and
// --pod-manifest-path, or Kubeconfig). It is stopped when the test ends,
// before the root's mounts are unmounted (register those first).
func newAgent(t *testing.T, o e2eutil.AgentOptions) *agent {
	t.Helper()
	o.Binary = bins.AgentBin
	o.ReadyTimeout = 90 * time.Second
	o.Args = append([]string{"--shutdown-grace-period=20s", "--operation-timeout=30s", "--log-level=debug"}, o.Args...)
	return &agent{Agent: e2eutil.NewAgent(t, o), t: t}
}

// stop sends SIGTERM; the agent must exit cleanly (exit 0; with -race, a
// data race makes it exit 66).
func (a *agent) stop() {
	a.t.Helper()
	if err := a.Stop(); err != nil {
		a.t.Fatalf("the agent did not stop cleanly: %v\n%s", err, a.Process().Tail(30))
	}
}

// opCounts sums volume_agent_operation_duration_seconds_count by
// operation and plugin (every result: success, failure, uncertain, stale).
func (a *agent) opCounts() (map[string]map[string]float64, error) {
	ms, err := a.Metrics()
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]float64{}
	for series, v := range ms {
		labels, ok := strings.CutPrefix(series, "volume_agent_operation_duration_seconds_count{")
		if !ok {
			continue
		}
		l := parseLabels(strings.TrimSuffix(labels, "}"))
		if out[l["operation"]] == nil {
			out[l["operation"]] = map[string]float64{}
		}
		out[l["operation"]][l["plugin"]] += v
	}
	return out, nil
}

func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		k, rest, ok := strings.Cut(s, `="`)
		if !ok {
			break
		}
		v, rest, _ := strings.Cut(rest, `"`)
		out[k] = v
		s = strings.TrimPrefix(rest, ",")
	}
	return out
}

// settled checks the agent has finished: every pod it wants has its
// volumes ready, nothing in the ASW is still reconstructed or uncertain,
// no operation is pending and no orphan is reported. It returns the
// desired pods' UIDs.
func (a *agent) settled() (map[string]bool, error) {
	d, err := a.DSW()
	if err != nil {
		return nil, err
	}
	if !d.SourcesReady {
		return nil, errors.New("sources not ready")
	}
	uids := map[string]bool{}
	for _, p := range d.Pods {
		if !p.VolumesReady {
			return nil, fmt.Errorf("pod %s/%s: volumes not ready (errors %+v)", p.Namespace, p.Name, p.Errors)
		}
		uids[p.UID] = true
	}
	s, err := a.ASW()
	if err != nil {
		return nil, err
	}
	for _, v := range s.Volumes {
		if v.DeviceMountState == "Uncertain" || v.AttachState == "Uncertain" {
			return nil, fmt.Errorf("volume %s: device %s, attach %q", v.Name, v.DeviceMountState, v.AttachState)
		}
		for _, m := range v.Pods {
			if m.Reconstructed || m.MountState != "Mounted" {
				return nil, fmt.Errorf("volume %s pod %s: %s (reconstructed %v)", v.Name, m.UID, m.MountState, m.Reconstructed)
			}
			if !uids[m.UID] {
				return nil, fmt.Errorf("volume %s still mounted for pod %s that is not desired", v.Name, m.UID)
			}
		}
	}
	ops, err := a.Operations()
	if err != nil {
		return nil, err
	}
	if len(ops.Operations) > 0 {
		return nil, fmt.Errorf("operations pending: %+v", ops.Operations)
	}
	o, err := a.Orphans()
	if err != nil {
		return nil, err
	}
	if len(o.Orphans) > 0 {
		return nil, fmt.Errorf("orphans reported: %+v", o.Orphans)
	}
	return uids, nil
}

// waitSettled waits for settled and returns the desired pods' UIDs.
func (a *agent) waitSettled(timeout time.Duration) map[string]bool {
	a.t.Helper()
	var uids map[string]bool
	e2eutil.PollErr(a.t, timeout, "the agent to settle", func() error {
		var err error
		uids, err = a.settled()
		return err
	})
	return uids
}

// --- mounts and directories ---

// mountCounts counts the mount table's entries per mount point at or below
// root: more than one is a stacked mount.
func mountCounts(t *testing.T, root string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range mounttest.MountsUnder(t, root) {
		out[m.MountPoint]++
	}
	return out
}

// checkNoStackedMounts fails for every mount point under root with more
// than one entry.
func checkNoStackedMounts(t *testing.T, counts map[string]int) {
	t.Helper()
	var stacked []string
	for p, n := range counts {
		if n > 1 {
			stacked = append(stacked, fmt.Sprintf("%s (%d)", p, n))
		}
	}
	sort.Strings(stacked)
	if len(stacked) > 0 {
		t.Errorf("stacked mounts: %v", stacked)
	}
}

func podDirs(t *testing.T, root string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "pods"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		out[e.Name()] = true
	}
	return out
}

// sameMounts compares two mount tables under a root by mount ID and point:
// equal means nothing was unmounted, remounted or added.
func sameMounts(a, b []mounttest.Mount) bool {
	key := func(ms []mounttest.Mount) []string {
		var out []string
		for _, m := range ms {
			out = append(out, fmt.Sprintf("%d %s", m.ID, m.MountPoint))
		}
		sort.Strings(out)
		return out
	}
	x, y := key(a), key(b)
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}
