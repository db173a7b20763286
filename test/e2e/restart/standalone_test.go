package restart_test

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

const standaloneNode = "restart-node"

// newStandaloneAgent prepares a standalone agent on a new root directory.
func newStandaloneAgent(t *testing.T, m *e2eutil.Manifests) (*agent, string) {
	t.Helper()
	root := mounttest.TempDir(t) // unmounted after the agent stops
	return newAgent(t, e2eutil.AgentOptions{Root: root, Node: standaloneNode, Args: []string{"--pod-manifest-path=" + m.Dir}}), root
}

func newPod(name string, vols ...corev1.Volume) *corev1.Pod {
	return e2eutil.Pod("default", "", name, vols...)
}

func diskVolume(name string) corev1.Volume { return e2eutil.EmptyDirVolume(name, "", "") }

// localPV is a local PV for the standalone node, bound to default/claim.
func localPV(name, path, claim string) *corev1.PersistentVolume {
	return e2eutil.LocalPV(name, path, claim, corev1.LabelHostname, standaloneNode)
}

func mkdirAll(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// podUIDs reads the UIDs of the named pods from /debug/dsw.
func (a *agent) podUIDs(names ...string) map[string]string {
	a.t.Helper()
	out := map[string]string{}
	e2eutil.PollErr(a.t, 60*time.Second, "pods in /debug/dsw", func() error {
		d, err := a.DSW()
		if err != nil {
			return err
		}
		for _, p := range d.Pods {
			out[p.Name] = p.UID
		}
		for _, n := range names {
			if out[n] == "" {
				return fmt.Errorf("pod %s not desired", n)
			}
		}
		return nil
	})
	return out
}

// waitPodsReady waits until the named pods have all their volumes ready.
func (a *agent) waitPodsReady(names ...string) {
	a.t.Helper()
	e2eutil.PollErr(a.t, 60*time.Second, fmt.Sprintf("pods %v ready", names), func() error {
		d, err := a.DSW()
		if err != nil {
			return err
		}
		ready := map[string]bool{}
		for _, p := range d.Pods {
			ready[p.Name] = p.VolumesReady
		}
		for _, n := range names {
			if !ready[n] {
				return fmt.Errorf("pod %s not ready", n)
			}
		}
		return nil
	})
}

// checkOps compares the operations the agent ran (by operation and plugin,
// from /metrics) with want.
func (a *agent) checkOps(what string, want map[string]map[string]float64) {
	a.t.Helper()
	got, err := a.opCounts()
	if err != nil {
		a.t.Fatal(err)
	}
	if want == nil {
		want = map[string]map[string]float64{}
	}
	if !maps.EqualFunc(got, want, func(x, y map[string]float64) bool { return maps.Equal(x, y) }) {
		a.t.Errorf("%s: operations run (volume_agent_operation_duration_seconds_count) %v, want %v", what, got, want)
	}
}

// Pods of the kill test: a Memory emptyDir, a disk emptyDir and a local
// directory PV shared by all.
func killTestPod(i int) *corev1.Pod {
	return newPod(fmt.Sprintf("pod-%03d", i), e2eutil.MemoryVolume("mem"), diskVolume("disk"), e2eutil.ClaimVolume("data", "shared"))
}

// mountIDs is the set of mounts at or below root, by mount ID.
func mountIDs(root string) (map[int]string, error) {
	all, err := mounttest.ReadMounts()
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, m := range all {
		if strings.HasPrefix(m.MountPoint, root+"/") {
			out[m.ID] = m.MountPoint
		}
	}
	return out, nil
}

// changes counts the mounts added or removed between two sets.
func changes(a, b map[int]string) int {
	n := 0
	for id := range a {
		if _, ok := b[id]; !ok {
			n++
		}
	}
	for id := range b {
		if _, ok := a[id]; !ok {
			n++
		}
	}
	return n
}

// killRounds starts the agent once per round and kills it with SIGKILL
// as soon as it has changed (mounted or unmounted) deltas[round] mounts
// under root since its start; just before each kill it writes data into up
// to writes of the pod volumes mounted at that moment (and into the disk
// emptyDir "disk" of their pods). between runs while the agent is down.
// It returns the files written into pods' volumes and, for the local
// directory PV, the file names written into the shared directory.
func killRounds(t *testing.T, a *agent, root string, deltas []int, writes int, between func(round int)) (written, sharedData map[string]string) {
	t.Helper()
	written, sharedData = map[string]string{}, map[string]string{}
	rnd := rand.New(rand.NewPCG(1, 2))
	for round, delta := range deltas {
		base, err := mountIDs(root)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Launch(); err != nil {
			t.Fatal(err)
		}
		launched := time.Now()
		lastSettledCheck := launched
		var cur map[int]string
		for {
			if cur, err = mountIDs(root); err != nil {
				t.Fatal(err)
			}
			if changes(base, cur) >= delta {
				break
			}
			// Earlier rounds may have left fewer changes than this round
			// asks for (a kill lands a little after its threshold while
			// the test writes into the volumes): once the agent has
			// nothing left to do, kill it as it is.
			if time.Since(lastSettledCheck) > 100*time.Millisecond {
				lastSettledCheck = time.Now()
				if _, err := a.settled(); err == nil {
					t.Logf("round %d: the agent settled after %d mount changes, fewer than the %d asked for", round, changes(base, cur), delta)
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
		seen := changes(base, cur)
		// Write only into volumes of pods the agent still wants: a
		// removed pod's volume is being torn down, and a file written
		// into its mount point just after the unmount lands in the
		// directory itself, which the agent then rightly refuses to
		// remove (it holds data).
		wanted := map[string]bool{}
		if d, err := a.DSW(); err != nil || !d.SourcesReady {
			t.Logf("round %d: no writes (the agent's desired pods are not known yet: %v)", round, err)
		} else {
			for _, p := range d.Pods {
				wanted[p.UID] = true
			}
		}
		points := slices.Collect(maps.Values(cur))
		rnd.Shuffle(len(points), func(i, j int) { points[i], points[j] = points[j], points[i] })
		n := 0
		for _, p := range points {
			if n >= writes {
				break
			}
			rel, ok := strings.CutPrefix(p, filepath.Join(root, "pods")+"/")
			if !ok {
				continue
			}
			uid := strings.Split(rel, "/")[0]
			if !wanted[uid] {
				continue
			}
			file := fmt.Sprintf("round-%d", round)
			content := fmt.Sprintf("%s round %d", uid, round)
			if strings.Contains(p, "~local-volume/") {
				f := uid + "-" + file
				mounttest.WriteFile(t, filepath.Join(p, f), content)
				sharedData[f] = content
			} else {
				mounttest.WriteFile(t, filepath.Join(p, file), content)
				written[filepath.Join(p, file)] = content
			}
			if disk := e2eutil.VolumeDir(root, uid, e2eutil.EmptyDirPlugin, "disk"); mounttest.Exists(t, disk) {
				mounttest.WriteFile(t, filepath.Join(disk, file), content)
				written[filepath.Join(disk, file)] = content
			}
			n++
		}
		a.Kill()
		atDeath, err := mountIDs(root)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: killed %v after the start, having seen %d mount changes (%d at its death; %d mounts)",
			round, time.Since(launched).Round(time.Millisecond), seen, changes(base, atDeath), len(atDeath))
		checkNoStackedMounts(t, mountCounts(t, root))
		if between != nil {
			between(round)
		}
	}
	return written, sharedData
}

// checkKillOutcome checks the end of a kill test: the agent has settled
// with the desired pods uids, each having a Memory emptyDir "mem" and a
// disk emptyDir "disk" and a bind mount of the local directory PV
// localPV (on sharedDir). Every volume is mounted exactly once (the disk
// emptyDir not at all) and nothing else is mounted, only the desired pods
// have directories, and every file written is intact (those in the
// emptyDirs of pods that are gone excepted).
func checkKillOutcome(t *testing.T, root string, uids map[string]bool, localPV, sharedDir string, written, sharedData map[string]string) {
	t.Helper()
	e2eutil.PollErr(t, time.Minute, "only the desired pods' directories", func() error {
		if dirs := podDirs(t, root); !maps.Equal(dirs, uids) {
			var extra []string
			for d := range dirs {
				if !uids[d] {
					extra = append(extra, d)
				}
			}
			return fmt.Errorf("%d pod directories for %d desired pods; not desired: %v", len(dirs), len(uids), extra)
		}
		return nil
	})
	counts := mountCounts(t, root)
	checkNoStackedMounts(t, counts)
	total := 0
	for _, n := range counts {
		total += n
	}
	if total != 2*len(uids) {
		t.Errorf("%d mounts under the root, want %d (a tmpfs and a bind mount per pod)", total, 2*len(uids))
	}
	for uid := range uids {
		for _, p := range []string{e2eutil.VolumeDir(root, uid, e2eutil.EmptyDirPlugin, "mem"), e2eutil.VolumeDir(root, uid, e2eutil.LocalPlugin, localPV)} {
			if counts[p] != 1 {
				t.Errorf("%s: %d mounts, want 1", p, counts[p])
			}
		}
		disk := e2eutil.VolumeDir(root, uid, e2eutil.EmptyDirPlugin, "disk")
		// Not checked: its mode. A kill between the directory's creation
		// and its chmod to 0777 leaves it 0755, and the next start adopts
		// it as it is (the directory is the only evidence of a set up).
		if info, err := os.Stat(disk); err != nil || !info.IsDir() || counts[disk] != 0 {
			t.Errorf("disk emptyDir %s: %v, %v, %d mounts", disk, info, err, counts[disk])
		}
		if ms := mounttest.MountsAt(t, e2eutil.VolumeDir(root, uid, e2eutil.EmptyDirPlugin, "mem")); len(ms) == 1 && ms[0].FSType != "tmpfs" {
			t.Errorf("Memory emptyDir of %s is %s", uid, ms[0].FSType)
		}
	}
	checked, lost := 0, 0
	for path, content := range written {
		uid := strings.Split(strings.TrimPrefix(path, filepath.Join(root, "pods")+"/"), "/")[0]
		if !uids[uid] {
			continue // the pod is gone: its emptyDirs went with it
		}
		checked++
		if got, err := os.ReadFile(path); err != nil || string(got) != content {
			lost++
			if lost <= 10 {
				t.Errorf("data written before a kill: %s: %q, %v", path, got, err)
			}
		}
	}
	for f, content := range sharedData {
		checked++
		if got, err := os.ReadFile(filepath.Join(sharedDir, f)); err != nil || string(got) != content {
			lost++
			t.Errorf("local PV data %s: %q, %v", f, got, err)
		}
	}
	if lost > 0 {
		t.Errorf("%d files lost", lost)
	}
	if checked < 20 {
		t.Errorf("only %d files written before kills were checked", checked)
	}
	t.Logf("%d pods settled, each volume mounted once; %d files written before kills intact", len(uids), checked)
}

// The agent is killed with SIGKILL while it mounts 200 pods × 3 volumes (a
// Memory emptyDir, a disk emptyDir, a local directory PV shared by all),
// four times at different moments: after its first few mounts, half way,
// right after a restart (while it adopts, mounts what is missing and tears
// down what pods removed meanwhile no longer want) and once more later.
// Pods are removed, and added, while it is down. Just before each kill the
// test writes data into some of the volumes mounted at that moment.
//
// After the last start: every volume a pod wants is mounted exactly once
// (no stacked mounts, none missing), all data written is intact, nothing
// of the removed pods is left (mounts, directories), no orphan is reported
// and the ASW holds nothing reconstructed or uncertain.
func TestKillDuringMount(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	const pods, removedPerRound = 200, 10
	host := mounttest.TempDir(t)
	sharedDir := mkdirAll(t, filepath.Join(host, "shared"))
	m := e2eutil.NewManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.Write("storage.yaml", localPV("shared", sharedDir, "shared"), e2eutil.PVC("shared", "shared"))
	for i := range pods {
		m.Write(fmt.Sprintf("pod-%03d.yaml", i), killTestPod(i))
	}

	removed := 0
	written, sharedData := killRounds(t, a, root, []int{5, 150, 3, 60}, 40, func(round int) {
		// While the agent is down: pods removed, whatever state they are
		// in, and (once) new pods.
		for i := round * removedPerRound; i < (round+1)*removedPerRound; i++ {
			m.Remove(fmt.Sprintf("pod-%03d.yaml", i))
			removed++
		}
		if round == 1 {
			for i := pods; i < pods+5; i++ {
				m.Write(fmt.Sprintf("pod-%03d.yaml", i), killTestPod(i))
			}
		}
	})

	a.Start()
	uids := a.waitSettled(3 * time.Minute)
	if want := pods + 5 - removed; len(uids) != want {
		t.Errorf("%d pods desired, want %d", len(uids), want)
	}
	checkKillOutcome(t, root, uids, "shared", sharedDir, written, sharedData)
	if n, err := a.Metric("volume_agent_reconstructed_pod_volumes_total"); err != nil || n == 0 {
		t.Errorf("volume_agent_reconstructed_pod_volumes_total %v (%v), want what the last run found", n, err)
	}
}

// SIGTERM then start (an upgrade): the new agent adopts every mount, the
// global mount of a local block PV included, with zero mount and zero
// unmount operations; the mount table does not change at all; data stays.
// A pod added afterwards proves the new agent reconciled after adopting.
func TestUpgradeRunsNoOperations(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	const apps = 150
	loop := mounttest.LoopDevice(t, 64<<20) // detached after everything else
	host := mounttest.TempDir(t)
	sharedDir := mkdirAll(t, filepath.Join(host, "shared"))
	barrierDir := mkdirAll(t, filepath.Join(host, "barrier"))
	m := e2eutil.NewManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.Write("storage.yaml",
		localPV("shared", sharedDir, "shared"), e2eutil.PVC("shared", "shared"),
		localPV("block", loop, "block"), e2eutil.PVC("block", "block"))
	var names []string
	for i := range apps {
		name := fmt.Sprintf("app-%03d", i)
		names = append(names, name)
		m.Write(name+".yaml", newPod(name, e2eutil.MemoryVolume("mem"), diskVolume("disk"), e2eutil.ClaimVolume("data", "shared")))
	}
	for _, name := range []string{"db-0", "db-1"} {
		names = append(names, name)
		m.Write(name+".yaml", newPod(name, e2eutil.ClaimVolume("block", "block"), e2eutil.MemoryVolume("mem")))
	}
	a.Start()
	uids := a.waitSettled(2 * time.Minute)
	if len(uids) != len(names) {
		t.Fatalf("%d pods desired, want %d", len(uids), len(names))
	}
	byName := a.podUIDs(names...)
	data := map[string]string{}
	for _, name := range names {
		uid := byName[name]
		for _, dir := range []string{e2eutil.VolumeDir(root, uid, e2eutil.EmptyDirPlugin, "mem"), e2eutil.VolumeDir(root, uid, e2eutil.EmptyDirPlugin, "disk"), e2eutil.VolumeDir(root, uid, e2eutil.LocalPlugin, "block")} {
			if mounttest.Exists(t, dir) {
				data[filepath.Join(dir, name)] = "before the upgrade: " + name
			}
		}
	}
	for path, content := range data {
		mounttest.WriteFile(t, path, content)
	}
	global := e2eutil.GlobalMount(root, e2eutil.LocalPlugin, "block")
	before := mounttest.MountsUnder(t, root)
	if want := 2*apps + 2*2 + 1; len(before) != want {
		t.Fatalf("%d mounts before the upgrade, want %d: %v", len(before), want, mounttest.MountPoints(before))
	}
	if len(mounttest.MountsAt(t, global)) != 1 {
		t.Fatalf("no global mount at %s", global)
	}

	a.stop()
	if after := mounttest.MountsUnder(t, root); !sameMounts(before, after) {
		t.Fatalf("SIGTERM changed the mounts:\nbefore %v\nafter  %v", mounttest.MountPoints(before), mounttest.MountPoints(after))
	}
	a.Start()
	a.waitSettled(2 * time.Minute)
	if n, err := a.Metric("volume_agent_reconstructed_pod_volumes_total"); err != nil || n != float64(3*apps+2*2) {
		t.Errorf("volume_agent_reconstructed_pod_volumes_total = %v (%v), want %d", n, err, 3*apps+2*2)
	}
	a.checkOps("after the upgrade", nil)

	// A new pod is mounted (with a plugin no other pod uses): the agent
	// has reconciled after adopting, and still did nothing else.
	m.Write("barrier.yaml", newPod("barrier", e2eutil.HostPathVolume("host", barrierDir, nil)))
	a.waitPodsReady("barrier")
	a.waitSettled(time.Minute)
	a.checkOps("after the upgrade and a new pod", map[string]map[string]float64{"mount_volume": {e2eutil.HostPathPlugin: 1}})
	after := mounttest.MountsUnder(t, root)
	barrier := e2eutil.VolumeDir(root, a.podUIDs("barrier")["barrier"], e2eutil.HostPathPlugin, "host")
	var withoutBarrier []mounttest.Mount
	for _, mt := range after {
		if mt.MountPoint != barrier {
			withoutBarrier = append(withoutBarrier, mt)
		}
	}
	if !sameMounts(before, withoutBarrier) || len(after) != len(before)+1 {
		t.Errorf("the upgrade changed the mounts:\nbefore %v\nafter  %v", mounttest.MountPoints(before), mounttest.MountPoints(after))
	}
	checkNoStackedMounts(t, mountCounts(t, root))
	for path, content := range data {
		if got := mounttest.ReadFile(t, path); got != content {
			t.Errorf("%s: %q after the upgrade", path, got)
		}
	}
}

// A pod whose manifest is removed while the agent is down is torn down
// completely after the start: its tmpfs, its bind mount of a local directory
// PV another pod still uses, the bind mount and the global mount of a local
// block PV, its disk emptyDir, its pod directory. The other pod keeps its
// mounts untouched, and no PV data is deleted.
func TestPodRemovedWhileDown(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	loop := mounttest.LoopDevice(t, 64<<20)
	host := mounttest.TempDir(t)
	sharedDir := mkdirAll(t, filepath.Join(host, "shared"))
	m := e2eutil.NewManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.Write("storage.yaml",
		localPV("shared", sharedDir, "shared"), e2eutil.PVC("shared", "shared"),
		localPV("block", loop, "block"), e2eutil.PVC("block", "block"))
	m.Write("gone.yaml", newPod("gone", e2eutil.MemoryVolume("mem"), diskVolume("disk"), e2eutil.ClaimVolume("data", "shared"), e2eutil.ClaimVolume("block", "block")))
	m.Write("stays.yaml", newPod("stays", e2eutil.MemoryVolume("mem"), e2eutil.ClaimVolume("data", "shared")))
	a.Start()
	a.waitSettled(time.Minute)
	uids := a.podUIDs("gone", "stays")
	gone, stays := uids["gone"], uids["stays"]
	mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(root, gone, e2eutil.EmptyDirPlugin, "disk"), "sub", "f"), "disk")
	mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(root, gone, e2eutil.EmptyDirPlugin, "mem"), "f"), "mem")
	mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(root, gone, e2eutil.LocalPlugin, "shared"), "from-gone"), "shared data")
	mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(root, gone, e2eutil.LocalPlugin, "block"), "from-gone"), "block data")
	global := e2eutil.GlobalMount(root, e2eutil.LocalPlugin, "block")
	staysMounts := mounttest.MountsUnder(t, filepath.Join(root, "pods", stays))
	if len(staysMounts) != 2 || len(mounttest.MountsUnder(t, filepath.Join(root, "pods", gone))) != 3 || len(mounttest.MountsAt(t, global)) != 1 {
		t.Fatalf("mounts before: %v", mounttest.MountPoints(mounttest.MountsUnder(t, root)))
	}

	a.stop()
	m.Remove("gone.yaml")
	a.Start()
	e2eutil.PollErr(t, time.Minute, "pod gone torn down", func() error {
		if ms := mounttest.MountsUnder(t, filepath.Join(root, "pods", gone)); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mounttest.MountPoints(ms))
		}
		if len(mounttest.MountsAt(t, global)) > 0 {
			return errors.New("the global mount is still there")
		}
		if mounttest.Exists(t, filepath.Dir(global)) {
			return fmt.Errorf("%s still exists", filepath.Dir(global))
		}
		if mounttest.Exists(t, filepath.Join(root, "pods", gone)) {
			return errors.New("the pod directory still exists")
		}
		return nil
	})
	a.waitSettled(time.Minute)
	if got := mounttest.MountsUnder(t, filepath.Join(root, "pods", stays)); !sameMounts(staysMounts, got) {
		t.Errorf("the other pod's mounts changed: %v -> %v", mounttest.MountPoints(staysMounts), mounttest.MountPoints(got))
	}
	if dirs := podDirs(t, root); !maps.Equal(dirs, map[string]bool{stays: true}) {
		t.Errorf("pod directories %v, want only %s", slices.Sorted(maps.Keys(dirs)), stays)
	}
	a.checkOps("after the restart", map[string]map[string]float64{
		"unmount_volume": {e2eutil.EmptyDirPlugin: 2, e2eutil.LocalPlugin: 2},
		"unmount_device": {e2eutil.LocalPlugin: 1},
	})
	if got := mounttest.ReadFile(t, filepath.Join(sharedDir, "from-gone")); got != "shared data" {
		t.Errorf("local directory PV data: %q", got)
	}
	probe := mkdirAll(t, filepath.Join(host, "probe"))
	mounttest.MountDevice(t, loop, probe, "ext4")
	if got := mounttest.ReadFile(t, filepath.Join(probe, "from-gone")); got != "block data" {
		t.Errorf("local block PV data: %q", got)
	}
}

