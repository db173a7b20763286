package e2eutil

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// AgentOptions configure an Agent.
type AgentOptions struct {
	// Binary is the volume-agent program (Binaries.AgentBin).
	Binary string
	// Root is the agent's --root-dir. Create it with mounttest.TempDir
	// before the agent: cleanups run last-registered first, so whatever
	// is mounted below it is unmounted after the agent has stopped.
	Root string
	// Node is the agent's --node-name.
	Node string
	// Kubeconfig, if set, runs the agent in cluster mode (--kubeconfig) as
	// the kubeconfig's user (ControlPlane.Kubeconfig: the deploy/
	// ServiceAccount).
	Kubeconfig string
	// Args are the agent's other flags: --pod-manifest-path in standalone
	// mode, and whatever the test varies. The Agent sets --root-dir,
	// --debug-address and --metrics-address.
	Args []string
	// Name says which agent it is in messages; default "volume-agent" (on
	// <Node>).
	Name string
	// ReadyTimeout bounds how long Start waits for /readyz; default 60s.
	ReadyTimeout time.Duration
	// LogDir holds the agent's logs, agent-<run>.log; default a new
	// t.TempDir().
	LogDir string
}

// stopGrace is how long an agent may take to exit after SIGTERM.
const stopGrace = 30 * time.Second

// Agent is the volume-agent of a test: the same options for every run, and
// a new process, on new free ports, each time it is started.
//
// When the test ends a running agent is stopped with SIGTERM. A run that
// did not exit cleanly, unless the test killed it, fails the test, as does
// a data race in a run's log; on failure the end of every run's log is
// logged. VOLUME_AGENT_E2E_LOG_DIR=DIR keeps every run's whole log in DIR.
type Agent struct {
	t        *testing.T
	opts     AgentOptions
	client   *http.Client
	runs     int // runs launched
	finished int // the last run whose end was checked
	proc     *Process

	debugURL, metricsURL string
}

