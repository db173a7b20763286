package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
)

// apiServer answers pod status patches and counts them.
type apiServer struct {
	mu      sync.Mutex
	patches int
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPatch || !strings.HasSuffix(r.URL.Path, "/status") {
		http.Error(w, "not served", http.StatusNotFound)
		return
	}
	s.mu.Lock()
	s.patches++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web","namespace":"ns"}}`)
}

func (s *apiServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.patches
}

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, server)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Pod condition patches go through a rate limiter of their own, of the
// configured size: a burst of them is let through, the next waits for a
// token, and the other API requests keep their own budget.
func TestStatusClientRateLimit(t *testing.T) {
	cases := []struct {
		name  string
		burst int
	}{
		{name: "burst of one", burst: 1},
		{name: "burst of five", burst: 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			api := &apiServer{}
			srv := httptest.NewServer(api)
			defer srv.Close()
			// One token per 1,000 s: the request after the burst cannot be
			// let through within the context's minute, and client-go's
			// limiter says so at once instead of waiting.
			cfg := Config{NodeName: "node-a", Kubeconfig: writeKubeconfig(t, srv.URL), KubeAPIQPS: 0.001, KubeAPIBurst: tc.burst}
			parts, err := newClusterParts(cfg, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			defer parts.close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			patch := []byte(`{"status":{}}`)
			for i := range tc.burst {
				if err := parts.statusClient.PatchPodStatus(ctx, "ns", "web", patch); err != nil {
					t.Fatalf("patch %d of the burst: %v", i+1, err)
				}
			}
			if err := parts.statusClient.PatchPodStatus(ctx, "ns", "web", patch); err == nil {
				t.Fatalf("patch %d went through a limiter of burst %d at %g QPS", tc.burst+1, tc.burst, cfg.KubeAPIQPS)
			}
			if got := api.count(); got != tc.burst {
				t.Fatalf("the API server got %d patches, want %d", got, tc.burst)
			}
			// The agent's other requests are not held back by the
			// conditions' spent budget.
			if err := parts.client.PatchPodStatus(ctx, "ns", "web", patch); err != nil {
				t.Fatalf("the main client after the status client's burst: %v", err)
			}
			if got := api.count(); got != tc.burst+1 {
				t.Fatalf("the API server got %d patches, want %d", got, tc.burst+1)
			}
		})
	}
}

func TestClientLimitDefaults(t *testing.T) {
	cases := []struct {
		name      string
		qps       float32
		burst     int
		wantQPS   float32
		wantBurst int
	}{
		{name: "the kubelet's defaults", wantQPS: 50, wantBurst: 100},
		{name: "set", qps: 5, burst: 7, wantQPS: 5, wantBurst: 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Config{NodeName: "node-a", RootDir: "/var/lib/volume-agent", KubeAPIQPS: tc.qps, KubeAPIBurst: tc.burst}.complete()
			if err != nil {
				t.Fatal(err)
			}
			if c.KubeAPIQPS != tc.wantQPS || c.KubeAPIBurst != tc.wantBurst {
				t.Fatalf("QPS %g, burst %d; want %g, %d", c.KubeAPIQPS, c.KubeAPIBurst, tc.wantQPS, tc.wantBurst)
			}
		})
	}
}

// The node's IPs for status.hostIP(s) as the kubelet picks them.
func TestNodeHostIPs(t *testing.T) {
	addr := func(typ v1.NodeAddressType, a string) v1.NodeAddress { return v1.NodeAddress{Type: typ, Address: a} }
	for _, tc := range []struct {
		name  string
		addrs []v1.NodeAddress
		want  []string
	}{
		{"none", []v1.NodeAddress{addr(v1.NodeHostName, "n1")}, nil},
		{"internal first", []v1.NodeAddress{addr(v1.NodeExternalIP, "203.0.113.1"), addr(v1.NodeInternalIP, "10.0.0.1")}, []string{"10.0.0.1"}},
		{"external alone", []v1.NodeAddress{addr(v1.NodeExternalIP, "203.0.113.1")}, []string{"203.0.113.1"}},
		{"dual stack", []v1.NodeAddress{addr(v1.NodeInternalIP, "10.0.0.1"), addr(v1.NodeInternalIP, "10.0.0.2"), addr(v1.NodeInternalIP, "fd00::1")}, []string{"10.0.0.1", "fd00::1"}},
		{"unparsable skipped", []v1.NodeAddress{addr(v1.NodeInternalIP, "x"), addr(v1.NodeInternalIP, "fd00::1")}, []string{"fd00::1"}},
	} {
		got := nodeHostIPs(&v1.Node{Status: v1.NodeStatus{Addresses: tc.addrs}})
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
