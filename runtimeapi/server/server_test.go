package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/runtimeapi/client"
	"github.com/volume-agent/volume-agent/volume"
)

// serving starts a Server on a socket in dir (a new temporary directory
// if empty) and stops it when the test ends.
func serving(t *testing.T, dir string) (*Server, string) {
	t.Helper()
	return servingTB(t, dir)
}

func servingB(b *testing.B) (*Server, string) { return servingTB(b, "") }

func servingTB(t testing.TB, dir string) (*Server, string) {
	t.Helper()
	mounttest.RequireRoot(t) // the API answers root only
	if dir == "" {
		dir = t.TempDir()
	}
	socket := filepath.Join(dir, runtimeapi.SocketName)
	s := New(Options{Socket: socket, Paths: volume.Paths{Root: dir}})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		// net/http's Shutdown counts a connection that never sent a
		// request as active for its first 5 s, and the client's transport
		// may dial one it then does not use: a 5 s limit made this
		// cleanup fail on a loaded machine.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s, socket
}

// publish hands the server the world's snapshots, as a reconciler pass
// does.
func publish(s *Server, w *world) {
	w.dsw.SetPodWithContainers(w.pod, w.vols, w.errs, nil, w.containers)
	s.Reconciled(w.dsw.Snapshot(), w.asw.Snapshot(), nil, 0)
}

func emptyDirWorld(uid string) (*world, volume.UniqueName) {
	w := newWorld(uid)
	n := w.volume("scratch", emptyDirPlugin, volume.Attributes{}, spec("scratch", v1.PersistentVolumeFilesystem, false))
	w.containers = []volume.Container{{Name: "app", Type: volume.RegularContainer, Mounts: []volume.ContainerMount{{Volume: "scratch", MountPath: "/scratch"}}}}
	return w, n
}

func TestSocketIsRootOnly(t *testing.T) {
	_, socket := serving(t, "")
	fi, err := os.Stat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want a 0600 socket", fi.Mode())
	}
	if entries, _ := os.ReadDir(filepath.Dir(socket)); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the socket", len(entries))
	}
}

func TestGetPodAndList(t *testing.T) {
	s, socket := serving(t, "")
	c := client.New(socket)
	ctx := t.Context()

	if l, err := c.Pods(ctx); err != nil || len(l.Pods) != 0 || l.APIVersion != "v1" {
		t.Fatalf("before the first pass: %+v, %v", l, err)
	}
	if _, err := c.Pod(ctx, "u1"); !client.IsNotFound(err) {
		t.Fatalf("unknown pod: %v, want PodNotFound", err)
	}
	w, n := emptyDirWorld("u1")
	dir := w.mounted(n, emptyDirPlugin, volume.Attributes{}, "scratch", cache.Mounted)
	publish(s, w)
	p, err := c.Pod(ctx, "u1")
	if err != nil {
		t.Fatal(err)
	}
	if !p.Ready || p.Volumes[0].HostPath != dir || p.Containers[0].Mounts[0].HostPath != dir {
		t.Errorf("pod %+v", p)
	}
	l, err := c.Pods(ctx)
	if err != nil || len(l.Pods) != 1 || l.Pods[0] != (runtimeapi.PodSummary{UID: "u1", Namespace: "shop", Name: "web-u1", Ready: true}) {
		t.Errorf("list %+v, %v", l, err)
	}
	// A pod gone from the DSW is gone from the API.
	w.dsw.DeletePod(w.pod.UID)
	s.Reconciled(w.dsw.Snapshot(), w.asw.Snapshot(), nil, 0)
	if _, err := c.Pod(ctx, "u1"); !client.IsNotFound(err) {
		t.Errorf("deleted pod: %v, want PodNotFound", err)
	}
}

