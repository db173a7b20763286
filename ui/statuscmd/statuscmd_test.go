package statuscmd

import (
	"bytes"
	"context"
	"flag"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/ui"
	"github.com/volume-agent/volume-agent/ui/internal/fixture"
	"github.com/volume-agent/volume-agent/ui/model"
	"github.com/volume-agent/volume-agent/volume"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ with the current output")

// agent serves the fixture's state the way the agent's debug endpoint does.
type agent struct {
	url string
	mu  sync.Mutex
	in  model.Input
	srv *ui.Server
}

func newAgent(t *testing.T) *agent {
	t.Helper()
	a := &agent{in: fixture.Input()}
	a.srv = ui.New(ui.Options{Gather: a.input, MinInterval: time.Millisecond})
	mux := http.NewServeMux()
	a.srv.Register(mux)
	hs := httptest.NewServer(mux)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.srv.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; hs.Close() })
	a.url = hs.URL
	return a
}

func (a *agent) input() model.Input {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.in
}

func (a *agent) set(in model.Input) {
	a.mu.Lock()
	a.in = in
	a.mu.Unlock()
	a.srv.Changed()
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./ui/statuscmd -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test ./ui/statuscmd -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestGolden(t *testing.T) {
	a := newAgent(t)
	tests := []struct {
		name string
		args []string
	}{
		{"page", nil},
		{"page-wide", []string{"--output", "wide"}},
		{"namespace", []string{"--namespace", "team-b"}},
		{"state-error", []string{"--state", "error"}},
		{"state-none", []string{"--namespace", "nope"}},
		{"pod-web", []string{"--pod", "default/web"}},
		{"pod-db", []string{"--pod", "team-b/db"}},
		{"pod-worker-json", []string{"--pod", "default/worker", "--output", "json"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if err := Main(t.Context(), append([]string{"--address", a.url}, tc.args...), &out, &errOut); err != nil {
				t.Fatalf("%v (stderr %s)", err, errOut.String())
			}
			golden(t, tc.name, out.Bytes())
		})
	}
}

func TestTerminalSafe(t *testing.T) {
	a := newAgent(t)
	in := fixture.Input()
	in.InputErrors[0].Error = "bad \x1b]0;pwned\x07 title\nsecond line"
	a.set(in)
	var out bytes.Buffer
	if err := Main(t.Context(), []string{"--address", a.url}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\x07") || !strings.Contains(out.String(), `bad \x1b]0;pwned\x07 title second line`) {
		t.Errorf("control characters reach the terminal: %q", out.String())
	}
}

func TestErrors(t *testing.T) {
	a := newAgent(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--pod", "web"}, `--pod "web": want NAMESPACE/NAME`},
		{[]string{"--pod", "default/web", "--state", "error"}, "--namespace and --state do not apply"},
		{[]string{"--output", "yaml"}, `--output "yaml": want wide or json`},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"--pod", "default/nope"}, "pod default/nope is not on node node-1"},
		{[]string{"--address", "127.0.0.1:1"}, "cannot reach the agent's debug endpoint at http://127.0.0.1:1"},
	}
	for _, tc := range tests {
		var out bytes.Buffer
		err := Main(t.Context(), append([]string{"--address", a.url}, tc.args...), &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the test to read while Main
// writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func waitFor(t *testing.T, b *syncBuffer, what string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(b.String(), what) < n {
		if time.Now().After(deadline) {
			t.Fatalf("output has %q %d times, want %d: %s", what, strings.Count(b.String(), what), n, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWatch(t *testing.T) {
	now = func() time.Time { return fixture.Now }
	t.Cleanup(func() { now = time.Now })
	a := newAgent(t)
	ctx, cancel := context.WithCancel(t.Context())
	var out, errOut syncBuffer
	done := make(chan error)
	go func() {
		done <- Main(ctx, []string{"--address", a.url, "--watch", "--namespace", "default"}, &out, &errOut)
	}()
	waitFor(t, &out, "--- ", 1)
	a.set(fixture.WithPod(a.input(), volume.PodRef{UID: "new-uid", Namespace: "default", Name: "added-later"}))
	waitFor(t, &out, "--- ", 2)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("watch returned %v", err)
	}
	golden(t, "watch", []byte(out.String()))
}

func TestWatchPodThatGoes(t *testing.T) {
	now = func() time.Time { return fixture.Now }
	t.Cleanup(func() { now = time.Now })
	a := newAgent(t)
	var out, errOut syncBuffer
	done := make(chan error)
	go func() {
		done <- Main(t.Context(), []string{"--address", a.url, "--watch", "--pod", "default/worker"}, &out, &errOut)
	}()
	waitFor(t, &out, "--- ", 1)
	in := a.input()
	s := *cache.NewDesiredSnapshot(maps.Collect(in.DSW.Volumes()), nil, in.DSW.Generation)
	in.DSW, in.ASW = &s, nil
	a.set(in)
	// The pod going away is shown, and the watch goes on.
	waitFor(t, &out, "pod default/worker is not on node node-1", 1)
	select {
	case err := <-done:
		t.Fatalf("watch ended: %v", err)
	default:
	}
}
