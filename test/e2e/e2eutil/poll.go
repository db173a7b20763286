package e2eutil

import (
	"context"
	"strings"
	"testing"
	"time"
)

// pollInterval is how often Poll checks its condition.
const pollInterval = 50 * time.Millisecond

// Poll calls cond every 50 ms until it reports done, failing the test with
// cond's last explanation once timeout has passed. cond's context ends with
// the timeout (or the test).
func Poll(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (done bool, why string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	for {
		done, why := cond(ctx)
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not after %v: %s", what, timeout, why)
		case <-time.After(pollInterval):
		}
	}
}

// PollErr is Poll for a condition that returns nil once it holds, and
// until then an error that says what is missing.
func PollErr(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	Poll(t, timeout, what, func(context.Context) (bool, string) {
		if err := cond(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// Must returns what get returns, failing the test if it also returns an
// error: Must(t, agent.DSW).
func Must[T any](t testing.TB, get func() (T, error)) T {
	t.Helper()
	v, err := get()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ContainsAll reports whether s contains every one of subs.
func ContainsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
