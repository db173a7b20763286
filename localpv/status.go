package localpv

import (
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// State is where a discovered entry or one of the provisioner's PVs is.
type State string

// States of the debug document and of the volume_agent_local_volumes metric.
const (
	StateAvailable State = "available"
	StateBound     State = "bound"
	// StateReleased: Released and not cleaned by the provisioner (reclaim
	// policy Retain, Recycle, unknown, or class no longer configured).
	StateReleased State = "released"
	// StateCleaning: Released with policy Delete, being cleaned (or
	// cleaned and being deleted).
	StateCleaning      State = "cleaning"
	StateCleanupFailed State = "cleanupFailed"
	// StateMissing: the PV's disk is gone; the PV is kept, not cleaned and
	// not offered again until the disk comes back.
	StateMissing State = "missing"
	// StateSkipped: an entry that does not become a PV (Reason says why).
	StateSkipped State = "skipped"
	// StatePending: a PV just created, or in phase Pending.
	StatePending State = "pending"
	// StateFailed: a PV in phase Failed.
	StateFailed State = "failed"
)

// Document is the provisioner's debug document (/debug/local-volumes).
type Document struct {
	// Node is the node name; Hostname its kubernetes.io/hostname label,
	// which PV node affinity names.
	Node     string `json:"node"`
	Hostname string `json:"hostname,omitempty"`
	// Provisioner is the value of the PVs' pv.kubernetes.io/provisioned-by
	// annotation.
	Provisioner string       `json:"provisioner"`
	Config      ConfigStatus `json:"config"`
	// Synced: the API caches have listed once; nothing is created,
	// cleaned or deleted before.
	Synced       bool          `json:"synced"`
	Passes       uint64        `json:"passes"`
	LastPass     time.Time     `json:"lastPass,omitzero"`
	LastPassTook time.Duration `json:"lastPassNanoseconds"`
	// Error stops every class (no Node object yet...).
	Error    string        `json:"error,omitempty"`
	Classes  []ClassStatus `json:"classes"`
	Volumes  []Volume      `json:"volumes"`
	Cleanups []Cleanup     `json:"cleanups"`
}

// ConfigStatus is the configuration file's state.
type ConfigStatus struct {
	File string `json:"file"`
	// Loaded is when the configuration in use was read.
	Loaded time.Time `json:"loaded,omitzero"`
	// SHA256 of the file content in use.
	SHA256 string `json:"sha256,omitempty"`
	// Errors of the last read: a file-level error keeps the previous
	// configuration; a class error keeps that class's previous definition.
	Errors []string `json:"errors,omitempty"`
}

// ClassStatus is one configured class.
type ClassStatus struct {
	Name          string                  `json:"name"`
	DiscoveryDir  string                  `json:"discoveryDir"`
	VolumeMode    v1.PersistentVolumeMode `json:"volumeMode"`
	FSType        string                  `json:"fsType,omitempty"`
	NamePattern   string                  `json:"namePattern"`
	CleanupMethod string                  `json:"blockCleanupMethod"`
	ReclaimPolicy string                  `json:"reclaimPolicy,omitempty"`
	// Error: why the class creates no PV now (StorageClass missing,
	// discovery directory unreadable...). Cleanups go on.
	Error string `json:"error,omitempty"`
}

// Volume is one discovered entry or one PV of the provisioner.
type Volume struct {
	Class string `json:"class"`
	// Entry is the name in the discovery directory.
	Entry string `json:"entry,omitempty"`
	// Path is the node's path (what the PV records).
	Path          string                           `json:"path"`
	PV            string                           `json:"persistentVolume,omitempty"`
	UID           types.UID                        `json:"uid,omitempty"`
	Phase         v1.PersistentVolumePhase         `json:"phase,omitempty"`
	Claim         string                           `json:"claim,omitempty"`
	VolumeMode    v1.PersistentVolumeMode          `json:"volumeMode,omitempty"`
	FSType        string                           `json:"fsType,omitempty"`
	Capacity      string                           `json:"capacity,omitempty"`
	ReclaimPolicy v1.PersistentVolumeReclaimPolicy `json:"reclaimPolicy,omitempty"`
	State         State                            `json:"state"`
	// Since is when the state last changed.
	Since time.Time `json:"since,omitzero"`
	// Reason explains the state (why skipped, why missing...).
	Reason string `json:"reason,omitempty"`
	// LastError is the last failure (creating the PV, cleaning it...).
	LastError string `json:"lastError,omitempty"`

	capacityBytes int64
}
