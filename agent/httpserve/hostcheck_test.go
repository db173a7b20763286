package httpserve

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHostCheck(t *testing.T) {
	loopback := &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 9808}
	for _, tc := range []struct {
		name       string
		listening  net.Addr
		configured string
		host       string
		want       int
	}{
		{"loopback IP", loopback, "127.0.0.1:9808", "127.0.0.1:9808", http.StatusOK},
		{"another loopback IP", loopback, "127.0.0.1:9808", "127.1.2.3:9808", http.StatusOK},
		{"IPv6 loopback", loopback, "127.0.0.1:9808", "[::1]:9808", http.StatusOK},
		{"IPv4-mapped loopback", loopback, "127.0.0.1:9808", "[::ffff:127.0.0.1]:9808", http.StatusOK},
		{"localhost", loopback, "127.0.0.1:9808", "localhost:9808", http.StatusOK},
		{"localhost without port", loopback, "127.0.0.1:9808", "localhost", http.StatusOK},
		{"LOCALHOST.", loopback, "127.0.0.1:9808", "LOCALHOST.:9808", http.StatusOK},
		{"a .localhost name", loopback, "127.0.0.1:9808", "agent.localhost:9808", http.StatusOK},
		{"the configured name", loopback, "node-debug.internal:9808", "node-debug.internal:9808", http.StatusOK},
		{"no Host header", loopback, "127.0.0.1:9808", "", http.StatusOK},
		{"a rebinding name", loopback, "127.0.0.1:9808", "attacker.example:9808", http.StatusMisdirectedRequest},
		{"a rebinding name without port", loopback, "127.0.0.1:9808", "attacker.example", http.StatusMisdirectedRequest},
		{"localhost as a prefix", loopback, "127.0.0.1:9808", "localhost.attacker.example", http.StatusMisdirectedRequest},
		{"a non-loopback IP", loopback, "127.0.0.1:9808", "10.0.0.1:9808", http.StatusMisdirectedRequest},
		{"the unspecified address", loopback, "127.0.0.1:9808", "0.0.0.0:9808", http.StatusMisdirectedRequest},
		{"not listening on loopback", &net.TCPAddr{IP: net.IPv4zero, Port: 9808}, ":9808", "attacker.example:9808", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
			h := HostCheck(ok, tc.listening, tc.configured)
			r := httptest.NewRequest(http.MethodGet, "/debug/dsw", nil)
			r.Host = tc.host
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("Host %q: %d %s, want %d", tc.host, w.Code, w.Body, tc.want)
			}
			if tc.want != http.StatusOK && !strings.Contains(w.Body.String(), "DNS rebinding") {
				t.Errorf("refusal does not say why: %s", w.Body)
			}
		})
	}
}
