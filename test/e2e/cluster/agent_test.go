package cluster_test

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

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

// agent is one volume-agent process of a test.
type agent struct {
	t        *testing.T
	node     string
	root     string
	debugURL string
	logPath  string
	cmd      *exec.Cmd
	done     chan struct{} // closed once the process has been reaped
	waitErr  error
	stopOnce sync.Once
}

// spawn runs f on one OS thread that never exits. Agents are started with
// Pdeathsig=SIGKILL so that they die with the test binary even when a panic
// or `go test -timeout` skips every cleanup; Linux sends the signal when the
// thread that forked the child exits, so all forks happen on this thread.
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

// startAgent starts an agent for node on root (cluster mode, as the deploy/
// ServiceAccount) and waits until it is ready. SIGTERM stops it when the
// test ends; the caller registers the unmount of root before (see newRoot).
func startAgent(t *testing.T, node, root string, extraArgs ...string) *agent {
	t.Helper()
	var lastErr error
	for range 3 { // the ports are free when chosen, but may be taken before the agent binds them
		a, err := tryStartAgent(t, node, root, extraArgs)
		if err == nil {
			return a
		}
		lastErr = err
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	t.Fatalf("starting the agent: %v", lastErr)
	return nil
}

func tryStartAgent(t *testing.T, node, root string, extraArgs []string) (*agent, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	debugAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	a := &agent{
		t: t, node: node, root: root, debugURL: "http://" + debugAddr,
		logPath: filepath.Join(t.TempDir(), "agent.log"), done: make(chan struct{}),
	}
	logFile, err := os.Create(a.logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	args := append([]string{
		"--kubeconfig=" + suite.kubeconfig,
		"--node-name=" + node,
		"--root-dir=" + root,
		"--debug-address=" + debugAddr,
		fmt.Sprintf("--metrics-address=127.0.0.1:%d", ports[1]),
		"--shutdown-grace-period=10s",
	}, extraArgs...)
	a.cmd = exec.Command(suite.agentBin, args...)
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	spawn(func() { err = a.cmd.Start() })
	if err != nil {
		return nil, err
	}
	go func() { a.waitErr = a.cmd.Wait(); close(a.done) }()
	ok := false
	defer func() {
		if ok {
			t.Cleanup(a.stop)
		} else { // a failed attempt: no agent for this test
			_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
			<-a.done
		}
	}()

	// Ready: the informers have listed and the desired state is populated.
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-a.done:
			return nil, fmt.Errorf("agent exited during start-up (%v):\n%s", a.waitErr, tail(a.logPath, 20))
		default:
		}
		if resp, err := client.Get(a.debugURL + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("agent for node %s ready (pid %d, root %s, log %s)", node, a.cmd.Process.Pid, root, a.logPath)
				ok = true
				return a, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("agent not ready after 60s:\n%s", tail(a.logPath, 20))
		}
		select {
		case <-a.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM and waits for the agent to exit (SIGKILL after 30 s).
// The agent must exit 0: with -race, a data race makes it exit 66.
func (a *agent) stop() {
	a.stopOnce.Do(func() {
		t := a.t
		select {
		case <-a.done:
		default:
			_ = a.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-a.done:
			case <-time.After(30 * time.Second):
				_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
				<-a.done
				t.Errorf("agent for node %s did not stop within 30s of SIGTERM", a.node)
			}
		}
		if a.waitErr != nil {
			t.Errorf("agent for node %s exited with %v", a.node, a.waitErr)
		}
		if log, err := os.ReadFile(a.logPath); err == nil && bytes.Contains(log, []byte("WARNING: DATA RACE")) {
			t.Errorf("the agent's race detector found a data race; log in %s", a.logPath)
		}
		if t.Failed() {
			t.Logf("--- last lines of the agent's log (node %s) ---\n%s", a.node, tail(a.logPath, 60))
		}
		// For debugging: keep every agent's whole log.
		if dir := os.Getenv("VOLUME_AGENT_E2E_LOG_DIR"); dir != "" {
			if data, err := os.ReadFile(a.logPath); err == nil {
				_ = os.MkdirAll(dir, 0o755)
				_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", a.node, a.cmd.Process.Pid)), data, 0o644)
			}
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

// dswDoc is the part of /debug/dsw the tests read.
type dswDoc struct {
	SourcesReady bool `json:"sourcesReady"`
	Pods         []struct {
		UID          string `json:"uid"`
		Namespace    string `json:"namespace"`
		Name         string `json:"name"`
		VolumesReady bool   `json:"volumesReady"`
		Errors       []struct {
			Volume, Reason, Message string
		} `json:"errors"`
	} `json:"pods"`
}

func (a *agent) dsw(t *testing.T) dswDoc {
	t.Helper()
	var d dswDoc
	if err := a.getJSON("/debug/dsw", &d); err != nil {
		t.Fatalf("agent for node %s: %v", a.node, err)
	}
	return d
}

// desiredPod reports whether the agent's desired state has the pod.
func (a *agent) desiredPod(t *testing.T, uid string) bool {
	t.Helper()
	for _, p := range a.dsw(t).Pods {
		if p.UID == uid {
			return true
		}
	}
	return false
}

func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // only after all are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
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

// newRoot returns a root directory for an agent. Everything mounted below it
// is unmounted when the test ends, after the agent has stopped (cleanups run
// in reverse order), even if the test fails: nothing leaks.
func newRoot(t *testing.T) string {
	t.Helper()
	root := mounttest.TempDir(t)
	// mounttest's cleanup gives up after 64 mounts; TestManyPodsAtStartup
	// makes 200. This one runs first and calls it until nothing is left.
	t.Cleanup(func() {
		for range 100 {
			ms, err := mounttest.ReadMounts()
			if err != nil {
				t.Errorf("reading mountinfo: %v", err)
				return
			}
			left := 0
			for _, m := range ms {
				if m.MountPoint == root || strings.HasPrefix(m.MountPoint, root+"/") {
					left++
				}
			}
			if left == 0 {
				return
			}
			if err := mounttest.UnmountUnder(root); err != nil && !strings.Contains(err.Error(), "mounts left under") {
				t.Errorf("unmounting under %s: %v", root, err)
				return
			}
		}
	})
	return root
}

// mounted reports whether path is a mount point.
func mounted(t *testing.T, path string) bool {
	t.Helper()
	return len(mounttest.MountsAt(t, path)) > 0
}

// mountsUnder counts the mounts at or below dir.
func mountsUnder(t *testing.T, dir string) int {
	t.Helper()
	return len(mounttest.MountsUnder(t, dir))
}

// exists reports whether path exists.
func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}
