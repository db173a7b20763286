package volume

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// UniqueName identifies a volume on this node. Shared volumes (one device or
// staging mount for every pod using them) are named "<plugin>/<identity>";
// per-pod volumes are named "<plugin>/<podUID>-<specName>".
type UniqueName string

// SharedName names a volume that all pods using the same identity share.
func SharedName(plugin, identity string) UniqueName {
	return UniqueName(plugin + "/" + identity)
}

// PodScopedName names a volume that belongs to exactly one pod.
func PodScopedName(plugin string, pod types.UID, specName string) UniqueName {
	return UniqueName(plugin + "/" + string(pod) + "-" + specName)
}

// PodRef names a pod. The UID is what the agent keys on; namespace and name
// are kept for people reading logs, events and the debug endpoint.
type PodRef struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
}

func (p PodRef) String() string { return p.Namespace + "/" + p.Name }

// PodInfo is what plugins may need to know about the pod a volume is mounted
// for, copied out of the pod object so the caches never hold API objects of
// pods.
type PodInfo struct {
	PodRef
	ServiceAccount      string                     `json:"serviceAccount,omitempty"`
	FSGroup             *int64                     `json:"fsGroup,omitempty"`
	FSGroupChangePolicy *v1.PodFSGroupChangePolicy `json:"fsGroupChangePolicy,omitempty"`
	MemoryLimit         *resource.Quantity         `json:"memoryLimit,omitempty"`
	// EphemeralStorageLimit is the pod's ephemeral-storage limit as the
	// kubelet's eviction manager sums it; nil when no container has one.
	EphemeralStorageLimit *resource.Quantity `json:"ephemeralStorageLimit,omitempty"`
	// HugePageSizes are the <size>s of the pod's hugepages-<size>
	// requests (pod-level, containers, init containers), each once,
	// comma-separated: what a HugePages emptyDir's page size is chosen
	// from.
	HugePageSizes string `json:"hugePageSizes,omitempty"`
}

// Spec describes one volume as a pod uses it. It is built by the populator and
// never modified afterwards, so it can be shared between goroutines.
type Spec struct {
	// Name is the inner volume name: the PV name for a volume backed by a
	// PersistentVolume, the pod's volume name for an inline volume. It names
	// the pod's volume directory.
	Name string
	// Volume is the pod's volume for inline volumes, nil otherwise.
	Volume *v1.Volume
	// PV is the PersistentVolume for PV-backed volumes, nil otherwise.
	PV *v1.PersistentVolume
	// PVC is the claim through which the pod reached PV, if any.
	PVC *v1.PersistentVolumeClaim
	// ReadOnly is true when the pod asked for the volume read-only.
	ReadOnly bool
	// Mode is how the pod consumes the volume.
	Mode v1.PersistentVolumeMode
	// InlineEphemeral marks a CSI volume declared inline in the pod.
	InlineEphemeral bool
}

// IsBlock reports whether the pod consumes the volume as a raw block device.
func (s *Spec) IsBlock() bool { return s.Mode == v1.PersistentVolumeBlock }

// ClaimRef returns "namespace/name" of the claim, or "".
func (s *Spec) ClaimRef() string {
	if s.PVC == nil {
		return ""
	}
	return s.PVC.Namespace + "/" + s.PVC.Name
}

// Attributes say how a plugin handles a particular volume. The populator asks
// the plugin once; the planner decides the order of operations from them.
type Attributes struct {
	// Identity names the volume for shared volumes (a PV name, a CSI
	// driver+handle, ...). Empty for per-pod volumes.
	Identity string `json:"identity,omitempty"`
	// DeviceMountable volumes are mounted once at a global path (MountDevice
	// / NodeStage) before being set up for each pod.
	DeviceMountable bool `json:"deviceMountable,omitempty"`
	// Attachable volumes must be attached to the node before MountDevice.
	Attachable bool `json:"attachable,omitempty"`
	// RequiresRemount volumes are set up again on every pod update.
	RequiresRemount bool `json:"requiresRemount,omitempty"`
	// Block volumes are raw block devices the pods use in volumeDevices
	// (volumeMode Block): they are mapped, never formatted or mounted, and
	// each pod gets an access point at Paths.PodDevicePath.
	Block bool `json:"block,omitempty"`
	// ReadOnlyForContainers volumes are given to containers read-only
	// whatever the pod says, and nothing is ever created in them for a
	// sub-path: their content is the agent's to keep in sync with its
	// sources (the kubelet's ReadOnlyAPIDataVolumes: configMap, secret,
	// downwardAPI, projected).
	ReadOnlyForContainers bool `json:"readOnlyForContainers,omitempty"`
	// NoHostPath volumes have nothing on the node: the container runtime
	// mounts them from their spec (an image volume: the runtime pulls and
	// mounts the image). Set up records them; no directory is made, no
	// sub-path is prepared (the runtime resolves it inside what it
	// mounts), no fsGroup is applied, and the pod's mount has no path.
	NoHostPath bool `json:"noHostPath,omitempty"`
	// NoSizeLimit volumes have no size limit to release at teardown (an
	// emptyDir in memory, or on disk without a sizeLimit), so teardown
	// need not read the spec, cold by then, to learn it. False says one
	// may apply: a volume found on disk after a restart has no attributes.
	NoSizeLimit bool `json:"noSizeLimit,omitempty"`
}

// Mode is the volume mode the attributes describe, as Kubernetes spells it.
func (a Attributes) Mode() v1.PersistentVolumeMode {
	if a.Block {
		return v1.PersistentVolumeBlock
	}
	return v1.PersistentVolumeFilesystem
}

// Shared reports whether all pods using the volume share one ASW entry.
func (a Attributes) Shared() bool { return a.Identity != "" }
