// Package budget owns the byte budget of API-volume content (configMap,
// secret, downwardAPI, projected): how many bytes each pod volume holds,
// their sum per pod and per node, and whether a volume's new content fits
// before it is written.
//
// The agent writes this content itself, so the kernel charges the pages to
// the agent's memory cgroup (tmpfs pages are charged to the writer at
// first touch and stay charged until the file is removed). Without a
// bound, one pod mounting a large Secret hundreds of times makes the agent
// run out of memory, and, since the pages stay, again after every restart.
// The budget turns that into an error of that pod's volume only.
//
// The package is pure: sizes come in, decisions go out; the caller does
// the I/O.
package budget

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/volume"
)

// Limits are the budgets; 0 is no limit.
type Limits struct {
	// Pod bounds the content of one pod's API volumes together.
	Pod int64
	// Node bounds the content of every API volume on the node.
	Node int64
}

// Scope says which budget a volume did not fit.
type Scope string

const (
	PodScope  Scope = "pod"
	NodeScope Scope = "node"
)

// Observer hears of refused volumes (metrics). May be nil.
type Observer interface {
	OverBudget(scope Scope)
}

// Budget accounts the content of every API volume on the node. Safe for
// concurrent use: volumes of one pod are set up in parallel.
type Budget struct {
	limits   Limits
	observer Observer

	mu     sync.Mutex
	held   map[volume.UniqueName]holding
	perPod map[types.UID]int64
	total  int64
}

type holding struct {
	pod   types.UID
	bytes int64
}

// New returns an empty budget.
func New(l Limits, o Observer) *Budget {
	return &Budget{limits: l, observer: o, held: map[volume.UniqueName]holding{}, perPod: map[types.UID]int64{}}
}

// Limits returns the budgets.
func (b *Budget) Limits() Limits { return b.limits }

// OverError is a volume whose content does not fit. It does not go away by
// retrying unless something else gives bytes back: for the pod's budget,
// only a change to the pod or to what it mounts does.
type OverError struct {
	Pod    volume.PodRef
	Volume string // the pod's name for the volume
	Scope  Scope
	// Bytes is the volume's content; Others what the pod's other volumes
	// (PodScope) or every other volume on the node (NodeScope) hold.
	Bytes, Others, Limit int64
}

func (e *OverError) Error() string {
	if e.Scope == PodScope {
		return fmt.Sprintf("pod %s volume %q: content of %d bytes (with the pod's other API volumes, %d bytes) is over the per-pod API-volume budget of %d bytes (--api-volume-pod-bytes); nothing was written, and retrying will not help: mount less (fewer or smaller secrets, configMaps or items) or raise the budget",
			e.Pod, e.Volume, e.Bytes, e.Bytes+e.Others, e.Limit)
	}
	return fmt.Sprintf("pod %s volume %q: content of %d bytes does not fit the node's API-volume budget of %d bytes (--api-volume-node-bytes), of which %d are held by other volumes; nothing was written; it is retried, and fits once other pods' volumes go away",
		e.Pod, e.Volume, e.Bytes, e.Limit, e.Others)
}

// Reserve makes v (of pod) hold bytes instead of what it held, if the
// pod's and the node's budgets allow it; otherwise it changes nothing and
// returns an *OverError. Shrinking or keeping a size always fits: content
// already held is never refused its rewrite.
func (b *Budget) Reserve(pod volume.PodRef, specName string, v volume.UniqueName, bytes int64) error {
	b.mu.Lock()
	old := b.held[v]
	podOthers := b.perPod[pod.UID] - old.bytes
	if old.pod != pod.UID {
		podOthers = b.perPod[pod.UID]
	}
	nodeOthers := b.total - old.bytes
	var err *OverError
	if bytes > old.bytes {
		switch {
		case b.limits.Pod > 0 && podOthers+bytes > b.limits.Pod:
			err = &OverError{Pod: pod, Volume: specName, Scope: PodScope, Bytes: bytes, Others: podOthers, Limit: b.limits.Pod}
		case b.limits.Node > 0 && nodeOthers+bytes > b.limits.Node:
			err = &OverError{Pod: pod, Volume: specName, Scope: NodeScope, Bytes: bytes, Others: nodeOthers, Limit: b.limits.Node}
		}
	}
	if err == nil {
		b.setLocked(v, pod.UID, bytes)
	}
	b.mu.Unlock()
	if err != nil {
		if b.observer != nil {
			b.observer.OverBudget(err.Scope)
		}
		return err
	}
	return nil
}

// Found records content found on disk after a restart, whatever the
// budgets: it is there, and the memory it costs with it.
func (b *Budget) Found(pod types.UID, v volume.UniqueName, bytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setLocked(v, pod, bytes)
}

// Release forgets v (torn down, or removed after a failed first write).
func (b *Budget) Release(v volume.UniqueName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setLocked(v, "", 0)
}

func (b *Budget) setLocked(v volume.UniqueName, pod types.UID, bytes int64) {
	if old, ok := b.held[v]; ok {
		b.total -= old.bytes
		if n := b.perPod[old.pod] - old.bytes; n > 0 {
			b.perPod[old.pod] = n
		} else {
			delete(b.perPod, old.pod)
		}
		delete(b.held, v)
	}
	if pod == "" {
		return
	}
	b.held[v] = holding{pod: pod, bytes: bytes}
	b.perPod[pod] += bytes
	b.total += bytes
}

// Total is the content of every API volume on the node.
func (b *Budget) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// Pod is the content of one pod's API volumes.
func (b *Budget) Pod(uid types.UID) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.perPod[uid]
}

// Holding is what one volume holds, and whether it is accounted at all.
func (b *Budget) Holding(v volume.UniqueName) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.held[v]
	return h.bytes, ok
}
