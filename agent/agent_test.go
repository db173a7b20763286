package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/volume-agent/volume-agent/agent/debug"
	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/volume"
)

// podManifest is a pod with a disk emptyDir: setting it up mounts nothing,
// so the test needs no cleanup of the host.
const podManifest = `apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default, uid: 6f1c1d52-0000-4000-8000-000000000001}
spec:
  containers: [{name: web, image: busybox, volumeMounts: [{name: scratch, mountPath: /scratch}]}]
  volumes: [{name: scratch, emptyDir: {}}]
`

// standaloneConfig is an agent on a temporary manifest directory and root
// directory, with both endpoints on free loopback ports.
func standaloneConfig(t *testing.T) Config {
	t.Helper()
	manifests := t.TempDir()
	if err := os.WriteFile(filepath.Join(manifests, "web.yaml"), []byte(podManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	return Config{
		NodeName:            "node-1",
		RootDir:             t.TempDir(),
		PodManifestPath:     manifests,
		DebugAddress:        "127.0.0.1:0",
		MetricsAddress:      "127.0.0.1:0",
		ShutdownGracePeriod: 10 * time.Second,
	}
}

// running is an agent running in the background.
type running struct {
	*Agent
	stop  context.CancelFunc
	done  chan error
	err   error
	ended bool
}

// startAgent builds the agent and runs it in the background; the test's
// cleanup stops it.
func startAgent(t *testing.T, cfg Config) *running {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return run(t, a)
}

func run(t *testing.T, a *Agent) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Agent: a, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		r.wait(t)
	})
	return r
}

// wait returns what Run returned.
func (r *running) wait(t *testing.T) error {
	t.Helper()
	if r.ended {
		return r.err
	}
	select {
	case r.err = <-r.done:
		r.ended = true
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s")
	}
	return r.err
}

// checkNoLeaks fails the test if a goroutine started after this call is
// still running once the test and its cleanups are done.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

// get fetches a URL without keeping the connection, so no client goroutine
// is left over for the leak check.
func get(url string) (int, []byte, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func TestRunStopsEverythingItStarted(t *testing.T) {
	checkNoLeaks(t)

	cfg := standaloneConfig(t)
	a := startAgent(t, cfg)
	scratch := volume.Paths{Root: cfg.RootDir}.PodVolumeDir("6f1c1d52-0000-4000-8000-000000000001", "kubernetes.io/empty-dir", "scratch")

	// Ready, and the pod's volume set up: every loop has run.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, err := get("http://" + a.DebugAddress() + "/readyz")
		_, statErr := os.Stat(scratch)
		if err == nil && code == http.StatusOK && statErr == nil && mounted(t, a, scratch) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not ready with the volume set up after 30s: readyz %d %v, volume %v", code, err, statErr)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The operator page shows the pod, and a live view open while the
	// agent stops ends with it.
	if code, body, err := get("http://" + a.DebugAddress() + "/"); err != nil || code != http.StatusOK || !bytes.Contains(body, []byte("default/</span>web")) {
		t.Errorf("GET /: %d %v, want the page with the pod default/web:\n%s", code, err, body)
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + a.DebugAddress() + "/debug/status?watch=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first, err := bufio.NewReader(resp.Body).ReadString('}')
	if err != nil || !strings.Contains(first, "event: status") {
		t.Fatalf("the live view's first event: %q %v", first, err)
	}
	streamEnded := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, resp.Body); close(streamEnded) }()

	a.stop()
	if err := a.wait(t); err != nil {
		t.Fatalf("Run after its context ended: %v, want nil", err)
	}
	select {
	case <-streamEnded:
	case <-time.After(10 * time.Second):
		t.Error("a live view still streams after Run returned")
	}
	if _, err := os.Stat(scratch); err != nil {
		t.Errorf("stopping removed the pod's volume: %v", err)
	}
	for _, addr := range []string{a.DebugAddress(), a.MetricsAddress()} {
		if _, _, err := get("http://" + addr + "/healthz"); err == nil {
			t.Errorf("%s still answers after Run returned", addr)
		}
	}
}

// mounted reports whether the debug endpoint shows the volume set up.
func mounted(t *testing.T, a *running, dir string) bool {
	t.Helper()
	code, body, err := get("http://" + a.DebugAddress() + "/debug/asw")
	if err != nil || code != http.StatusOK {
		return false
	}
	var doc debug.ASWDocument
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("/debug/asw: %v", err)
	}
	for _, v := range doc.Volumes {
		for _, p := range v.Pods {
			if p.MountPath == dir && p.MountState == cache.Mounted {
				return true
			}
		}
	}
	return false
}

