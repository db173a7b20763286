package ui

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
)

// serveStream sends render's output of the latest snapshot as server-sent
// events named event: one at once, then one after each change of what it
// shows. It ends when the client goes, a write fails or times out, or the
// server stops.
//
// Each write gets its own deadline through http.ResponseController, so a
// stream outlives the server's WriteTimeout (which would otherwise cut it
// after that long) while a client that stops reading is still dropped.
func (s *Server) serveStream(w http.ResponseWriter, r *http.Request, event string, render func(*snapshot) ([]byte, error)) {
	if n := s.streams.Add(1); int(n) > s.opts.MaxStreams {
		s.streams.Add(-1)
		w.Header().Set("Retry-After", "30")
		http.Error(w, fmt.Sprintf("%v (%d): reload the page to see the current state", errTooManyStreams, s.opts.MaxStreams), http.StatusServiceUnavailable)
		return
	}
	defer s.streams.Add(-1)
	sub := s.hub.subscribe()
	defer s.hub.unsubscribe(sub)

	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)

	var buf bytes.Buffer
	write := func() error {
		// A deadline the writer does not support (a test recorder) only
		// means no deadline.
		if err := rc.SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
		buf.Reset()
		return rc.Flush()
	}
	// Reconnect soon after the agent restarts.
	buf.WriteString("retry: 2000\n\n")
	// Viewers of the same view share one rendering of each snapshot.
	q := r.URL.Query()
	q.Del("watch")
	key := event + " " + r.URL.Path + "?" + q.Encode()
	var sent uint64
	send := func() error {
		snap := s.hub.latest(false)
		if snap.seq == sent {
			return nil
		}
		data, err := s.renders.get(key, snap, render)
		if err != nil {
			return err
		}
		sent = snap.seq
		writeEvent(&buf, event, snap.seq, data)
		return write()
	}
	heartbeat := time.NewTimer(s.opts.Heartbeat)
	defer heartbeat.Stop()
	for {
		if err := send(); err != nil {
			s.opts.Log.Debug("live view stream ended", zap.String("path", r.URL.Path), zap.Error(err))
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-s.hub.done:
			return
		case <-sub.wake.C():
		case <-heartbeat.C:
			buf.WriteString(": keep-alive\n\n")
			if err := write(); err != nil {
				return
			}
		}
		heartbeat.Reset(s.opts.Heartbeat)
	}
}

// writeEvent formats one server-sent event; every line of data becomes a
// data field (the client joins them with newlines). A carriage return ends
// a line too, so none can start a field of its own.
func writeEvent(buf *bytes.Buffer, event string, id uint64, data []byte) {
	if bytes.IndexByte(data, '\r') >= 0 {
		data = bytes.ReplaceAll(bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
	}
	buf.WriteString("id: ")
	buf.WriteString(strconv.FormatUint(id, 10))
	buf.WriteString("\nevent: ")
	buf.WriteString(event)
	buf.WriteByte('\n')
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		buf.WriteString("data: ")
		buf.Write(line)
		buf.WriteByte('\n')
	}
	buf.WriteByte('\n')
}

// renders keeps the last rendering of each view streamed, for the snapshot
// it was made from.
type renders struct {
	mu      sync.Mutex
	entries map[string]rendering
}

type rendering struct {
	seq  uint64
	data []byte
}

// get returns the rendering of view key for snap, rendering it if no
// viewer did yet. Renderings of older snapshots are dropped, so there are
// no more than views being streamed.
func (c *renders) get(key string, snap *snapshot, render func(*snapshot) ([]byte, error)) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.entries[key]; ok && r.seq == snap.seq {
		return r.data, nil
	}
	data, err := render(snap)
	if err != nil {
		return nil, err
	}
	if c.entries == nil {
		c.entries = map[string]rendering{}
	}
	for k, r := range c.entries {
		if r.seq < snap.seq {
			delete(c.entries, k)
		}
	}
	c.entries[key] = rendering{seq: snap.seq, data: data}
	return data, nil
}
