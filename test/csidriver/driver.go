package csidriver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/volume-agent/volume-agent/csi/csiclient"
)

const (
	// DefaultName is the driver name used when Config.Name is empty.
	DefaultName = "test.csi.volume-agent.io"
	// DefaultVolumeSize is the size of a volume created without a capacity.
	DefaultVolumeSize int64 = 64 << 20
	// DefaultEphemeralVolumeSize is the size of an inline ephemeral volume
	// whose volume_context has no "size".
	DefaultEphemeralVolumeSize int64 = 16 << 20
	// DefaultFSType is the filesystem created when a volume capability does
	// not name one.
	DefaultFSType = "ext4"

	// EphemeralContextKey is the volume_context key with which the kubelet
	// marks inline ephemeral volumes.
	EphemeralContextKey = "csi.storage.k8s.io/ephemeral"
	// EphemeralSizeKey is the volume_context key holding the size of an
	// inline ephemeral volume: bytes, or a number with a Ki/Mi/Gi/K/M/G suffix.
	EphemeralSizeKey = "size"
	// PublishContextAttachedTo is the publish_context key that
	// ControllerPublishVolume sets to the node the volume is attached to.
	PublishContextAttachedTo = "attachedTo"
)

// Config configures a Driver. StateDir and Endpoint are required.
type Config struct {
	// Name is the CSI driver name (GetPluginInfo). Default DefaultName.
	Name string
	// Version is the vendor version reported by GetPluginInfo. Default "1.0.0".
	Version string
	// NodeID is reported by NodeGetInfo. Default: the host name.
	NodeID string
	// Endpoint is the CSI socket: "unix:///path/csi.sock" or a plain path.
	Endpoint string
	// StateDir holds the backing files and the state file. It is created if
	// missing. A driver started on the state directory of an earlier one
	// takes over its volumes, loop devices and mounts.
	StateDir string

	// RegistrationDir, if set, gets a kubelet plugin registration socket
	// "<Name>-reg.sock" that points the kubelet at Endpoint.
	RegistrationDir string
	// ControlSocket, if set, serves the HTTP control API (see control.go).
	ControlSocket string
	// CallsFile, if set, is rewritten with the per-method call counts as JSON
	// whenever a call arrives.
	CallsFile string

	// AttachRequired enables ControllerPublishVolume and
	// ControllerUnpublishVolume; NodeStageVolume (or NodePublishVolume when
	// staging is disabled) then refuses volumes not published to this node.
	AttachRequired bool
	// DisableStaging drops STAGE_UNSTAGE_VOLUME, making the driver
	// publish-only: NodePublishVolume does all the work.
	DisableStaging bool
	// DisableSingleNodeMultiWriter drops SINGLE_NODE_MULTI_WRITER (node and
	// controller): the driver then knows SINGLE_NODE_WRITER only, and
	// refuses SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER.
	DisableSingleNodeMultiWriter bool
	// Topology advertises VOLUME_ACCESSIBILITY_CONSTRAINTS with the single
	// segment TopologyKey(Name)=NodeID.
	Topology bool
	// VolumeCondition advertises the node capability VOLUME_CONDITION
	// (value 4, which CSI spec 1.13 removed) and makes NodeGetVolumeStats
	// return volume_condition (field 2) as a driver built with spec 1.12
	// does: healthy unless SetVolumeCondition says otherwise.
	VolumeCondition bool
	// MaxVolumesPerNode is reported by NodeGetInfo and enforced by
	// ControllerPublishVolume; 0 means no limit.
	MaxVolumesPerNode int64
	// Capacity is the total size of all volumes the driver may create; 0
	// means the free space of the filesystem holding StateDir.
	Capacity int64
	// DefaultVolumeSize, DefaultEphemeralVolumeSize and DefaultFSType
	// override the package defaults of the same names.
	DefaultVolumeSize          int64
	DefaultEphemeralVolumeSize int64
	DefaultFSType              string

	// Faults, Hangs and CrashAfter set up fault injection at start; the
	// Driver's setters change it later.
	Faults     []Fault
	Hangs      []string
	CrashAfter int

	// Logger receives the driver's logs. Default: none.
	Logger *zap.Logger
	// Exit ends the process when CrashAfter is reached. Default os.Exit;
	// tests of the library replace it.
	Exit func(code int)
}

