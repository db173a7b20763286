package ui

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/ui/internal/fixture"
	"github.com/volume-agent/volume-agent/ui/model"
	"github.com/volume-agent/volume-agent/volume"
)

// testServer serves the fixture; set changes what it gathers next.
type testServer struct {
	*Server
	URL string

	mu sync.Mutex
	in model.Input
}

func (ts *testServer) set(in model.Input) {
	ts.mu.Lock()
	ts.in = in
	ts.mu.Unlock()
	ts.Changed()
}

func (ts *testServer) input() model.Input {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.in
}

func newTestServer(t *testing.T, o Options, configure ...func(*http.Server)) *testServer {
	t.Helper()
	ts := &testServer{in: fixture.Input()}
	o.Gather = ts.input
	ts.Server = New(o)
	mux := http.NewServeMux()
	ts.Register(mux)
	hs := httptest.NewUnstartedServer(mux)
	for _, c := range configure {
		c(hs.Config)
	}
	hs.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ts.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		hs.Close()
	})
	ts.URL = hs.URL
	return ts
}

func get(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func TestPages(t *testing.T) {
	ts := newTestServer(t, Options{})
	tests := []struct {
		path    string
		code    int
		want    []string
		notWant []string
	}{
		{"/", 200, []string{
			"waiting-for-claim", "PVCNotFound: PVC default/does-not-exist not found", `href="/pods/team-b/db"`,
			`class="badge state-error"`, "MountFailed: rpc error", "next try", `data-until`,
			"csi.example.com", "unresponsive", "broken-reg.sock", "etc-hosts", "/mnt/disks/ssd2", "the disk is gone",
			"bad.yaml", "SuccessfulMountVolume", `<svg class="statebar"`, `data-stream="/?watch=1"`,
		}, nil},
		{"/?namespace=team-b", 200, []string{"old-job", `href="/pods/team-b/db"`, "2 of 5 (filtered)", `<option value="team-b" selected>`},
			[]string{`href="/pods/default/web"`}},
		{"/?state=error&pod=d", 200, []string{`href="/pods/team-b/db"`, `href="/pods/team-b/old-job"`}, []string{`href="/pods/default/web"`, "waiting-for-claim</a>"}},
		{"/pods/default/web", 200, []string{
			"default/", "web", `<svg class="tree"`, "/mnt/disks/content", "global mount", "default/worker · mounted",
			`<svg class="timeline"`, "mount_device", "content", "(every pod)", `data-stream="/pods/default/web?watch=1"`,
		}, nil},
		{"/pods/team-b/db", 200, []string{"/dev/vdb", "op-failed", "rpc error: code = Unavailable"}, nil},
		{"/pods/default/nope", 404, []string{"default/nope is not on this node"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			code, h, body := get(t, ts.URL+tc.path)
			if code != tc.code {
				t.Fatalf("status %d, want %d: %s", code, tc.code, body)
			}
			if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("page lacks %q", w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(body, w) {
					t.Errorf("page has %q", w)
				}
			}
			// Nothing from elsewhere.
			for _, w := range []string{"http://", "https://", "//cdn"} {
				if strings.Contains(body, w) {
					t.Errorf("page refers to %q", w)
				}
			}
		})
	}
}

func TestPageEscapesWhatTenantsControl(t *testing.T) {
	ts := newTestServer(t, Options{})
	in := fixture.Input()
	in.InputErrors[0].Error = `<script>alert(1)</script>`
	ts.set(in)
	_, _, body := get(t, ts.URL+"/")
	if strings.Contains(body, "<script>alert") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("a manifest's error is not escaped")
	}
}

func TestStatic(t *testing.T) {
	ts := newTestServer(t, Options{})
	for path, ctype := range map[string]string{"/ui/static/page.css": "text/css", "/ui/static/page.js": "text/javascript"} {
		code, h, body := get(t, ts.URL+path)
		if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), ctype) || len(body) < 100 {
			t.Errorf("%s: %d %s (%d bytes)", path, code, h.Get("Content-Type"), len(body))
		}
	}
}

