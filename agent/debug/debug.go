// Package debug owns the debug endpoint's JSON documents
// (docs/debug-endpoint.md), built from snapshots and the parts' status
// lists, and the routes that serve them with health, readiness and pprof.
// It reads the parts through the small interfaces of Options and knows
// nothing of how they are wired.
package debug

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/agent/httpserve"
	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/nodeinfo"
	"github.com/volume-agent/volume-agent/csi/registration"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/apivolume"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/podcerts"
	"github.com/volume-agent/volume-agent/reconciler/housekeeping"
	"github.com/volume-agent/volume-agent/refresh"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/source/objectwatch"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/tokens"
	"github.com/volume-agent/volume-agent/volume"
)

// DSWDocument is GET /debug/dsw.
type DSWDocument struct {
	Generation   uint64      `json:"generation"`
	SourcesReady bool        `json:"sourcesReady"`
	Volumes      []DSWVolume `json:"volumes"`
	Pods         []DSWPod    `json:"pods"`
}

// DSWVolume is one desired volume.
type DSWVolume struct {
	Name       volume.UniqueName `json:"name"`
	Plugin     string            `json:"plugin"`
	SpecName   string            `json:"specName"`
	Attributes volume.Attributes `json:"attributes"`
	// Mode is Filesystem or Block (a raw block volume, in volumeDevices).
	Mode        v1.PersistentVolumeMode `json:"mode"`
	PV          string                  `json:"persistentVolume,omitempty"`
	PVC         string                  `json:"persistentVolumeClaim,omitempty"`
	DesiredSize string                  `json:"desiredSize,omitempty"`
	Pods        []DSWVolumePod          `json:"pods"`
}

// DSWVolumePod is one pod wanting a volume.
type DSWVolumePod struct {
	volume.PodRef
	OuterVolumeNames []string         `json:"outerVolumeNames"`
	ReadOnly         bool             `json:"readOnly,omitempty"`
	SubPaths         []volume.SubPath `json:"subPaths,omitempty"`
	// ContentGeneration: the content the pod's mount must hold (volumes
	// whose content follows their sources).
	ContentGeneration uint64    `json:"contentGeneration,omitempty"`
	Since             time.Time `json:"since"`
}

// DSWPod is one pod with its volumes and errors.
type DSWPod struct {
	volume.PodRef
	Volumes           []volume.UniqueName `json:"volumes"`
	VolumesReady      bool                `json:"volumesReady"`
	Errors            []PodError          `json:"errors,omitempty"`
	UnresolvedVolumes []string            `json:"unresolvedVolumes,omitempty"`
	Since             time.Time           `json:"since"`
}

