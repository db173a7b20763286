package e2eutil

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/test/cluster"
)

// SidecarOptions configure a Sidecar.
type SidecarOptions struct {
	// Name is the sidecar's program: cluster.CSIProvisioner,
	// cluster.CSIAttacher or cluster.CSIResizer.
	Name string
	// CSIAddress is the path of the driver's CSI socket (CSIDriver.Socket).
	CSIAddress string
	// Kubeconfig is the sidecar's identity: an administrator's
	// (ControlPlane.Cluster.AdminKubeconfig) will do, the sidecars being
	// parts of the cluster the tests use, not what they test.
	Kubeconfig string
	// Args follow SidecarArgs; a flag given twice takes the later value.
	Args []string
	// LogDir holds the log, <Name>.log (appended to); default a new
	// t.TempDir().
	LogDir string
}

// SidecarArgs are the flags every sidecar gets besides --csi-address and
// --kubeconfig: one replica, so no leader election; a call timeout that
// suits a loaded 2-core machine running the race detector; failed
// operations retried after at most 5 s instead of 5 minutes, so that a
// transient failure (a sidecar that ran before the CSINode it needs was
// written) delays a step by seconds; the calls and API updates in the log.
var SidecarArgs = []string{
	"--leader-election=false",
	"--timeout=30s",
	"--retry-interval-start=500ms",
	"--retry-interval-max=5s",
	"--v=5",
}

// sidecarDefaults are each sidecar's own flags.
var sidecarDefaults = map[string][]string{
	// Topology is a GA feature gate of external-provisioner v6, on by
	// default: no --feature-gates. --immediate-topology (the default)
	// passes the topology of every node whose CSINode lists the driver to
	// CreateVolume for Immediate binding. --extra-create-metadata adds the
	// claim's and the PV's names to CreateVolume's parameters, as most
	// deployments do. No --default-fstype: the StorageClass says.
	cluster.CSIProvisioner: {"--extra-create-metadata=true"},
	// The node ID for ControllerPublishVolume comes from the node's
	// CSINode entry of the driver; the default 10 workers.
	cluster.CSIAttacher: nil,
	// --handle-volume-inuse-error (the default) watches pods, to retry a
	// driver's "in use" refusal once the claim's pods are gone.
	cluster.CSIResizer: {"--handle-volume-inuse-error=true"},
}

// Sidecar is a CSI sidecar process (external-provisioner, -attacher or
// -resizer) serving one driver, with the log kept. It is stopped when the
// test ends; on failure, the end of its log is logged. Built by
// test/tools/build.sh (cluster.SidecarBin); SidecarSkipReason says when
// they are missing.
type Sidecar struct {
	t       *testing.T
	opts    SidecarOptions
	proc    *Process
	args    []string
	stopped bool
}

// StartSidecar starts a sidecar. It fails the test if the program is
// missing or exits within its first moments (a bad flag).
func StartSidecar(t *testing.T, o SidecarOptions) *Sidecar {
	t.Helper()
	bin, err := cluster.SidecarBin(o.Name)
	if err != nil {
		t.Fatal(err)
	}
	if o.LogDir == "" {
		o.LogDir = t.TempDir()
	}
	s := &Sidecar{t: t, opts: o}
	s.args = slices.Concat([]string{"--csi-address=" + o.CSIAddress, "--kubeconfig=" + o.Kubeconfig}, SidecarArgs, sidecarDefaults[o.Name], o.Args)
	if s.proc, err = startProcess(o.Name, filepath.Join(o.LogDir, o.Name+".log"), bin, s.args...); err != nil {
		t.Fatalf("starting %s: %v", o.Name, err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("%s at the end of the test: %v", o.Name, err)
		}
		if t.Failed() {
			t.Logf("--- last lines of %s's log %s ---\n%s", o.Name, s.proc.LogPath(), s.proc.Tail(60))
		}
	})
	t.Logf("%s running (pid %d, log %s)", o.Name, s.proc.PID(), s.proc.LogPath())
	return s
}

// Args are the flags the sidecar runs with.
func (s *Sidecar) Args() []string { return s.args }

// Process is the sidecar's process.
func (s *Sidecar) Process() *Process { return s.proc }

// Stop stops the sidecar with SIGTERM (its process group gets SIGKILL
// after 10 s) and returns an error if it had exited before (the sidecars
// exit when they lose their driver, which a test must stop after them) or
// could not be stopped. The sidecars do not catch SIGTERM: dying of it is
// their clean exit. Calling it again returns nil.
func (s *Sidecar) Stop() error {
	p := s.proc
	if s.stopped {
		return nil
	}
	s.stopped = true
	if p.Exited() {
		return fmt.Errorf("%s (pid %d) had exited (%v):\n%s", s.opts.Name, p.PID(), p.err, p.Tail(20))
	}
	_ = syscall.Kill(p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s (pid %d) did not exit within 10s of SIGTERM and was killed", s.opts.Name, p.PID())
	}
	var exit *exec.ExitError
	if p.err == nil || errors.As(p.err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGTERM {
		return nil
	}
	return fmt.Errorf("%s (pid %d) exited with %v", s.opts.Name, p.PID(), p.err)
}

// SidecarSkipReason says why the CSI sidecars cannot run here, or "": the
// control-plane's skip reasons, or a sidecar missing from the tools
// directory.
func SidecarSkipReason() string {
	if reason := ControlPlaneSkipReason(); reason != "" {
		return reason
	}
	for _, name := range cluster.Sidecars {
		if _, err := cluster.SidecarBin(name); err != nil {
			return "CSI sidecars unavailable: " + err.Error()
		}
	}
	return ""
}

// Name is the sidecar's program name.
func (s *Sidecar) Name() string { return s.opts.Name }
