package e2eutil

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/csidriver"
)

// CSIDriverOptions configure a CSIDriver.
type CSIDriverOptions struct {
	// Binary is the test CSI driver program (Binaries.CSIDriverBin).
	Binary string
	// Name is the driver's name (--name), NodeID its --node-id.
	Name, NodeID string
	// Socket and ControlSocket are the paths of its CSI and control
	// sockets; default csi.sock and control.sock in a new directory under
	// /tmp (a socket's path holds at most 108 bytes).
	Socket, ControlSocket string
	// StateDir is its --state-dir (volumes' backing files); default a new
	// t.TempDir(). When the test ends, after the driver has stopped, loop
	// devices backed by files below it are unmounted and detached.
	StateDir string
	// StrictLoops makes a loop device left attached below StateDir an
	// error of a test that did not fail otherwise: for tests that release
	// every volume before they end.
	StrictLoops bool
	// Args are more flags for every start (--attach-required,
	// --default-fstype...).
	Args []string
	// LogPath is its log, appended to by every start; default driver.log
	// in a new t.TempDir().
	LogPath string
	// OwnMountNamespace runs the driver in a mount namespace of its own
	// whose mounts are copies of the test's with their propagation kept
	// (unshare --mount --propagation unchanged), as a driver container
	// with a Bidirectional mount of the kubelet's directory has: its mounts
	// reach the test's namespace only below a shared mount.
	OwnMountNamespace bool
}

// CSIDriver is a process of test/csidriver/cmd/test-csi-driver that a test
// can kill and start again on the same state, with a gRPC connection to it
// (for the controller calls the test makes itself: there is no
// external-provisioner, -attacher or -resizer) and its control client
// (call counts, faults, hangs, volumes). When the test ends it is stopped
// with SIGTERM; its mounts stay (the agent's root is unmounted separately).
type CSIDriver struct {
	t    *testing.T
	opts CSIDriverOptions
	proc *Process
	// Conn is a connection to the driver's CSI socket.
	Conn *grpc.ClientConn
	// Control is the driver's control client.
	Control *csidriver.ControlClient
}

// NewCSIDriver prepares a driver without starting it (see Start).
func NewCSIDriver(t *testing.T, o CSIDriverOptions) *CSIDriver {
	t.Helper()
	if o.Socket == "" || o.ControlSocket == "" {
		dir, err := os.MkdirTemp("", "e2ecsi-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		o.Socket, o.ControlSocket = filepath.Join(dir, "csi.sock"), filepath.Join(dir, "control.sock")
	}
	if o.StateDir == "" {
		o.StateDir = t.TempDir()
	}
	o.StateDir = mounttest.Real(o.StateDir)
	if o.LogPath == "" {
		o.LogPath = filepath.Join(t.TempDir(), "driver.log")
	}
	// Registered first, so run last: after the driver has stopped.
	t.Cleanup(func() {
		if o.StrictLoops && !t.Failed() {
			for dev, file := range mounttest.LoopDevicesUnder(t, o.StateDir) {
				t.Errorf("loop device %s (backed by %s) left attached", dev, file)
			}
		}
		mounttest.DetachLoopsUnder(t, o.StateDir)
	})
	d := &CSIDriver{t: t, opts: o, Control: csidriver.NewControlClient(o.ControlSocket)}
	var err error
	if d.Conn, err = grpc.NewClient(d.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Conn.Close() })
	t.Cleanup(func() {
		if d.proc == nil {
			return
		}
		if err := d.proc.Stop(20 * time.Second); err != nil {
			t.Errorf("stopping CSI driver %s: %v", o.Name, err)
		}
		if t.Failed() {
			t.Logf("--- last lines of CSI driver %s's log %s ---\n%s", o.Name, o.LogPath, d.proc.Tail(40))
		}
	})
	return d
}

// StartCSIDriver starts a driver (NewCSIDriver, then Start).
func StartCSIDriver(t *testing.T, o CSIDriverOptions) *CSIDriver {
	t.Helper()
	d := NewCSIDriver(t, o)
	d.Start()
	return d
}

// Name is the driver's name.
func (d *CSIDriver) Name() string { return d.opts.Name }

