// Package restart_test proves end to end, with the real volume-agent binary,
// that restarts, crashes and upgrades of the agent never unmount a volume a
// pod uses, never stack a second mount on one, never lose data, and always
// finish tearing down what pods no longer want (including what a crash left
// half done): kill -9 in the middle of mounting hundreds of volumes, SIGTERM
// and start again (an upgrade) with zero mount and unmount operations, pods
// removed while the agent is down, a manifest that never parses, an API
// server that is down when the agent starts, and CSI volumes whose pods went
// away while the agent was down or whose agent died between NodeUnpublish and
// NodeUnstage.
//
// TestMain builds cmd/volume-agent (with -race when the tests run with it, so
// a data race in the agent is found in its log) and the test CSI driver once.
// The standalone tests need root; the cluster tests also need the control
// plane binaries (test/tools/build.sh) and start one shared control plane on
// first use (and a private one for the API server outage), with the RBAC
// objects rendered from deploy/self-attach (the base ClusterRole plus the
// self-attach one) for the agents' ServiceAccount. Everything a test starts
// (processes, mounts, loop devices) is stopped, unmounted and detached when
// it ends, also on failure.
package restart_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

var bins struct {
	skip string // why every test skips
	e2eutil.Binaries
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if bins.skip = e2eutil.SkipReason(); bins.skip != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "volume-agent-restart-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if bins.Binaries, err = e2eutil.Build(context.Background(), dir, e2eutil.BuildOptions{Race: e2eutil.RaceEnabled, CSIDriver: true}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	shared.stop(code != 0)
	return code
}

// requireRoot skips the test when the package cannot run.
func requireRoot(t *testing.T) {
	t.Helper()
	e2eutil.Skip(t, bins.skip)
}

// sharedPlane is the control plane the cluster tests share, started on
// first use. The API server outage test has its own.
type sharedPlane struct {
	once sync.Once
	dir  string
	cp   *e2eutil.ControlPlane
	err  error
}

var shared sharedPlane

// stop stops the control plane; its directory (logs, audit log) is kept
// when a test failed.
func (s *sharedPlane) stop(failed bool) {
	if s.cp != nil {
		s.cp.Cluster.Stop()
	}
	if s.dir == "" {
		return
	}
	if failed {
		fmt.Fprintf(os.Stderr, "the shared control plane's logs are in %s\n", s.dir)
		return
	}
	os.RemoveAll(s.dir)
}

// clusterSkip says why the cluster tests cannot run, or "".
func clusterSkip() string {
	if bins.skip != "" {
		return bins.skip
	}
	return e2eutil.ControlPlaneSkipReason()
}

// sharedControlPlane starts the shared control plane on first use.
func sharedControlPlane(t *testing.T) *e2eutil.ControlPlane {
	t.Helper()
	e2eutil.Skip(t, clusterSkip())
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "volume-agent-restart-cluster-"); shared.err != nil {
			return
		}
		shared.cp, shared.err = startControlPlane(shared.dir)
	})
	if shared.err != nil {
		t.Fatalf("starting the shared control plane: %v", shared.err)
	}
	return shared.cp
}

// privateControlPlane starts a control plane for one test, stopped when it
// ends.
func privateControlPlane(t *testing.T) *e2eutil.ControlPlane {
	t.Helper()
	e2eutil.Skip(t, clusterSkip())
	cp, err := startControlPlane(t.TempDir())
	if err != nil {
		t.Fatalf("starting a control plane: %v", err)
	}
	t.Cleanup(cp.Cluster.Stop)
	return cp
}

// startControlPlane starts a control plane with the RBAC objects rendered
// from deploy/self-attach (the base ClusterRole plus the self-attach one)
// and waits until they allow the last thing the agent may need (deleting a
// VolumeAttachment, granted by the self-attach binding).
func startControlPlane(dir string) (*e2eutil.ControlPlane, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	cp, err := e2eutil.StartControlPlane(ctx, e2eutil.ControlPlaneOptions{
		Dir:           dir,
		Kustomization: "deploy/self-attach",
		Allowed:       []authorizationv1.ResourceAttributes{{Verb: "delete", Group: "storage.k8s.io", Resource: "volumeattachments"}},
	})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "control plane in %s ready in %v\n", dir, time.Since(start).Round(time.Millisecond))
	return cp, nil
}
