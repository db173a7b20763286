package populator

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/internal/pathcheck"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/volume"
)

// TestSyncNeverWaitsOnTheHost: a local PV on a disk that hangs (every
// lookup below it blocks, as on a dead NFS server or a failing drive) must
// not stall the populator. The pass completes at once, the other pods'
// volumes are desired, the hung pod's volume waits unresolved without an
// error; once the disk has not answered for the check's timeout, the pod
// gets an error saying so.
func TestSyncNeverWaitsOnTheHost(t *testing.T) {
	hung := mounttest.HungDir(t)
	recheck := notify.New()
	host := plugins.Host{Paths: volume.Paths{Root: t.TempDir()}, Mounter: mountutil.New(), NodeName: testNode, Recheck: recheck.Notify}
	reg := plugins.NewRegistry(emptydir.New(host), local.NewWithOptions(host, pathcheck.Options{Timeout: 200 * time.Millisecond}))
	h := newHarness(t, func(o *Options) { o.Plugins = reg; o.Recheck = recheck.C() })

	pvc, pv := boundPair("claim", "pv-hung", filepath.Join(hung, "disk"))
	stuck := newPod("stuck", withVolume(claimVol("data", "claim")), withVolume(emptyDirVol("scratch")))
	other := newPod("other", withVolume(emptyDirVol("scratch")))
	h.src.Add(pvc, pv, stuck, other)

	done := make(chan struct{})
	go func() {
		defer close(done)
		h.pop.Sync(false)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the populator pass did not complete within 30s: it waits on the hung disk")
	}
	if p := h.pod(t, other); len(p.Volumes) != 1 {
		t.Errorf("the other pod's volumes %v", p.Volumes)
	}
	p := h.pod(t, stuck)
	if len(p.Errors) != 0 || len(p.Unresolved) != 1 || p.Unresolved[0] != "data" || len(p.Volumes) != 1 {
		t.Errorf("stuck pod: volumes %v, unresolved %v, errors %v; want scratch desired, data unresolved, no error", p.Volumes, p.Unresolved, reasons(p.Errors))
	}
	if errs := h.obs.errors(); len(errs) != 0 {
		t.Errorf("reported %v while the path was being checked", errs)
	}

	// The check outlives its timeout: the populator is told, and the pod
	// gets the error.
	select {
	case <-recheck.C():
	case <-time.After(30 * time.Second):
		t.Fatal("no recheck signal after the check's timeout")
	}
	h.pop.Sync(true)
	p = h.pod(t, stuck)
	if len(p.Errors) != 1 || !strings.Contains(p.Errors[0].Error(), "does not answer") {
		t.Errorf("stuck pod's errors %v, want one saying the disk does not answer", p.Errors)
	}
}
