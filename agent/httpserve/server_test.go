package httpserve

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// testServer serves h within l on a loopback port the way the agent's
// endpoints do, and reports the most connections it ever served at once.
type testServer struct {
	addr string
	mu   sync.Mutex
	open int
	max  int
}

func serveTest(t *testing.T, h http.Handler, l Limits) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{addr: lis.Addr().String()}
	s := New(h, l)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(&countingListener{Listener: lis, ts: ts})
	}()
	t.Cleanup(func() {
		_ = s.Close()
		<-done
	})
	return ts
}

// countingListener counts the connections accepted and not yet closed.
type countingListener struct {
	net.Listener
	ts *testServer
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.ts.mu.Lock()
	l.ts.open++
	l.ts.max = max(l.ts.max, l.ts.open)
	l.ts.mu.Unlock()
	return &countedConn{Conn: c, ts: l.ts}, nil
}

type countedConn struct {
	net.Conn
	ts   *testServer
	once sync.Once
}

// Close counts the connection closed before closing it: the cap's slot is
// freed by the close.
func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.ts.mu.Lock()
		c.ts.open--
		c.ts.mu.Unlock()
	})
	return c.Conn.Close()
}

func (ts *testServer) maxOpen() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.max
}

// waitClosed reads from c until the server closes it.
func waitClosed(t *testing.T, c net.Conn, within time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("the server did not close an idle connection within %v", within)
	}
}

// A flood of idle connections (connected, sending nothing) is held at most
// MaxConnections at a time (plus the one just accepted, which closes the
// oldest), and each is closed when its headers do not come in time: memory
// stays bounded however many there are.
func TestIdleConnectionsAreCappedAndTimedOut(t *testing.T) {
	const cap, flood = 4, 40
	ts := serveTest(t, http.NotFoundHandler(), Limits{MaxConnections: cap, ReadHeaderTimeout: 100 * time.Millisecond})
	conns := make([]net.Conn, flood)
	for i := range conns {
		c, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	// Every connection is accepted in turn and closed by the server; once
	// all are, the high-water mark is final.
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			waitClosed(t, c, time.Minute)
		}()
	}
	wg.Wait()
	if got := ts.maxOpen(); got > cap+1 {
		t.Errorf("%d connections were held at once, the cap is %d", got, cap)
	}
	// The endpoint still answers.
	resp, err := http.Get("http://" + ts.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// Silent connections that fill the cap do not keep a real request waiting:
// the newcomer closes the oldest silent one, long before its header timeout.
func TestFloodDoesNotDelayRequests(t *testing.T) {
	const cap, flood = 4, 200
	ts := serveTest(t, http.NotFoundHandler(), Limits{MaxConnections: cap, ReadHeaderTimeout: time.Hour})
	for range flood {
		c, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n")); err != nil {
			t.Fatal(err)
		}
	}
	client := &http.Client{Timeout: time.Minute}
	for i := range 3 {
		resp, err := client.Get("http://" + ts.addr + "/")
		if err != nil {
			t.Fatalf("request %d during the flood: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	if got := ts.maxOpen(); got > cap+1 {
		t.Errorf("%d connections were held at once, the cap is %d", got, cap)
	}
}

// Requests in progress are never closed to make room: a connection beyond
// the cap while all are busy is the one closed.
func TestBusyConnectionsAreKept(t *testing.T) {
	const cap = 2
	release := make(chan struct{})
	started := make(chan struct{}, cap)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		w.WriteHeader(http.StatusNoContent)
	})
	ts := serveTest(t, h, Limits{MaxConnections: cap})
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	errs := make(chan error, cap)
	for range cap {
		go func() {
			resp, err := client.Get("http://" + ts.addr + "/")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					err = errors.New(resp.Status)
				}
			}
			errs <- err
		}()
	}
	for range cap {
		<-started
	}
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitClosed(t, c, time.Minute)
	close(release)
	for range cap {
		if err := <-errs; err != nil {
			t.Errorf("a busy request was cut: %v", err)
		}
	}
}

// A kept-alive connection that sends nothing more is closed after the idle
// timeout.
func TestKeptAliveConnectionIsClosedWhenIdle(t *testing.T) {
	ts := serveTest(t, http.NotFoundHandler(), Limits{IdleTimeout: 100 * time.Millisecond})
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Close {
		t.Fatal("the server did not keep the connection alive")
	}
	waitClosed(t, c, time.Minute)
}

// writeUntil writes to w until a write fails or the response has lasted
// for; it reports how long it wrote.
func writeUntil(w http.ResponseWriter, r *http.Request, lasted time.Duration) (time.Duration, error) {
	start := time.Now()
	buf := make([]byte, 32<<10)
	for time.Since(start) < lasted {
		if _, err := w.Write(buf); err != nil {
			return time.Since(start), err
		}
		if err := http.NewResponseController(w).Flush(); err != nil {
			return time.Since(start), err
		}
		if r.Context().Err() != nil {
			return time.Since(start), r.Context().Err()
		}
	}
	return time.Since(start), nil
}

// A response that takes longer than the write timeout to write is cut
// off; a streaming one (pprof, server-sent events) is not, nor is its
// request's context cancelled by the read timeout.
func TestWriteTimeoutAndStreaming(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	results := make(chan error, 2)
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		_, err := writeUntil(w, r, time.Minute)
		results <- err
	})
	mux.HandleFunc("/stream", Streaming(func(w http.ResponseWriter, r *http.Request) {
		_, err := writeUntil(w, r, 3*writeTimeout)
		results <- err
	}))
	ts := serveTest(t, mux, Limits{WriteTimeout: writeTimeout, ReadTimeout: writeTimeout})
	for _, tc := range []struct {
		path    string
		wantErr bool
	}{{"/slow", true}, {"/stream", false}} {
		resp, err := http.Get("http://" + ts.addr + tc.path)
		if err == nil {
			// A client that reads slowly is what makes a writer block.
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err := <-results; (err != nil) != tc.wantErr {
			t.Errorf("%s: the handler's writes ended with %v, want an error: %v", tc.path, err, tc.wantErr)
		}
	}
}