// NewAgent prepares an agent without starting it (see Start and Launch).
func NewAgent(t *testing.T, o AgentOptions) *Agent {
	t.Helper()
	if o.Name == "" {
		o.Name = "volume-agent"
		if o.Node != "" {
			o.Name += " on " + o.Node
		}
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	if o.LogDir == "" {
		o.LogDir = t.TempDir()
	}
	a := &Agent{t: t, opts: o, client: &http.Client{Timeout: 10 * time.Second}}
	t.Cleanup(func() {
		if err := a.Stop(); err != nil {
			t.Errorf("%s at the end of the test: %v", o.Name, err)
		}
		if t.Failed() {
			for run := 1; run <= a.runs; run++ {
				t.Logf("--- last lines of %s's log %s ---\n%s", o.Name, a.logPath(run), tail(a.logPath(run), 80))
			}
		}
	})
	return a
}

// StartAgent starts an agent (NewAgent, then Start).
func StartAgent(t *testing.T, o AgentOptions) *Agent {
	t.Helper()
	a := NewAgent(t, o)
	a.Start()
	return a
}

// Root is the agent's --root-dir.
func (a *Agent) Root() string { return a.opts.Root }

// DebugURL is the current run's debug endpoint, http://127.0.0.1:<port>.
func (a *Agent) DebugURL() string { return a.debugURL }

// MetricsURL is the base URL of the current run's metrics endpoint (the one
// the DaemonSet exposes on the pod network).
func (a *Agent) MetricsURL() string { return a.metricsURL }

// Process is the current (or last) run's process.
func (a *Agent) Process() *Process { return a.proc }

func (a *Agent) logPath(run int) string {
	return filepath.Join(a.opts.LogDir, fmt.Sprintf("agent-%d.log", run))
}

// Start launches a new run and waits until /readyz answers 200, failing
// the test if it does not within ReadyTimeout. A port taken by another
// process between choosing it and the agent binding it is retried.
func (a *Agent) Start() {
	a.t.Helper()
	for attempt := 1; ; attempt++ {
		if err := a.Launch(); err != nil {
			a.t.Fatalf("starting %s: %v", a.opts.Name, err)
		}
		err := a.WaitReady(a.opts.ReadyTimeout)
		if err == nil {
			return
		}
		if attempt < 5 && a.proc.Exited() && strings.Contains(a.proc.Tail(20), "address already in use") {
			a.t.Logf("retrying: %v", err)
			a.finished = a.runs // an expected failure
			continue
		}
		a.t.Fatal(err)
	}
}

// Launch starts a new run without waiting for anything. The last run must
// have exited.
func (a *Agent) Launch() error {
	if a.proc != nil {
		if !a.proc.Exited() {
			a.t.Fatalf("%s (pid %d) is still running", a.opts.Name, a.proc.PID())
		}
		if err := a.Stop(); err != nil { // unless stopped or killed: it exited on its own
			a.t.Errorf("%s run %d: %v", a.opts.Name, a.runs, err)
		}
	}
	addrs, err := freeAddrs(2)
	if err != nil {
		return err
	}
	args := []string{
		"--root-dir=" + a.opts.Root,
		"--debug-address=" + addrs[0],
		"--metrics-address=" + addrs[1],
	}
	if a.opts.Node != "" {
		args = append(args, "--node-name="+a.opts.Node)
	}
	if a.opts.Kubeconfig != "" {
		args = append(args, "--kubeconfig="+a.opts.Kubeconfig)
	}
	args = append(args, a.opts.Args...)
	p, err := startProcess(a.opts.Name, a.logPath(a.runs+1), a.opts.Binary, args...)
	if err != nil {
		return err
	}
	a.runs++
	a.proc, a.debugURL, a.metricsURL = p, "http://"+addrs[0], "http://"+addrs[1]
	a.t.Logf("%s run %d: pid %d, root %s, log %s", a.opts.Name, a.runs, p.PID(), a.opts.Root, p.LogPath())
	return nil
}

// WaitReady polls /readyz until it answers 200, and returns an error (with
// the end of the log) if the run exits first or timeout passes.
func (a *Agent) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		code, body, err := a.Readyz()
		if err == nil && code == http.StatusOK {
			return nil
		}
		last := fmt.Sprintf("%d %q %v", code, body, err)
		select {
		case <-a.proc.Done():
			return fmt.Errorf("%s exited before becoming ready (%v):\n%s", a.opts.Name, a.proc.Err(), a.proc.Tail(30))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v (last /readyz: %s):\n%s", a.opts.Name, timeout, last, a.proc.Tail(30))
		}
	}
}

// Readyz returns the status code and body of GET /readyz.
func (a *Agent) Readyz() (int, string, error) {
	resp, err := a.client.Get(a.debugURL + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), nil
}

// Stop stops the current run with SIGTERM (its process group gets SIGKILL
// after 30 s) and returns how it exited: nil for exit status 0 (with -race,
// a data race makes the agent exit 66). A run stopped or killed before
// returns nil. A data race in the run's log fails the test.
func (a *Agent) Stop() error {
	if a.proc == nil || a.finished == a.runs {
		return nil
	}
	err := a.proc.Stop(stopGrace)
	a.finish()
	return err
}

// Kill kills the current run with SIGKILL: no cleanup of any kind runs.
func (a *Agent) Kill() {
	a.t.Helper()
	a.proc.Kill()
	a.t.Logf("%s run %d (pid %d) killed with SIGKILL", a.opts.Name, a.runs, a.proc.PID())
	a.finish()
}

// finish checks the end of the current run: no data race in its log.
func (a *Agent) finish() {
	a.finished = a.runs
	log := a.proc.Log()
	if strings.Contains(log, "WARNING: DATA RACE") {
		a.t.Errorf("the race detector found a data race in %s; log in %s", a.opts.Name, a.proc.LogPath())
	}
	if dir := os.Getenv("VOLUME_AGENT_E2E_LOG_DIR"); dir != "" {
		name := fmt.Sprintf("%s-%d.log", strings.ReplaceAll(a.opts.Name, " ", "-"), a.proc.PID())
		_ = os.MkdirAll(dir, 0o755)
		_ = os.WriteFile(filepath.Join(dir, name), []byte(log), 0o644)
	}
}

// freeAddrs returns n distinct 127.0.0.1 addresses whose ports were free a
// moment ago.
func freeAddrs(n int) ([]string, error) {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // only after all are chosen, so they differ
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}