// TopologyKey is the topology segment key a driver with Config.Topology
// reports, for a driver named name.
func TopologyKey(name string) string { return "topology." + name + "/node" }

// Driver is a running (or runnable) test CSI driver. All its methods are safe
// for concurrent use.
type Driver struct {
	cfg        Config
	log        *zap.Logger
	faults     *injector
	socketPath string
	volumesDir string
	statePath  string

	mu    sync.Mutex // guards state, and serialises writes of the state file
	state *stateFile
	locks keyedMutex // one operation at a time per volume (or name)

	condMu     sync.Mutex
	conditions map[string]csiclient.VolumeCondition // by volume ID; absent: healthy

	regMu      sync.Mutex
	regHistory []RegistrationStatus

	lifeMu   sync.Mutex
	started  bool
	stopped  bool
	csiSrv   *grpc.Server
	regSrv   *grpc.Server
	regPath  string
	ctrlSrv  *http.Server
	ctrlPath string
	serveWG  sync.WaitGroup
}

// New checks cfg, creates the state directory and loads the state an earlier
// driver may have left there. It does not listen yet; see Start.
func New(cfg Config) (*Driver, error) {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Version == "" {
		cfg.Version = "1.0.0"
	}
	if cfg.NodeID == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("no node ID and no host name: %w", err)
		}
		cfg.NodeID = host
	}
	if cfg.DefaultVolumeSize <= 0 {
		cfg.DefaultVolumeSize = DefaultVolumeSize
	}
	if cfg.DefaultEphemeralVolumeSize <= 0 {
		cfg.DefaultEphemeralVolumeSize = DefaultEphemeralVolumeSize
	}
	if cfg.DefaultFSType == "" {
		cfg.DefaultFSType = DefaultFSType
	}
	if !supportedFSTypes[cfg.DefaultFSType] {
		return nil, fmt.Errorf("unsupported default filesystem type %q", cfg.DefaultFSType)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Exit == nil {
		cfg.Exit = os.Exit
	}
	if cfg.StateDir == "" {
		return nil, errors.New("a state directory is required")
	}
	socketPath, err := parseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	stateDir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	// The backing file paths must match what the kernel reports for loop
	// devices, which is the path with symlinks resolved.
	if err := os.MkdirAll(filepath.Join(stateDir, "volumes"), 0o755); err != nil {
		return nil, err
	}
	if stateDir, err = filepath.EvalSymlinks(stateDir); err != nil {
		return nil, err
	}
	cfg.StateDir = stateDir

	d := &Driver{
		cfg:        cfg,
		log:        cfg.Logger.With(zap.String("driver", cfg.Name)),
		socketPath: socketPath,
		volumesDir: filepath.Join(stateDir, "volumes"),
		statePath:  filepath.Join(stateDir, "state.json"),
	}
	d.faults = newInjector(d.log, cfg.Exit, cfg.CallsFile)
	for _, f := range cfg.Faults {
		if err := d.faults.setFault(f); err != nil {
			return nil, err
		}
	}
	for _, m := range cfg.Hangs {
		if err := d.faults.setHang(m, true); err != nil {
			return nil, err
		}
	}
	d.faults.setCrashAfter(cfg.CrashAfter)

	if d.state, err = loadState(d.statePath); err != nil {
		return nil, err
	}
	d.reconcile()
	return d, nil
}

// parseEndpoint returns the socket path of "unix:///path", "unix:/path" or
// "/path".
func parseEndpoint(ep string) (string, error) {
	path := ep
	if rest, ok := strings.CutPrefix(ep, "unix://"); ok {
		path = rest
	} else if rest, ok := strings.CutPrefix(ep, "unix:"); ok {
		path = rest
	} else if strings.Contains(ep, "://") {
		return "", fmt.Errorf("endpoint %q: only unix sockets are supported", ep)
	}
	if path == "" {
		return "", errors.New("an endpoint is required")
	}
	return filepath.Abs(path)
}

