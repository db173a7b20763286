package localpv_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

// spawn runs f on one OS thread that never exits: agents get
// Pdeathsig=SIGKILL so that they die with the test binary even when a
// panic skips every cleanup, and Linux sends that signal when the thread
// that forked the child exits.
var spawn = func() func(func()) {
	reqs := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked
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

// agent is a volume-agent process of a test.
type agent struct {
	root    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// startAgent runs the volume-agent binary for the test's node (cluster
// mode, as the deploy/ ServiceAccount) and waits until it is ready. It is
// stopped with SIGTERM when the test ends, before its root directory is
// unmounted.
func (e *env) startAgent() *agent {
	e.t.Helper()
	t := e.t
	a := &agent{root: mounttest.TempDir(t), logPath: filepath.Join(t.TempDir(), "agent.log"), done: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	debug := l.Addr().String()
	l.Close()
	logFile, err := os.Create(a.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	a.cmd = exec.Command(suite.agentBin,
		"--kubeconfig="+suite.agentKubeconfig, "--node-name="+e.node, "--root-dir="+a.root,
		"--debug-address="+debug, "--metrics-address=", "--shutdown-grace-period=10s")
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	spawn(func() { err = a.cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	go func() { a.err = a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() { a.stop(t) })
	client := &http.Client{Timeout: 2 * time.Second}
	eventually(t, 60*time.Second, "the agent ready", func(context.Context) (bool, string) {
		select {
		case <-a.done:
			t.Fatalf("the agent exited: %v\n%s", a.err, tail(a.logPath))
		default:
		}
		resp, err := client.Get("http://" + debug + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return a
}

func (a *agent) stop(t *testing.T) {
	select {
	case <-a.done:
	default:
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
			<-a.done
			t.Errorf("the agent did not stop within 30s of SIGTERM")
		}
	}
	if a.err != nil {
		t.Errorf("the agent exited with %v", a.err)
	}
	if log, err := os.ReadFile(a.logPath); err == nil && bytes.Contains(log, []byte("WARNING: DATA RACE")) {
		t.Errorf("the agent's race detector found a data race; log in %s", a.logPath)
	}
	if t.Failed() {
		t.Logf("--- the agent's log ---\n%s", tail(a.logPath))
	}
}

// volumePath is where the agent mounts a pod's local volume.
func (a *agent) volumePath(podUID, pv string) string {
	return filepath.Join(a.root, "pods", podUID, "volumes", "kubernetes.io~local-volume", pv)
}

func tail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(data) > 8000 {
		data = data[len(data)-8000:]
	}
	return string(data)
}
