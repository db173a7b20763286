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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

const standaloneNode = "restart-node"

// manifests is a standalone agent's --pod-manifest-path.
type manifests struct {
	t   *testing.T
	dir string
}

func newManifests(t *testing.T) *manifests {
	return &manifests{t: t, dir: t.TempDir()}
}

// writeRaw (re)places a file atomically (a temporary name the agent
// ignores, then a rename), so the agent never reads half a file.
func (m *manifests) writeRaw(name, content string) {
	m.t.Helper()
	tmp := filepath.Join(m.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, name)); err != nil {
		m.t.Fatal(err)
	}
}

func (m *manifests) write(name string, objs ...any) {
	m.t.Helper()
	var docs []string
	for _, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			m.t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	m.writeRaw(name, strings.Join(docs, "---\n"))
}

func (m *manifests) remove(name string) {
	m.t.Helper()
	if err := os.Remove(filepath.Join(m.dir, name)); err != nil {
		m.t.Fatal(err)
	}
}

// newStandaloneAgent prepares a standalone agent on a new root directory.
func newStandaloneAgent(t *testing.T, m *manifests) (*agent, string) {
	t.Helper()
	root := tempRoot(t) // unmounted after the agent stops
	return newAgent(t, root, "--node-name="+standaloneNode, "--pod-manifest-path="+m.dir), root
}

func newPod(name string, vols ...corev1.Volume) *corev1.Pod {
	c := corev1.Container{Name: "main", Image: "registry.k8s.io/pause:3.10"}
	for _, v := range vols {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/mnt/" + v.Name})
	}
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{c}, Volumes: vols},
	}
}

func memoryVolume(name string) corev1.Volume {
	q := resource.MustParse("1Mi")
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &q},
	}}
}

func diskVolume(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
}

func hostPathVolume(name, path string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}}
}

func claimVolume(name, claim string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}}
}

// localPV is a local PV for the standalone node, bound to default/claim.
func localPV(name, path, claim string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: path}},
			ClaimRef:               &corev1.ObjectReference{Namespace: "default", Name: claim},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{standaloneNode},
				}}}},
			}},
		},
	}
}

