package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// pipeline is what a flooding connection sends: many requests at once,
// whose replies it never reads, so that the agent's reply writes block.
func pipeline(path string, n int) []byte {
	return []byte(strings.Repeat("GET "+path+" HTTP/1.1\r\nHost: localhost\r\n\r\n", n))
}

// flood opens rate connections a second to addr until ctx ends, each
// pipelining depth requests for path and never reading; the connections stay
// open until the test ends, as an attacker keeps them.
func flood(t *testing.T, ctx context.Context, addr, path string, depth, rate int) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	payload := pipeline(path, depth)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					return // refused or dropped: the attacker does not care
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
				// A small receive window: the replies stall sooner.
				_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
				_ = c.SetWriteDeadline(time.Now().Add(time.Second))
				_, _ = c.Write(payload)
			}()
		}
	}()
	return &wg
}

// probeResult is what a prober saw.
type probeResult struct {
	total    int
	failures []string
}

// poll GETs each of paths on addr in turn every period, from the local
// address from (a new connection each time, as the kubelet's probes, and
// timeout for each), until ctx ends.
func poll(ctx context.Context, from, addr string, paths []string, period, timeout time.Duration) probeResult {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: dialer.DialContext}, Timeout: timeout}
	var r probeResult
	tick := time.NewTicker(period)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return r
		case <-tick.C:
		}
		path := paths[i%len(paths)]
		start := time.Now()
		resp, err := client.Get("http://" + addr + path)
		if ctx.Err() != nil && err != nil {
			return r // cut by the end of the test, not by the agent
		}
		r.total++
		switch {
		case err != nil:
			r.failures = append(r.failures, fmt.Sprintf("%s after %v: %v", path, time.Since(start).Round(time.Millisecond), err))
		case resp.StatusCode != http.StatusOK:
			r.failures = append(r.failures, fmt.Sprintf("%s: %s", path, resp.Status))
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
}

// waitReady polls /readyz until the agent is ready.
func waitReady(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, err := get("http://" + addr + "/readyz")
		if err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready within 30s: %d %v", code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An unprivileged local user pipelines GET /metrics on many connections
// and never reads the replies (issue 28, finding 5: 20–50 connections a
// second made 30 of 34 probes fail), while the kubelet probes health and
// readiness on the health endpoint (from the same address: local users
// and the kubelet share the node's) and Prometheus scrapes from another
// address: no probe and no scrape fails. The probes' timeout is the
// kubelet's, 1 s (stretched under the race detector, which makes every
// request several times slower).
func TestProbesSurviveAMetricsFlood(t *testing.T) {
	for _, rate := range []int{20, 50} {
		t.Run(fmt.Sprintf("%d connections a second", rate), func(t *testing.T) {
			cfg := standaloneConfig(t)
			cfg.HealthAddress = "127.0.0.1:0"
			a := startAgent(t, cfg)
			waitReady(t, a.HealthAddress())

			ctx, cancel := context.WithTimeout(t.Context(), 8*time.Second)
			defer cancel()
			wg := flood(t, ctx, a.MetricsAddress(), "/metrics", 100, rate)
			scrapes := make(chan probeResult, 1)
			go func() {
				scrapes <- poll(ctx, "127.0.0.2", a.MetricsAddress(), []string{"/metrics"}, 500*time.Millisecond, 10*time.Second)
			}()
			probes := poll(ctx, "127.0.0.1", a.HealthAddress(), []string{"/healthz", "/readyz"}, 150*time.Millisecond, raceSlowdown*time.Second)
			wg.Wait()
			for _, r := range []struct {
				what string
				probeResult
			}{{"probes", probes}, {"scrapes", <-scrapes}} {
				t.Logf("%d %s, %d failed", r.total, r.what, len(r.failures))
				if r.total == 0 || len(r.failures) > 0 {
					t.Errorf("%d of %d %s failed during the flood: %q", len(r.failures), r.total, r.what, r.failures)
				}
			}
		})
	}
}
