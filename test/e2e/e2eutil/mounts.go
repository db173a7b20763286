package e2eutil

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

// WaitMounted waits up to timeout until every path is a mount point.
func WaitMounted(t *testing.T, timeout time.Duration, paths ...string) {
	t.Helper()
	Poll(t, timeout, "mounted", func(context.Context) (bool, string) {
		for _, p := range paths {
			if len(mounttest.MountsAt(t, p)) == 0 {
				return false, p + " is not a mount point"
			}
		}
		return true, ""
	})
}

// WaitGone waits up to timeout until nothing is mounted at or under any
// path and the paths no longer exist.
func WaitGone(t *testing.T, timeout time.Duration, paths ...string) {
	t.Helper()
	Poll(t, timeout, "unmounted and removed", func(context.Context) (bool, string) {
		for _, p := range paths {
			if n := len(mounttest.MountsUnder(t, p)); n > 0 {
				return false, fmt.Sprintf("%d mounts left at or under %s", n, p)
			}
			if mounttest.Exists(t, p) {
				return false, p + " still exists"
			}
		}
		return true, ""
	})
}
