package e2eutil

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/cluster"
)

// Suite is what RunSuite sets up once for the tests of a package.
type Suite struct {
	// Skip says why every test of the package skips; empty when the suite
	// runs.
	Skip string
	// Dir is the suite's directory: the binaries, and the control plane's
	// logs and audit log (kept when a test failed).
	Dir string
	Binaries
	*ControlPlane
}

// Require skips the test if the suite cannot run (see Skip).
func (s *Suite) Require(t testing.TB) {
	t.Helper()
	Skip(t, s.Skip)
}

// StartAgent starts an agent (StartAgent) for node on root in cluster mode,
// as the suite's ServiceAccount, with --shutdown-grace-period=10s and args.
// When the admission policies are in force, the agent runs with a token
// bound to its pod on node (AgentPod), as in a DaemonSet.
func (s *Suite) StartAgent(t *testing.T, node, root string, args ...string) *Agent {
	t.Helper()
	kubeconfig := s.Kubeconfig
	if s.ControlPlane.AdmissionPolicies {
		_, kubeconfig = s.AgentPod(t, node)
	}
	return StartAgent(t, AgentOptions{
		Binary: s.AgentBin, Kubeconfig: kubeconfig, Node: node, Root: root,
		Args: append([]string{"--shutdown-grace-period=10s"}, args...),
	})
}

// SuiteOptions configure RunSuite.
type SuiteOptions struct {
	// Name names the suite's directory (volume-agent-e2e-<name>-*).
	Name string
	// Tools must be installed for the suite to run (losetup: and loop
	// devices available).
	Tools []string
	// CSIDriver builds the test CSI driver too.
	CSIDriver bool
	// Sidecars says that the tests run the CSI sidecars (StartSidecar):
	// they skip, saying why, when test/tools/build.sh did not build them.
	Sidecars bool
	// ControlPlane configures the control plane (RunSuite sets Dir).
	ControlPlane ControlPlaneOptions
	// Setup, if set, runs once the control plane is up, before the tests.
	Setup func(ctx context.Context, s *Suite) error
	// Check, if set, runs after the tests if they passed; false fails
	// the run (the suites check the audit log).
	Check func() bool
	// KeepDir keeps the suite's directory even when the tests pass.
	KeepDir bool
}

// RunSuite is the TestMain of a cluster-mode suite; it returns the exit
// code. Every test skips (s.Skip, through Skip) in -short mode, with
// VOLUME_AGENT_SKIP_CLUSTER=1, when not run as root, or without the tools,
// the control-plane binaries or (with Sidecars) the CSI sidecars. Otherwise
// RunSuite builds the binaries (the agent with -race when the tests run
// with it), starts the control plane, runs Setup, the tests and Check, and
// stops the control plane.
func RunSuite(m *testing.M, s *Suite, o SuiteOptions) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if s.Skip = SkipReason(o.Tools...); s.Skip == "" {
		s.Skip = ControlPlaneSkipReason()
	}
	if s.Skip == "" && o.Sidecars {
		s.Skip = SidecarSkipReason()
	}
	if s.Skip != "" {
		return m.Run()
	}
	var err error
	if s.Dir, err = os.MkdirTemp("", "volume-agent-e2e-"+o.Name+"-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := 1
	defer func() {
		if code == 0 && !o.KeepDir {
			os.RemoveAll(s.Dir)
		} else {
			fmt.Fprintf(os.Stderr, "binaries, control plane logs and audit log kept in %s\n", s.Dir)
		}
	}()
	if err := s.setup(o); err != nil {
		fmt.Fprintf(os.Stderr, "setting up the suite: %v\n", err)
		return 1
	}
	defer s.Cluster.Stop()
	code = m.Run()
	if code == 0 && o.Check != nil && !o.Check() {
		code = 1
	}
	return code
}

