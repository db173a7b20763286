// Package ui is the operator page on the debug endpoint: what an operator
// opens first when a pod hangs on its volumes. It serves, from one model
// (ui/model):
//
//   - GET /                          every pod with its volumes and their
//     state, operations, CSI drivers, orphans, local volumes, events;
//     filters ?namespace=&pod=&state=
//   - GET /pods/{namespace}/{name}   one pod: its mount tree and the
//     timeline of its operations
//   - GET /debug/status[/pods/{namespace}/{name}]   the same as JSON (what
//     `volume-agent status` reads)
//
// Every view is rendered on the server (html/template; it works without
// JavaScript) and, with ?watch=1, streamed as server-sent events: the page's
// script swaps in each new rendering. One hub builds the model once per
// change for every viewer (coalesced, at most one build per interval,
// none while nobody watches), and the number of streams is capped. Assets
// are embedded; the page loads nothing from elsewhere.
package ui

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/volume-agent/volume-agent/ui/model"
)

//go:embed assets
var assets embed.FS

// Options configure a Server. Zero values get defaults.
type Options struct {
	// Gather collects the model's input; it is called once per build.
	Gather func() model.Input
	// MaxStreams caps the live views (server-sent event streams) open at
	// once (default 8); more get 503 and a page that does not update.
	MaxStreams int
	// MinInterval is the shortest time between two builds for the live
	// views (default 250ms).
	MinInterval time.Duration
	// Refresh is how often live views are rebuilt without a change signal
	// (default 15s): the local volume provisioner and driver probes have
	// none.
	Refresh time.Duration
	// Heartbeat is how long a stream stays silent before a comment keeps
	// proxies (kubectl port-forward) from closing it (default 20s).
	Heartbeat time.Duration
	// WriteTimeout bounds each write to a stream (default 10s): a viewer
	// that stops reading loses its stream.
	WriteTimeout time.Duration
	Log          *zap.Logger
}

// Server serves the page. Create it with New, register its handlers with
// Register, tell it about changes with Changed and run it with Run.
type Server struct {
	opts    Options
	hub     *hub
	streams atomic.Int32
	// tmpl is parsed when the page is first served: an agent nobody
	// looks at does not hold the parsed templates.
	tmpl    func() *templates
	renders renders
}

// New returns a Server.
func New(o Options) *Server {
	if o.MaxStreams <= 0 {
		o.MaxStreams = 8
	}
	if o.MinInterval <= 0 {
		o.MinInterval = 250 * time.Millisecond
	}
	if o.Refresh <= 0 {
		o.Refresh = 15 * time.Second
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 20 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return &Server{opts: o, hub: newHub(o.Gather, o.MinInterval, o.Refresh), tmpl: sync.OnceValue(parseTemplates)}
}

// Changed tells the server the agent's state may have changed. It never
// blocks; changes are coalesced.
func (s *Server) Changed() { s.hub.notify() }

// Run builds the live views after changes until ctx ends; the streams end
// then.
func (s *Server) Run(ctx context.Context) { s.hub.run(ctx) }

// Register adds the page's handlers to mux.
func (s *Server) Register(mux *http.ServeMux) {
	static, _ := fs.Sub(assets, "assets/static")
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", noCache(http.FileServerFS(static))))
	mux.HandleFunc("GET /{$}", s.mainPage)
	mux.HandleFunc("GET /pods/{namespace}/{name}", s.podPage)
	mux.HandleFunc("GET /debug/status", s.statusJSON)
	mux.HandleFunc("GET /debug/status/pods/{namespace}/{name}", s.podJSON)
}

func noCache(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	})
}

// filterOf reads the filter of a request.
func filterOf(r *http.Request) model.Filter {
	q := r.URL.Query()
	return model.Filter{
		Namespace: strings.TrimSpace(q.Get("namespace")),
		Pod:       strings.TrimSpace(q.Get("pod")),
		State:     strings.TrimSpace(q.Get("state")),
	}
}

func watching(r *http.Request) bool {
	switch r.URL.Query().Get("watch") {
	case "", "0", "false":
		return false
	}
	return true
}

func (s *Server) mainPage(w http.ResponseWriter, r *http.Request) {
	f := filterOf(r)
	render := func(snap *snapshot, fragment bool) ([]byte, int, error) {
		return s.tmpl().main(snap.page, f, streamURL(r), fragment)
	}
	s.serveHTML(w, r, render)
}

func (s *Server) podPage(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	render := func(snap *snapshot, fragment bool) ([]byte, int, error) {
		d, ok := model.BuildPod(snap.in, ns, name)
		if !ok {
			return s.tmpl().missing(snap.page, ns, name, streamURL(r), fragment)
		}
		return s.tmpl().pod(snap.page, d, streamURL(r), fragment)
	}
	s.serveHTML(w, r, render)
}

// streamURL is the request's URL with watch=1: where the page's script
// gets its updates.
func streamURL(r *http.Request) string {
	q := r.URL.Query()
	q.Set("watch", "1")
	return r.URL.Path + "?" + q.Encode()
}

// serveHTML serves a whole page, or its stream of fragments with ?watch=1.
func (s *Server) serveHTML(w http.ResponseWriter, r *http.Request, render func(snap *snapshot, fragment bool) ([]byte, int, error)) {
	if watching(r) {
		s.serveStream(w, r, "view", func(snap *snapshot) ([]byte, error) {
			b, _, err := render(snap, true)
			return b, err
		})
		return
	}
	body, code, err := render(s.hub.latest(true), false)
	if err != nil {
		s.opts.Log.Error("rendering the page", zap.Error(err))
		http.Error(w, "rendering the page failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	setPageHeaders(w.Header())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// setPageHeaders forbids what the page never does: loading anything from
// elsewhere, inline scripts and styles, being framed.
func setPageHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

func (s *Server) statusJSON(w http.ResponseWriter, r *http.Request) {
	f := filterOf(r)
	render := func(snap *snapshot) (any, bool) { return snap.page.Filtered(f), true }
	s.serveJSON(w, r, render)
}

func (s *Server) podJSON(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	render := func(snap *snapshot) (any, bool) {
		d, ok := model.BuildPod(snap.in, ns, name)
		if !ok {
			return notFound{Error: fmt.Sprintf("pod %s/%s is not on node %s (no volume of it is desired or mounted)", ns, name, snap.page.Node)}, false
		}
		return d, true
	}
	s.serveJSON(w, r, render)
}

// notFound is the JSON of a pod the agent does not know (a stream sends it
// when the pod goes away).
type notFound struct {
	Error string `json:"error"`
}

func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request, render func(snap *snapshot) (any, bool)) {
	if watching(r) {
		s.serveStream(w, r, "status", func(snap *snapshot) ([]byte, error) {
			v, _ := render(snap)
			return json.Marshal(v)
		})
		return
	}
	v, ok := render(s.hub.latest(true))
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		w.WriteHeader(http.StatusNotFound)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// errTooManyStreams is the answer past MaxStreams.
var errTooManyStreams = errors.New("too many live views are open")
