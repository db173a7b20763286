// Package plugins defines what a volume plugin is and finds the plugin for a
// volume. A plugin implements Plugin; optional capabilities (device mounts,
// attach, expansion) are separate interfaces found by type assertion, so a
// simple plugin stays simple.
//
// Plugins never touch the desired or actual state of world: they get a
// request, change the host, and return nil, a final error, or an error marked
// volume.Uncertain when the outcome is unknown.
package plugins

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/volume"
)

// Host is what plugins get from the agent.
type Host struct {
	Paths    volume.Paths
	Mounter  Mounter
	NodeName string
	// HostRoot is where the node's root filesystem is visible to the agent:
	// "/" when the agent runs on the host, e.g. "/host" in a container that
	// mounts it there. Paths from pods and volumes (hostPath, local) are
	// the node's paths and are resolved within it (internal/hostroot).
	HostRoot string
	// NodeMemory returns the node's allocatable memory in bytes (0:
	// unknown): what a memory-backed volume may hold at most, as the
	// kubelet sizes them. Nil: unknown.
	NodeMemory func() int64
	// Recheck asks the populator to resolve again the volumes whose
	// Attributes returned ErrNotReady: the answer they waited for came.
	// Nil when nothing waits.
	Recheck func()
	Log     *zap.Logger
}

// ErrNotReady is returned (wrapped) by Attributes when it cannot answer yet
// without waiting on the host (a check of a path runs in the background:
// the populate path never waits on a filesystem). It is not a problem with
// the pod and is not reported as one; Host.Recheck is called when the
// answer comes.
var ErrNotReady = errors.New("not known yet")

// Plugin handles one kind of volume.
type Plugin interface {
	// Name is the plugin's name, e.g. "kubernetes.io/empty-dir".
	Name() string
	// CanSupport reports whether the plugin handles the volume.
	CanSupport(spec *volume.Spec) bool
	// Attributes validates the spec and says how the volume is handled. It
	// never waits on the host: what it needs to know of it (is this path a
	// block device?) it learns in the background, returning ErrNotReady
	// meanwhile. Any other error is a problem with the pod's volume,
	// reported per pod.
	Attributes(spec *volume.Spec) (volume.Attributes, error)
	// SetUp makes the volume available to the pod at req.Dir. It must be
	// idempotent: called again for a volume already set up, it succeeds.
	SetUp(ctx context.Context, req *SetUpRequest) error
	// TearDown undoes SetUp. It must be idempotent, must not follow paths
	// out of req.Dir and must leave req.Dir removed.
	TearDown(ctx context.Context, req *TearDownRequest) error
}

// Log is where a plugin logs about the operation it serves: a *zap.Logger,
// or the operation's own logger, which carries the operation's fields and
// costs nothing until a line is written (most operations never write one).
type Log interface {
	Debug(msg string, fields ...zap.Field)
	Info(msg string, fields ...zap.Field)
	Warn(msg string, fields ...zap.Field)
	Error(msg string, fields ...zap.Field)
}

// SetUpRequest asks a plugin to make a volume available to one pod.
type SetUpRequest struct {
	VolumeName volume.UniqueName
	Spec       *volume.Spec
	Pod        volume.PodInfo
	// Dir is where the pod expects the volume.
	Dir string
	// DevicePath and PublishContext are what attaching returned, for
	// attachable volumes.
	DevicePath     string
	PublishContext map[string]string
	// DeviceMountPath is the device (staging) mount, for device-mountable
	// volumes.
	DeviceMountPath string
	Log             Log
	// RefreshAt is set by SetUp when the content it wrote goes stale at a
	// known time (a token due for refresh, a CSI volume that must be
	// republished): the volume is set up again then.
	RefreshAt time.Time
}

// TearDownRequest asks a plugin to remove a volume from one pod.
type TearDownRequest struct {
	VolumeName volume.UniqueName
	// Spec is nil when the mount was found on disk after a restart and no
	// pod wants it any more.
	Spec            *volume.Spec
	Pod             volume.PodRef
	Dir             string
	DeviceMountPath string
	// NoSizeLimit is the volume's Attributes.NoSizeLimit: true only when
	// the plugin said so while the spec was known.
	NoSizeLimit bool
	Log         Log
}