func (s *Suite) setup(o SuiteOptions) (err error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if s.Binaries, err = Build(ctx, s.Dir, BuildOptions{Race: RaceEnabled, CSIDriver: o.CSIDriver}); err != nil {
		return err
	}
	o.ControlPlane.Dir = filepath.Join(s.Dir, "cluster")
	if s.ControlPlane, err = StartControlPlane(ctx, o.ControlPlane); err != nil {
		return err
	}
	if o.Setup != nil {
		if err := o.Setup(ctx, s); err != nil {
			s.Cluster.Stop()
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "suite ready in %v (agent %s, race detector %v)\n", time.Since(start).Round(time.Millisecond), s.AgentBin, RaceEnabled)
	return nil
}

// Skip skips t, saying why, when reason (from SkipReason or the like) is
// not empty. Without root the test goes through mounttest.RequireRoot
// first, which fails it when root is required (as `make test` requires it).
func Skip(t testing.TB, reason string) {
	t.Helper()
	if reason == "" {
		return
	}
	if !testing.Short() {
		mounttest.RequireRoot(t)
	}
	t.Skip("skipping: " + reason)
}

// SkipReason says why tests that mount cannot run here, or "": in -short
// mode, when not run as root, or without one of the tools (losetup: or
// without loop devices). Tests skip with it through Skip.
func SkipReason(tools ...string) string {
	switch {
	case testing.Short():
		return "-short: the end-to-end tests build and run the agent"
	case os.Geteuid() != 0:
		return "the end-to-end tests mount filesystems: run them as root"
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " is not installed"
		}
	}
	if slices.Contains(tools, "losetup") {
		if _, err := os.Stat("/dev/loop-control"); err != nil {
			return "no loop devices: " + err.Error()
		}
	}
	return ""
}

// ControlPlaneSkipReason says why no control plane can be started here, or
// "": with VOLUME_AGENT_SKIP_CLUSTER=1 or without the control-plane
// binaries (test/tools/build.sh).
func ControlPlaneSkipReason() string {
	if os.Getenv("VOLUME_AGENT_SKIP_CLUSTER") == "1" {
		return "VOLUME_AGENT_SKIP_CLUSTER=1: not starting a control plane"
	}
	if _, err := cluster.ToolsBin(); err != nil {
		return fmt.Sprintf("control-plane binaries unavailable: %v", err)
	}
	return ""
}

// CheckNothingRefused reads every request the suite's ServiceAccount made:
// none may have been refused, and claims, volumes and attachments were read
// one by one, by name. It prints what it found and is meant as a suite's
// Check.
func (s *Suite) CheckNothingRefused() bool {
	evs, err := s.Cluster.AuditEvents()
	if err != nil {
		fmt.Fprintf(os.Stderr, "RBAC check: %v\n", err)
		return false
	}
	counts, refused := Requests(evs, s.User)
	for _, e := range refused {
		fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %s %s by %s was forbidden\n", e.Verb, e.RequestURI, e.UserAgent)
	}
	PrintRequests(s.User, counts, nil)
	bad := UnscopedReads(evs, s.User, "volume-agent/")
	if len(bad) > 0 {
		fmt.Fprintf(os.Stderr, "RBAC check: FAIL: listed or watched without a name selector: %v\n", bad)
	}
	if len(refused) > 0 || len(bad) > 0 {
		return false
	}
	fmt.Fprintln(os.Stderr, "RBAC check: ok: no request refused")
	return true
}

var uniqueNames = struct {
	sync.Mutex
	used map[string]int
}{used: map[string]int{}}

// UniqueName makes a name unique within the suite's cluster when a test
// runs more than once (-count): name, name-2, name-3...
func UniqueName(name string) string {
	uniqueNames.Lock()
	defer uniqueNames.Unlock()
	uniqueNames.used[name]++
	if n := uniqueNames.used[name]; n > 1 {
		return fmt.Sprintf("%s-%d", name, n)
	}
	return name
}
