package cluster

import (
	"os"
	"testing"
)

// StartForTest starts a control plane for a test and stops it in t.Cleanup,
// so that no process outlives the test even when it fails. On failure the end
// of each component's log is added to the test output.
//
// It skips the test if VOLUME_AGENT_SKIP_CLUSTER=1, in -short mode, or if the
// binaries cannot be found or built. Note that a cold build (10-20 minutes)
// can exceed go test's default 10 minute timeout; run test/tools/build.sh
// first or pass -timeout.
func StartForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if os.Getenv("VOLUME_AGENT_SKIP_CLUSTER") == "1" {
		t.Skip("VOLUME_AGENT_SKIP_CLUSTER=1: not starting a control plane")
	}
	if testing.Short() {
		t.Skip("-short: not starting a control plane")
	}
	if _, err := ToolsBin(); err != nil {
		t.Skipf("control-plane binaries unavailable: %v", err)
	}
	if opts.Dir == "" {
		// Registered before the cleanup below, so removed after it has run.
		opts.Dir = t.TempDir()
	}
	c, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			t.Logf("control plane in %s\n%s", c.Dir(), c.logTails())
		}
	})
	return c
}
