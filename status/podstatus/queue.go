package podstatus

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// priority orders the queue: a pod whose readiness changes (its condition
// turns True, or stops being True) goes before pods that only get a new
// "not ready" message, so a burst of messages about pods still waiting
// never holds back a pod that could start serving.
type priority int

const (
	low priority = iota
	high
	numPriorities
)

// queue holds the pods whose condition is to be published. It holds pod
// UIDs, never patches: the worker that takes a pod reads the latest wanted
// condition, so changes made while a pod waits merge into one patch. A pod
// is queued at most once (at the higher of the priorities asked for),
// handed to one worker at a time, and queued again when it was added while
// a worker had it.
type queue struct {
	mu   sync.Mutex
	cond *sync.Cond
	// lists are FIFO per priority; an entry whose pod was since raised to
	// the other list, or taken, is stale and skipped.
	lists    [numPriorities][]types.UID
	queued   map[types.UID]priority
	active   map[types.UID]bool
	again    map[types.UID]priority
	shutdown bool
}

func newQueue() *queue {
	q := &queue{queued: map[types.UID]priority{}, active: map[types.UID]bool{}, again: map[types.UID]priority{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// add queues uid at priority p, or raises it to p.
func (q *queue) add(uid types.UID, p priority) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addLocked(uid, p)
}

func (q *queue) addLocked(uid types.UID, p priority) {
	if q.shutdown {
		return
	}
	if q.active[uid] {
		if cur, ok := q.again[uid]; !ok || p > cur {
			q.again[uid] = p
		}
		return
	}
	if cur, ok := q.queued[uid]; ok && cur >= p {
		return
	}
	q.queued[uid] = p
	q.lists[p] = append(q.lists[p], uid)
	q.cond.Signal()
}

// get blocks until a pod is queued and hands it over, highest priority
// first, oldest first within a priority; ok is false once the queue is shut
// down. The caller calls done when it is finished with the pod.
func (q *queue) get() (uid types.UID, p priority, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.shutdown {
			return "", 0, false
		}
		for p := numPriorities - 1; p >= 0; p-- {
			for len(q.lists[p]) > 0 {
				uid := q.lists[p][0]
				q.lists[p][0] = ""
				q.lists[p] = q.lists[p][1:]
				if cur, ok := q.queued[uid]; ok && cur == p {
					delete(q.queued, uid)
					q.active[uid] = true
					return uid, p, true
				}
			}
		}
		q.cond.Wait()
	}
}

// done ends a worker's hold on uid, queuing it again if it was added
// meanwhile.
func (q *queue) done(uid types.UID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.active, uid)
	if p, ok := q.again[uid]; ok {
		delete(q.again, uid)
		q.addLocked(uid, p)
	}
}

// shutDown wakes every waiting get, which then reports the end.
func (q *queue) shutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.shutdown = true
	q.cond.Broadcast()
}

// len is the number of queued pods (for tests and metrics).
func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queued)
}
