// Package model turns the agent's state into what the operator page and
// `volume-agent status` show: every pod with its volumes and their state,
// operations, CSI drivers, orphans, local volumes and recent events. Build
// and BuildPod are pure functions of an Input (snapshots the agent gathers
// once per change); the page's HTML, its live updates and the JSON of
// /debug/status all come from the same model.
package model

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/internal/disklimit"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/ui/timeline"
	"github.com/volume-agent/volume-agent/volume"
)

// State is the state of one pod's volume.
type State string

const (
	// Desired: wanted, nothing done for it yet (or its operation runs).
	Desired State = "desired"
	// Attached: the device is attached, not yet mounted.
	Attached State = "attached"
	// DeviceMounted: the device is mounted at its global path, not yet in
	// the pod.
	DeviceMounted State = "device-mounted"
	// Mounted: ready for the pod.
	Mounted State = "mounted"
	// Uncertain: an operation may have left it (half) mounted; retried
	// while wanted.
	Uncertain State = "uncertain"
	// Error: it cannot be used (it does not resolve, or its operation
	// fails and waits in backoff).
	Error State = "error"
	// Unmounting: still mounted, no longer wanted.
	Unmounting State = "unmounting"
)

// States lists the volume states in the order the page shows them.
var States = []State{Error, Uncertain, Desired, Attached, DeviceMounted, Mounted, Unmounting}

// PodState is a pod's overall state.
type PodState string

const (
	PodReady   PodState = "ready"
	PodWaiting PodState = "waiting"
	PodError   PodState = "error"
	// PodTerminating: gone from the desired state; its volumes are being
	// torn down.
	PodTerminating PodState = "terminating"
)

// Page is the whole node: GET /debug/status.
type Page struct {
	Node string `json:"node"`
	// Mode is "standalone" or "cluster".
	Mode string `json:"mode"`
	// Now is when the page was built (the agent's clock): ages are
	// relative to it.
	Now          time.Time `json:"now"`
	SourcesReady bool      `json:"sourcesReady"`
	// EmptyDirLimits is how disk emptyDirs' sizeLimit is enforced.
	EmptyDirLimits disklimit.Status `json:"emptyDirLimits"`
	Summary        Summary          `json:"summary"`
	// Namespaces are every namespace with a pod (for filters), sorted.
	Namespaces []string    `json:"namespaces"`
	Pods       []Pod       `json:"pods"`
	Operations []Operation `json:"operations"`
	Drivers    []Driver    `json:"drivers"`
	// Sockets are registration sockets that did not register a driver.
	Sockets      []Socket      `json:"sockets,omitempty"`
	Orphans      []Orphan      `json:"orphans"`
	LocalVolumes *LocalVolumes `json:"localVolumes,omitempty"`
	InputErrors  []InputError  `json:"inputErrors,omitempty"`
	// Events are the most recent events, newest first.
	Events []events.Event `json:"events"`
}

// Summary counts what the page lists.
type Summary struct {
	Pods      int `json:"pods"`
	PodsReady int `json:"podsReady"`
	PodsError int `json:"podsError"`
	// PodsWaiting have a volume not ready yet (none failing).
	PodsWaiting int `json:"podsWaiting"`
	// PodsTerminating are gone, their volumes being torn down.
	PodsTerminating int `json:"podsTerminating"`
	Volumes         int `json:"volumes"`
	// VolumeStates counts pod volumes by state, in the order of States,
	// states without volumes left out.
	VolumeStates      []StateCount `json:"volumeStates"`
	OperationsRunning int          `json:"operationsRunning"`
	OperationsBackoff int          `json:"operationsBackoff"`
	Drivers           int          `json:"drivers"`
	DriversUnhealthy  int          `json:"driversUnhealthy"`
	Orphans           int          `json:"orphans"`
}

// StateCount is how many pod volumes are in a state.
type StateCount struct {
	State State `json:"state"`
	Count int   `json:"count"`
}

