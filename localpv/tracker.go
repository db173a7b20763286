package localpv

import (
	"errors"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// CleanupState is where one cleanup is.
type CleanupState string

// Cleanup states.
const (
	// CleanupPending: queued, not started yet (a PV deleted before it was
	// cleaned).
	CleanupPending CleanupState = "pending"
	// CleanupRunning: the cleaner is running (or waiting for a worker).
	CleanupRunning   CleanupState = "running"
	CleanupSucceeded CleanupState = "succeeded"
	CleanupFailed    CleanupState = "failed"
)

// Cleanup is one PV's cleanup as the debug document shows it.
type Cleanup struct {
	PV    string    `json:"persistentVolume"`
	UID   types.UID `json:"uid"`
	Class string    `json:"class"`
	Path  string    `json:"path"`
	// ClaimUID is the claim whose release is being cleaned up after: a
	// success is only good for that release, never for a later one of the
	// same PV (or for a new PV of the same name, which has another UID).
	ClaimUID  types.UID    `json:"claimUID,omitempty"`
	Block     bool         `json:"block"`
	Mode      string       `json:"volumeMode"`
	Method    string       `json:"method"`
	State     CleanupState `json:"state"`
	Attempts  int          `json:"attempts"`
	Started   time.Time    `json:"started,omitzero"`
	Finished  time.Time    `json:"finished,omitzero"`
	LastError string       `json:"lastError,omitempty"`
	NextRetry time.Time    `json:"nextRetry,omitzero"`
	// PVGone: the PV was deleted before its cleanup succeeded; the disk is
	// not offered again until it has been cleaned.
	PVGone bool `json:"pvGone,omitempty"`
	// Identity is the disk the PV was made from: nothing else is cleaned.
	Identity DiskIdentity `json:"diskIdentity,omitzero"`
	// DiskMismatch: the last attempt found another disk at the path. If
	// the PV is deleted, the cleanup is given up: what it owed was owed to
	// a disk that is not there.
	DiskMismatch bool `json:"diskMismatch,omitempty"`
}

// target is what a cleanup works on.
type target struct {
	PV       string
	UID      types.UID
	ClaimUID types.UID
	Class    string
	Path     string
	Block    bool
	// Mode is the PV's volume mode (a device may back a Filesystem PV).
	Mode string
	// Identity is the disk the PV was made from (its annotations).
	Identity DiskIdentity
}

// tracker remembers cleanups by PV UID, so that one PV is never cleaned
// twice at once, a PV is deleted only after its cleanup succeeded, and a
// success is never reused for another release or another PV. It is
// in-memory on purpose: after a restart a Released PV is simply cleaned
// again from scratch (cleaning is idempotent).
type tracker struct {
	mu           sync.Mutex
	recs         map[types.UID]*Cleanup
	backoffStart time.Duration
	backoffMax   time.Duration
}

func newTracker(start, max time.Duration) *tracker {
	return &tracker{recs: map[types.UID]*Cleanup{}, backoffStart: start, backoffMax: max}
}

// start records that a cleanup of t begins and reports whether it may: not
// while one runs for the PV or for its path, not before a failed one's
// retry time, and not again after a success for the same release.
func (tr *tracker) start(t target, method string, now time.Time) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for uid, r := range tr.recs {
		if uid != t.UID && r.Path == t.Path && r.State == CleanupRunning {
			return false
		}
	}
	r, ok := tr.recs[t.UID]
	if ok {
		switch r.State {
		case CleanupRunning:
			return false
		case CleanupSucceeded:
			if r.ClaimUID == t.ClaimUID {
				return false
			}
			ok = false // a new release of the same PV: start over
		case CleanupFailed:
			if now.Before(r.NextRetry) {
				return false
			}
		}
	}
	if !ok {
		r = &Cleanup{}
		tr.recs[t.UID] = r
	}
	gone := r.PVGone
	attempts := r.Attempts
	lastErr := r.LastError
	*r = Cleanup{
		PV: t.PV, UID: t.UID, Class: t.Class, Path: t.Path, ClaimUID: t.ClaimUID, Block: t.Block, Mode: t.Mode, Method: method, Identity: t.Identity,
		State: CleanupRunning, Attempts: attempts + 1, Started: now, LastError: lastErr, PVGone: gone,
	}
	return true
}

// finish records a cleanup's result; a failure is retried after a backoff
// that doubles with every attempt.
func (tr *tracker) finish(uid types.UID, err error, now time.Time) Cleanup {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	r, ok := tr.recs[uid]
	if !ok {
		return Cleanup{}
	}
	r.Finished = now
	if err == nil {
		r.State = CleanupSucceeded
		r.LastError = ""
		r.NextRetry = time.Time{}
		return *r
	}
	r.State = CleanupFailed
	r.LastError = err.Error()
	var mismatch *DiskMismatchError
	r.DiskMismatch = errors.As(err, &mismatch)
	r.NextRetry = now.Add(tr.backoff(r.Attempts))
	return *r
}

func (tr *tracker) backoff(attempts int) time.Duration {
	d := tr.backoffStart
	for i := 1; i < attempts && d < tr.backoffMax; i++ {
		d *= 2
	}
	return min(d, tr.backoffMax)
}

// pvDeleted is told that one of our PVs was deleted while Released with
// the Delete policy. Unless it was cleaned for that release (or is being
// cleaned), its disk is queued for cleaning: offering it again uncleaned
// would hand the last tenant's data to the next.
func (tr *tracker) pvDeleted(t target, now time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if r, ok := tr.recs[t.UID]; ok {
		r.PVGone = true
		if r.State == CleanupSucceeded && r.ClaimUID == t.ClaimUID {
			return
		}
		if r.State == CleanupSucceeded { // an older release's success
			r.State = CleanupPending
			r.ClaimUID = t.ClaimUID
			r.NextRetry = now
		}
		return
	}
	tr.recs[t.UID] = &Cleanup{
		PV: t.PV, UID: t.UID, Class: t.Class, Path: t.Path, ClaimUID: t.ClaimUID, Block: t.Block, Mode: t.Mode,
		State: CleanupPending, NextRetry: now, PVGone: true,
		LastError: "the PV was deleted before it was cleaned: cleaning before the disk is offered again",
	}
}

// get returns the PV's cleanup.
func (tr *tracker) get(uid types.UID) (Cleanup, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	r, ok := tr.recs[uid]
	if !ok {
		return Cleanup{}, false
	}
	return *r, true
}

// forget drops a finished cleanup whose PV is gone.
func (tr *tracker) forget(uid types.UID) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	delete(tr.recs, uid)
}

// snapshot returns every cleanup, by path then PV.
func (tr *tracker) snapshot() []Cleanup {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make([]Cleanup, 0, len(tr.recs))
	for _, r := range tr.recs {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].UID < out[j].UID
	})
	return out
}

// blocksPath reports whether a cleanup still owes the path: a disk is not
// offered again while it is being cleaned or after its PV went away
// uncleaned.
func (c Cleanup) blocksPath() bool {
	return c.State == CleanupRunning || (c.PVGone && c.State != CleanupSucceeded)
}
