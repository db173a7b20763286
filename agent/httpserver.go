package agent

import (
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// HTTPLimits bound what clients of the agent's endpoints can make it hold.
// The metrics endpoint listens on the pod's address: every connection costs
// buffers and a goroutine, so without a cap and timeouts a flood of idle
// connections alone would reach the agent's memory limit. Zero values get
// the defaults.
type HTTPLimits struct {
	// MaxConnections caps the connections each endpoint serves at once
	// (default 64); further ones wait in the kernel's accept queue.
	MaxConnections int
	// ReadHeaderTimeout closes a connection that has not sent a request's
	// headers in time (default 5s); ReadTimeout bounds reading a whole
	// request (default 10s: the endpoints take no bodies).
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	// WriteTimeout bounds writing a response (default 30s). Streaming
	// handlers (pprof profiles and traces, server-sent events) lift it for
	// themselves: see streaming.
	WriteTimeout time.Duration
	// IdleTimeout closes a kept-alive connection waiting for its next
	// request (default 90s: longer than common scrape intervals, so a
	// scraper keeps its connection).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (default 16 KiB).
	MaxHeaderBytes int
}

func (l HTTPLimits) withDefaults() HTTPLimits {
	if l.MaxConnections <= 0 {
		l.MaxConnections = 64
	}
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = 5 * time.Second
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = 10 * time.Second
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = 30 * time.Second
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = 90 * time.Second
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = 16 << 10
	}
	return l
}

// newHTTPServer is an endpoint's server within the limits. The write
// timeout is set per request (writeDeadline), not on the server, so that
// streaming handlers can lift it: net/http/pprof refuses a profile longer
// than a server-wide WriteTimeout.
func newHTTPServer(h http.Handler, l HTTPLimits) *http.Server {
	return &http.Server{
		Handler:           writeDeadline(h, l.WriteTimeout),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// limitListener caps the connections served at once.
func limitListener(lis net.Listener, l HTTPLimits) net.Listener {
	return netutil.LimitListener(lis, l.MaxConnections)
}

// writeDeadline gives every response d to be written.
func writeDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
		h.ServeHTTP(w, r)
	})
}

// streaming marks a handler that answers for as long as it needs (pprof
// profiles and traces, whose length the client asks for; server-sent
// events): it lifts the request's write deadline, and its read deadline
// too, whose expiry would cancel the request's context mid-stream. The
// connection cap still applies, and the idle timeout once it is done.
func streaming(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{})
		_ = rc.SetReadDeadline(time.Time{})
		h(w, r)
	}
}