// Pod is one pod with its volumes.
type Pod struct {
	volume.PodRef
	State PodState `json:"state"`
	// Since is when the pod reached its state, as well as it is known.
	Since time.Time `json:"since,omitzero"`
	// Reason says why the pod is not ready ("volume: reason"), or for a
	// ready pod its first warning.
	Reason  string      `json:"reason,omitempty"`
	Volumes []PodVolume `json:"volumes"`
	// Warnings are the explanation's: local storage over its limits.
	Warnings []explain.Warning `json:"warnings,omitempty"`
}

// VolumeUsage is a volume's last measured usage (package usage).
type VolumeUsage struct {
	UsedBytes  int64 `json:"usedBytes"`
	InodesUsed int64 `json:"inodesUsed"`
	// LimitBytes is an emptyDir's sizeLimit (0: none).
	LimitBytes int64 `json:"limitBytes,omitempty"`
	// Method is how it was measured: source, statfs or walk.
	Method string    `json:"method"`
	At     time.Time `json:"at"`
	// Error is why the last measurement failed (the figures are older).
	Error string `json:"error,omitempty"`
}

// Text is the usage in a few words: "3.1Mi of 16Mi used".
func (u *VolumeUsage) Text() string {
	used := resource.NewQuantity(u.UsedBytes, resource.BinarySI)
	if u.LimitBytes > 0 {
		return fmt.Sprintf("%s of %s used", used, resource.NewQuantity(u.LimitBytes, resource.BinarySI))
	}
	return used.String() + " used"
}

// PodVolume is one volume of a pod.
type PodVolume struct {
	// Name is the pod's name for the volume (several names, comma
	// separated, when two pod volumes name one claim).
	Name string `json:"name"`
	// Volume is the unique volume name (empty when it does not resolve).
	Volume volume.UniqueName `json:"volume,omitempty"`
	Plugin string            `json:"plugin,omitempty"`
	// Source says what the volume is: "emptyDir (Memory)", "PVC
	// default/data → PV pv-1 (local /mnt/disks/a)"...
	Source string `json:"source,omitempty"`
	// State is where the volume is in its life (attached, mounted...).
	State State `json:"state"`
	// Since is when the volume reached its state, as well as it is known
	// (zero when unknown).
	Since time.Time `json:"since,omitzero"`
	// Ready and Status are the pod's explanation of the volume
	// (explain.Explain): a mounted volume whose sub-paths are missing is
	// not ready. Status is empty for a volume the pod no longer wants.
	Ready  bool           `json:"ready"`
	Status explain.Status `json:"status,omitempty"`
	// Reason explains a volume that is not ready: the explanation's
	// reason and details.
	Reason string `json:"reason,omitempty"`
	// Operation is the operation running or in backoff for it, if any.
	Operation string `json:"operation,omitempty"`
	// RetryAt is when a failed operation is retried.
	RetryAt         *time.Time `json:"retryAt,omitempty"`
	ReadOnly        bool       `json:"readOnly,omitempty"`
	MountPath       string     `json:"mountPath,omitempty"`
	DevicePath      string     `json:"devicePath,omitempty"`
	DeviceMountPath string     `json:"deviceMountPath,omitempty"`
	// Usage is the volume's last measured usage (emptyDirs; hostPath when
	// measured).
	Usage *VolumeUsage `json:"usage,omitempty"`
}

// Operation is one entry of the executor's pending-operations map.
type Operation struct {
	Volume volume.UniqueName `json:"volume"`
	// VolumeName is the volume's inner name (PV name, pod's volume name).
	VolumeName string         `json:"volumeName,omitempty"`
	Pod        *volume.PodRef `json:"pod,omitempty"`
	Operation  string         `json:"operation"`
	Plugin     string         `json:"plugin"`
	// State is queued, running, timedOut or backoff.
	State     string     `json:"state"`
	Since     time.Time  `json:"since,omitzero"`
	LastError string     `json:"lastError,omitempty"`
	RetryAt   *time.Time `json:"retryAt,omitempty"`
}