// PodError is one problem with a pod's volume.
type PodError struct {
	Volume  string `json:"volume"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// ASWDocument is GET /debug/asw.
type ASWDocument struct {
	Generation uint64      `json:"generation"`
	Volumes    []ASWVolume `json:"volumes"`
}

// ASWVolume is one attached or mounted volume.
type ASWVolume struct {
	Name       volume.UniqueName `json:"name"`
	Plugin     string            `json:"plugin"`
	Attributes volume.Attributes `json:"attributes"`
	// Mode is Filesystem or Block; for Block, each pod's mountPath is the
	// access point (see volume.Paths) and deviceMountPath the CSI staging
	// directory.
	Mode             v1.PersistentVolumeMode `json:"mode"`
	AttachState      cache.AttachState       `json:"attachState,omitempty"`
	DeviceMountState cache.DeviceMountState  `json:"deviceMountState"`
	DevicePath       string                  `json:"devicePath,omitempty"`
	DeviceMountPath  string                  `json:"deviceMountPath,omitempty"`
	Size             string                  `json:"size,omitempty"`
	ResizeBlocked    string                  `json:"resizeBlocked,omitempty"`
	Pods             []ASWPod                `json:"pods"`
}

// ASWPod is one pod's mount of a volume.
type ASWPod struct {
	volume.PodRef
	SpecName   string           `json:"specName"`
	MountState cache.MountState `json:"mountState"`
	MountPath  string           `json:"mountPath"`
	// ContentGeneration is the content the mount holds; RemountRequired
	// says the DSW wants a newer one.
	ContentGeneration uint64 `json:"contentGeneration,omitempty"`
	RemountRequired   bool   `json:"remountRequired,omitempty"`
	Reconstructed     bool   `json:"reconstructed,omitempty"`
	// SubPaths are the sub-paths prepared for the pod's containers.
	SubPaths         []volume.SubPath `json:"subPaths,omitempty"`
	SubPathsOutdated bool             `json:"subPathsOutdated,omitempty"`
	Since            time.Time        `json:"since"`
}

// OperationsDocument is GET /debug/operations.
type OperationsDocument struct {
	Operations []operations.OperationStatus `json:"operations"`
}

// NewDSWDocument only reads the snapshots, which the planner and the other
// readers share (agent/snapshots_test.go).
func NewDSWDocument(s *cache.DesiredSnapshot, asw *cache.ActualSnapshot, sourcesReady bool) DSWDocument {
	doc := DSWDocument{Generation: s.Generation, SourcesReady: sourcesReady, Volumes: []DSWVolume{}, Pods: []DSWPod{}}
	for _, v := range s.Volumes() {
		dv := DSWVolume{Name: v.Name, Plugin: v.Plugin, SpecName: v.SpecName, Attributes: v.Attributes, Mode: v.Attributes.Mode(), Pods: []DSWVolumePod{}}
		if v.Spec != nil && v.Spec.PV != nil {
			dv.PV = v.Spec.PV.Name
			dv.PVC = v.Spec.ClaimRef()
		}
		if v.DesiredSize != nil {
			dv.DesiredSize = volume.SizeString(v.DesiredSize)
		}
		for _, p := range v.Pods.All() {
			dv.Pods = append(dv.Pods, DSWVolumePod{PodRef: p.Pod.PodRef, OuterVolumeNames: p.OuterNames, ReadOnly: p.Spec.ReadOnly, SubPaths: p.SubPaths,
				ContentGeneration: p.ContentGeneration, Since: p.Since})
		}
		sort.Slice(dv.Pods, func(i, j int) bool { return dv.Pods[i].UID < dv.Pods[j].UID })
		doc.Volumes = append(doc.Volumes, dv)
	}
	sort.Slice(doc.Volumes, func(i, j int) bool { return doc.Volumes[i].Name < doc.Volumes[j].Name })
	for _, p := range s.Pods() {
		dp := DSWPod{PodRef: p.Pod.PodRef, Volumes: p.Volumes, VolumesReady: explain.PodReady(p, s, asw), UnresolvedVolumes: p.Unresolved, Since: p.Since}
		if dp.Volumes == nil {
			dp.Volumes = []volume.UniqueName{}
		}
		for _, e := range p.Errors {
			dp.Errors = append(dp.Errors, PodError{Volume: e.Volume, Reason: e.Reason, Message: e.Error()})
		}
		doc.Pods = append(doc.Pods, dp)
	}
	sort.Slice(doc.Pods, func(i, j int) bool {
		if doc.Pods[i].Namespace != doc.Pods[j].Namespace {
			return doc.Pods[i].Namespace < doc.Pods[j].Namespace
		}
		return doc.Pods[i].Name < doc.Pods[j].Name
	})
	return doc
}

// NewASWDocument only reads the snapshots, as NewDSWDocument; dsw gives
// the content generations each mount must have.
func NewASWDocument(s *cache.ActualSnapshot, dsw *cache.DesiredSnapshot) ASWDocument {
	doc := ASWDocument{Generation: s.Generation, Volumes: []ASWVolume{}}
	for _, v := range s.Volumes() {
		av := ASWVolume{
			Name: v.Name, Plugin: v.Plugin, Attributes: v.Attributes, Mode: v.Attributes.Mode(), AttachState: v.AttachState,
			DeviceMountState: v.DeviceState, DevicePath: v.DevicePath, DeviceMountPath: v.DeviceMountPath,
			ResizeBlocked: v.ResizeBlocked, Pods: []ASWPod{},
		}
		if v.Size != nil {
			av.Size = volume.SizeString(v.Size)
		}
		for uid, m := range v.Pods.All() {
			var want uint64
			if dv := dsw.Volume(v.Name); dv != nil {
				if dp, ok := dv.Pods.Get(uid); ok {
					want = dp.ContentGeneration
				}
			}
			av.Pods = append(av.Pods, ASWPod{
				PodRef: m.Pod, SpecName: m.SpecName, MountState: m.State, MountPath: m.MountPath,
				ContentGeneration: m.ContentGeneration, RemountRequired: cache.ContentOutdated(m, want),
				Reconstructed: m.Reconstructed, Since: m.Since,
				SubPaths: m.SubPaths, SubPathsOutdated: m.SubPathsOutdated,
			})
		}
		sort.Slice(av.Pods, func(i, j int) bool { return av.Pods[i].UID < av.Pods[j].UID })
		doc.Volumes = append(doc.Volumes, av)
	}
	sort.Slice(doc.Volumes, func(i, j int) bool { return doc.Volumes[i].Name < doc.Volumes[j].Name })
	return doc
}

// SourcesDocument is GET /debug/sources.
type SourcesDocument struct {
	Synced      bool                `json:"synced"`
	InputErrors []source.InputError `json:"inputErrors"`
	// Watches are the claims, volumes and attachments watched one by one
	// for the node's pods (cluster mode).
	Watches []objectwatch.KeyStatus `json:"watches"`
}

// OrphansDocument is GET /debug/orphans.
type OrphansDocument struct {
	Orphans []housekeeping.OrphanStatus `json:"orphans"`
}

// EventsDocument is GET /debug/events.
type EventsDocument struct {
	Events []events.Event `json:"events"`
}

// DriversDocument is GET /debug/drivers.
type DriversDocument struct {
	Drivers             []DriverStatus              `json:"drivers"`
	RegistrationSockets []registration.SocketStatus `json:"registrationSockets"`
	// NodeInfo says, per driver, whether the cluster knows it is on this
	// node (CSINode entry, node ID annotation, topology labels); absent in
	// standalone mode and with --csi-node-info=false.
	NodeInfo []nodeinfo.DriverStatus `json:"nodeInfo,omitempty"`
}

// DriverStatus is a registered driver and what its CSIDriver object (or
// its absence) makes the agent do with its volumes.
type DriverStatus struct {
	registry.Driver
	Policy csiplugin.DriverPolicy `json:"policy"`
}

// APIVolumesDocument is GET /debug/api-volumes: what each API volume was
// built from and when it was last written, what is watched, and the
// tokens' lifetimes. Never any content: no data, no token.
type APIVolumesDocument struct {
	Credentials string                   `json:"credentials"`
	Volumes     []apivolume.VolumeStatus `json:"volumes"`
	Watches     []objectwatch.KeyStatus  `json:"watches"`
	Tokens      []tokens.Status          `json:"tokens"`
	// PodCertificates: each projection's request, expiry and refresh;
	// never a key.
	PodCertificates []podcerts.Status `json:"podCertificates,omitempty"`
	Refresh         refresh.Stats     `json:"refresh"`
}

// Options are what the endpoint reads, on each request.
type Options struct {
	DSW interface {
		Snapshot() *cache.DesiredSnapshot
	}
	ASW interface {
		Snapshot() *cache.ActualSnapshot
	}
	// SourcesReady: the desired state reflects every source, read
	// completely.
	SourcesReady func() bool
	Operations   interface {
		Status() []operations.OperationStatus
	}
	Source interface {
		HasSynced() bool
		source.ErrorReporter
	}
	// Watches are the cluster source's per-object watches (nil in
	// standalone mode).
	Watches    func() []objectwatch.KeyStatus
	Drivers    func() DriversDocument
	APIVolumes func() APIVolumesDocument
	// LocalVolumes is the local volume provisioner's status (nil when it
	// is off).
	LocalVolumes func() localpv.Document
	Orphans      interface {
		List() []housekeeping.OrphanStatus
	}
	Events interface{ Recent() []events.Event }
	// Readiness says whether the agent acts on a complete view of its
	// sources, and if not, why.
	Readiness func() (string, bool)
	// Page is the operator page (/, /pods/..., /debug/status).
	Page interface{ Register(mux *http.ServeMux) }
}

// NewMux routes the debug endpoint.
func NewMux(o Options) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/dsw", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, NewDSWDocument(o.DSW.Snapshot(), o.ASW.Snapshot(), o.SourcesReady()))
	})
	mux.HandleFunc("GET /debug/asw", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, NewASWDocument(o.ASW.Snapshot(), o.DSW.Snapshot()))
	})
	mux.HandleFunc("GET /debug/operations", func(w http.ResponseWriter, _ *http.Request) {
		ops := o.Operations.Status()
		if ops == nil {
			ops = []operations.OperationStatus{}
		}
		writeJSON(w, OperationsDocument{Operations: ops})
	})
	mux.HandleFunc("GET /debug/sources", func(w http.ResponseWriter, _ *http.Request) {
		doc := SourcesDocument{Synced: o.Source.HasSynced(), InputErrors: []source.InputError{}, Watches: []objectwatch.KeyStatus{}}
		doc.InputErrors = append(doc.InputErrors, o.Source.InputErrors()...)
		if o.Watches != nil {
			doc.Watches = append(doc.Watches, o.Watches()...)
		}
		writeJSON(w, doc)
	})
	mux.HandleFunc("GET /debug/drivers", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, o.Drivers())
	})
	mux.HandleFunc("GET /debug/local-volumes", func(w http.ResponseWriter, _ *http.Request) {
		if o.LocalVolumes == nil {
			http.Error(w, "the local volume provisioner is off (no --local-volumes-config)", http.StatusNotFound)
			return
		}
		writeJSON(w, o.LocalVolumes())
	})
	mux.HandleFunc("GET /debug/api-volumes", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, o.APIVolumes()) })
	mux.HandleFunc("GET /debug/orphans", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, OrphansDocument{Orphans: o.Orphans.List()})
	})
	mux.HandleFunc("GET /debug/events", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, EventsDocument{Events: o.Events.Recent()})
	})
	RegisterHealth(mux, o.Readiness)
	o.Page.Register(mux)
	// Profiles and traces last as long as the client asks (?seconds=).
	mux.HandleFunc("/debug/pprof/", httpserve.Streaming(pprof.Index))
	mux.HandleFunc("/debug/pprof/profile", httpserve.Streaming(pprof.Profile))
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", httpserve.Streaming(pprof.Trace))
	return mux
}

// RegisterHealth adds /healthz and /readyz (503 with readiness's reason
// until it says ready).
func RegisterHealth(mux *http.ServeMux, readiness func() (string, bool)) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if msg, ok := readiness(); !ok {
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
