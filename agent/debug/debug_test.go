package debug

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler/housekeeping"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/status/events"
)

type fakeSource struct {
	synced bool
	errs   []source.InputError
}

func (f fakeSource) HasSynced() bool                  { return f.synced }
func (f fakeSource) InputErrors() []source.InputError { return f.errs }

type noOperations struct{}

func (noOperations) Status() []operations.OperationStatus { return nil }

type orphans []housekeeping.OrphanStatus

func (o orphans) List() []housekeeping.OrphanStatus { return o }

type recent []events.Event

func (r recent) Recent() []events.Event { return r }

type noPage struct{}

func (noPage) Register(*http.ServeMux) {}

// The routes answer from what Options give them, in the documents'
// shapes: empty lists as [], the local volumes 404 while the provisioner
// is off, readiness 503 with its reason until ready.
func TestMux(t *testing.T) {
	clk := clock.RealClock{}
	base := Options{
		DSW: cache.NewDesiredStateOfWorld(clk), ASW: cache.NewActualStateOfWorld(clk),
		SourcesReady: func() bool { return true },
		Operations:   noOperations{},
		Source:       fakeSource{synced: true, errs: []source.InputError{{Input: "bad.yaml", Error: "no kind"}}},
		Drivers:      func() DriversDocument { return DriversDocument{Drivers: []DriverStatus{}} },
		APIVolumes:   func() APIVolumesDocument { return APIVolumesDocument{Credentials: "none (standalone mode)"} },
		Orphans:      orphans{},
		Events:       recent{{Reason: "FailedMount", Time: time.Unix(0, 0).UTC()}},
		Readiness:    func() (string, bool) { return "sources not read completely yet", false },
		Page:         noPage{},
	}
	withLocal := base
	withLocal.LocalVolumes = func() localpv.Document { return localpv.Document{} }
	for _, tc := range []struct {
		name     string
		opts     Options
		path     string
		wantCode int
		wantBody []string
	}{
		{"dsw", base, "/debug/dsw", 200, []string{`"sourcesReady": true`, `"volumes": []`, `"pods": []`}},
		{"asw", base, "/debug/asw", 200, []string{`"volumes": []`}},
		{"operations", base, "/debug/operations", 200, []string{`"operations": []`}},
		{"sources", base, "/debug/sources", 200, []string{`"synced": true`, `bad.yaml`, `"watches": []`}},
		{"drivers", base, "/debug/drivers", 200, []string{`"drivers": []`}},
		{"api volumes", base, "/debug/api-volumes", 200, []string{`"credentials": "none (standalone mode)"`}},
		{"orphans", base, "/debug/orphans", 200, []string{`"orphans": []`}},
		{"events", base, "/debug/events", 200, []string{`FailedMount`}},
		{"local volumes off", base, "/debug/local-volumes", 404, []string{"--local-volumes-config"}},
		{"local volumes on", withLocal, "/debug/local-volumes", 200, nil},
		{"healthz", base, "/healthz", 200, []string{"ok"}},
		{"readyz", base, "/readyz", 503, []string{"sources not read completely yet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			NewMux(tc.opts).ServeHTTP(w, httptest.NewRequest(http.MethodGet, tc.path, nil))
			if w.Code != tc.wantCode {
				t.Fatalf("GET %s: %d %s, want %d", tc.path, w.Code, w.Body, tc.wantCode)
			}
			for _, s := range tc.wantBody {
				if !strings.Contains(w.Body.String(), s) {
					t.Errorf("GET %s: %s\ndoes not say %s", tc.path, w.Body, s)
				}
			}
			if w.Code == 200 && strings.HasPrefix(tc.path, "/debug/") && !json.Valid(w.Body.Bytes()) {
				t.Errorf("GET %s: not JSON: %s", tc.path, w.Body)
			}
		})
	}
}