// reconcile checks the loop devices recorded in the state against the
// kernel, after a restart: a device that no longer holds the volume's file
// (the machine rebooted, someone detached it) is forgotten, and a file that
// is attached to a device the state does not know is picked up.
func (d *Driver) reconcile() {
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := false
	for _, v := range d.state.Volumes {
		file := d.backingPath(v)
		if v.LoopDevice != "" && loopBackingFile(v.LoopDevice) == file {
			continue
		}
		dev := findLoop(file)
		if dev != v.LoopDevice {
			d.log.Info("loop device changed while the driver was down",
				zap.String("volume", v.ID), zap.String("recorded", v.LoopDevice), zap.String("actual", dev))
			v.LoopDevice = dev
			changed = true
		}
	}
	if changed {
		if err := saveState(d.statePath, d.state); err != nil {
			d.log.Error("cannot save state", zap.Error(err))
		}
	}
}

// Start listens on the CSI socket (and the registration and control sockets
// if configured) and serves them in the background until Stop.
func (d *Driver) Start() error {
	d.lifeMu.Lock()
	defer d.lifeMu.Unlock()
	if d.started {
		return errors.New("driver already started")
	}
	d.started = true

	lis, err := listenUnix(d.socketPath)
	if err != nil {
		return err
	}
	d.csiSrv = grpc.NewServer(grpc.UnaryInterceptor(d.faults.interceptor(true)))
	csi.RegisterIdentityServer(d.csiSrv, &identityServer{d: d})
	csi.RegisterControllerServer(d.csiSrv, &controllerServer{d: d})
	csi.RegisterNodeServer(d.csiSrv, &nodeServer{d: d})
	d.serve(func() error { return d.csiSrv.Serve(lis) })

	if d.cfg.RegistrationDir != "" {
		d.regPath = filepath.Join(d.cfg.RegistrationDir, d.cfg.Name+"-reg.sock")
		lis, err := listenUnix(d.regPath)
		if err != nil {
			d.stopLocked()
			return err
		}
		d.regSrv = grpc.NewServer(grpc.UnaryInterceptor(d.faults.interceptor(false)))
		registerapi.RegisterRegistrationServer(d.regSrv, &registrationServer{d: d})
		d.serve(func() error { return d.regSrv.Serve(lis) })
	}

	if d.cfg.ControlSocket != "" {
		d.ctrlPath = d.cfg.ControlSocket
		lis, err := listenUnix(d.ctrlPath)
		if err != nil {
			d.stopLocked()
			return err
		}
		d.ctrlSrv = &http.Server{Handler: d.controlHandler(), ReadHeaderTimeout: 10 * time.Second}
		d.serve(func() error {
			if err := d.ctrlSrv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	d.log.Info("driver started", zap.String("endpoint", d.socketPath), zap.String("nodeID", d.cfg.NodeID),
		zap.String("stateDir", d.cfg.StateDir), zap.String("registration", d.regPath),
		zap.Bool("attachRequired", d.cfg.AttachRequired), zap.Bool("staging", !d.cfg.DisableStaging))
	return nil
}

func (d *Driver) serve(fn func() error) {
	d.serveWG.Add(1)
	go func() {
		defer d.serveWG.Done()
		if err := fn(); err != nil {
			d.log.Error("server stopped", zap.Error(err))
		}
	}()
}

// listenUnix listens on a unix socket at path, replacing a stale socket an
// earlier (killed) process left behind.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	return net.Listen("unix", path)
}

// Stop stops serving and removes the sockets. Calls that hang because of an
// injected hang fail with Unavailable; other calls in progress finish first.
// Volumes stay as they are: staged and published volumes stay mounted, so a
// new driver on the same state directory can carry on.
func (d *Driver) Stop() {
	d.lifeMu.Lock()
	defer d.lifeMu.Unlock()
	d.stopLocked()
}

func (d *Driver) stopLocked() {
	if d.stopped {
		return
	}
	d.stopped = true
	d.faults.stop()
	// Registration goes first, so that a plugin watcher sees the driver go
	// before its CSI socket does.
	if d.regSrv != nil {
		d.regSrv.Stop()
		os.Remove(d.regPath)
	}
	if d.csiSrv != nil {
		gracefulStop(d.csiSrv, 10*time.Second)
		os.Remove(d.socketPath)
	}
	if d.ctrlSrv != nil {
		d.ctrlSrv.Close()
		os.Remove(d.ctrlPath)
	}
	d.serveWG.Wait()
	d.log.Info("driver stopped")
}

func gracefulStop(s *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		s.Stop()
		<-done
	}
}

// Run starts the driver, waits for ctx to end and stops it.
func (d *Driver) Run(ctx context.Context) error {
	if err := d.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	d.Stop()
	return nil
}

// Name returns the driver name.
func (d *Driver) Name() string { return d.cfg.Name }

// NodeID returns the node ID the driver reports.
func (d *Driver) NodeID() string { return d.cfg.NodeID }

// Endpoint returns the CSI endpoint as "unix:///path".
func (d *Driver) Endpoint() string { return "unix://" + d.socketPath }

// SocketPath returns the path of the CSI socket.
func (d *Driver) SocketPath() string { return d.socketPath }

// RegistrationSocketPath returns the registration socket's path, or "" when
// the driver does not register.
func (d *Driver) RegistrationSocketPath() string {
	if d.cfg.RegistrationDir == "" {
		return ""
	}
	return filepath.Join(d.cfg.RegistrationDir, d.cfg.Name+"-reg.sock")
}

// StateDir returns the (absolute) state directory.
func (d *Driver) StateDir() string { return d.cfg.StateDir }

// VolumeInfo describes a volume as the driver sees it.
type VolumeInfo struct {
	ID            string   `json:"id"`
	Name          string   `json:"name,omitempty"` // empty for ephemeral volumes
	CapacityBytes int64    `json:"capacityBytes"`
	BackingFile   string   `json:"backingFile"` // absolute path
	Ephemeral     bool     `json:"ephemeral,omitempty"`
	AttachedNodes []string `json:"attachedNodes,omitempty"` // ControllerPublishVolume records
	LoopDevice    string   `json:"loopDevice,omitempty"`    // "" when not attached on this node
	StagingPath   string   `json:"stagingPath,omitempty"`   // "" when not staged
	TargetPaths   []string `json:"targetPaths,omitempty"`   // NodePublishVolume targets
}

func (d *Driver) volumeInfo(v *volume) VolumeInfo {
	info := VolumeInfo{
		ID: v.ID, Name: v.Name, CapacityBytes: v.CapacityBytes, BackingFile: d.backingPath(v),
		Ephemeral: v.Ephemeral, LoopDevice: v.LoopDevice,
	}
	if v.Staged != nil {
		info.StagingPath = v.Staged.Path
	}
	info.AttachedNodes = slices.Sorted(maps.Keys(v.Attachments))
	info.TargetPaths = slices.Sorted(maps.Keys(v.Publications))
	return info
}

// Volumes lists every volume the driver knows, ephemeral ones included,
// ordered by ID.
func (d *Driver) Volumes() []VolumeInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]VolumeInfo, 0, len(d.state.Volumes))
	for _, v := range d.state.Volumes {
		out = append(out, d.volumeInfo(v))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Volume returns one volume by ID.
func (d *Driver) Volume(id string) (VolumeInfo, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.state.Volumes[id]
	if !ok {
		return VolumeInfo{}, false
	}
	return d.volumeInfo(v), true
}

// --- fault injection and call counting ---

// SetFault makes method fail with code for the next times calls (every call
// if times <= 0), replacing an earlier fault for it. codes.OK clears it.
func (d *Driver) SetFault(method string, code codes.Code, times int) error {
	return d.faults.setFault(Fault{Method: method, Code: code, Times: times})
}

// ClearFault removes the fault for method.
func (d *Driver) ClearFault(method string) error {
	return d.faults.setFault(Fault{Method: method, Code: codes.OK})
}

// Faults returns the faults in force, with the calls left for counted ones.
func (d *Driver) Faults() []Fault { return d.faults.listFaults() }

// SetHang makes calls of method block until their context ends or the
// driver stops (hang=true), or releases them to do their work (hang=false).
func (d *Driver) SetHang(method string, hang bool) error { return d.faults.setHang(method, hang) }

// Hangs returns the methods that hang.
func (d *Driver) Hangs() []string { return d.faults.listHangs() }

// HungCalls is how many calls of method wait in a hang now.
func (d *Driver) HungCalls(method string) int { return d.faults.hungCalls(method) }

// SetCrashAfter makes the driver exit with status 2 (through Config.Exit)
// once n more CSI calls have been answered; a call arriving after that is
// not served. n <= 0 disables it. Registration calls do not count.
func (d *Driver) SetCrashAfter(n int) { d.faults.setCrashAfter(n) }

// ResetFaults clears all faults, hangs (releasing hung calls) and
// crash-after.
func (d *Driver) ResetFaults() { d.faults.reset() }

// CallCounts returns how often each gRPC method was called (CSI and
// registration), by short method name, faulted and hung calls included.
func (d *Driver) CallCounts() map[string]int { return d.faults.callCounts() }

// SetVolumeCondition sets what NodeGetVolumeStats reports as the volume's
// condition (with Config.VolumeCondition); abnormal false and an empty
// message make it healthy again. It is kept in memory only.
func (d *Driver) SetVolumeCondition(id string, abnormal bool, message string) {
	d.condMu.Lock()
	defer d.condMu.Unlock()
	if d.conditions == nil {
		d.conditions = map[string]csiclient.VolumeCondition{}
	}
	if !abnormal && message == "" {
		delete(d.conditions, id)
		return
	}
	d.conditions[id] = csiclient.VolumeCondition{Abnormal: abnormal, Message: message}
}

// volumeCondition is what NodeGetVolumeStats reports for a volume.
func (d *Driver) volumeCondition(id string) csiclient.VolumeCondition {
	d.condMu.Lock()
	defer d.condMu.Unlock()
	if c, ok := d.conditions[id]; ok {
		return c
	}
	return csiclient.VolumeCondition{Message: "volume is healthy"}
}

// CallCount returns how often method was called.
func (d *Driver) CallCount(method string) int {
	short := method[strings.LastIndex(method, "/")+1:]
	return d.faults.callCounts()[short]
}

// ResetCallCounts sets all call counts to zero.
func (d *Driver) ResetCallCounts() { d.faults.resetCalls() }

// --- state access ---

func (d *Driver) backingPath(v *volume) string { return filepath.Join(d.volumesDir, v.BackingFile) }

// getVolume returns a copy of the volume, or nil.
func (d *Driver) getVolume(id string) *volume {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v, ok := d.state.Volumes[id]; ok {
		return v.clone()
	}
	return nil
}

// putVolume stores v and saves the state.
func (d *Driver) putVolume(v *volume) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.state.Volumes[v.ID] = v.clone()
	return d.saveLocked()
}

// removeVolume forgets a volume and saves the state.
func (d *Driver) removeVolume(id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.state.Volumes, id)
	return d.saveLocked()
}

func (d *Driver) saveLocked() error {
	if err := saveState(d.statePath, d.state); err != nil {
		d.log.Error("cannot save state", zap.Error(err))
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

func newVolumeID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return "vol-" + hex.EncodeToString(b)
}

// keyedMutex hands out one mutex per key and forgets it when unused.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	sync.Mutex
	refs int
}

// lock locks key and returns the function that unlocks it.
func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()

	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
