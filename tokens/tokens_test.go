package tokens

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeAPI issues tokens "tok-<n>" valid for the requested time (or
// serverTTL when set, as a server with a maximum expiration does).
type fakeAPI struct {
	clock     *clocktesting.FakeClock
	mu        sync.Mutex
	requests  []authenticationv1.TokenRequestSpec
	fail      error
	serverTTL int64
	block     chan struct{}
}

func (f *fakeAPI) RequestToken(_ context.Context, ns, sa string, spec authenticationv1.TokenRequestSpec) (*authenticationv1.TokenRequest, error) {
	if f.block != nil {
		<-f.block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, spec)
	if f.fail != nil {
		return nil, f.fail
	}
	ttl := *spec.ExpirationSeconds
	if f.serverTTL != 0 {
		ttl = f.serverTTL
	}
	spec.ExpirationSeconds = &ttl
	return &authenticationv1.TokenRequest{
		Spec: spec,
		Status: authenticationv1.TokenRequestStatus{
			Token:               fmt.Sprintf("tok-%d", len(f.requests)),
			ExpirationTimestamp: metav1.NewTime(f.clock.Now().Add(time.Duration(ttl) * time.Second)),
		},
	}, nil
}

func (f *fakeAPI) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

type countingObserver struct {
	mu       sync.Mutex
	ok, fail int
}

func (c *countingObserver) TokenRequested(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.fail++
	} else {
		c.ok++
	}
}

var start = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func newManager(jitter time.Duration) (*Manager, *fakeAPI, *clocktesting.FakeClock, *countingObserver) {
	clk := clocktesting.NewFakeClock(start)
	api := &fakeAPI{clock: clk}
	obs := &countingObserver{}
	m := New(Options{Requester: api, Clock: clk, Jitter: func() time.Duration { return jitter }, Observer: obs})
	return m, api, clk, obs
}

var key = Key{Namespace: "ns", ServiceAccount: "default", ExpirationSeconds: 3607, PodName: "p", PodUID: "uid-1"}

func get(t *testing.T, m *Manager, k Key) (string, time.Time) {
	t.Helper()
	tok, at, err := m.Get(context.Background(), k)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return string(tok), at
}

func TestRequestBoundToThePod(t *testing.T) {
	m, api, _, _ := newManager(0)
	k := key
	k.Audience = "vault"
	get(t, m, k)
	get(t, m, key)
	if api.count() != 2 {
		t.Fatalf("%d requests, want one per audience", api.count())
	}
	spec := api.requests[0]
	ref := spec.BoundObjectRef
	if ref == nil || ref.Kind != "Pod" || ref.APIVersion != "v1" || ref.Name != "p" || ref.UID != "uid-1" {
		t.Errorf("boundObjectRef = %+v, want the pod by name and UID", ref)
	}
	if *spec.ExpirationSeconds != 3607 || len(spec.Audiences) != 1 || spec.Audiences[0] != "vault" {
		t.Errorf("spec = %+v", spec)
	}
	if api.requests[1].Audiences != nil {
		t.Errorf("no audience must leave audiences unset (the API server's defaults), got %v", api.requests[1].Audiences)
	}
}

func TestRefreshTiming(t *testing.T) {
	tests := []struct {
		name      string
		expSecs   int64
		serverTTL int64
		jitter    time.Duration
		wantDue   time.Duration // after issue
	}{
		{"80% of the kube-api-access lifetime", 3607, 0, 0, 3607*time.Second - 721*time.Second},
		{"minimum lifetime", 600, 0, 0, 480 * time.Second},
		{"jitter brings it forward", 3600, 0, 7 * time.Second, 2880*time.Second - 7*time.Second},
		{"24 h cap for long tokens", 7 * 24 * 3600, 0, 0, 24 * time.Hour},
		{"the server's lifetime counts, not the requested one", 3600, 1200, 0, 960 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, api, clk, _ := newManager(tt.jitter)
			api.serverTTL = tt.serverTTL
			k := key
			k.ExpirationSeconds = tt.expSecs
			tok, due := get(t, m, k)
			if want := start.Add(tt.wantDue); !due.Equal(want) {
				t.Fatalf("refresh at %s, want %s", due, want)
			}
			clk.SetTime(due.Add(-time.Second))
			if again, _ := get(t, m, k); again != tok || api.count() != 1 {
				t.Fatalf("before it is due: token %s after %d requests, want the cached one after 1", again, api.count())
			}
			clk.SetTime(due)
			if again, _ := get(t, m, k); again == tok || api.count() != 2 {
				t.Fatalf("when due: token %s after %d requests, want a new one", again, api.count())
			}
		})
	}
}

