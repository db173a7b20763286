// Package example_test runs examples/run.sh (what `sudo make run` runs) the
// way a person does in a terminal, and presses Ctrl-C: SIGINT to the
// script's whole process group. The script must remove the manifests, let
// the agent unmount every volume, stop it, and leave no mount and no
// process behind. It needs root (the agent mounts), bash, setsid and curl.
package example_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

var suite struct {
	skip     string
	bin      string
	consumer string // examples/runtime-consumer
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if suite.skip = e2eutil.SkipReason("bash", "setsid", "curl"); suite.skip != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "volume-agent-example-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bins, err := e2eutil.Build(context.Background(), dir, e2eutil.BuildOptions{RuntimeConsumer: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "building volume-agent:", err)
		return 1
	}
	suite.bin, suite.consumer = bins.AgentBin, bins.RuntimeConsumerBin
	return m.Run()
}

// output is a file collecting what the script and the agent print: a
// file, not a pipe, so that waiting for the script does not wait for the
// agent (which has the pipe too) as well.
type output struct{ path string }

func (o output) String() string {
	b, _ := os.ReadFile(o.path)
	return string(b)
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// processesUsing lists the processes whose command line contains s.
func processesUsing(s string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestCtrlCLeavesNothingBehind(t *testing.T) {
	e2eutil.Skip(t, suite.skip)
	repo, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// Whatever the script leaves mounted is unmounted when the test ends
	// (after the processes below are gone), also when it fails.
	base := mounttest.TempDir(t)
	root := filepath.Join(base, "root")
	killLeftovers := func() {
		for _, pid := range processesUsing(root) {
			t.Errorf("process %d still runs; killing it", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	t.Cleanup(killLeftovers)

	// A shell started in the background (as CI and tools may start the
	// tests) ignores SIGINT, and so would the script: catching it here
	// gives the script, like any child, the default disposition, as in a
	// terminal.
	sigint := make(chan os.Signal, 1)
	signal.Notify(sigint, syscall.SIGINT)
	t.Cleanup(func() { signal.Stop(sigint) })

	cmd := exec.Command("bash", filepath.Join(repo, "examples", "run.sh"))
	cmd.Env = append(os.Environ(),
		"EXAMPLE_BASE="+base, "VOLUME_AGENT_BIN="+suite.bin, "RUNTIME_CONSUMER_BIN="+suite.consumer,
		"EXAMPLE_DEBUG_ADDRESS="+freePort(t), "EXAMPLE_METRICS_ADDRESS="+freePort(t),
	)
	out := output{path: filepath.Join(t.TempDir(), "run.sh.out")}
	f, err := os.Create(out.path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	// A terminal's foreground job: a process group of its own, which
	// Ctrl-C signals as a whole.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	// exited is closed when the script has ended, with waitErr.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("run.sh printed:\n%s", out.String())
		}
		select {
		case <-exited:
		default:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			killLeftovers()
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				t.Errorf("run.sh (pid %d) did not end after SIGKILL", pgid)
			}
		}
	})

	// The example is up: its volumes are mounted and the script waits.
	e2eutil.PollErr(t, 60*time.Second, "the example's volumes are mounted", func() error {
		select {
		case <-exited:
			return fmt.Errorf("run.sh ended early (%v): %s", waitErr, out.String())
		default:
		}
		n := len(mounttest.MountsUnder(t, root))
		if n < 5 || !strings.Contains(out.String(), "Ctrl-C to stop") {
			return fmt.Errorf("%d mounts under %s", n, root)
		}
		return nil
	})
	// What a new user sees: the example pods' containers (run by
	// examples/runtime-consumer with their volumes from the runtime API)
	// read their configMap, share the local volume, write to their
	// emptyDirs; the pod without its claim does not start and says why.
	for _, want := range []string{
		"[default/configured/app] read its configMap: greeting=hello workers=4",
		"[default/configured/app] one key through a subPath: greeting=hello",
		"[default/web/web] content (local PV, read-only): <h1>served from a local PersistentVolume</h1>",
		"[default/web/web] cannot write to the content: read-only, as asked",
		"[default/web/web] wrote /scratch/greeting: hello from web (emptyDir on disk)",
		"[default/web/web] bounded is ext4 (emptyDir on disk with sizeLimit 16Mi: a filesystem image of its own)",
		"[default/web/web] bounded refuses the 17th MiB: no space left on device",
		"[default/web/web] the worker left in the shared volume: a note from the worker",
		"[default/worker/worker] wrote /tmp/scratch on tmpfs (emptyDir medium Memory)",
		// An image volume: the agent hands the reference to the runtime,
		// which unpacks it from the OCI layout run.sh built.
		"[default/worker/worker] the image volume example.local/greeting:v1 says: hello from an OCI image",
		"[default/worker/worker] one file of the image through a subPath: a file of the image, through a subPath",
		"[default/worker/worker] cannot write to the image volume: read-only",
		"[default/web] all containers exited 0",
		"[default/worker] all containers exited 0",
		"[default/configured] all containers exited 0",
		"[default/waiting-for-claim] not started: timed out after 5s: volumes not ready: data (PVCNotFound",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("run.sh's output lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(base, "host", "logs", "web", "access.log")); err != nil {
		t.Errorf("the web pod's log in its hostPath sub-directory (subPathExpr): %v", err)
	}
	t.Logf("%d mounts under %s; pressing Ctrl-C", len(mounttest.MountsUnder(t, root)), root)

	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(90 * time.Second):
		t.Fatalf("run.sh still runs 90s after Ctrl-C")
	}
	var exit *exec.ExitError
	if !errors.As(waitErr, &exit) || exit.ExitCode() != 130 {
		t.Errorf("run.sh ended with %v, want exit status 130 (interrupted, cleaned up)", waitErr)
	}
	if left := mounttest.MountsUnder(t, root); len(left) > 0 {
		t.Errorf("%d mounts left under %s after Ctrl-C: %+v", len(left), root, left)
	}
	if left := mounttest.MountsAt(t, root); len(left) > 0 {
		t.Errorf("the root directory's own mount is left after Ctrl-C: %+v", left)
	}
	if pids := processesUsing(root); len(pids) > 0 {
		t.Errorf("processes still running after Ctrl-C: %v", pids)
	}
	if s := out.String(); !strings.Contains(s, "mounts left under "+root+": 0") || !strings.Contains(s, `"msg":"stopped"`) {
		t.Errorf("run.sh did not report a clean stop:\n%s", s)
	}
}