func TestRunReturnsTheErrorOfAFailingLoop(t *testing.T) {
	for _, tc := range []struct {
		name string
		// breakIt makes one loop fail, before or after New.
		breakIt func(t *testing.T, cfg *Config) (afterNew func())
		want    []string
	}{
		{
			name: "registration watcher cannot create its directory",
			breakIt: func(t *testing.T, cfg *Config) func() {
				file := filepath.Join(t.TempDir(), "file")
				if err := os.WriteFile(file, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				cfg.PluginRegistryDir = filepath.Join(file, "plugins_registry")
				return nil
			},
			want: []string{"CSI registration watcher", "creating plugin registry directory"},
		},
		{
			name: "manifest directory gone before Run",
			breakIt: func(t *testing.T, cfg *Config) func() {
				return func() {
					if err := os.RemoveAll(cfg.PodManifestPath); err != nil {
						t.Fatal(err)
					}
				}
			},
			want: []string{"source:", "does not exist"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			cfg := standaloneConfig(t)
			afterNew := tc.breakIt(t, &cfg)
			agent, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if afterNew != nil {
				afterNew()
			}
			a := run(t, agent)
			err = a.wait(t)
			if err == nil {
				t.Fatal("Run returned nil, want the loop's error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Run: %v, want it to say %q", err, w)
				}
			}
			if _, _, err := get("http://" + a.MetricsAddress() + "/healthz"); err == nil {
				t.Error("the metrics endpoint still answers after Run returned")
			}
		})
	}
}

func TestLoops(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		loop    func(ctx context.Context) error
		stop    bool // end the parent context
		want    error
		wantMsg string
	}{
		{name: "fails", loop: func(context.Context) error { return boom }, want: boom, wantMsg: "failing: boom"},
		{name: "returns early", loop: func(context.Context) error { return nil }, want: errStoppedEarly, wantMsg: "failing: stopped unexpectedly"},
		{name: "fails because the agent stops", loop: func(ctx context.Context) error { <-ctx.Done(); return boom }, stop: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			l := newLoops(parent)
			stopped := make(chan struct{})
			l.run("steady", untilDone(func(ctx context.Context) { <-ctx.Done(); close(stopped) }))
			l.run("failing", tc.loop)
			if tc.stop {
				cancel()
			}
			err := l.wait()
			select {
			case <-stopped:
			default:
				t.Error("the other loop was not stopped")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("wait: %v, want %v", err, tc.want)
			}
			if err != nil && err.Error() != tc.wantMsg {
				t.Errorf("wait: %q, want %q", err, tc.wantMsg)
			}
			if tc.want != nil && !errors.Is(context.Cause(l.ctx), tc.want) {
				t.Errorf("cause: %v, want %v", context.Cause(l.ctx), tc.want)
			}
		})
	}
}

// TestClusterModeRunStopsEverythingItStarted runs the cluster-mode loops
// too: informers, event broadcaster, pod and node status, the local volume
// provisioner.
func TestClusterModeRunStopsEverythingItStarted(t *testing.T) {
	c := cluster.StartForTest(t, cluster.Options{})
	if _, err := c.CreateNode(t.Context(), "node-1", nil); err != nil {
		t.Fatal(err)
	}
	// After the control plane's own goroutines (process waiters, the
	// thread that forks them) have started.
	checkNoLeaks(t)
	dir := t.TempDir()
	localVolumes := filepath.Join(dir, "local-volumes.yaml")
	if err := os.WriteFile(localVolumes, []byte("storageClasses:\n  fast: {discoveryDir: "+filepath.Join(dir, "disks")+"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := standaloneConfig(t)
	cfg.PodManifestPath = ""
	cfg.Kubeconfig = c.AdminKubeconfig()
	cfg.LocalVolumesConfig = localVolumes
	cfg.HostRoot = "/"
	a := startAgent(t, cfg)

	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body, err := get("http://" + a.MetricsAddress() + "/readyz")
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not ready after 60s: %d %s %v", code, body, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.stop()
	if err := a.wait(t); err != nil {
		t.Fatalf("Run after its context ended: %v, want nil", err)
	}
}
