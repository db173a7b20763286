// Package timeline keeps the recent history of volume operations in memory,
// for the operator page: how each operation on a pod or a volume ended, and
// when. It is bounded (the last records of each pod and volume, a bounded
// number of pods and volumes, and the last records overall) and cheap on the
// executor's hot path: recording a success copies a struct under a mutex and
// allocates nothing once the ring is warm.
package timeline

import (
	"cmp"
	"errors"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// Outcome is how an operation ended.
type Outcome string

const (
	Succeeded Outcome = "succeeded"
	Failed    Outcome = "failed"
	// Uncertain: failed, and it may have left the volume (half) mounted.
	Uncertain Outcome = "uncertain"
)

// Record is one finished operation.
type Record struct {
	// Seq orders records: it increases with every record.
	Seq      uint64            `json:"seq"`
	Start    time.Time         `json:"start"`
	End      time.Time         `json:"end"`
	Op       operations.Op     `json:"operation"`
	Volume   volume.UniqueName `json:"volume"`
	SpecName string            `json:"specName,omitempty"`
	// Pod is the pod of a per-pod operation (zero for volume-wide ones).
	Pod     volume.PodRef `json:"pod,omitzero"`
	Outcome Outcome       `json:"outcome"`
	Error   string        `json:"error,omitempty"`
	// RetryIn is the backoff after a failure.
	RetryIn time.Duration `json:"retryInNanoseconds,omitempty"`
}

// Options bound a Ring. Zero values get defaults.
type Options struct {
	// PerKey is how many records are kept for each pod and each volume
	// (default 32).
	PerKey int
	// Keys bounds how many pods and volumes have records (default 4096):
	// the one updated least recently is forgotten first.
	Keys int
	// Overall is how many records are kept across every key (default 512).
	Overall int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Ring is the bounded history. It is safe for concurrent use.
type Ring struct {
	opts Options

	mu      sync.Mutex
	seq     uint64
	overall ring
	keys    map[key]*keyRing
	// lru is a circular list of keyRings, most recently updated first.
	lru keyRing
	// spare are keyRings made in a block, for new keys, with their first
	// buffers: a storm starts thousands of pods, each a new key. They are never freed (a key
	// forgotten hands its keyRing to the next one), so a block costs
	// nothing its keyRings would not.
	spare []keyRing
}

// key is a pod (pod != "") or a volume's volume-wide operations.
type key struct {
	pod    types.UID
	volume volume.UniqueName
}

type keyRing struct {
	key        key
	ring       ring
	prev, next *keyRing
}

// ring is a circular buffer of at most size records. Its buffer grows
// with the records it gets (from firstBuf): most pods have a few operations
// (a mount and an unmount per volume), and a buffer of size records for each of thousands of pods
// would be most of the agent's memory.
type ring struct {
	buf  []Record
	size int
	next int
	full bool
}

// firstBuf is a key's first buffer: a pod with up to four volumes mounts
// and unmounts them all without growing it (growing was most of what
// recording cost a storm's teardown).
const firstBuf = 8

// slot returns where the next record goes: a new one at the end while the
// ring is not full, else the oldest one's. The caller fills it in, so a
// record is written once in each ring rather than copied on its way.
func (r *ring) slot() *Record {
	if !r.full {
		if len(r.buf) == cap(r.buf) {
			grown := make([]Record, len(r.buf), min(max(firstBuf, 2*cap(r.buf)), r.size))
			copy(grown, r.buf)
			r.buf = grown
		}
		r.buf = r.buf[:len(r.buf)+1]
		s := &r.buf[len(r.buf)-1]
		if len(r.buf) == r.size {
			r.next, r.full = 0, true
		}
		return s
	}
	s := &r.buf[r.next]
	r.next++
	if r.next == len(r.buf) {
		r.next = 0
	}
	return s
}

// reset empties the ring, keeping its buffer.
func (r *ring) reset() {
	clear(r.buf)
	r.buf, r.next, r.full = r.buf[:0], 0, false
}

// appendTo appends the records oldest first.
func (r *ring) appendTo(out []Record) []Record {
	if !r.full {
		return append(out, r.buf...)
	}
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// New returns an empty Ring.
func New(o Options) *Ring {
	if o.PerKey <= 0 {
		o.PerKey = 32
	}
	if o.Keys <= 0 {
		o.Keys = 4096
	}
	if o.Overall <= 0 {
		o.Overall = 512
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	r := &Ring{opts: o, overall: ring{size: o.Overall}, keys: map[key]*keyRing{}}
	r.lru.prev, r.lru.next = &r.lru, &r.lru
	return r
}

// OperationFinished records an operation's end; it is an
// operations.Observer. Operations skipped because their plan was stale did
// nothing and are not recorded.
func (r *Ring) OperationFinished(k operations.Key, op *operations.Operation, took time.Duration, err error, retryIn time.Duration) {
	if errors.Is(err, operations.ErrStale) {
		return
	}
	end := r.opts.Now()
	var errText string
	outcome := Succeeded
	if err != nil {
		outcome, errText = Failed, err.Error()
		if volume.IsUncertain(err) {
			outcome = Uncertain
		}
	}
	var pod volume.PodRef
	if k.Pod != "" {
		pod = op.Pod.PodRef
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.slot(pod.UID, k.Volume)
	*rec = Record{Seq: r.seq, Start: end.Add(-took), End: end, Op: op.Name, Volume: k.Volume, Pod: pod, Outcome: outcome, Error: errText, RetryIn: retryIn}
	if op.Spec != nil {
		rec.SpecName = op.Spec.Name
	}
	r.copyToKey(rec)
}

// Add records rec (its Seq is set here).
func (r *Ring) Add(rec Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.slot(rec.Pod.UID, rec.Volume)
	rec.Seq = r.seq
	*s = rec
	r.copyToKey(s)
}

// slot numbers a new record and returns its slot in the overall ring,
// making the record's key the most recently updated: copyToKey then puts
// the filled-in record in the key's ring. r.mu is held.
func (r *Ring) slot(pod types.UID, vol volume.UniqueName) *Record {
	k := key{pod: pod}
	if k.pod == "" {
		k.volume = vol
	}
	r.seq++
	// The most recently updated key is often the one again (a pod's
	// volumes are mounted one after another): it needs no lookup by its
	// long name, nor moving to the front.
	if kr := r.lru.next; kr == &r.lru || kr.key != k {
		kr = r.keys[k]
		if kr == nil {
			kr = r.newKey(k)
		} else {
			kr.unlink()
		}
		r.pushFront(kr)
	}
	return r.overall.slot()
}

// copyToKey copies rec into the ring of the most recently updated key, its
// own (see slot).
func (r *Ring) copyToKey(rec *Record) {
	*r.lru.next.ring.slot() = *rec
}

// newKey returns an unlinked keyRing for k, reusing the least recently
// updated one when the ring holds Keys keys already.
func (r *Ring) newKey(k key) *keyRing {
	var kr *keyRing
	if len(r.keys) >= r.opts.Keys {
		kr = r.lru.prev
		kr.unlink()
		delete(r.keys, kr.key)
		kr.ring.reset()
	} else {
		if len(r.spare) == 0 {
			r.spare = make([]keyRing, min(64, r.opts.Keys-len(r.keys)))
			// Their first buffers too, in one block: they live as long.
			n := min(firstBuf, r.opts.PerKey)
			recs := make([]Record, n*len(r.spare))
			for i := range r.spare {
				r.spare[i].ring.buf = recs[i*n : i*n : (i+1)*n]
			}
		}
		kr, r.spare = &r.spare[0], r.spare[1:]
		kr.ring.size = r.opts.PerKey
	}
	kr.key = k
	r.keys[k] = kr
	return kr
}

func (kr *keyRing) unlink() {
	kr.prev.next, kr.next.prev = kr.next, kr.prev
	kr.prev, kr.next = nil, nil
}

func (r *Ring) pushFront(kr *keyRing) {
	kr.prev, kr.next = &r.lru, r.lru.next
	r.lru.next.prev = kr
	r.lru.next = kr
}

// Seq is the sequence number of the last record (0: none yet); it changes
// whenever a record is added.
func (r *Ring) Seq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// Recent returns the last records across every key, oldest first.
func (r *Ring) Recent() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.overall.appendTo(nil)
}

// ForPod returns the pod's records and those of the volume-wide
// operations on the given volumes, oldest first.
func (r *Ring) ForPod(pod types.UID, volumes []volume.UniqueName) []Record {
	r.mu.Lock()
	var out []Record
	if kr := r.keys[key{pod: pod}]; kr != nil {
		out = kr.ring.appendTo(out)
	}
	for _, v := range volumes {
		if kr := r.keys[key{volume: v}]; kr != nil {
			out = kr.ring.appendTo(out)
		}
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}