// A connection whose client pipelines requests and never reads the
// replies holds a busy connection whose reply write is stalled: once the
// stall has lasted WriteStall, a newcomer over the cap closes it instead
// of being refused, long before the write timeout.
func TestStalledConnectionIsEvicted(t *testing.T) {
	const cap = 2
	big := make([]byte, 64<<10)
	// writing is when each client's reply write in progress began.
	var mu sync.Mutex
	writing := map[string]time.Time{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		writing[r.RemoteAddr] = time.Now()
		mu.Unlock()
		_, _ = w.Write(big)
		_ = http.NewResponseController(w).Flush()
		mu.Lock()
		delete(writing, r.RemoteAddr)
		mu.Unlock()
	})
	// stuck reports whether n clients' writes have made no progress for
	// a while: the sockets' buffers are full.
	stuck := func(n int) bool {
		mu.Lock()
		defer mu.Unlock()
		k := 0
		for _, since := range writing {
			if time.Since(since) > 100*time.Millisecond {
				k++
			}
		}
		return k >= n
	}
	for _, tc := range []struct {
		name    string
		stall   time.Duration
		evicted bool
	}{
		{"stalled longer than WriteStall", 50 * time.Millisecond, true},
		{"stalled shorter than WriteStall", time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := serveTest(t, h, Limits{MaxConnections: cap, WriteStall: tc.stall, WriteTimeout: time.Hour})
			stalled := make([]net.Conn, cap)
			for i := range stalled {
				c, err := net.DialTCP("tcp", nil, mustResolve(t, ts.addr))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetReadBuffer(4 << 10)
				// Replies far larger than the sockets' buffers.
				if _, err := c.Write([]byte(strings.Repeat("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 200))); err != nil {
					t.Fatal(err)
				}
				stalled[i] = c
			}
			for deadline := time.Now().Add(time.Minute); !stuck(cap); {
				if time.Now().After(deadline) {
					t.Fatal("the replies never stalled")
				}
				time.Sleep(10 * time.Millisecond) // polling the handlers
			}
			// The newcomer is served once a stalled one may be closed;
			// otherwise it is the one closed.
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
			deadline := time.Now().Add(5 * time.Second)
			var err error
			for time.Now().Before(deadline) {
				var resp *http.Response
				if resp, err = client.Get("http://" + ts.addr + "/"); err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err == nil || !tc.evicted {
					break
				}
				time.Sleep(10 * time.Millisecond) // polling until a write has stalled long enough
			}
			if served := err == nil; served != tc.evicted {
				t.Fatalf("newcomer served: %v (%v), want %v", served, err, tc.evicted)
			}
			if tc.evicted {
				// A stalled connection was closed: reading it drains the
				// replies written and ends (the other one is still open).
				ended := make(chan error, cap)
				for _, c := range stalled {
					go func() {
						_ = c.SetReadDeadline(time.Now().Add(time.Minute))
						_, err := io.Copy(io.Discard, c)
						ended <- err
					}()
				}
				var ne net.Error
				if err := <-ended; errors.As(err, &ne) && ne.Timeout() {
					t.Error("no stalled connection was closed")
				}
			}
		})
	}
}

func mustResolve(t *testing.T, addr string) *net.TCPAddr {
	t.Helper()
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Connections from one address are capped apart from the total: a peer
// over its share closes its own oldest idle connection, not another
// peer's, and a peer whose connections are all busy gets its newcomer
// closed while another peer is still served.
func TestPerPeerCap(t *testing.T) {
	const perPeer = 2
	release := make(chan struct{})
	defer close(release)
	held := make(chan struct{}, perPeer)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			held <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusNoContent)
	})
	ts := serveTest(t, h, Limits{MaxConnections: 10, MaxConnectionsPerPeer: perPeer})
	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// An idle connection of another peer is not touched by the flood of
	// 127.0.0.1's silent ones.
	other := dial("127.0.0.2")
	var silent []net.Conn
	for range 5 * perPeer {
		silent = append(silent, dial("127.0.0.1"))
	}
	for _, c := range silent[:len(silent)-perPeer] {
		waitClosed(t, c, time.Minute)
	}
	if _, err := io.WriteString(other, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(other), nil)
	if err != nil {
		t.Fatalf("another peer's connection was closed by 127.0.0.1's flood: %v", err)
	}
	resp.Body.Close()

	// 127.0.0.1's connections all busy: its newcomer is closed, and
	// 127.0.0.3 is still served.
	for _, c := range silent[len(silent)-perPeer:] {
		if _, err := io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	client := func(from string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: d.DialContext}, Timeout: 10 * time.Second}
	}
	for range perPeer {
		<-held
	}
	if resp, err := client("127.0.0.1").Get("http://" + ts.addr + "/"); err == nil {
		resp.Body.Close()
		t.Fatal("127.0.0.1 was served a third connection while its two were busy")
	}
	resp, err = client("127.0.0.3").Get("http://" + ts.addr + "/")
	if err != nil {
		t.Fatalf("another peer was refused: %v", err)
	}
	resp.Body.Close()
}