func TestStatusJSON(t *testing.T) {
	ts := newTestServer(t, Options{})
	_, _, body := get(t, ts.URL+"/debug/status?namespace=team-b")
	var page model.Page
	if err := json.Unmarshal([]byte(body), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Pods) != 2 || page.Pods[0].Name != "db" || page.Summary.Pods != 5 || page.Node != "node-1" {
		t.Errorf("filtered page: %d pods, summary %+v", len(page.Pods), page.Summary)
	}

	_, _, body = get(t, ts.URL+"/debug/status/pods/default/web")
	var d model.PodDetail
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if d.Pod.Name != "web" || len(d.Mounts) != 3 || len(d.Timeline) != 4 {
		t.Errorf("detail: %+v", d)
	}

	code, _, body := get(t, ts.URL+"/debug/status/pods/default/nope")
	if code != 404 || !strings.Contains(body, `"error": "pod default/nope is not on node node-1`) {
		t.Errorf("unknown pod: %d %s", code, body)
	}
}

// event is one server-sent event.
type event struct {
	id, name, data string
	comment        bool
}

// events reads server-sent events from a stream.
func events(t *testing.T, ctx context.Context, url string) (*http.Response, <-chan event) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan event)
	if resp.StatusCode != 200 {
		close(ch)
		return resp, ch
	}
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		var ev event
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" || ev.comment {
					ev.data = strings.Join(data, "\n")
					select {
					case ch <- ev:
					case <-ctx.Done():
						return
					}
				}
				ev, data = event{}, nil
			case strings.HasPrefix(line, ":"):
				ev.comment = true
			case strings.HasPrefix(line, "id: "):
				ev.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.name = line[7:]
			case strings.HasPrefix(line, "data: "):
				data = append(data, line[6:])
			}
		}
	}()
	return resp, ch
}

func next(t *testing.T, ch <-chan event) event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the stream ended")
		}
		return ev
	case <-time.After(20 * time.Second):
		t.Fatal("no event within 20s")
	}
	return event{}
}

func nextView(t *testing.T, ch <-chan event) event {
	t.Helper()
	for {
		if ev := next(t, ch); !ev.comment {
			return ev
		}
	}
}

func TestStreamSendsChanges(t *testing.T) {
	ts := newTestServer(t, Options{MinInterval: time.Millisecond})
	_, ch := events(t, t.Context(), ts.URL+"/?watch=1")
	first := nextView(t, ch)
	if first.name != "view" || first.id != "1" || !strings.HasPrefix(first.data, `<div id="view"`) || !strings.Contains(first.data, "waiting-for-claim") {
		t.Fatalf("first event %s %s: %.200s", first.id, first.name, first.data)
	}
	// A signal without a change sends nothing: the next event is the
	// change after it.
	ts.Changed()
	newPod := volume.PodRef{UID: "new-uid", Namespace: "default", Name: "added-later"}
	ts.set(fixture.WithPod(ts.input(), newPod))
	second := nextView(t, ch)
	if second.id != "2" || !strings.Contains(second.data, "added-later") {
		t.Fatalf("second event %s: want id 2 with the new pod, got %.300s", second.id, second.data)
	}
}

func TestStreamOfJSONAndOfAPod(t *testing.T) {
	ts := newTestServer(t, Options{MinInterval: time.Millisecond})
	_, ch := events(t, t.Context(), ts.URL+"/debug/status/pods/default/worker?watch=1")
	ev := nextView(t, ch)
	var d model.PodDetail
	if err := json.Unmarshal([]byte(ev.data), &d); ev.name != "status" || err != nil || d.Pod.Name != "worker" {
		t.Fatalf("event %s: %v %.200s", ev.name, err, ev.data)
	}
	// The pod goes away: the stream says so.
	in := ts.input()
	s := *cache.NewDesiredSnapshot(maps.Collect(in.DSW.Volumes()), nil, in.DSW.Generation)
	in.DSW = &s
	in.ASW = nil
	ts.set(in)
	ev = nextView(t, ch)
	if !strings.Contains(ev.data, `"error":"pod default/worker is not on node node-1`) {
		t.Errorf("after the pod went: %s", ev.data)
	}
}