// The last pods removed while the agent is down: nothing at all is desired
// after the start, so the sources becoming ready is the only event, and the
// teardown must follow it at once, not at the next periodic resync (a
// minute).
func TestAllPodsRemovedWhileDown(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	m := e2eutil.NewManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.Write("a.yaml", newPod("a", e2eutil.MemoryVolume("mem"), diskVolume("disk")))
	m.Write("b.yaml", newPod("b", e2eutil.MemoryVolume("mem")))
	a.Start()
	a.waitSettled(time.Minute)
	if n := len(mounttest.MountsUnder(t, root)); n != 2 {
		t.Fatalf("%d mounts, want 2", n)
	}
	a.stop()
	m.Remove("a.yaml")
	m.Remove("b.yaml")
	a.Start()
	start := time.Now()
	e2eutil.PollErr(t, 20*time.Second, "every pod torn down", func() error {
		if ms := mounttest.MountsUnder(t, root); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mounttest.MountPoints(ms))
		}
		if dirs := podDirs(t, root); len(dirs) > 0 {
			return fmt.Errorf("pod directories left: %v", slices.Sorted(maps.Keys(dirs)))
		}
		return nil
	})
	t.Logf("torn down %v after the agent became ready", time.Since(start).Round(time.Millisecond))
	a.waitSettled(time.Minute)
	a.checkOps("after the restart", map[string]map[string]float64{"unmount_volume": {e2eutil.EmptyDirPlugin: 3}})
}