func TestErrors(t *testing.T) {
	_, socket := serving(t, "")
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return runtimeapi.Dial(ctx, socket)
	}}}
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v1/pods/u1/wait?timeout=forever", 400, runtimeapi.CodeBadRequest},
		{"GET", "/v1/pods/u1/wait?timeout=11m", 400, runtimeapi.CodeBadRequest},
		{"GET", "/v2/pods", 404, runtimeapi.CodeNotFound},
		{"GET", "/v1/pods/u1", 404, runtimeapi.CodePodNotFound},
		{"GET", "/v1/pods/u1/wait?timeout=0", 404, runtimeapi.CodePodNotFound},
		{"POST", "/v1/pods", 405, ""},
	} {
		req, _ := http.NewRequest(tc.method, "http://x"+tc.path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, resp.StatusCode, body, tc.status)
			continue
		}
		if tc.code == "" {
			continue
		}
		var doc runtimeapi.ErrorDocument
		if err := json.Unmarshal(body, &doc); err != nil || doc.Error.Code != tc.code || doc.Error.Message == "" {
			t.Errorf("%s %s: body %s, want error code %s with a message", tc.method, tc.path, body, tc.code)
		}
	}
}

// A wait ends when a reconciler pass makes the pod ready; one that times
// out returns the pod and which volumes are not ready, and why.
func TestWait(t *testing.T) {
	s, socket := serving(t, "")
	c := client.New(socket)
	w, n := emptyDirWorld("u1")
	publish(s, w)

	start := time.Now()
	p, err := c.Wait(t.Context(), "u1", 200*time.Millisecond)
	var nr *client.NotReadyError
	if !errors.As(err, &nr) {
		t.Fatalf("wait on a pod that is not ready: %v, want a NotReadyError", err)
	}
	if time.Since(start) < 200*time.Millisecond {
		t.Errorf("returned after %v, before the timeout", time.Since(start))
	}
	if p.Ready || len(nr.NotReady()) != 1 || nr.NotReady()[0].Reason != runtimeapi.ReasonWaitingForMount ||
		!strings.Contains(err.Error(), "pod shop/web-u1: timed out after 200ms: volumes not ready: scratch (WaitingForMount)") {
		t.Errorf("not ready: %v (%+v)", err, nr.NotReady())
	}

	type result struct {
		p   *runtimeapi.Pod
		err error
	}
	results := make(chan result, 3)
	for range 3 {
		go func() {
			p, err := c.Wait(t.Context(), "u1", time.Minute)
			results <- result{p, err}
		}()
	}
	// Passes that change nothing relevant wake the waiters, which wait
	// on.
	for range 5 {
		publish(s, w)
	}
	select {
	case r := <-results:
		t.Fatalf("a wait returned before the pod was ready: %+v %v", r.p, r.err)
	default:
	}
	dir := w.mounted(n, emptyDirPlugin, volume.Attributes{}, "scratch", cache.Mounted)
	publish(s, w)
	for range 3 {
		r := <-results
		if r.err != nil || !r.p.Ready || r.p.Volumes[0].HostPath != dir {
			t.Errorf("wait: %+v %v", r.p, r.err)
		}
	}

	// A pod that appears during the wait.
	go func() {
		p, err := c.Wait(t.Context(), "late", time.Minute)
		results <- result{p, err}
	}()
	late, n2 := emptyDirWorld("late")
	late.dsw, late.asw = w.dsw, w.asw
	late.mounted(n2, emptyDirPlugin, volume.Attributes{}, "scratch", cache.Mounted)
	// Published until the waiter has certainly started waiting: a pass
	// before it connected must not be the one it depends on.
	deadline := time.After(30 * time.Second)
	for {
		publish(s, late)
		select {
		case r := <-results:
			if r.err != nil || !r.p.Ready || r.p.UID != "late" {
				t.Fatalf("wait for a late pod: %+v %v", r.p, r.err)
			}
			return
		case <-deadline:
			t.Fatal("the wait for a pod that appeared did not return")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Shutting the server down ends the waits at once.
func TestShutdownEndsWaits(t *testing.T) {
	mounttest.RequireRoot(t)
	socket := filepath.Join(t.TempDir(), runtimeapi.SocketName)
	s := New(Options{Socket: socket})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	w, _ := emptyDirWorld("u1")
	publish(s, w)
	c := client.New(socket)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Wait(context.Background(), "u1", 5*time.Minute)
		errc <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); s.Waiters() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the wait never started")
		}
		time.Sleep(time.Millisecond)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	select {
	case err := <-errc:
		var apiErr *client.Error
		if !errors.As(err, &apiErr) || apiErr.Code != runtimeapi.CodeShuttingDown {
			t.Errorf("wait during shutdown: %v, want ShuttingDown", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the wait outlived the server's shutdown")
	}
	if err := <-shut; err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after shutdown: %v", err)
	}
}

// A socket left by an agent that crashed is replaced; one another server
// answers on is not.
func TestListenReplacesAStaleSocket(t *testing.T) {
	mounttest.RequireRoot(t)
	dir := t.TempDir()
	_, socket := serving(t, dir)
	other := New(Options{Socket: socket})
	if err := other.Listen(); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("second server on a live socket: %v", err)
	}
	stale := filepath.Join(t.TempDir(), runtimeapi.SocketName)
	l, err := runtimeapi.ListenShort(stale)
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	s := New(Options{Socket: stale})
	if err := s.Listen(); err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	s.listener.Close()
}

// Sockets whose path is longer than a socket address holds are served and
// reached through a descriptor of their directory.
func TestLongSocketPath(t *testing.T) {
	dir := t.TempDir()
	for len(dir) < 120 {
		dir = filepath.Join(dir, "a-rather-long-directory-name")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s, socket := serving(t, dir)
	w, _ := emptyDirWorld("u1")
	publish(s, w)
	if _, err := client.New(socket).Pod(t.Context(), "u1"); err != nil {
		t.Fatalf("socket %d characters long: %v", len(socket), err)
	}
}

const asNobodyEnv = "VOLUME_AGENT_TEST_RUNTIME_CLIENT"

// nobodyBinary copies the test binary where uid 65534 may run it (a
// directory of mode 0755, not the test's own temporary directory); the
// copy is removed when the test ends. A copy per test, not one per
// process: a test run again (-count) after the first run's cleanup needs
// its own.
func nobodyBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "runtimeapi-client-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client.test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// asNobody runs TestClientHelper of bin (nobodyBinary) as uid 65534
// against socket and returns what its client said.
func asNobody(t *testing.T, bin, socket string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, "-test.run=^TestClientHelper$", "-test.v")
	cmd.Env = append(os.Environ(), asNobodyEnv+"="+socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as uid 65534: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if after, ok := strings.CutPrefix(strings.TrimSpace(line), "client: "); ok {
			return after
		}
	}
	t.Fatalf("no result from the client:\n%s", out)
	return ""
}

// TestClientHelper is the client asNobody runs.
func TestClientHelper(t *testing.T) {
	socket := os.Getenv(asNobodyEnv)
	if socket == "" {
		t.Skip("run by asNobody")
	}
	_, err := client.New(socket).Pods(context.Background())
	fmt.Printf("client: uid=%d err=%v\n", os.Getuid(), err)
}

// A client that is not root is refused: by the socket's mode, and by the
// peer credential check when the mode lets it connect.
func TestNonRootClientRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "runtimeapi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, socket := serving(t, dir)
	w, _ := emptyDirWorld("u1")
	publish(s, w)

	bin := nobodyBinary(t)
	if got := asNobody(t, bin, socket); !strings.Contains(got, "uid=65534") || !strings.Contains(got, "permission denied") {
		t.Errorf("non-root client on the 0600 socket: %s, want permission denied", got)
	}
	if err := os.Chmod(socket, 0o666); err != nil {
		t.Fatal(err)
	}
	got := asNobody(t, bin, socket)
	if !strings.Contains(got, "403 Forbidden") || !strings.Contains(got, "answers root (uid 0) only; this client runs as uid 65534") {
		t.Errorf("non-root client on a socket it may connect to: %s, want 403 from the peer check", got)
	}
	// Root still gets an answer.
	if _, err := client.New(socket).Pods(t.Context()); err != nil {
		t.Errorf("root client: %v", err)
	}
}
