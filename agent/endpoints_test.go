package agent

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/agent/httpserve"
)

// The agent's debug endpoint (and the page on it) refuses a request that
// names another host, as a browser sends it after DNS rebinding, and
// serves the same request for localhost.
func TestDebugEndpointRefusesForeignHosts(t *testing.T) {
	a := startAgent(t, standaloneConfig(t))
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	for _, tc := range []struct {
		path, host string
		want       int
	}{
		{"/", "attacker.example", http.StatusMisdirectedRequest},
		{"/debug/dsw", "attacker.example:9808", http.StatusMisdirectedRequest},
		{"/", "localhost", http.StatusOK},
		{"/debug/dsw", "", http.StatusOK}, // the address itself
	} {
		req, err := http.NewRequest(http.MethodGet, "http://"+a.DebugAddress()+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.host != "" {
			req.Host = tc.host
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s with Host %q: %d %s, want %d", tc.path, tc.host, resp.StatusCode, body, tc.want)
		}
	}
}

// The agent's debug endpoint serves a CPU profile longer than its write
// timeout: profiles are streaming handlers.
func TestDebugProfileOutlastsTheWriteTimeout(t *testing.T) {
	cfg := standaloneConfig(t)
	cfg.HTTP = httpserve.Limits{WriteTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond}
	a := startAgent(t, cfg)
	code, body, err := get("http://" + a.DebugAddress() + "/debug/pprof/profile?seconds=1")
	if err != nil || code != http.StatusOK || len(body) == 0 {
		t.Fatalf("profile: %d, %d bytes, %v", code, len(body), err)
	}
}

// The page's live view (server-sent events) outlasts the endpoint's read
// and write timeouts: a viewer keeps getting changes after them.
func TestPageStreamOutlastsTheTimeouts(t *testing.T) {
	const timeout = 200 * time.Millisecond
	cfg := standaloneConfig(t)
	cfg.HTTP = httpserve.Limits{WriteTimeout: timeout, ReadTimeout: timeout}
	a := startAgent(t, cfg)
	resp, err := http.Get("http://" + a.DebugAddress() + "/?watch=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %s", resp.Status)
	}
	events := make(chan string, 100)
	go func() {
		defer close(events)
		s := bufio.NewScanner(resp.Body)
		s.Buffer(nil, 4<<20)
		for s.Scan() {
			if ev, ok := strings.CutPrefix(s.Text(), "event: "); ok {
				events <- ev
			}
		}
	}()
	if _, ok := <-events; !ok {
		t.Fatal("the stream ended before its first event")
	}
	// What is tested is time passing: the stream must live through it.
	time.Sleep(3 * timeout)
	for drained := false; !drained; {
		select {
		case _, ok := <-events:
			if !ok {
				t.Fatal("the stream ended when the read or write timeout expired")
			}
		default:
			drained = true
		}
	}
	// A change after that still reaches the viewer.
	manifest := strings.NewReplacer("name: web", "name: later", "000000000001", "000000000002").Replace(podManifest)
	if err := os.WriteFile(filepath.Join(cfg.PodManifestPath, "later.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-events:
		if !ok {
			t.Fatal("the stream ended instead of showing the new pod")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no event for the new pod within 30s")
	}
}
