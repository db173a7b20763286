package e2eutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/volume-agent/volume-agent/test/cluster"
)

// BuildOptions say what Build builds.
type BuildOptions struct {
	// Race builds the agent with the race detector (pass RaceEnabled).
	Race bool
	// CSIDriver builds the test CSI driver as well.
	CSIDriver bool
	// RuntimeConsumer builds examples/runtime-consumer as well.
	RuntimeConsumer bool
}

// Binaries are the programs Build built.
type Binaries struct {
	// AgentBin is cmd/volume-agent, or $VOLUME_AGENT_BINARY if set (an
	// agent built elsewhere).
	AgentBin string
	// CSIDriverBin is test/csidriver/cmd/test-csi-driver, if built.
	CSIDriverBin string
	// RuntimeConsumerBin is examples/runtime-consumer, if built.
	RuntimeConsumerBin string
}

// Build builds the agent and, if asked, the test CSI driver into dir, at
// the same time.
func Build(ctx context.Context, dir string, o BuildOptions) (Binaries, error) {
	var b Binaries
	var wg sync.WaitGroup
	var agentErr, driverErr, consumerErr error
	if b.AgentBin = os.Getenv("VOLUME_AGENT_BINARY"); b.AgentBin == "" {
		b.AgentBin = filepath.Join(dir, "volume-agent")
		args := []string{"-o", b.AgentBin}
		if o.Race {
			args = append(args, "-race")
		}
		wg.Go(func() { agentErr = goBuild(ctx, append(args, "./cmd/volume-agent")...) })
	}
	if o.CSIDriver {
		b.CSIDriverBin = filepath.Join(dir, "test-csi-driver")
		wg.Go(func() { driverErr = goBuild(ctx, "-o", b.CSIDriverBin, "./test/csidriver/cmd/test-csi-driver") })
	}
	if o.RuntimeConsumer {
		b.RuntimeConsumerBin = filepath.Join(dir, "runtime-consumer")
		wg.Go(func() { consumerErr = goBuild(ctx, "-o", b.RuntimeConsumerBin, "./examples/runtime-consumer") })
	}
	wg.Wait()
	if agentErr != nil {
		return b, agentErr
	}
	if driverErr != nil {
		return b, driverErr
	}
	return b, consumerErr
}

// goBuild runs go build with args in the repository.
func goBuild(ctx context.Context, args ...string) error {
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{"build"}, args...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