func newPVC(name, volumeName string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
			VolumeName:  volumeName,
		},
	}
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
	eventually(a.t, 60*time.Second, "pods in /debug/dsw", func() error {
		d, err := a.dsw()
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
	eventually(a.t, 60*time.Second, fmt.Sprintf("pods %v ready", names), func() error {
		d, err := a.dsw()
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
	return newPod(fmt.Sprintf("pod-%03d", i), memoryVolume("mem"), diskVolume("disk"), claimVolume("data", "shared"))
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
		if err := a.launch(); err != nil {
			t.Fatal(err)
		}
		launched := time.Now()
		var cur map[int]string
		for {
			if cur, err = mountIDs(root); err != nil {
				t.Fatal(err)
			}
			if changes(base, cur) >= delta {
				break
			}
			if a.proc.exited() {
				t.Fatalf("round %d: the agent exited: %v\n%s", round, a.proc.err, tail(a.proc.logPath, 30))
			}
			if time.Since(launched) > 3*time.Minute {
				t.Fatalf("round %d: only %d mount changes after 3 minutes:\n%s", round, changes(base, cur), tail(a.proc.logPath, 30))
			}
			time.Sleep(time.Millisecond) // polling the mount table: the kill must follow closely
		}
		seen := changes(base, cur)
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
			if disk := volumeDir(root, uid, emptyDirPlugin, "disk"); exists(t, disk) {
				mounttest.WriteFile(t, filepath.Join(disk, file), content)
				written[filepath.Join(disk, file)] = content
			}
			n++
		}
		a.kill9()
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
	eventually(t, time.Minute, "only the desired pods' directories", func() error {
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
		for _, p := range []string{volumeDir(root, uid, emptyDirPlugin, "mem"), volumeDir(root, uid, localPlugin, localPV)} {
			if counts[p] != 1 {
				t.Errorf("%s: %d mounts, want 1", p, counts[p])
			}
		}
		disk := volumeDir(root, uid, emptyDirPlugin, "disk")
		// Not checked: its mode. A kill between the directory's creation
		// and its chmod to 0777 leaves it 0755, and the next start adopts
		// it as it is (the directory is the only evidence of a set up).
		if info, err := os.Stat(disk); err != nil || !info.IsDir() || counts[disk] != 0 {
			t.Errorf("disk emptyDir %s: %v, %v, %d mounts", disk, info, err, counts[disk])
		}
		if ms := mounttest.MountsAt(t, volumeDir(root, uid, emptyDirPlugin, "mem")); len(ms) == 1 && ms[0].FSType != "tmpfs" {
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
	host := tempRoot(t)
	sharedDir := mkdirAll(t, filepath.Join(host, "shared"))
	m := newManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.write("storage.yaml", localPV("shared", sharedDir, "shared"), newPVC("shared", "shared"))
	for i := range pods {
		m.write(fmt.Sprintf("pod-%03d.yaml", i), killTestPod(i))
	}

	removed := 0
	written, sharedData := killRounds(t, a, root, []int{5, 150, 3, 60}, 40, func(round int) {
		// While the agent is down: pods removed, whatever state they are
		// in, and (once) new pods.
		for i := round * removedPerRound; i < (round+1)*removedPerRound; i++ {
			m.remove(fmt.Sprintf("pod-%03d.yaml", i))
			removed++
		}
		if round == 1 {
			for i := pods; i < pods+5; i++ {
				m.write(fmt.Sprintf("pod-%03d.yaml", i), killTestPod(i))
			}
		}
	})

	a.start()
	uids := a.waitSettled(3 * time.Minute)
	if want := pods + 5 - removed; len(uids) != want {
		t.Errorf("%d pods desired, want %d", len(uids), want)
	}
	checkKillOutcome(t, root, uids, "shared", sharedDir, written, sharedData)
	if n, err := a.metric("volume_agent_reconstructed_pod_volumes_total"); err != nil || n == 0 {
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
	host := tempRoot(t)
	sharedDir := mkdirAll(t, filepath.Join(host, "shared"))
	barrierDir := mkdirAll(t, filepath.Join(host, "barrier"))
	m := newManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.write("storage.yaml",
		localPV("shared", sharedDir, "shared"), newPVC("shared", "shared"),
		localPV("block", loop, "block"), newPVC("block", "block"))
	var names []string
	for i := range apps {
		name := fmt.Sprintf("app-%03d", i)
		names = append(names, name)
		m.write(name+".yaml", newPod(name, memoryVolume("mem"), diskVolume("disk"), claimVolume("data", "shared")))
	}
	for _, name := range []string{"db-0", "db-1"} {
		names = append(names, name)
		m.write(name+".yaml", newPod(name, claimVolume("block", "block"), memoryVolume("mem")))
	}
	a.start()
	uids := a.waitSettled(2 * time.Minute)
	if len(uids) != len(names) {
		t.Fatalf("%d pods desired, want %d", len(uids), len(names))
	}
	byName := a.podUIDs(names...)
	data := map[string]string{}
	for _, name := range names {
		uid := byName[name]
		for _, dir := range []string{volumeDir(root, uid, emptyDirPlugin, "mem"), volumeDir(root, uid, emptyDirPlugin, "disk"), volumeDir(root, uid, localPlugin, "block")} {
			if exists(t, dir) {
				data[filepath.Join(dir, name)] = "before the upgrade: " + name
			}
		}
	}
	for path, content := range data {
		mounttest.WriteFile(t, path, content)
	}
	global := globalMount(root, localPlugin, "block")
	before := mounttest.MountsUnder(t, root)
	if want := 2*apps + 2*2 + 1; len(before) != want {
		t.Fatalf("%d mounts before the upgrade, want %d: %v", len(before), want, mountPoints(before))
	}
	if len(mounttest.MountsAt(t, global)) != 1 {
		t.Fatalf("no global mount at %s", global)
	}

	a.stop()
	if after := mounttest.MountsUnder(t, root); !sameMounts(before, after) {
		t.Fatalf("SIGTERM changed the mounts:\nbefore %v\nafter  %v", mountPoints(before), mountPoints(after))
	}
	a.start()
	a.waitSettled(2 * time.Minute)
	if n, err := a.metric("volume_agent_reconstructed_pod_volumes_total"); err != nil || n != float64(3*apps+2*2) {
		t.Errorf("volume_agent_reconstructed_pod_volumes_total = %v (%v), want %d", n, err, 3*apps+2*2)
	}
	a.checkOps("after the upgrade", nil)

	// A new pod is mounted (with a plugin no other pod uses): the agent
	// has reconciled after adopting, and still did nothing else.
	m.write("barrier.yaml", newPod("barrier", hostPathVolume("host", barrierDir)))
	a.waitPodsReady("barrier")
	a.waitSettled(time.Minute)
	a.checkOps("after the upgrade and a new pod", map[string]map[string]float64{"mount_volume": {hostPathPlugin: 1}})
	after := mounttest.MountsUnder(t, root)
	barrier := volumeDir(root, a.podUIDs("barrier")["barrier"], hostPathPlugin, "host")
	var withoutBarrier []mounttest.Mount
	for _, mt := range after {
		if mt.MountPoint != barrier {
			withoutBarrier = append(withoutBarrier, mt)
		}
	}
	if !sameMounts(before, withoutBarrier) || len(after) != len(before)+1 {
		t.Errorf("the upgrade changed the mounts:\nbefore %v\nafter  %v", mountPoints(before), mountPoints(after))
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
	host := tempRoot(t)
	sharedDir := mkdirAll(t, filepath.Join(host, "shared"))
	m := newManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.write("storage.yaml",
		localPV("shared", sharedDir, "shared"), newPVC("shared", "shared"),
		localPV("block", loop, "block"), newPVC("block", "block"))
	m.write("gone.yaml", newPod("gone", memoryVolume("mem"), diskVolume("disk"), claimVolume("data", "shared"), claimVolume("block", "block")))
	m.write("stays.yaml", newPod("stays", memoryVolume("mem"), claimVolume("data", "shared")))
	a.start()
	a.waitSettled(time.Minute)
	uids := a.podUIDs("gone", "stays")
	gone, stays := uids["gone"], uids["stays"]
	mounttest.WriteFile(t, filepath.Join(volumeDir(root, gone, emptyDirPlugin, "disk"), "sub", "f"), "disk")
	mounttest.WriteFile(t, filepath.Join(volumeDir(root, gone, emptyDirPlugin, "mem"), "f"), "mem")
	mounttest.WriteFile(t, filepath.Join(volumeDir(root, gone, localPlugin, "shared"), "from-gone"), "shared data")
	mounttest.WriteFile(t, filepath.Join(volumeDir(root, gone, localPlugin, "block"), "from-gone"), "block data")
	global := globalMount(root, localPlugin, "block")
	staysMounts := mounttest.MountsUnder(t, filepath.Join(root, "pods", stays))
	if len(staysMounts) != 2 || len(mounttest.MountsUnder(t, filepath.Join(root, "pods", gone))) != 3 || len(mounttest.MountsAt(t, global)) != 1 {
		t.Fatalf("mounts before: %v", mountPoints(mounttest.MountsUnder(t, root)))
	}

	a.stop()
	m.remove("gone.yaml")
	a.start()
	eventually(t, time.Minute, "pod gone torn down", func() error {
		if ms := mounttest.MountsUnder(t, filepath.Join(root, "pods", gone)); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mountPoints(ms))
		}
		if len(mounttest.MountsAt(t, global)) > 0 {
			return errors.New("the global mount is still there")
		}
		if exists(t, filepath.Dir(global)) {
			return fmt.Errorf("%s still exists", filepath.Dir(global))
		}
		if exists(t, filepath.Join(root, "pods", gone)) {
			return errors.New("the pod directory still exists")
		}
		return nil
	})
	a.waitSettled(time.Minute)
	if got := mounttest.MountsUnder(t, filepath.Join(root, "pods", stays)); !sameMounts(staysMounts, got) {
		t.Errorf("the other pod's mounts changed: %v -> %v", mountPoints(staysMounts), mountPoints(got))
	}
	if dirs := podDirs(t, root); !maps.Equal(dirs, map[string]bool{stays: true}) {
		t.Errorf("pod directories %v, want only %s", slices.Sorted(maps.Keys(dirs)), stays)
	}
	a.checkOps("after the restart", map[string]map[string]float64{
		"unmount_volume": {emptyDirPlugin: 2, localPlugin: 2},
		"unmount_device": {localPlugin: 1},
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
	m := newManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.write("a.yaml", newPod("a", memoryVolume("mem"), diskVolume("disk")))
	m.write("b.yaml", newPod("b", memoryVolume("mem")))
	a.start()
	a.waitSettled(time.Minute)
	if n := len(mounttest.MountsUnder(t, root)); n != 2 {
		t.Fatalf("%d mounts, want 2", n)
	}
	a.stop()
	m.remove("a.yaml")
	m.remove("b.yaml")
	a.start()
	start := time.Now()
	eventually(t, 20*time.Second, "every pod torn down", func() error {
		if ms := mounttest.MountsUnder(t, root); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mountPoints(ms))
		}
		if dirs := podDirs(t, root); len(dirs) > 0 {
			return fmt.Errorf("pod directories left: %v", slices.Sorted(maps.Keys(dirs)))
		}
		return nil
	})
	t.Logf("torn down %v after the agent became ready", time.Since(start).Round(time.Millisecond))
	a.waitSettled(time.Minute)
	a.checkOps("after the restart", map[string]map[string]float64{"unmount_volume": {emptyDirPlugin: 3}})
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
	host := tempRoot(t)
	sharedDir := mkdirAll(t, filepath.Join(host, "shared"))
	hostDir := mkdirAll(t, filepath.Join(host, "hostpath"))
	m := newManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.write("storage.yaml",
		localPV("shared", sharedDir, "shared"), newPVC("shared", "shared"),
		localPV("block", loop, "block"), newPVC("block", "block"))
	podA := newPod("a", memoryVolume("mem"), diskVolume("disk"), claimVolume("data", "shared"), claimVolume("block", "block"))
	m.write("a.yaml", podA)
	m.write("b.yaml", newPod("b", memoryVolume("mem"), diskVolume("disk"), claimVolume("data", "shared")))
	a.start()
	a.waitSettled(time.Minute)
	uids := a.podUIDs("a", "b")
	for _, name := range []string{"a", "b"} {
		mounttest.WriteFile(t, filepath.Join(volumeDir(root, uids[name], emptyDirPlugin, "mem"), "f"), "mem of "+name)
		mounttest.WriteFile(t, filepath.Join(volumeDir(root, uids[name], emptyDirPlugin, "disk"), "f"), "disk of "+name)
	}
	mounttest.WriteFile(t, filepath.Join(volumeDir(root, uids["a"], localPlugin, "block"), "f"), "block of a")
	podMounts := func(name string) []mounttest.Mount {
		return mounttest.MountsUnder(t, filepath.Join(root, "pods", uids[name]))
	}
	beforeA, beforeB := podMounts("a"), podMounts("b")
	global := globalMount(root, localPlugin, "block")
	beforeGlobal := mounttest.MountsAt(t, global)
	if len(beforeA) != 3 || len(beforeB) != 2 || len(beforeGlobal) != 1 {
		t.Fatalf("mounts before: %v", mountPoints(mounttest.MountsUnder(t, root)))
	}

	a.stop()
	m.writeRaw("a.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a\n") // never parses
	m.remove("b.yaml")
	m.write("c.yaml", newPod("c", hostPathVolume("host", hostDir)))
	a.start()
	a.waitPodsReady("c")
	// A pod added after the agent became ready is mounted by a pass that
	// saw complete, ready sources: had orphan cleanup been allowed, that
	// pass would have started tearing down as well.
	m.write("d.yaml", newPod("d", hostPathVolume("host", hostDir)))
	a.waitPodsReady("d")
	eventually(t, 30*time.Second, "no operation pending", func() error {
		ops, err := a.operations()
		if err == nil && len(ops.Operations) > 0 {
			err = fmt.Errorf("pending: %+v", ops.Operations)
		}
		return err
	})
	src, err := a.sources()
	if err != nil {
		t.Fatal(err)
	}
	if len(src.InputErrors) != 1 || filepath.Base(src.InputErrors[0].Input) != "a.yaml" {
		t.Errorf("input errors %+v, want one for a.yaml", src.InputErrors)
	}
	a.checkOps("with a.yaml broken", map[string]map[string]float64{"mount_volume": {hostPathPlugin: 2}})
	for name, before := range map[string][]mounttest.Mount{"a": beforeA, "b": beforeB} {
		if got := podMounts(name); !sameMounts(before, got) {
			t.Errorf("pod %s's mounts changed while a.yaml is broken: %v -> %v", name, mountPoints(before), mountPoints(got))
		}
	}
	if got := mounttest.MountsAt(t, global); !sameMounts(beforeGlobal, got) {
		t.Errorf("the global mount changed while a.yaml is broken")
	}
	s, err := a.asw()
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
	if code, body, err := a.readyz(); err != nil || code != 200 {
		t.Errorf("/readyz %d %q (%v): other pods proceed, the agent is ready", code, body, err)
	}

	m.write("a.yaml", podA)
	eventually(t, time.Minute, "pod b torn down", func() error {
		if exists(t, filepath.Join(root, "pods", uids["b"])) {
			return errors.New("pod b's directory still exists")
		}
		return nil
	})
	got := a.waitSettled(time.Minute)
	if !got[uids["a"]] || got[uids["b"]] || len(got) != 3 {
		t.Errorf("desired pods %v", got)
	}
	a.checkOps("after fixing a.yaml", map[string]map[string]float64{
		"mount_volume":   {hostPathPlugin: 2},
		"unmount_volume": {emptyDirPlugin: 2, localPlugin: 1},
	})
	if got := podMounts("a"); !sameMounts(beforeA, got) {
		t.Errorf("pod a's mounts changed: %v -> %v", mountPoints(beforeA), mountPoints(got))
	}
	if got := mounttest.MountsAt(t, global); !sameMounts(beforeGlobal, got) {
		t.Errorf("the global mount changed")
	}
	for _, f := range []string{
		filepath.Join(volumeDir(root, uids["a"], emptyDirPlugin, "mem"), "f"),
		filepath.Join(volumeDir(root, uids["a"], emptyDirPlugin, "disk"), "f"),
		filepath.Join(volumeDir(root, uids["a"], localPlugin, "block"), "f"),
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
