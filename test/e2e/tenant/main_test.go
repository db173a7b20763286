// Package tenant_test attacks the agent the way a tenant can: a tenant
// controls everything inside its volumes, and may race the agent. The tests
// play the tenant's pod from the host side (as the other end-to-end tests
// play the kubelet): before and while the real agent binary sets a volume
// up (fsGroup) and tears it down, they plant symbolic links to a decoy
// tree that stands for the host's data, FIFOs, device nodes, bind mounts,
// deep and wide trees and files kept open, and swap directories for links
// under the agent's feet. Every test checks that nothing outside the
// volume changed (modes, owners, contents and change times of every entry
// of the decoy tree), that no mount is left behind, and that the agent's
// peak memory stays bounded.
//
// The agent runs in standalone mode (manifests), built without the race
// detector so that its memory is what users see. Expectations that need a
// fix not yet on this branch skip, saying which (see docs/security.md).
//
// The tests need root and skip otherwise, and in -short mode.
package tenant_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// agentBinary is the volume-agent built by TestMain.
var agentBinary string

// skipReason, when set, makes every test skip.
var skipReason string

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	flag.Parse()
	if skipReason = e2eutil.SkipReason("mount", "losetup"); skipReason != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "volume-agent-e2e-tenant-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bins, err := e2eutil.Build(context.Background(), dir, e2eutil.BuildOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "building volume-agent:", err)
		return 1
	}
	agentBinary = bins.AgentBin
	return m.Run()
}