// Driver is a registered CSI driver.
type Driver struct {
	Name     string `json:"name"`
	Endpoint string `json:"endpoint"`
	Source   string `json:"source"`
	Version  string `json:"version,omitempty"`
	// Health is "healthy" (answered its last probe in time) or
	// "unresponsive" (missed probes; deregistered after three).
	Health       string    `json:"health"`
	RegisteredAt time.Time `json:"registeredAt,omitzero"`
	LastProbe    time.Time `json:"lastProbe,omitzero"`
	Capabilities []string  `json:"capabilities,omitempty"`
	// InCluster says whether the cluster knows the driver is on the node
	// (its CSINode entry, node ID annotation and topology labels):
	// installed, pending or failed (InClusterError says why); empty in
	// standalone mode.
	InCluster      string `json:"inCluster,omitempty"`
	InClusterError string `json:"inClusterError,omitempty"`
}

// Socket is a registration socket that did not register a driver.
type Socket struct {
	Path      string     `json:"path"`
	State     string     `json:"state"`
	Driver    string     `json:"driver,omitempty"`
	LastError string     `json:"lastError,omitempty"`
	NextRetry *time.Time `json:"nextRetry,omitempty"`
	Since     time.Time  `json:"since,omitzero"`
}

// Orphan is something on disk the agent cannot clean or account for.
type Orphan struct {
	Path   string    `json:"path"`
	PodUID types.UID `json:"podUID,omitempty"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since,omitzero"`
}

// LocalVolumes is the local volume provisioner's view (cluster mode with
// --local-volumes-config).
type LocalVolumes struct {
	Error   string        `json:"error,omitempty"`
	Volumes []LocalVolume `json:"volumes"`
}

// LocalVolume is one discovered disk or provisioned PV.
type LocalVolume struct {
	Class string `json:"class"`
	Path  string `json:"path"`
	PV    string `json:"persistentVolume,omitempty"`
	Claim string `json:"claim,omitempty"`
	// State: available, bound, released, cleaning, cleanupFailed,
	// missing, skipped, pending, failed.
	State     string    `json:"state"`
	Since     time.Time `json:"since,omitzero"`
	Reason    string    `json:"reason,omitempty"`
	LastError string    `json:"lastError,omitempty"`
	Capacity  string    `json:"capacity,omitempty"`
}

// InputError is a manifest or object the agent cannot use.
type InputError struct {
	Input string `json:"input"`
	Error string `json:"error"`
}

// PodDetail is one pod's view: GET /debug/status?pod=NS/NAME.
type PodDetail struct {
	Node string    `json:"node"`
	Now  time.Time `json:"now"`
	Pod  Pod       `json:"pod"`
	// Mounts is the pod's mount tree, one entry per volume.
	Mounts []MountTree `json:"mounts"`
	// Operations are the pending operations on the pod's volumes.
	Operations []Operation `json:"operations"`
	// Timeline is the recent history of the operations on the pod's
	// volumes (the pod's own and the volume-wide ones), oldest first.
	Timeline []TimelineEntry `json:"timeline"`
	// Events are the pod's recent events, newest first.
	Events []events.Event `json:"events"`
}

// MountTree is how one volume of a pod reaches it: device (or source) →
// global mount → the mounts of every pod sharing it.
type MountTree struct {
	Name  string `json:"name"`
	State State  `json:"state"`
	// Origin is where the data comes from: a device, a host path, a
	// tmpfs, a CSI volume.
	Origin string `json:"origin"`
	// GlobalMount is the device (staging) mount, if the volume has one.
	GlobalMount string            `json:"globalMount,omitempty"`
	Mounts      []PodMount        `json:"mounts"`
	Volume      volume.UniqueName `json:"volume,omitempty"`
}

// PodMount is one pod's mount of a volume.
type PodMount struct {
	Pod   volume.PodRef `json:"pod"`
	Path  string        `json:"path"`
	State string        `json:"state"`
	// This marks the pod of the detail view.
	This bool `json:"this,omitempty"`
}

// TimelineEntry is one finished operation of the pod's timeline.
type TimelineEntry struct {
	timeline.Record
	// Name is the pod's name for the volume.
	Name string `json:"name"`
}
