package httpserve

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// HostCheck guards an endpoint that listens on loopback against DNS
// rebinding: a web page from another site that makes its own name resolve
// to 127.0.0.1 can have the browser send requests to the endpoint and read
// the answers (same origin, by name), but the requests carry that name in
// their Host header. So when the endpoint listens on a loopback address,
// only requests naming a loopback host are served — localhost (and
// *.localhost, which browsers always resolve to loopback), a loopback IP
// literal, or the host of the configured listen address — and every other
// one gets 421 Misdirected Request. An endpoint listening elsewhere is
// reachable by address anyway (NetworkPolicy guards it) and is not checked.
func HostCheck(h http.Handler, listening net.Addr, configured string) http.Handler {
	if !isLoopbackAddr(listening) {
		return h
	}
	configuredHost, _, err := net.SplitHostPort(configured)
	if err != nil {
		configuredHost = configured
	}
	configuredHost = normalHost(configuredHost)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := requestHost(r.Host)
		if allowedHost(host, configuredHost) {
			h.ServeHTTP(w, r)
			return
		}
		http.Error(w, fmt.Sprintf("421 misdirected request: host %q is not served here: this endpoint listens on loopback (%s) "+
			"and answers only requests for localhost, a loopback address or %q, so that no web page can reach it through DNS rebinding",
			host, listening, configuredHost), http.StatusMisdirectedRequest)
	})
}

// allowedHost reports whether a request for host (normalised) may reach a
// loopback endpoint configured with the host configured.
func allowedHost(host, configured string) bool {
	switch {
	case host == "":
		// No Host header: HTTP/1.0 from a program. Browsers always send
		// one.
		return true
	case host == "localhost", strings.HasSuffix(host, ".localhost"):
		return true
	case configured != "" && host == configured:
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// requestHost is the host of a Host header without its port and brackets,
// normalised.
func requestHost(hostport string) string {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport // no port
	}
	return normalHost(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
}

// normalHost lower-cases a host name and drops a final dot ("localhost."
// is localhost).
func normalHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

func isLoopbackAddr(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
