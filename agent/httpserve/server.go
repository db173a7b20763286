// Package httpserve owns the hardening of the agent's HTTP endpoints (debug
// and metrics): listeners whose connections are capped, timeouts for slow
// and idle clients, bounded headers, handlers that stream for as long as
// they need, and the host check that keeps a loopback endpoint out of reach
// of DNS rebinding.
package httpserve

import (
	"container/list"
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits bound what clients of the agent's endpoints can make it hold.
// The metrics endpoint listens on the pod's address: every connection costs
// buffers and a goroutine, so without a cap and timeouts a flood of idle
// connections alone would reach the agent's memory limit. Zero values get
// the defaults.
type Limits struct {
	// MaxConnections caps the connections each endpoint holds at once
	// (default 64). A connection beyond it closes the oldest one that has
	// not sent a request (or is idle between requests), so a flood of
	// silent connections cannot keep a scraper or a probe waiting; if all
	// are busy with requests, the new one is closed.
	MaxConnections int
	// ReadHeaderTimeout closes a connection that has not sent a request's
	// headers in time (default 5s); ReadTimeout bounds reading a whole
	// request (default 10s: the endpoints take no bodies).
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	// WriteTimeout bounds writing a response (default 30s). Streaming
	// handlers (pprof profiles and traces, server-sent events) lift it for
	// themselves: see Streaming.
	WriteTimeout time.Duration
	// IdleTimeout closes a kept-alive connection waiting for its next
	// request (default 90s: longer than common scrape intervals, so a
	// scraper keeps its connection).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (default 16 KiB).
	MaxHeaderBytes int
}

// WithDefaults fills the zero fields with the defaults.
func (l Limits) WithDefaults() Limits {
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

// Server serves one endpoint within its Limits.
type Server struct {
	srv   *http.Server
	conns *connLimiter
}

// New is an endpoint's server for h within l (zero fields get the
// defaults). The write timeout is set per request (writeDeadline), not on
// the server, so that streaming handlers can lift it: net/http/pprof
// refuses a profile longer than a server-wide WriteTimeout.
func New(h http.Handler, l Limits) *Server {
	l = l.WithDefaults()
	s := &Server{
		srv: &http.Server{
			Handler:           writeDeadline(h, l.WriteTimeout),
			ReadHeaderTimeout: l.ReadHeaderTimeout,
			ReadTimeout:       l.ReadTimeout,
			IdleTimeout:       l.IdleTimeout,
			MaxHeaderBytes:    l.MaxHeaderBytes,
		},
		conns: newConnLimiter(l.MaxConnections),
	}
	s.srv.ConnState = s.conns.ConnState
	return s
}

// Serve accepts connections on lis, within the connection cap, until
// Shutdown or Close (then it returns http.ErrServerClosed).
func (s *Server) Serve(lis net.Listener) error { return s.srv.Serve(s.conns.Listener(lis)) }

// Shutdown stops accepting and waits, until ctx ends, for the requests in
// progress (see http.Server.Shutdown).
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Close closes the listener and every connection at once.
func (s *Server) Close() error { return s.srv.Close() }

// connLimiter keeps an endpoint's connections within MaxConnections. It
// sees each connection from its accept (Listener) and follows its state
// through the server's ConnState hook.
type connLimiter struct {
	max   int
	mu    sync.Mutex
	conns list.List // of *limitedConn, oldest first
}

func newConnLimiter(max int) *connLimiter { return &connLimiter{max: max} }

// Listener wraps lis: every accepted connection is counted, and one over
// the cap evicts the oldest evictable connection (or itself).
func (l *connLimiter) Listener(lis net.Listener) net.Listener {
	return &limitedListener{Listener: lis, l: l}
}

// ConnState is the server's ConnState hook.
func (l *connLimiter) ConnState(c net.Conn, state http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case http.StateActive:
		lc.busy = true
	case http.StateIdle:
		lc.busy = false
	case http.StateHijacked, http.StateClosed:
		l.forgetLocked(lc)
	}
}

func (l *connLimiter) forgetLocked(c *limitedConn) {
	if c.elem != nil {
		l.conns.Remove(c.elem)
		c.elem = nil
	}
}

// admit records c and returns the connection to close to stay within the
// cap (nil if none).
func (l *connLimiter) admit(c *limitedConn) *limitedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.elem = l.conns.PushBack(c)
	if l.conns.Len() <= l.max {
		return nil
	}
	for e := l.conns.Front(); e != nil; e = e.Next() {
		if old := e.Value.(*limitedConn); !old.busy && old != c {
			l.forgetLocked(old)
			return old
		}
	}
	l.forgetLocked(c)
	return c
}

type limitedListener struct {
	net.Listener
	l *connLimiter
}

func (ll *limitedListener) Accept() (net.Conn, error) {
	for {
		nc, err := ll.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &limitedConn{Conn: nc, l: ll.l}
		evict := ll.l.admit(c)
		if evict != nil {
			_ = evict.Conn.Close()
		}
		if evict != c {
			return c, nil
		}
	}
}

// limitedConn is a connection the limiter follows; busy is guarded by the
// limiter's mutex.
type limitedConn struct {
	net.Conn
	l    *connLimiter
	elem *list.Element
	busy bool
}

func (c *limitedConn) Close() error {
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// writeDeadline gives every response d to be written.
func writeDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
		h.ServeHTTP(w, r)
	})
}

// Streaming marks a handler that answers for as long as it needs (pprof
// profiles and traces, whose length the client asks for; server-sent
// events): it lifts the request's write deadline, and its read deadline
// too, whose expiry would cancel the request's context mid-stream. The
// connection cap still applies, and the idle timeout once it is done.
func Streaming(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{})
		_ = rc.SetReadDeadline(time.Time{})
		h(w, r)
	}
}
