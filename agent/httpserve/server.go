// Package httpserve owns the hardening of the agent's HTTP endpoints (debug,
// metrics and health): listeners whose connections are capped in all and
// per peer, connections evicted when they idle or stop reading their
// replies, timeouts for slow and idle clients, bounded headers, handlers
// that stream for as long as they need, and the host check that keeps a
// loopback endpoint out of reach of DNS rebinding.
package httpserve

import (
	"container/list"
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bound what clients of the agent's endpoints can make it hold.
// The metrics endpoint listens on the pod's address: every connection costs
// buffers and a goroutine, so without a cap and timeouts a flood of idle
// connections alone would reach the agent's memory limit. Zero values get
// the defaults.
type Limits struct {
	// MaxConnections caps the connections each endpoint holds at once
	// (default 64). A connection beyond it closes the one that has done
	// nothing for its client longest: one that has not sent a request (or
	// is idle between requests), so a flood of silent connections cannot
	// keep a scraper or a probe waiting, or one whose reply write has
	// made no progress for at least WriteStall (its client does not read:
	// pipelining requests and never reading the replies would otherwise
	// hold a connection until the write timeout); if all are busy with
	// requests, the new one is closed.
	MaxConnections int
	// MaxConnectionsPerPeer caps the connections from one remote address
	// (default 16), the same way, so one neighbour cannot take every slot
	// from a scraper at another address. Every local user shares the
	// loopback address and the node's: a per-peer cap alone does not
	// protect the kubelet's probes, which is why health has a listener of
	// its own.
	MaxConnectionsPerPeer int
	// WriteStall is how long a reply write may make no progress before
	// its connection may be closed to make room (default 2s).
	WriteStall time.Duration
	// ReadHeaderTimeout closes a connection that has not sent a request's
	// headers in time (default 5s); ReadTimeout bounds reading a whole
	// request (default 10s: the endpoints take no bodies).
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	// WriteTimeout bounds writing a response (default 30s). Streaming
	// handlers (pprof profiles and traces, server-sent events) lift it for
	// themselves: see Streaming.
	WriteTimeout time.Duration
	// ShortWriteTimeout bounds writing the small replies made in memory
	// (/metrics, /healthz, /readyz; default 5s): their clients read at
	// once, and one that does not is not kept for WriteTimeout. See
	// WriteDeadline.
	ShortWriteTimeout time.Duration
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
	if l.MaxConnectionsPerPeer <= 0 {
		l.MaxConnectionsPerPeer = 16
	}
	if l.WriteStall <= 0 {
		l.WriteStall = 2 * time.Second
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
	if l.ShortWriteTimeout <= 0 {
		l.ShortWriteTimeout = 5 * time.Second
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
// defaults). The write timeout is set per request (WriteDeadline), not on
// the server, so that streaming handlers can lift it: net/http/pprof
// refuses a profile longer than a server-wide WriteTimeout.
func New(h http.Handler, l Limits) *Server {
	l = l.WithDefaults()
	s := &Server{
		srv: &http.Server{
			Handler:           WriteDeadline(h, l.WriteTimeout),
			ReadHeaderTimeout: l.ReadHeaderTimeout,
			ReadTimeout:       l.ReadTimeout,
			IdleTimeout:       l.IdleTimeout,
			MaxHeaderBytes:    l.MaxHeaderBytes,
		},
		conns: newConnLimiter(l),
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

// connLimiter keeps an endpoint's connections within MaxConnections, and
// those of each peer within MaxConnectionsPerPeer. It sees each connection
// from its accept (Listener) and follows its state through the server's
// ConnState hook and its writes.
type connLimiter struct {
	max, maxPerPeer int
	stall           time.Duration
	now             func() time.Time
	mu              sync.Mutex
	conns           list.List // of *limitedConn, oldest first
	peers           map[string]int
}

func newConnLimiter(l Limits) *connLimiter {
	return &connLimiter{
		max: l.MaxConnections, maxPerPeer: l.MaxConnectionsPerPeer, stall: l.WriteStall,
		now: time.Now, peers: map[string]int{},
	}
}

// Listener wraps lis: every accepted connection is counted, and one over
// a cap evicts the oldest evictable connection (or itself).
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
		lc.quietSince = l.now().UnixNano()
	case http.StateHijacked, http.StateClosed:
		l.forgetLocked(lc)
	}
}

func (l *connLimiter) forgetLocked(c *limitedConn) {
	if c.elem != nil {
		l.conns.Remove(c.elem)
		c.elem = nil
		if l.peers[c.peer]--; l.peers[c.peer] <= 0 {
			delete(l.peers, c.peer)
		}
	}
}

// admit records c and returns the connections to close to stay within
// the caps: c itself, or those it evicts.
func (l *connLimiter) admit(c *limitedConn) []*limitedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.elem = l.conns.PushBack(c)
	c.quietSince = l.now().UnixNano()
	l.peers[c.peer]++
	var evict []*limitedConn
	if l.peers[c.peer] > l.maxPerPeer {
		victim := l.victimLocked(c, func(o *limitedConn) bool { return o.peer == c.peer })
		l.forgetLocked(victim)
		if victim == c {
			return []*limitedConn{c}
		}
		evict = append(evict, victim)
	}
	if l.conns.Len() > l.max {
		victim := l.victimLocked(c, func(*limitedConn) bool { return true })
		l.forgetLocked(victim)
		evict = append(evict, victim)
	}
	return evict
}

// victimLocked is the connection to close among those of which, to make
// room for c: the one that has done nothing for its client longest — not
// busy with a request since it was accepted or became idle, or stalled in
// a reply write for at least the stall time — else c. A connection
// busy otherwise (its handler is working, its reply is being written) is
// never closed, and one just accepted (a probe about to send its request)
// goes after every one stalled for the stall time.
func (l *connLimiter) victimLocked(c *limitedConn, of func(*limitedConn) bool) *limitedConn {
	victim := c
	var victimSince int64
	cutoff := l.now().Add(-l.stall).UnixNano()
	for e := l.conns.Front(); e != nil; e = e.Next() {
		o := e.Value.(*limitedConn)
		if o == c || !of(o) {
			continue
		}
		since := o.quietSince
		if o.busy {
			if since = o.writeStalledSince.Load(); since == 0 || since > cutoff {
				continue
			}
		}
		if victim == c || since < victimSince {
			victim, victimSince = o, since
		}
	}
	return victim
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
		c := &limitedConn{Conn: nc, l: ll.l, peer: peerOf(nc.RemoteAddr())}
		admitted := true
		for _, evict := range ll.l.admit(c) {
			_ = evict.Conn.Close()
			admitted = admitted && evict != c
		}
		if admitted {
			return c, nil
		}
	}
}

// peerOf is the address a connection's per-peer cap counts it under: its
// remote IP (every unix-socket client is one peer).
func peerOf(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	return a.Network()
}

// limitedConn is a connection the limiter follows; elem, busy and
// quietSince are guarded by the limiter's mutex.
type limitedConn struct {
	net.Conn
	l    *connLimiter
	peer string
	elem *list.Element
	busy bool
	// quietSince is when it was accepted or last became idle (Unix
	// nanoseconds).
	quietSince int64
	// writeStalledSince is when the write in progress last made progress
	// (Unix nanoseconds; 0 when no write is in progress).
	writeStalledSince atomic.Int64
}

// writeChunk bounds what one write to the socket carries, so that a
// client reading slowly still shows progress.
const writeChunk = 4 << 10

// Write writes in chunks and notes each one's progress: a write that has
// made none for the stall time marks a client that does not read.
func (c *limitedConn) Write(p []byte) (int, error) {
	var n int
	for {
		c.writeStalledSince.Store(c.l.now().UnixNano())
		k, err := c.Conn.Write(p[n:min(len(p), n+writeChunk)])
		n += k
		if err != nil || n == len(p) {
			c.writeStalledSince.Store(0)
			return n, err
		}
	}
}

func (c *limitedConn) Close() error {
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// WriteDeadline gives every response of h d to be written, from the
// request's start; within an endpoint's server it overrides the endpoint's
// WriteTimeout for h. The agent gives its small replies made in memory
// (/metrics, /healthz, /readyz) a few seconds: a client that takes longer
// is not reading.
func WriteDeadline(h http.Handler, d time.Duration) http.Handler {
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