// DeviceMounter is implemented by plugins whose volumes are mounted once per
// node (formatted block devices, CSI staging) before per-pod SetUp.
type DeviceMounter interface {
	MountDevice(ctx context.Context, req *DeviceRequest) error
	UnmountDevice(ctx context.Context, req *DeviceRequest) error
}

// DeviceRequest asks for a device (staging) mount or unmount.
type DeviceRequest struct {
	VolumeName volume.UniqueName
	// Spec is nil for an unmount of a volume found on disk after a restart.
	Spec     *volume.Spec
	Identity string
	// Attachable: the volume is attached to the node first (recorded so a
	// restart keeps reporting it in use until it is unmounted).
	Attachable      bool
	DevicePath      string
	PublishContext  map[string]string
	DeviceMountPath string
	// DesiredSize is set when node expansion is pending: a plugin that can
	// grow the filesystem while it is not mounted does so in MountDevice
	// and reports the size in Resized.
	DesiredSize *resource.Quantity
	Resized     *resource.Quantity
	Log         Log
}

// ErrExpansionNotSupported is returned (wrapped) by Expand when the volume
// has nothing the node can grow; the expansion counts as done.
var ErrExpansionNotSupported = errors.New("node expansion is not supported for this volume")

// ErrNotPublished is returned (wrapped) by Expand when the volume can only be
// grown once a pod has it (a CSI driver that does not stage): pods are
// published first and the volume is grown online.
var ErrNotPublished = errors.New("volume must be published before it can be expanded")

// ErrExpansionInfeasible is returned (wrapped) by Expand when the storage
// says the expansion cannot be done as asked (a CSI InvalidArgument,
// OutOfRange or NotFound): the claim is marked NodeResizeInfeasible, as the
// kubelet marks it, which stops the node retrying until the claim changes
// (a user can then ask for less).
var ErrExpansionInfeasible = errors.New("node expansion is infeasible")

// ErrVolumeInUse is returned (wrapped) by Expand when the driver refuses to
// grow the volume while it is in use; it is not retried until the volume's
// pods change.
var ErrVolumeInUse = errors.New("volume in use")

// Attacher is implemented by plugins whose volumes must be attached to the
// node (by a controller, or by the agent itself) before their device is
// mounted.
type Attacher interface {
	// Attach makes sure the volume is attached to this node, attaching it
	// if this plugin does that itself, and returns what attaching produced.
	// It returns an error while the volume is not attached yet.
	Attach(ctx context.Context, req *AttachRequest) (*AttachResult, error)
	// Detach detaches a volume no pod uses any more (or just forgets it
	// when a controller detaches).
	Detach(ctx context.Context, req *AttachRequest) error
}

// AttachRequest asks for an attach or detach.
type AttachRequest struct {
	VolumeName volume.UniqueName
	// Spec is nil for a detach of a volume found on disk after a restart.
	Spec *volume.Spec
	Log  Log
}

// AttachResult is what attaching produced.
type AttachResult struct {
	DevicePath     string
	PublishContext map[string]string
}

// Expander is implemented by plugins that can grow a volume's filesystem on
// the node.
type Expander interface {
	// Expand grows the filesystem of the volume to fit newSize and returns
	// the size it now has.
	Expand(ctx context.Context, req *ExpandRequest) (*resource.Quantity, error)
}

// ExpandRequest asks for a node-side expansion.
type ExpandRequest struct {
	VolumeName      volume.UniqueName
	Spec            *volume.Spec
	DevicePath      string
	DeviceMountPath string
	// VolumePath is one pod's mount of the volume (CSI needs one).
	VolumePath string
	OldSize    *resource.Quantity
	NewSize    resource.Quantity
	Log        Log
}

// Reconstructor is implemented by plugins whose volumes can be found on disk
// after a restart: given a pod volume directory, it names the volume the
// same way the populator would, so the mount can be matched with what pods
// want (and adopted) or torn down.
type Reconstructor interface {
	ReconstructPodVolume(pod types.UID, specName, dir string) (volume.UniqueName, volume.Attributes, error)
}