func TestRefreshFailureKeepsValidTokenWithBackoff(t *testing.T) {
	m, api, clk, obs := newManager(0)
	tok, due := get(t, m, key)
	clk.SetTime(due)
	api.fail = errors.New("connection refused")
	var retries []time.Duration
	for range 10 {
		got, at, err := m.Get(context.Background(), key)
		if err != nil {
			t.Fatalf("refresh failure with a valid token must not fail: %v", err)
		}
		if string(got) != tok {
			t.Fatalf("got token %q, want the cached one", got)
		}
		retries = append(retries, at.Sub(clk.Now()))
		clk.SetTime(at)
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second, 120 * time.Second}
	for i, w := range want {
		if retries[i] != w {
			t.Fatalf("retry delays %v, want %v...", retries, want)
		}
	}
	// The last retry is capped at the expiry; past it, the error.
	expires := start.Add(3607 * time.Second)
	clk.SetTime(expires)
	_, _, err := m.Get(context.Background(), key)
	if err == nil || !strings.Contains(err.Error(), "expired") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("expired and unrefreshable: err = %v", err)
	}
	if strings.Contains(err.Error(), tok) {
		t.Fatal("the error shows the token")
	}
	// The API server is back: a new token at once.
	api.fail = nil
	if got, _ := get(t, m, key); got == tok {
		t.Fatal("still the expired token")
	}
	if obs.fail < 10 || obs.ok != 2 {
		t.Errorf("observer: %d ok, %d failed", obs.ok, obs.fail)
	}
}

func TestFirstRequestFails(t *testing.T) {
	m, api, _, _ := newManager(0)
	api.fail = errors.New("forbidden")
	if _, _, err := m.Get(context.Background(), key); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("err = %v", err)
	}
	if m.Len() != 0 {
		t.Errorf("a failed first request left %d entries", m.Len())
	}
	api.fail = nil
	get(t, m, key)
	if api.count() != 2 {
		t.Errorf("%d requests", api.count())
	}
}

func TestNoRequester(t *testing.T) {
	m := New(Options{})
	if _, _, err := m.Get(context.Background(), key); err == nil || !strings.Contains(err.Error(), "no API server") {
		t.Fatalf("err = %v", err)
	}
}

func TestConcurrentGetsShareOneRequest(t *testing.T) {
	m, api, _, _ := newManager(0)
	api.block = make(chan struct{})
	var wg sync.WaitGroup
	toks := make([]string, 8)
	for i := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok, _, err := m.Get(context.Background(), key)
			if err != nil {
				t.Error(err)
			}
			toks[i] = string(tok)
		}()
	}
	close(api.block)
	wg.Wait()
	if api.count() != 1 {
		t.Errorf("%d requests for one key, want 1", api.count())
	}
	for _, tok := range toks {
		if tok != toks[0] {
			t.Errorf("tokens differ: %v", toks)
		}
	}
}

func TestForgetPodAndStatus(t *testing.T) {
	m, _, _, _ := newManager(0)
	tok, _ := get(t, m, key)
	other := key
	other.PodUID, other.PodName = "uid-2", "q"
	get(t, m, other)
	st := m.Status()
	if len(st) != 2 || st[0].PodUID != "uid-1" || st[0].Expires.IsZero() {
		t.Fatalf("status = %+v", st)
	}
	raw, _ := json.Marshal(st)
	if strings.Contains(string(raw), tok) || strings.Contains(string(raw), "tok-") {
		t.Fatalf("status shows a token: %s", raw)
	}
	m.ForgetPod("uid-1")
	if st := m.Status(); len(st) != 1 || st[0].PodUID != "uid-2" {
		t.Fatalf("after ForgetPod: %+v", st)
	}
}

// Token carries the expiry of the token it returns: the issued one, the
// cached one, and after a refresh the new one.
func TestTokenExpiry(t *testing.T) {
	m, _, clk, _ := newManager(0)
	k := key
	k.ExpirationSeconds = 600
	want := func(what, wantValue string, wantExpires time.Time) {
		t.Helper()
		tok, _, err := m.Token(context.Background(), k)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if string(tok.Value) != wantValue || !tok.Expires.Equal(wantExpires) {
			t.Errorf("%s: token %q expiring %s, want %q expiring %s", what, tok.Value, tok.Expires, wantValue, wantExpires)
		}
	}
	want("issued", "tok-1", start.Add(600*time.Second))
	clk.Step(100 * time.Second)
	want("cached", "tok-1", start.Add(600*time.Second))
	clk.Step(400 * time.Second) // past 80 %
	want("refreshed", "tok-2", start.Add(1100*time.Second))
}