// A manifest file that is broken when the agent starts has never been read:
// the pods in it are unknown, so volumes found on disk that no known pod
// wants may be theirs. None of them is torn down (neither that file's pod's
// nor a pod removed meanwhile), while other pods are mounted. Once the file
// is fixed its pod's volumes are adopted without a single mount operation,
// and the removed pod is torn down.
func TestBrokenManifestAtStart(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	loop := mounttest.LoopDevice(t, 64<<20)
	host := mounttest.TempDir(t)
	sharedDir := mkdirAll(t, filepath.Join(host, "shared"))
	hostDir := mkdirAll(t, filepath.Join(host, "hostpath"))
	m := e2eutil.NewManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.Write("storage.yaml",
		localPV("shared", sharedDir, "shared"), e2eutil.PVC("shared", "shared"),
		localPV("block", loop, "block"), e2eutil.PVC("block", "block"))
	podA := newPod("a", e2eutil.MemoryVolume("mem"), diskVolume("disk"), e2eutil.ClaimVolume("data", "shared"), e2eutil.ClaimVolume("block", "block"))
	m.Write("a.yaml", podA)
	m.Write("b.yaml", newPod("b", e2eutil.MemoryVolume("mem"), diskVolume("disk"), e2eutil.ClaimVolume("data", "shared")))
	a.Start()
	a.waitSettled(time.Minute)
	uids := a.podUIDs("a", "b")
	for _, name := range []string{"a", "b"} {
		mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(root, uids[name], e2eutil.EmptyDirPlugin, "mem"), "f"), "mem of "+name)
		mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(root, uids[name], e2eutil.EmptyDirPlugin, "disk"), "f"), "disk of "+name)
	}
	mounttest.WriteFile(t, filepath.Join(e2eutil.VolumeDir(root, uids["a"], e2eutil.LocalPlugin, "block"), "f"), "block of a")
	podMounts := func(name string) []mounttest.Mount {
		return mounttest.MountsUnder(t, filepath.Join(root, "pods", uids[name]))
	}
	beforeA, beforeB := podMounts("a"), podMounts("b")
	global := e2eutil.GlobalMount(root, e2eutil.LocalPlugin, "block")
	beforeGlobal := mounttest.MountsAt(t, global)
	if len(beforeA) != 3 || len(beforeB) != 2 || len(beforeGlobal) != 1 {
		t.Fatalf("mounts before: %v", mounttest.MountPoints(mounttest.MountsUnder(t, root)))
	}

	a.stop()
	m.WriteRaw("a.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a\n") // never parses
	m.Remove("b.yaml")
	m.Write("c.yaml", newPod("c", e2eutil.HostPathVolume("host", hostDir, nil)))
	a.Start()
	a.waitPodsReady("c")
	// A pod added after the agent became ready is mounted by a pass that
	// saw complete, ready sources: had orphan cleanup been allowed, that
	// pass would have started tearing down as well.
	m.Write("d.yaml", newPod("d", e2eutil.HostPathVolume("host", hostDir, nil)))
	a.waitPodsReady("d")
	e2eutil.PollErr(t, 30*time.Second, "no operation pending", func() error {
		ops, err := a.Operations()
		if err == nil && len(ops.Operations) > 0 {
			err = fmt.Errorf("pending: %+v", ops.Operations)
		}
		return err
	})
	src, err := a.Sources()
	if err != nil {
		t.Fatal(err)
	}
	if len(src.InputErrors) != 1 || filepath.Base(src.InputErrors[0].Input) != "a.yaml" {
		t.Errorf("input errors %+v, want one for a.yaml", src.InputErrors)
	}
	a.checkOps("with a.yaml broken", map[string]map[string]float64{"mount_volume": {e2eutil.HostPathPlugin: 2}})
	for name, before := range map[string][]mounttest.Mount{"a": beforeA, "b": beforeB} {
		if got := podMounts(name); !sameMounts(before, got) {
			t.Errorf("pod %s's mounts changed while a.yaml is broken: %v -> %v", name, mounttest.MountPoints(before), mounttest.MountPoints(got))
		}
	}
	if got := mounttest.MountsAt(t, global); !sameMounts(beforeGlobal, got) {
		t.Errorf("the global mount changed while a.yaml is broken")
	}
	s, err := a.ASW()
	if err != nil {
		t.Fatal(err)
	}
	reconstructed := 0
	for _, v := range s.Volumes {
		for _, p := range v.Pods {
			if p.UID == uids["a"] || p.UID == uids["b"] {
				if !p.Reconstructed || p.MountState != "Uncertain" {
					t.Errorf("volume %s of pod %s: %+v, want reconstructed and uncertain", v.Name, p.UID, p)
				}
				reconstructed++
			}
		}
	}
	if reconstructed != 4+3 {
		t.Errorf("%d reconstructed pod volumes of a and b in /debug/asw, want 7", reconstructed)
	}
	if code, body, err := a.Readyz(); err != nil || code != 200 {
		t.Errorf("/readyz %d %q (%v): other pods proceed, the agent is ready", code, body, err)
	}

	m.Write("a.yaml", podA)
	e2eutil.PollErr(t, time.Minute, "pod b torn down", func() error {
		if mounttest.Exists(t, filepath.Join(root, "pods", uids["b"])) {
			return errors.New("pod b's directory still exists")
		}
		return nil
	})
	got := a.waitSettled(time.Minute)
	if !got[uids["a"]] || got[uids["b"]] || len(got) != 3 {
		t.Errorf("desired pods %v", got)
	}
	a.checkOps("after fixing a.yaml", map[string]map[string]float64{
		"mount_volume":   {e2eutil.HostPathPlugin: 2},
		"unmount_volume": {e2eutil.EmptyDirPlugin: 2, e2eutil.LocalPlugin: 1},
	})
	if got := podMounts("a"); !sameMounts(beforeA, got) {
		t.Errorf("pod a's mounts changed: %v -> %v", mounttest.MountPoints(beforeA), mounttest.MountPoints(got))
	}
	if got := mounttest.MountsAt(t, global); !sameMounts(beforeGlobal, got) {
		t.Errorf("the global mount changed")
	}
	for _, f := range []string{
		filepath.Join(e2eutil.VolumeDir(root, uids["a"], e2eutil.EmptyDirPlugin, "mem"), "f"),
		filepath.Join(e2eutil.VolumeDir(root, uids["a"], e2eutil.EmptyDirPlugin, "disk"), "f"),
		filepath.Join(e2eutil.VolumeDir(root, uids["a"], e2eutil.LocalPlugin, "block"), "f"),
	} {
		if !strings.HasSuffix(mounttest.ReadFile(t, f), " of a") {
			t.Errorf("%s lost its data", f)
		}
	}
	dirs := slices.Sorted(maps.Keys(podDirs(t, root)))
	want := slices.Sorted(maps.Keys(got))
	if !slices.Equal(dirs, want) {
		t.Errorf("pod directories %v, want %v", dirs, want)
	}
}
