package csi_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// spawn runs f on one OS thread that never exits. Processes are started
// with Pdeathsig=SIGKILL so that they die with the test binary even when a
// panic or `go test -timeout` skips every cleanup; Linux sends the signal
// when the thread that forked the child exits, so all forks happen here.
var spawn = func() func(func()) {
	reqs := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives as long as the process
		for f := range reqs {
			f()
		}
	}()
	return func(f func()) {
		done := make(chan struct{})
		reqs <- func() { f(); close(done) }
		<-done
	}
}()

// proc is one child process of a test: an agent or a driver.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once reaped
	waitErr error
}

// startProc starts bin with args, output appended to logPath.
func startProc(name, bin, logPath string, args ...string) (*proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	fmt.Fprintf(logFile, "=== %s %s\n", bin, strings.Join(args, " "))
	p := &proc{name: name, logPath: logPath, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	spawn(func() { err = p.cmd.Start() })
	if err != nil {
		return nil, err
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// terminate sends SIGTERM and waits (SIGKILL after timeout). It reports
// whether the process stopped within the timeout.
func (p *proc) terminate(timeout time.Duration) bool {
	if p.exited() {
		return true
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		return false
	}
}

// kill sends SIGKILL (kill -9) to the process and waits for it.
func (p *proc) kill() {
	if !p.exited() {
		_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
}

func (p *proc) exitCode() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// --- the agent ---

// agent is one volume-agent process of a test.
type agent struct {
	t        *testing.T
	node     string
	debugURL string
	p        *proc
	stopOnce sync.Once
}

// agentOptions are the flags a test varies.
type agentOptions struct {
	kubeconfig string // default: deploy/'s ServiceAccount
	args       []string
}

// startAgent starts an agent for the env's node and root (cluster mode)
// and waits until it is ready. It is stopped with SIGTERM when the test
// ends, before the root is unmounted (see newEnv).
func (e *env) startAgent(o agentOptions) *agent {
	e.t.Helper()
	var lastErr error
	for range 3 { // the port is free when chosen, but may be taken before the agent binds it
		a, err := e.tryStartAgent(o)
		if err == nil {
			e.agent = a
			return a
		}
		lastErr = err
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	e.t.Fatalf("starting the agent: %v", lastErr)
	return nil
}

func (e *env) tryStartAgent(o agentOptions) (*agent, error) {
	t := e.t
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	kubeconfig := o.kubeconfig
	if kubeconfig == "" {
		kubeconfig = suite.kubeconfig
	}
	debugAddr := fmt.Sprintf("127.0.0.1:%d", port)
	args := append([]string{
		"--kubeconfig=" + kubeconfig,
		"--node-name=" + e.node,
		"--root-dir=" + e.root,
		"--debug-address=" + debugAddr,
		"--metrics-address=",
		"--shutdown-grace-period=10s",
	}, o.args...)
	p, err := startProc("agent", suite.agentBin, filepath.Join(e.logs, "agent.log"), args...)
	if err != nil {
		return nil, err
	}
	a := &agent{t: t, node: e.node, debugURL: "http://" + debugAddr, p: p}
	ok := false
	defer func() {
		if ok {
			t.Cleanup(a.stop)
		} else {
			p.kill()
		}
	}()
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if p.exited() {
			return nil, fmt.Errorf("agent exited during start-up (%v):\n%s", p.waitErr, tail(p.logPath, 20))
		}
		if resp, err := client.Get(a.debugURL + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("agent for node %s ready (pid %d, root %s, log %s)", e.node, p.cmd.Process.Pid, e.root, p.logPath)
				ok = true
				return a, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("agent not ready after 60s:\n%s", tail(p.logPath, 20))
		}
		select {
		case <-p.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM and waits for the agent to exit. The agent must exit 0
// (with -race, a data race makes it exit 66) and log no race.
func (a *agent) stop() {
	a.stopOnce.Do(func() {
		t := a.t
		if !a.p.terminate(30 * time.Second) {
			t.Errorf("agent for node %s did not stop within 30s of SIGTERM", a.node)
		} else if a.p.waitErr != nil {
			t.Errorf("agent for node %s exited with %v", a.node, a.p.waitErr)
		}
		if log, err := os.ReadFile(a.p.logPath); err == nil && bytes.Contains(log, []byte("WARNING: DATA RACE")) {
			t.Errorf("the agent's race detector found a data race; log in %s", a.p.logPath)
		}
		if t.Failed() {
			t.Logf("--- last lines of the agent's log (node %s) ---\n%s", a.node, tail(a.p.logPath, 80))
		}
	})
}

// getJSON decodes one of the agent's debug documents.
func (a *agent) getJSON(path string, into any) error {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(a.debugURL + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

// The parts of the debug documents the tests read.

type driversDoc struct {
	Drivers []struct {
		Name               string   `json:"name"`
		Endpoint           string   `json:"endpoint"`
		Source             string   `json:"source"`
		RegistrationSocket string   `json:"registrationSocket"`
		NodeID             string   `json:"nodeID"`
		NodeCapabilities   []string `json:"nodeCapabilities"`
		StageUnstage       bool     `json:"stageUnstage"`
		ControllerPublish  bool     `json:"controllerPublish"`
	} `json:"drivers"`
}

type aswDoc struct {
	Volumes []struct {
		Name             string `json:"name"`
		AttachState      string `json:"attachState"`
		DeviceMountState string `json:"deviceMountState"`
		DeviceMountPath  string `json:"deviceMountPath"`
		Pods             []struct {
			UID        string `json:"uid"`
			Name       string `json:"name"`
			MountState string `json:"mountState"`
			MountPath  string `json:"mountPath"`
		} `json:"pods"`
	} `json:"volumes"`
}

type operationsDoc struct {
	Operations []operationStatus `json:"operations"`
}

type operationStatus struct {
	Volume string `json:"volume"`
	Pod    *struct {
		UID  string `json:"uid"`
		Name string `json:"name"`
	} `json:"pod"`
	Operation string     `json:"operation"`
	State     string     `json:"state"`
	Since     time.Time  `json:"since"`
	LastError string     `json:"lastError"`
	RetryAt   *time.Time `json:"retryAt"`
}

type eventsDoc struct {
	Events []struct {
		Object struct {
			Kind, Namespace, Name string
		} `json:"object"`
		Type    string `json:"type"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"events"`
}

func (a *agent) drivers(t *testing.T) driversDoc {
	t.Helper()
	var d driversDoc
	if err := a.getJSON("/debug/drivers", &d); err != nil {
		t.Fatalf("agent: %v", err)
	}
	return d
}

func (a *agent) events(t *testing.T) eventsDoc {
	t.Helper()
	var d eventsDoc
	if err := a.getJSON("/debug/events", &d); err != nil {
		t.Fatalf("agent: %v", err)
	}
	return d
}

func (a *agent) asw(t *testing.T) aswDoc {
	t.Helper()
	var d aswDoc
	if err := a.getJSON("/debug/asw", &d); err != nil {
		t.Fatalf("agent: %v", err)
	}
	return d
}

// operation returns the pending operation of a kind on a volume, if any.
func (a *agent) operation(t *testing.T, volume, name string) (operationStatus, bool) {
	t.Helper()
	var d operationsDoc
	if err := a.getJSON("/debug/operations", &d); err != nil {
		t.Fatalf("agent: %v", err)
	}
	for _, op := range d.Operations {
		if op.Volume == volume && op.Operation == name {
			return op, true
		}
	}
	return operationStatus{}, false
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}
