package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// agentBinary is the volume-agent built by TestMain, consumerBinary
// examples/runtime-consumer (in a directory anyone may read).
var agentBinary, consumerBinary string

// skipReason, when set, makes every test skip.
var skipReason string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if skipReason = e2eutil.SkipReason(); skipReason != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "volume-agent-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Without the race detector: the agents of this suite must be ready
	// within startTimeout.
	bins, err := e2eutil.Build(context.Background(), dir, e2eutil.BuildOptions{RuntimeConsumer: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "building volume-agent:", err)
		return 1
	}
	// The consumer also runs as a user who is not root.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	agentBinary, consumerBinary = bins.AgentBin, bins.RuntimeConsumerBin
	return m.Run()
}

const (
	// nodeName is the node every agent runs as.
	nodeName = "e2e-node"
	// startTimeout bounds how long an agent may take to become ready.
	startTimeout = 15 * time.Second
	// settleTimeout bounds how long a change may take to be reflected in
	// mounts and the debug endpoint.
	settleTimeout = 20 * time.Second
)

// requireE2E skips the test, saying why, when the e2e tests cannot run.
// Tests that prepare host paths or loop devices before newAgent call it
// first.
func requireE2E(t *testing.T) {
	t.Helper()
	e2eutil.Skip(t, skipReason)
}

// agent is a standalone volume-agent with its own root and manifest
// directories (Root(), Manifests.Dir).
type agent struct {
	*e2eutil.Agent
	*e2eutil.Manifests
	t *testing.T
}

type agentOption func(*[]string)

// withNodeLabels passes --node-labels.
func withNodeLabels(l string) agentOption {
	return func(args *[]string) { *args = append(*args, "--node-labels", l) }
}

// newAgent prepares the directories of an agent without starting it, so
// that manifests can be written first. Whatever is mounted under the root
// directory is unmounted when the test ends, after the agent is stopped,
// even if the test fails. Create loop devices before calling it (their
// detaching must come after the agent stopped).
func newAgent(t *testing.T, opts ...agentOption) *agent {
	t.Helper()
	requireE2E(t)
	root := mounttest.TempDir(t)
	m := e2eutil.NewManifests(t)
	args := []string{
		"--pod-manifest-path", m.Dir,
		"--operation-timeout", "30s",
		"--shutdown-grace-period", "10s",
		"--log-level", "debug",
	}
	for _, o := range opts {
		o(&args)
	}
	return &agent{t: t, Manifests: m, Agent: e2eutil.NewAgent(t, e2eutil.AgentOptions{
		Binary: agentBinary, Node: nodeName, Root: root, Args: args, ReadyTimeout: startTimeout,
	})}
}

// Objects.

func newPod(name string, vols ...corev1.Volume) *corev1.Pod {
	return e2eutil.Pod("default", "", name, vols...)
}

func claim(name, claimName string, readOnly bool) corev1.Volume {
	v := e2eutil.ClaimVolume(name, claimName)
	v.PersistentVolumeClaim.ReadOnly = readOnly
	return v
}

func hostPathType(t corev1.HostPathType) *corev1.HostPathType { return &t }

// Waiting.

// waitReady waits until every named pod has all its volumes mounted and
// returns their UIDs by name.
func (a *agent) waitReady(pods ...string) map[string]string {
	a.t.Helper()
	uids := map[string]string{}
	e2eutil.PollErr(a.t, settleTimeout, "pods "+strings.Join(pods, ", ")+" to have their volumes ready", func() error {
		d, err := a.DSW()
		if err != nil {
			return err
		}
		for _, name := range pods {
			p := d.Pod("default", name)
			if p == nil {
				return fmt.Errorf("pod %s is not in /debug/dsw", name)
			}
			if !p.VolumesReady {
				return fmt.Errorf("pod %s: volumes not ready: %+v", name, p)
			}
			uids[name] = p.UID
		}
		return nil
	})
	return uids
}

// podUID waits for the pod to appear in /debug/dsw and returns its UID.
func (a *agent) podUID(name string) string {
	a.t.Helper()
	var uid string
	e2eutil.PollErr(a.t, settleTimeout, "pod "+name+" in /debug/dsw", func() error {
		d, err := a.DSW()
		if err != nil {
			return err
		}
		if p := d.Pod("default", name); p != nil {
			uid = p.UID
			return nil
		}
		return errors.New("not there")
	})
	return uid
}

// Paths.

// volumeDir is the documented place of a pod's volume.
func (a *agent) volumeDir(uid, plugin, specName string) string {
	return e2eutil.VolumeDir(a.Root(), uid, plugin, specName)
}

func (a *agent) globalMount(plugin, pv string) string {
	return e2eutil.GlobalMount(a.Root(), plugin, pv)
}

// podDirs lists the entries of <root>/pods.
func (a *agent) podDirs() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(a.Root(), "pods"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

// noMountsUnder fails (as a condition) while anything is mounted at or
// below dir.
func noMountsUnder(t *testing.T, dir string) error {
	if ms := mounttest.MountsUnder(t, dir); len(ms) > 0 {
		return fmt.Errorf("still mounted: %v", mounttest.MountPoints(ms))
	}
	return nil
}

// mountAt returns the one mount at path, or an error.
func mountAt(t *testing.T, path string) (mounttest.Mount, error) {
	found := mounttest.MountsAt(t, path)
	if len(found) != 1 {
		return mounttest.Mount{}, fmt.Errorf("%d mounts at %s, want 1", len(found), path)
	}
	return found[0], nil
}

// sameFile reports whether two paths are the same inode.
func sameFile(a, b string) (bool, error) {
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := syscall.Stat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// devNumbers returns the major and minor numbers of a device node.
func devNumbers(t *testing.T, dev string) (int, int) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	return int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev))
}
