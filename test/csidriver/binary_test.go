package csidriver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

var (
	binaryOnce sync.Once
	binaryDir  string
	binaryPath string
	binaryErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binaryDir != "" {
		os.RemoveAll(binaryDir)
	}
	os.Exit(code)
}

// driverBinary builds cmd/test-csi-driver once per test run.
func driverBinary(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("skipping: no go tool to build the driver binary")
	}
	binaryOnce.Do(func() {
		if binaryDir, binaryErr = os.MkdirTemp("", "csidrv-bin-"); binaryErr != nil {
			return
		}
		binaryPath = filepath.Join(binaryDir, "test-csi-driver")
		out, err := exec.Command(goTool, "build", "-o", binaryPath, "./cmd/test-csi-driver").CombinedOutput()
		if err != nil {
			binaryErr = errors.New(err.Error() + ": " + string(out))
		}
	})
	if binaryErr != nil {
		t.Fatalf("building the driver: %v", binaryErr)
	}
	return binaryPath
}

// driverProcess is the driver binary running in the background.
type driverProcess struct {
	cmd    *exec.Cmd
	output *bytes.Buffer
	done   chan struct{}
	err    error // of Wait, valid after done is closed
}

// startBinary runs the driver with args plus --endpoint and --state-dir in
// dir and waits for its CSI socket. It is killed at the end of the test if
// it is still running.
func startBinary(t *testing.T, dir string, args ...string) *driverProcess {
	t.Helper()
	sock := filepath.Join(dir, "csi.sock")
	args = append([]string{"--endpoint", "unix://" + sock, "--state-dir", filepath.Join(dir, "state"),
		"--node-id", "node-1"}, args...)
	p := &driverProcess{cmd: exec.Command(driverBinary(t), args...), output: &bytes.Buffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	// A socket left by an earlier, killed instance must not count as ready.
	os.Remove(sock)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("driver output:\n%s", p.output)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("driver exited early: %v\n%s", p.err, p.output)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver socket %s did not appear\n%s", sock, p.output)
		}
	}
}

func (p *driverProcess) kill() {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Kill()
		<-p.done
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *driverProcess) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("driver did not exit\n%s", p.output)
	}
	return p.cmd.ProcessState.ExitCode()
}

func TestBinaryFlags(t *testing.T) {
	dir := newTestDir(t)
	regDir := filepath.Join(dir, "registry")
	control := filepath.Join(dir, "control.sock")
	p := startBinary(t, dir, "--name", "bin.test.io", "--registration-dir", regDir, "--control-socket", control,
		"--fault", "Probe=Unavailable:1", "--fault", "NodeGetInfo=resource_exhausted", "--hang", "GetPluginInfo",
		"--max-volumes-per-node", "7", "--log-level", "debug")
	conn := dial(t, "unix://"+filepath.Join(dir, "csi.sock"))
	ident, node := csi.NewIdentityClient(conn), csi.NewNodeClient(conn)
	ctx := testCtx(t)

	_, err := ident.Probe(ctx, &csi.ProbeRequest{})
	expectCode(t, err, codes.Unavailable)
	_, err = ident.Probe(ctx, &csi.ProbeRequest{})
	mustOK(t, err)
	_, err = node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	expectCode(t, err, codes.ResourceExhausted)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = ident.GetPluginInfo(short, &csi.GetPluginInfoRequest{})
	cancel()
	expectCode(t, err, codes.DeadlineExceeded)

	// Change the faults of the running process.
	c := NewControlClient(control)
	mustOK(t, c.ResetFaults())
	info, err := ident.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	mustOK(t, err)
	if info.GetName() != "bin.test.io" {
		t.Errorf("name %q", info.GetName())
	}
	ni, err := node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	mustOK(t, err)
	if ni.GetNodeId() != "node-1" || ni.GetMaxVolumesPerNode() != 7 {
		t.Errorf("NodeGetInfo = %v", ni)
	}

	// Registration socket.
	reg := registerapi.NewRegistrationClient(dial(t, "unix://"+filepath.Join(regDir, "bin.test.io-reg.sock")))
	pi, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	mustOK(t, err)
	if pi.GetType() != registerapi.CSIPlugin || pi.GetEndpoint() != filepath.Join(dir, "csi.sock") {
		t.Errorf("GetInfo = %v", pi)
	}
	_, err = reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
	mustOK(t, err)

	// calls.json tracks every call.
	var counts map[string]int
	data, err := os.ReadFile(filepath.Join(dir, "state", "calls.json"))
	mustOK(t, err)
	mustOK(t, json.Unmarshal(data, &counts))
	want := map[string]int{"Probe": 2, "NodeGetInfo": 2, "GetPluginInfo": 2, "GetInfo": 1, "NotifyRegistrationStatus": 1}
	for m, n := range want {
		if counts[m] != n {
			t.Errorf("calls.json: %s=%d, want %d (%s)", m, counts[m], n, data)
		}
	}

	// SIGTERM: clean exit, sockets gone.
	mustOK(t, p.cmd.Process.Signal(syscall.SIGTERM))
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d after SIGTERM\n%s", code, p.output)
	}
	for _, s := range []string{filepath.Join(dir, "csi.sock"), filepath.Join(regDir, "bin.test.io-reg.sock"), control} {
		if _, err := os.Stat(s); !os.IsNotExist(err) {
			t.Errorf("%s left after SIGTERM: %v", s, err)
		}
	}
}

func TestBinaryBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--fault", "Nope=Internal"},
		{"--fault", "Probe=Whatever"},
		{"--hang", "Nope"},
		{"--default-fstype", "btrfs"},
		{"--capacity", "lots"},
	} {
		dir := newTestDir(t)
		cmd := exec.Command(driverBinary(t), append([]string{"--endpoint", "unix://" + filepath.Join(dir, "csi.sock"),
			"--state-dir", dir}, args...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || cmd.ProcessState.ExitCode() != 1 {
			t.Errorf("%v: %v, want exit code 1\n%s", args, err, out)
		}
	}
}

func TestBinaryCrashAfter(t *testing.T) {
	dir := newTestDir(t)
	p := startBinary(t, dir, "--crash-after", "2")
	ident := csi.NewIdentityClient(dial(t, "unix://"+filepath.Join(dir, "csi.sock")))
	for range 2 {
		_, err := ident.Probe(testCtx(t), &csi.ProbeRequest{})
		mustOK(t, err)
	}
	if code := p.wait(t); code != 2 {
		t.Errorf("exit code %d, want 2\n%s", code, p.output)
	}
}

// TestBinaryKillAndRestart kills the driver with SIGKILL while a volume is
// staged and published, restarts it on the same state directory and checks
// that it can tear the volume down.
func TestBinaryKillAndRestart(t *testing.T) {
	requireLoopDevices(t)
	dir := newTestDir(t)
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	mustOK(t, os.Mkdir(staging, 0o750))

	p := startBinary(t, dir)
	conn := dial(t, "unix://"+filepath.Join(dir, "csi.sock"))
	id := createVolume(t, conn, "kill-9", 0).GetVolumeId()
	node := csi.NewNodeClient(conn)
	_, err := node.NodeStageVolume(testCtx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo})
	mustOK(t, err)
	_, err = node.NodePublishVolume(testCtx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo})
	mustOK(t, err)

	mustOK(t, p.cmd.Process.Signal(syscall.SIGKILL))
	p.wait(t)
	expectMounted(t, target, true)

	startBinary(t, dir)
	conn = dial(t, "unix://"+filepath.Join(dir, "csi.sock"))
	node = csi.NewNodeClient(conn)
	_, err = node.NodeUnpublishVolume(testCtx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	mustOK(t, err)
	_, err = node.NodeUnstageVolume(testCtx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	mustOK(t, err)
	_, err = csi.NewControllerClient(conn).DeleteVolume(testCtx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	mustOK(t, err)
	expectClean(t, dir)

	// The restarted process counts from zero.
	var counts map[string]int
	data, err := os.ReadFile(filepath.Join(dir, "state", "calls.json"))
	mustOK(t, err)
	mustOK(t, json.Unmarshal(data, &counts))
	if counts["NodeUnstageVolume"] != 1 || counts["NodeStageVolume"] != 0 {
		t.Errorf("calls.json after restart: %s", data)
	}
}
