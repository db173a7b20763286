// Package source defines where the agent learns about the pods bound to its
// node and the storage objects they refer to. A Source is read-only: it never
// touches the desired or actual state of the world; the populator reads it
// and fills the desired state.
//
// Two implementations exist: source/manifest reads YAML/JSON files from a
// directory (standalone mode) and source/kube watches the API server through
// informers (cluster mode).
package source

import (
	"context"
	"errors"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volume-agent/volume-agent/internal/changelog"
)

// Store is a read-only view of the objects the agent acts on. Returned objects
// are shared with the store: callers must not modify them. Lookups of missing
// objects return an error for which apierrors.IsNotFound is true; lookups of
// objects not read yet one matching ErrNotRead.
type Store interface {
	// Pods returns the pods bound to this node (spec.nodeName equal to the
	// node name, or empty in standalone mode), including terminated ones.
	Pods() []*v1.Pod
	PVC(namespace, name string) (*v1.PersistentVolumeClaim, error)
	PV(name string) (*v1.PersistentVolume, error)
	StorageClass(name string) (*storagev1.StorageClass, error)
	CSIDriver(name string) (*storagev1.CSIDriver, error)
}

// Source is a Store that follows changes. Every source implements every
// part: a consumer never asks a source what it is.
type Source interface {
	Store
	PodChanges
	ErrorReporter
	Completeness
	// Run reads the inputs and follows them until ctx ends.
	Run(ctx context.Context) error
	// HasSynced reports whether every input has been read completely at least
	// once. Destructive decisions wait for it: before that, a pod that is
	// missing may only be not read yet.
	HasSynced() bool
	// Changed returns a channel that receives a value (coalesced, never
	// blocking the sender) whenever anything in the Store may have changed,
	// and when HasSynced becomes true (even if the first read found
	// nothing).
	Changed() <-chan struct{}
}

// InputError describes an input that could not be used, such as a malformed
// manifest file. It is shown on the debug endpoint and counted in metrics.
type InputError struct {
	// Input names the file (standalone) or object (cluster) at fault.
	Input string `json:"input"`
	// Error says what is wrong with it.
	Error string `json:"error"`
}

// ErrorReporter reports bad inputs (none for a source whose inputs are
// validated before it reads them, like the API server's objects).
type ErrorReporter interface {
	InputErrors() []InputError
}

// Completeness names the inputs that were unusable from the start (a
// manifest file that never parsed): the objects in them are unknown, so volumes found on disk after a restart that no known pod wants
// may still belong to one of them. Cleaning such orphans waits until
// UnreadInputs is empty; everything else proceeds.
type Completeness interface {
	UnreadInputs() []string
}

// ErrNotRead is matched (errors.Is) by the error of a lookup of an object
// the source has not read yet: it may exist. A source that reads objects
// on demand (cluster mode watches each claim and volume from the moment a
// pod on the node uses it) answers so until the object's first read is in;
// nothing may be decided on it, least of all a teardown.
var ErrNotRead = errors.New("not read yet")

// NotRead marks err as ErrNotRead, keeping its message.
func NotRead(err error) error { return notRead{err} }

type notRead struct{ error }

func (notRead) Is(target error) bool { return target == ErrNotRead }
func (e notRead) Unwrap() error      { return e.error }

// PodKey names a pod by namespace and name.
type PodKey struct{ Namespace, Name string }

// KeyOf is the key of a pod.
func KeyOf(pod *v1.Pod) PodKey { return PodKey{pod.Namespace, pod.Name} }

// PodChanges names the pods that changed, so that the populator's pass after one pod arrives looks at that pod, not
// at every pod of the node. It has one consumer.
type PodChanges interface {
	// TakePodChanges returns the keys of the pods added, changed or
	// removed since the last call, or all: any object may have changed
	// (the first call; too many changes to list; a change of an object
	// other than a pod, which any pod's volumes may depend on).
	TakePodChanges() (all bool, keys map[PodKey]struct{})
	// Pod returns the current pod under a key.
	Pod(namespace, name string) (*v1.Pod, bool)
}

// PodChangeLog is a source's record of pod changes for TakePodChanges,
// safe for concurrent use. The zero value is ready.
type PodChangeLog struct {
	mu  sync.Mutex
	log changelog.Log[PodKey]
}

// maxPodChanges bounds the keys a PodChangeLog holds: past this many, a
// full pass costs little more than looking at each of them (a changed pod
// is resolved again either way, an unchanged one only compared).
const maxPodChanges = 1024

// Mark records a change of the pod under key.
func (l *PodChangeLog) Mark(key PodKey) {
	l.mu.Lock()
	l.log.Mark(key, maxPodChanges)
	l.mu.Unlock()
}

// MarkAll records a change that may concern any pod.
func (l *PodChangeLog) MarkAll() {
	l.mu.Lock()
	l.log.MarkAll()
	l.mu.Unlock()
}

// Take implements PodChanges.TakePodChanges.
func (l *PodChangeLog) Take() (all bool, keys map[PodKey]struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.log.Take()
}