// DeviceReconstructor is implemented by plugins with device (staging)
// mounts: given a directory under <root>/plugins/<plugin>/mounts/, it says
// which volume it belongs to and what is left of it.
type DeviceReconstructor interface {
	// ReconstructDevice returns nil (and no error) when nothing is left to
	// undo in volumeDir, after removing it.
	ReconstructDevice(volumeDir string) (*ReconstructedDevice, error)
}

// ReconstructedDevice is a device mount found on disk.
type ReconstructedDevice struct {
	Name            volume.UniqueName
	Attributes      volume.Attributes
	DeviceMountPath string
	// Mounted: the device mount is in place (or the plugin has nothing to
	// mount for it).
	Mounted bool
	// Attached: an attachment made by the agent may remain to be released.
	Attached bool
}

// BlockMapper is implemented by plugins that can give pods a volume as a raw
// block device (volumeMode Block, used in volumeDevices). Nothing is ever
// formatted or mounted for such a volume: the device itself is what the pod
// gets.
//
// The agent (not the plugin) pins the device under each pod's access point
// after MapPodDevice and releases the pin before UnmapPodDevice.
type BlockMapper interface {
	// MapDevice prepares the device once per node for volumes whose
	// Attributes are DeviceMountable (CSI: NodeStageVolume with the block
	// capability into the staging directory req.DeviceMountPath).
	MapDevice(ctx context.Context, req *DeviceRequest) error
	// UnmapDevice undoes MapDevice once no pod has the device mapped.
	UnmapDevice(ctx context.Context, req *DeviceRequest) error
	// MapPodDevice places the block device at the access point req.Dir,
	// a file path whose parent exists (see volume.Paths), so that stat(2)
	// on it reports the device and opening it opens the device. It must be
	// idempotent and must verify, when it runs, that what it places is a
	// block device.
	MapPodDevice(ctx context.Context, req *SetUpRequest) error
	// UnmapPodDevice removes the access point req.Dir (unmounting it) and
	// never touches the device's data. It must be idempotent.
	UnmapPodDevice(ctx context.Context, req *TearDownRequest) error
}

// BlockReconstructor is implemented by BlockMappers whose access points can
// be found on disk after a restart: given an entry of
// <root>/pods/<uid>/volumeDevices/<plugin>/, it names the volume the way
// the populator would (with Attributes.Block set).
type BlockReconstructor interface {
	ReconstructPodDevice(pod types.UID, specName, path string) (volume.UniqueName, volume.Attributes, error)
}

// SetUpWithoutMount is implemented by plugins some of whose volumes are set
// up without a mount (an emptyDir on disk is just a directory): after a
// restart such a directory is evidence enough that the volume is set up.
type SetUpWithoutMount interface {
	SetUpWithoutMount(spec *volume.Spec) bool
}

// Registry finds plugins.
type Registry struct {
	plugins []Plugin
	byName  map[string]Plugin
}

// NewRegistry returns a registry of the given plugins.
func NewRegistry(ps ...Plugin) *Registry {
	r := &Registry{byName: map[string]Plugin{}}
	for _, p := range ps {
		r.plugins = append(r.plugins, p)
		r.byName[p.Name()] = p
	}
	return r
}

// ForSpec returns the one plugin that supports spec.
func (r *Registry) ForSpec(spec *volume.Spec) (Plugin, error) {
	var found Plugin
	for _, p := range r.plugins {
		if !p.CanSupport(spec) {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("both %s and %s support the volume", found.Name(), p.Name())
		}
		found = p
	}
	if found == nil {
		return nil, fmt.Errorf("no plugin on this node supports %s volumes", describeType(spec))
	}
	return found, nil
}

// ByName returns the plugin with the given name.
func (r *Registry) ByName(name string) (Plugin, bool) {
	p, ok := r.byName[name]
	return p, ok
}

// describeType names the kind of volume source for error messages.
func describeType(spec *volume.Spec) string {
	switch {
	case spec.PV != nil:
		return "PersistentVolume " + sourceKind(spec.PV.Spec.PersistentVolumeSource)
	case spec.Volume != nil:
		return sourceKind(spec.Volume.VolumeSource)
	}
	return "unknown"
}
