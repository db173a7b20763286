package localpv_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// noticeWithin bounds how long the test waits for a change to be noticed.
// The rescan is an hour away, so a change the watches miss is never
// noticed: this only bounds how long a failing test waits.
const noticeWithin = 15 * time.Second

// TestMountChangesNoticedWithoutRescan: with the periodic rescan an hour
// away, a disk mounted in a discovery directory becomes a PV, and each of
// 50 unmounts and remounts of it in a row is noticed (the PV's disk is
// reported missing, then back) by the pass the change itself starts.
//
// Not parallel: other tests' mounts also wake the provisioner and could
// hide a change it missed.
func TestMountChangesNoticedWithoutRescan(t *testing.T) {
	e := newEnv(t, "lpv-watch")
	class := e.class("fast")
	e.storageClass(class, corev1.PersistentVolumeReclaimRetain)
	disc := e.dir("disks")
	disk := e.dir("disks/disk1")
	e.writeConfig(fmt.Sprintf("storageClasses:\n  %s:\n    discoveryDir: %s\n", class, disc))
	pr := e.startProvisioner(func(o *localpv.Options) {
		o.ResyncPeriod = time.Hour
		o.ConfigSyncPeriod = time.Hour
	})
	if v := pr.waitState(disk, localpv.StateSkipped); v.Reason == "" {
		t.Fatalf("the plain directory: %+v", v)
	}

	var took []time.Duration
	noticed := func(what string, state localpv.State) {
		t.Helper()
		begin := time.Now()
		e2eutil.Poll(t, noticeWithin, what+" noticed (the rescan is an hour away)", func(context.Context) (bool, string) {
			v, ok := pr.volume(disk)
			return ok && v.State == state, fmt.Sprintf("%+v", v)
		})
		took = append(took, time.Since(begin))
	}
	mount := func() {
		if err := unix.Mount("tmpfs", disk, "tmpfs", 0, "size=16m"); err != nil {
			t.Fatal(err)
		}
	}

	mount()
	begin := time.Now()
	pv := e.waitAvailable(disk, "")
	t.Logf("PV %s Available %v after the mount (settling %v)", pv.Name, time.Since(begin).Round(time.Millisecond), 200*time.Millisecond)
	for i := range 50 {
		if err := unix.Unmount(disk, 0); err != nil {
			t.Fatal(err)
		}
		noticed(fmt.Sprintf("unmount %d", i+1), localpv.StateMissing)
		mount()
		noticed(fmt.Sprintf("mount %d", i+1), localpv.StateAvailable)
	}
	if v, _ := pr.volume(disk); v.PV != pv.Name {
		t.Errorf("after the remounts: %+v, want PV %s", v, pv.Name)
	}
	slices.Sort(took)
	t.Logf("100 changes noticed: median %v, slowest %v (polled every 50ms)", took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))

	// A second disk, on a directory made now, becomes a PV as quickly.
	second := filepath.Join(disc, "disk2")
	e.tmpfs(second, "16m")
	begin = time.Now()
	e.waitAvailable(second, "")
	t.Logf("a second disk's PV Available %v after its mount", time.Since(begin).Round(time.Millisecond))
}
