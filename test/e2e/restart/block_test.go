package restart_test

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// The agent is killed with SIGKILL while it maps raw block local PVs (one
// loop device each, two pods per device), three times at different moments:
// early, late, and right after a restart; some pods are removed while it is
// down. A kill may fall between any two steps of a mapping: access point
// file made, device bind-mounted, pin attached; before the last start the
// test also puts two access points into the states a kill between those
// steps leaves (mounted but not pinned; a file not mounted), whatever the
// kills hit.
//
// After the last start: each wanted pod has exactly one mount at its access
// point, of its device, and exactly one pin; removed pods have no access
// point, pin or directory left; no pin exists that no access point accounts
// for; no device was written (its first blocks are as they were). An
// upgrade after that runs no operation at all.
func TestKillDuringBlockMapping(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	const devices = 16
	loops := make([]string, devices)
	heads := make([][]byte, devices)
	for i := range loops {
		loops[i] = mounttest.LoopDevice(t, 8<<20)
		heads[i] = e2eutil.RandomHead(t, loops[i], 64<<10)
	}
	m := e2eutil.NewManifests(t)
	a, root := newStandaloneAgent(t, m)
	for i, dev := range loops {
		pv := localPV(fmt.Sprintf("blk-%02d", i), dev, fmt.Sprintf("claim-%02d", i))
		pvc := e2eutil.PVC(fmt.Sprintf("claim-%02d", i), pv.Name)
		e2eutil.AsBlock(pv, pvc)
		m.Write(fmt.Sprintf("storage-%02d.yaml", i), pv, pvc)
		for _, side := range []string{"a", "b"} {
			m.Write(fmt.Sprintf("pod-%02d-%s.yaml", i, side), blockPod(i, side))
		}
	}

	removed := map[string]bool{}
	for round, delta := range []int{3, 20, 2} {
		base, err := mountIDs(root)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Launch(); err != nil {
			t.Fatal(err)
		}
		launched := time.Now()
		for polls := 0; ; polls++ {
			cur, err := mountIDs(root)
			if err != nil {
				t.Fatal(err)
			}
			if changes(base, cur) >= delta {
				break
			}
			// A loaded machine may have let an earlier run get further
			// than planned, leaving fewer changes to make: a settled
			// agent is killed as it is.
			if polls%100 == 99 {
				if _, err := a.settled(); err == nil {
					break
				}
			}
			if a.Process().Exited() {
				t.Fatalf("round %d: the agent exited: %v\n%s", round, a.Process().Err(), a.Process().Tail(30))
			}
			if time.Since(launched) > 3*time.Minute {
				t.Fatalf("round %d: only %d mount changes after 3 minutes:\n%s", round, changes(base, cur), a.Process().Tail(30))
			}
			time.Sleep(time.Millisecond) // polling the mount table: the kill must follow closely
		}
		a.Kill()
		// While it is down: the "b" pods of two devices go away.
		for _, i := range []int{2 * round, 2*round + 1} {
			name := fmt.Sprintf("pod-%02d-b", i)
			m.Remove(name + ".yaml")
			removed[name] = true
		}
	}

	// Whatever the kills hit, make sure the next start also meets the two
	// states a kill between the steps of a mapping leaves: an access point
	// mounted but not pinned, and an access point file not mounted yet.
	aps, err := filepath.Glob(filepath.Join(root, "pods", "*", "volumeDevices", "*", "*"))
	if err != nil || len(aps) < 2 {
		t.Fatalf("access points after the kills: %v (%v)", aps, err)
	}
	sort.Strings(aps)
	pins := e2eutil.Pins(t, root)
	for i, ap := range aps[:2] {
		if loop := pins[ap]; loop != "" {
			mounttest.DetachLoop(t, loop)
		}
		if i == 1 {
			if err := unix.Unmount(ap, 0); err != nil && !errors.Is(err, unix.EINVAL) {
				t.Fatal(err)
			}
		}
	}

	a.Start()
	uids := a.waitSettled(3 * time.Minute)
	if want := 2*devices - len(removed); len(uids) != want {
		t.Errorf("%d pods desired, want %d", len(uids), want)
	}
	d, err := a.DSW()
	if err != nil {
		t.Fatal(err)
	}
	wantAPs := map[string]string{} // access point -> device
	for _, p := range d.Pods {
		var i int
		var side string
		if _, err := fmt.Sscanf(p.Name, "pod-%02d-%s", &i, &side); err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		wantAPs[e2eutil.DevicePath(root, p.UID, e2eutil.LocalPlugin, fmt.Sprintf("blk-%02d", i))] = loops[i]
	}
	counts := mountCounts(t, root)
	for ap, dev := range wantAPs {
		if counts[ap] != 1 {
			t.Errorf("%s: %d mounts, want exactly 1", ap, counts[ap])
		}
		got, err := e2eutil.Rdev(ap)
		want, _ := e2eutil.Rdev(dev)
		if err != nil || got != want {
			t.Errorf("%s is %d (%v), want %s (%d)", ap, got, err, dev, want)
		}
	}
	for mp := range counts {
		if _, ok := wantAPs[mp]; !ok {
			t.Errorf("mounted but no wanted pod's access point: %s", mp)
		}
	}
	pins = e2eutil.Pins(t, root)
	for ap := range wantAPs {
		if pins[ap] == "" {
			t.Errorf("%s is not pinned", ap)
		}
	}
	for ap, loop := range pins {
		if _, ok := wantAPs[ap]; !ok {
			t.Errorf("pin %s of %s: no wanted pod's access point (leaked)", loop, ap)
		}
	}
	if len(pins) != len(wantAPs) {
		t.Errorf("%d pins for %d access points", len(pins), len(wantAPs))
	}
	dirs := podDirNames(t, root)
	for _, name := range dirs {
		if !uids[name] {
			t.Errorf("directory of a pod that is not desired left: %s", name)
		}
	}
	for i, dev := range loops {
		if same, err := e2eutil.SameHead(dev, heads[i]); err != nil || !same {
			t.Errorf("%s: first blocks changed (%v): a Block volume must never be written by the agent", dev, err)
		}
	}

	// An upgrade (SIGTERM, start) adopts every pinned access point: no
	// operation runs, the mount table does not change.
	before := mountCounts(t, root)
	a.stop()
	a.Start()
	a.waitSettled(time.Minute)
	a.checkOps("after an upgrade", nil)
	if after := mountCounts(t, root); !maps.Equal(before, after) {
		t.Errorf("an upgrade changed the mount table: %d mount points before, %d after", len(before), len(after))
	}

	// Teardown after all of it: every pod goes, nothing is left.
	for i := range loops {
		for _, side := range []string{"a", "b"} {
			if name := fmt.Sprintf("pod-%02d-%s", i, side); !removed[name] {
				m.Remove(name + ".yaml")
			}
		}
	}
	e2eutil.PollErr(t, 2*time.Minute, "everything unmapped", func() error {
		if ms := mounttest.MountsUnder(t, root); len(ms) > 0 {
			return fmt.Errorf("mounts left: %d", len(ms))
		}
		if pins := e2eutil.Pins(t, root); len(pins) > 0 {
			return fmt.Errorf("pins left: %v", pins)
		}
		if dirs := podDirNames(t, root); len(dirs) > 0 {
			return fmt.Errorf("pod directories left: %s", strings.Join(dirs, ", "))
		}
		return nil
	})
}

func blockPod(i int, side string) *corev1.Pod {
	return e2eutil.DevicePod("default", "", fmt.Sprintf("pod-%02d-%s", i, side), e2eutil.ClaimVolume("disk", fmt.Sprintf("claim-%02d", i)))
}

func podDirNames(t *testing.T, root string) []string {
	t.Helper()
	entries, err := filepath.Glob(filepath.Join(root, "pods", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, filepath.Base(e))
	}
	return out
}
