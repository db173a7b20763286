package ui

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/ui/model"
)

// snapshot is one build of the page: the input it came from (detail views
// are built from it) and the node's page.
type snapshot struct {
	// seq increases when what the page shows changed.
	seq  uint64
	in   model.Input
	page *model.Page
}

// hub builds the page once per change for every live view, and tells the
// streams when there is a new one. Changes are coalesced: at most one build
// per minInterval, whatever the number of viewers, and none while nobody
// watches (a page load builds its own).
type hub struct {
	gather      func() model.Input
	minInterval time.Duration
	refresh     time.Duration

	changed *notify.Signal
	dirty   atomic.Bool
	// done is closed when Run returns: the streams end.
	done chan struct{}

	mu          sync.Mutex // serializes builds
	snap        *snapshot
	fingerprint [sha256.Size]byte

	subMu sync.Mutex
	subs  map[*subscriber]struct{}
}

// subscriber is one stream waiting for new snapshots.
type subscriber struct{ wake *notify.Signal }

func newHub(gather func() model.Input, minInterval, refresh time.Duration) *hub {
	h := &hub{
		gather: gather, minInterval: minInterval, refresh: refresh,
		changed: notify.New(), done: make(chan struct{}), subs: map[*subscriber]struct{}{},
	}
	h.dirty.Store(true)
	return h
}

// notify records a change; it never blocks.
func (h *hub) notify() {
	h.dirty.Store(true)
	h.changed.Notify()
}

// run builds and publishes a new snapshot after changes while someone
// watches, and rebuilds every refresh period then for what no change
// signal covers (the local volume provisioner, driver probes).
func (h *hub) run(ctx context.Context) {
	defer close(h.done)
	refresh := time.NewTicker(h.refresh)
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.changed.C():
		case <-refresh.C:
			h.dirty.Store(true)
		}
		if h.watchers() == 0 {
			continue // the next stream or page load builds
		}
		if h.current(false) {
			h.publish()
		}
		// Coalesce: changes meanwhile make one more build.
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.minInterval):
		}
	}
}

// current returns the latest snapshot, rebuilding it first when something
// changed since (or always, with force). It reports whether the rebuilt
// page differs from the one before.
func (h *hub) current(force bool) (changed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.snap != nil && !force && !h.dirty.Load() {
		return false
	}
	h.dirty.Store(false)
	in := h.gather()
	page := model.Build(in)
	fp := fingerprint(in, page)
	if h.snap != nil && fp == h.fingerprint {
		// Same content: keep the sequence number, refresh the times.
		h.snap = &snapshot{seq: h.snap.seq, in: in, page: page}
		return false
	}
	seq := uint64(1)
	if h.snap != nil {
		seq = h.snap.seq + 1
	}
	h.snap, h.fingerprint = &snapshot{seq: seq, in: in, page: page}, fp
	return true
}

// latest builds if needed (always, with force) and returns the snapshot;
// a new one is published to the streams.
func (h *hub) latest(force bool) *snapshot {
	if h.current(force) {
		h.publish()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.snap
}

// fingerprint identifies what a snapshot shows, but for the time it was
// built at (ages are computed by the viewer).
func fingerprint(in model.Input, page *model.Page) [sha256.Size]byte {
	p := *page
	p.Now = time.Time{}
	var buf bytes.Buffer
	_ = json.NewEncoder(&buf).Encode(&p)
	// What only detail views show: the operation history and events.
	if s, ok := in.History.(interface{ Seq() uint64 }); ok {
		_ = json.NewEncoder(&buf).Encode(s.Seq())
	}
	if n := len(in.Events); n > 0 {
		_ = json.NewEncoder(&buf).Encode(in.Events[n-1])
	}
	return sha256.Sum256(buf.Bytes())
}

func (h *hub) subscribe() *subscriber {
	s := &subscriber{wake: notify.New()}
	h.subMu.Lock()
	h.subs[s] = struct{}{}
	h.subMu.Unlock()
	return s
}

func (h *hub) unsubscribe(s *subscriber) {
	h.subMu.Lock()
	delete(h.subs, s)
	h.subMu.Unlock()
}

func (h *hub) watchers() int {
	h.subMu.Lock()
	defer h.subMu.Unlock()
	return len(h.subs)
}

func (h *hub) publish() {
	h.subMu.Lock()
	defer h.subMu.Unlock()
	for s := range h.subs {
		s.wake.Notify()
	}
}
