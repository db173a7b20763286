package volume

import (
	"slices"

	v1 "k8s.io/api/core/v1"
)

// ContainerType says which list of the pod spec a container comes from.
type ContainerType string

const (
	InitContainer      ContainerType = "init"
	RegularContainer   ContainerType = "regular"
	EphemeralContainer ContainerType = "ephemeral"
)

// Container is what one container of a pod gets from the pod's volumes, as
// the pod spec says, with subPathExpr expanded: what a container runtime
// needs from the agent (see runtimeapi).
type Container struct {
	Name    string            `json:"name"`
	Type    ContainerType     `json:"type"`
	Mounts  []ContainerMount  `json:"mounts,omitempty"`
	Devices []ContainerDevice `json:"devices,omitempty"`
}

// ContainerMount is one volumeMounts entry.
type ContainerMount struct {
	// Volume is the pod's volume name.
	Volume string `json:"volume"`
	// Index is the entry's position in the container's volumeMounts: it
	// names the sub-path's target.
	Index     int    `json:"index"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
	// SubPath is subPath, or subPathExpr expanded, cleaned; "" when the
	// container mounts the whole volume.
	SubPath string `json:"subPath,omitempty"`
	// SubPathError says why subPath or subPathExpr cannot be used; the
	// mount has no SubPath then and must not be given to the container.
	SubPathError      string                    `json:"subPathError,omitempty"`
	Propagation       v1.MountPropagationMode   `json:"propagation,omitempty"`
	RecursiveReadOnly *v1.RecursiveReadOnlyMode `json:"recursiveReadOnly,omitempty"`
}

// ContainerDevice is one volumeDevices entry.
type ContainerDevice struct {
	Volume     string `json:"volume"`
	DevicePath string `json:"devicePath"`
}

// SubPath is one sub-path of a pod's volume that a container mounts: the
// agent prepares it at Paths.SubPathTarget(pod, plugin, specName,
// Container, Index).
type SubPath struct {
	Container string `json:"container"`
	Index     int    `json:"index"`
	// MountPath is where the container mounts it, for messages.
	MountPath string `json:"mountPath"`
	// Path is relative to the volume, validated and cleaned.
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// SameSubPaths reports whether two lists, each sorted by container and
// index, hold the same sub-paths.
func SameSubPaths(a, b []SubPath) bool { return slices.Equal(a, b) }

// SortSubPaths sorts by container and index, the order SameSubPaths expects.
func SortSubPaths(s []SubPath) {
	slices.SortFunc(s, func(a, b SubPath) int {
		if a.Container != b.Container {
			if a.Container < b.Container {
				return -1
			}
			return 1
		}
		return a.Index - b.Index
	})
}