func TestStreamCap(t *testing.T) {
	ts := newTestServer(t, Options{MaxStreams: 1})
	_, ch := events(t, t.Context(), ts.URL+"/?watch=1")
	nextView(t, ch)
	resp, _ := events(t, t.Context(), ts.URL+"/?watch=1")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("second stream: %d, want 503 with Retry-After", resp.StatusCode)
	}
	// The page itself is still served.
	if code, _, _ := get(t, ts.URL+"/"); code != 200 {
		t.Errorf("page: %d", code)
	}
}

// A stream outlives the server's WriteTimeout: every write extends the
// deadline.
func TestStreamOutlivesWriteTimeout(t *testing.T) {
	ts := newTestServer(t, Options{Heartbeat: 300 * time.Millisecond}, func(s *http.Server) { s.WriteTimeout = 100 * time.Millisecond })
	_, ch := events(t, t.Context(), ts.URL+"/?watch=1")
	nextView(t, ch)
	for range 2 {
		if ev := next(t, ch); !ev.comment {
			t.Fatalf("want a keep-alive comment, got %+v", ev)
		}
	}
}

func TestStreamsEndWhenTheServerStops(t *testing.T) {
	s := New(Options{Gather: fixture.Input})
	mux := http.NewServeMux()
	s.Register(mux)
	hs := httptest.NewServer(mux)
	defer hs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	_, ch := events(t, t.Context(), hs.URL+"/?watch=1")
	nextView(t, ch)
	cancel()
	<-done
	for ev := range ch {
		if !ev.comment && ev.name == "" {
			t.Errorf("unexpected %+v", ev)
		}
	}
}

func TestWriteEvent(t *testing.T) {
	tests := []struct {
		data, want string
	}{
		{"one line", "id: 7\nevent: view\ndata: one line\n\n"},
		{"a\nb", "id: 7\nevent: view\ndata: a\ndata: b\n\n"},
		{"a\r\nb\rdata: c", "id: 7\nevent: view\ndata: a\ndata: b\ndata: data: c\n\n"},
		{"", "id: 7\nevent: view\n\n"},
	}
	for _, tc := range tests {
		var buf bytes.Buffer
		writeEvent(&buf, "view", 7, []byte(tc.data))
		if buf.String() != tc.want {
			t.Errorf("%q: %q, want %q", tc.data, buf.String(), tc.want)
		}
	}
}

func TestRendersAreShared(t *testing.T) {
	var c renders
	calls := 0
	render := func(s *snapshot) ([]byte, error) {
		calls++
		return []byte(fmt.Sprint(s.seq)), nil
	}
	s1, s2 := &snapshot{seq: 1}, &snapshot{seq: 2}
	for _, step := range []struct {
		key   string
		snap  *snapshot
		calls int
		want  string
	}{
		{"/", s1, 1, "1"},
		{"/", s1, 1, "1"}, // a second viewer of the same view
		{"/?state=error", s1, 2, "1"},
		{"/", s2, 3, "2"}, // a change
		{"/", s2, 3, "2"},
	} {
		got, err := c.get(step.key, step.snap, render)
		if err != nil || string(got) != step.want || calls != step.calls {
			t.Errorf("get(%q, seq %d) = %q %v after %d renders, want %q after %d", step.key, step.snap.seq, got, err, calls, step.want, step.calls)
		}
	}
	if len(c.entries) != 1 {
		t.Errorf("%d renderings kept, want only the current one: %v", len(c.entries), c.entries)
	}
}