// Endpoint is the driver's CSI endpoint, unix://<Socket>.
func (d *CSIDriver) Endpoint() string { return "unix://" + d.opts.Socket }

// Socket is the path of the driver's CSI socket.
func (d *CSIDriver) Socket() string { return d.opts.Socket }

// StateDir is the driver's --state-dir.
func (d *CSIDriver) StateDir() string { return d.opts.StateDir }

// Process is the driver's current (or last) process.
func (d *CSIDriver) Process() *Process { return d.proc }

// Start starts the driver (again, on the same state), with Args and extra,
// and waits until it answers on both sockets.
func (d *CSIDriver) Start(extra ...string) {
	t := d.t
	t.Helper()
	if d.proc != nil && !d.proc.Exited() {
		t.Fatalf("CSI driver %s is already running", d.opts.Name)
	}
	// Sockets a killed process left behind must not look like a live one.
	for _, s := range []string{d.opts.Socket, d.opts.ControlSocket} {
		os.Remove(s)
	}
	args := append([]string{
		"--endpoint=" + d.Endpoint(), "--name=" + d.opts.Name, "--node-id=" + d.opts.NodeID,
		"--state-dir=" + d.opts.StateDir, "--control-socket=" + d.opts.ControlSocket,
	}, slices.Concat(d.opts.Args, extra)...)
	bin := d.opts.Binary
	if d.opts.OwnMountNamespace {
		// unshare execs the driver: the process is the driver's.
		args = append([]string{"--mount", "--propagation", "unchanged", "--", bin}, args...)
		bin = "unshare"
	}
	p, err := startProcess("CSI driver "+d.opts.Name, d.opts.LogPath, bin, args...)
	if err != nil {
		t.Fatalf("starting CSI driver %s: %v", d.opts.Name, err)
	}
	d.proc = p
	Poll(t, 30*time.Second, "CSI driver "+d.opts.Name+" answers", func(ctx context.Context) (bool, string) {
		if p.Exited() {
			t.Fatalf("CSI driver %s exited during start-up (%v):\n%s", d.opts.Name, p.Err(), p.Tail(20))
		}
		if _, err := d.Control.CallCounts(); err != nil { // the last socket the driver opens
			return false, err.Error()
		}
		_, err := csi.NewIdentityClient(d.Conn).Probe(ctx, &csi.ProbeRequest{})
		return err == nil, fmt.Sprint(err)
	})
	t.Logf("CSI driver %s running (pid %d, log %s)", d.opts.Name, p.PID(), d.opts.LogPath)
}

// Kill kills the driver with SIGKILL, as a crash would.
func (d *CSIDriver) Kill() {
	d.t.Logf("kill -9 CSI driver %s (pid %d)", d.opts.Name, d.proc.PID())
	d.proc.Kill()
}

// CreateVolume creates a volume of size bytes (mount access,
// single-node-writer, formatted fsType) through the driver's controller
// service, as an external-provisioner would, and returns its ID.
func (d *CSIDriver) CreateVolume(name string, size int64, fsType string) string {
	t := d.t
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := csi.NewControllerClient(d.Conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{MountCapability(fsType)},
	})
	if err != nil {
		t.Fatalf("CreateVolume %s on %s: %v", name, d.opts.Name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

// MountCapability is a single-node-writer mount of a filesystem of fsType.
func MountCapability(fsType string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// CallCounts returns the running process's call counts by method.
func (d *CSIDriver) CallCounts(t testing.TB) map[string]int {
	t.Helper()
	c, err := d.Control.CallCounts()
	if err != nil {
		t.Fatalf("CSI driver %s call counts: %v", d.opts.Name, err)
	}
	return c
}

// Volume returns what the driver knows of a volume.
func (d *CSIDriver) Volume(t testing.TB, id string) (csidriver.VolumeInfo, bool) {
	t.Helper()
	vols, err := d.Control.Volumes()
	if err != nil {
		t.Fatalf("CSI driver %s volumes: %v", d.opts.Name, err)
	}
	for _, v := range vols {
		if v.ID == id {
			return v, true
		}
	}
	return csidriver.VolumeInfo{}, false
}
