package housekeeping

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/subpath"
	"github.com/volume-agent/volume-agent/volume"
)

// hkWorld is a root directory for CleanPodDirs with a fake mount table.
type hkWorld struct {
	t        *testing.T
	paths    volume.Paths
	mounted  map[string]bool
	failures map[string]error
	asked    []string // paths isMountPoint was asked about
}

func newHKWorld(t *testing.T) *hkWorld {
	t.Helper()
	return &hkWorld{t: t, paths: volume.Paths{Root: mounttest.TempDir(t)}, mounted: map[string]bool{}, failures: map[string]error{}}
}

func (w *hkWorld) isMountPoint(path string) (bool, error) {
	w.asked = append(w.asked, path)
	if err := w.failures[path]; err != nil {
		return false, err
	}
	return w.mounted[path], nil
}

func (w *hkWorld) mkdir(rel string) string {
	w.t.Helper()
	p := filepath.Join(w.paths.PodsDir(), rel)
	if err := os.MkdirAll(p, 0o750); err != nil {
		w.t.Fatal(err)
	}
	return p
}

func (w *hkWorld) file(rel, content string) string {
	w.t.Helper()
	p := filepath.Join(w.paths.PodsDir(), rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
		w.t.Fatal(err)
	}
	return p
}

func (w *hkWorld) exists(p string) bool {
	w.t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		w.t.Fatal(err)
	}
	return err == nil
}

// podDirs lists what is left under <root>/pods.
func (w *hkWorld) podDirs() []string {
	w.t.Helper()
	entries, err := os.ReadDir(w.paths.PodsDir())
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// hkTree lists every path below dir, for before/after comparisons.
func hkTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func hkDesired(uids ...types.UID) *cache.DesiredSnapshot {
	pods := map[types.UID]*cache.DesiredPod{}
	for _, uid := range uids {
		pods[uid] = &cache.DesiredPod{Pod: volume.PodInfo{PodRef: volume.PodRef{UID: uid}}}
	}
	return cache.NewDesiredSnapshot(map[volume.UniqueName]*cache.DesiredVolume{}, pods, 0)
}

// hkActual has one volume mounted (or uncertain) for each pod.
func hkActual(uids ...types.UID) *cache.ActualSnapshot {
	vols := map[volume.UniqueName]*cache.ActualVolume{}
	for _, uid := range uids {
		name := volume.PodScopedName("test", uid, "v")
		vols[name] = &cache.ActualVolume{Name: name, Plugin: "test", DeviceState: cache.DeviceNotMounted,
			Pods: cache.PodSetOf(map[types.UID]*cache.ActualPodMount{uid: {Pod: volume.PodRef{UID: uid}, State: cache.MountUncertain, Reconstructed: true}})}
	}
	return cache.NewActualSnapshot(vols, 0)
}

// Gone pods' empty trees are removed entirely, however deep; pods the DSW
// or the ASW still know are left alone even when empty.
func TestCleanPodDirsRemovesEmptyTreesOfGonePods(t *testing.T) {
	w := newHKWorld(t)
	w.mkdir("gone-1/volumes/kubernetes.io~empty-dir/scratch")
	w.mkdir("gone-1/volumes/kubernetes.io~local-volume")
	w.mkdir("gone-1/volume-state/kubernetes.io~csi")
	w.mkdir("gone-2") // a crash right after creating the pod directory
	w.mkdir("gone-3/volumes")
	desired := w.mkdir("desired/volumes/kubernetes.io~empty-dir/x")
	actual := w.mkdir("actual/volume-state/kubernetes.io~csi")
	// Entries of <root>/pods that are not directories are not pods.
	stray := w.file("stray", "")

	problems := CleanPodDirs(w.paths, hkDesired("desired"), hkActual("actual"), w.isMountPoint)
	if len(problems) != 0 {
		t.Errorf("problems: %+v", problems)
	}
	got := w.podDirs()
	if want := []string{"actual", "desired", "stray"}; !slices.Equal(got, want) {
		t.Errorf("left under pods/: %v, want %v", got, want)
	}
	for _, p := range []string{desired, actual, stray} {
		if !w.exists(p) {
			t.Errorf("%s removed", p)
		}
	}
	// Nothing of a busy pod was even looked at.
	for _, p := range w.asked {
		if strings.Contains(p, "/desired/") || strings.Contains(p, "/actual/") {
			t.Errorf("isMountPoint(%s) asked for a busy pod", p)
		}
	}
}

// Files, mount points, symbolic links and paths whose mount state cannot
// be read are never removed (nor anything below a mount point, nor what a
// link points to); they are reported once per pod with the pod directory,
// while the empty directories around them are removed.
func TestCleanPodDirsNeverDeletesFilesOrMountPoints(t *testing.T) {
	w := newHKWorld(t)
	outside := mounttest.TempDir(t)
	target := filepath.Join(outside, "precious")
	if err := os.WriteFile(target, []byte("data"), 0o640); err != nil {
		t.Fatal(err)
	}

	file := w.file("files/volumes/kubernetes.io~empty-dir/scratch/data.txt", "data")
	emptySibling := w.mkdir("files/volumes/kubernetes.io~empty-dir/empty")
	stateLeftover := w.file("files/volume-state/kubernetes.io~csi/.pv.json.tmp-1", "{")
	extra := w.file("files/etc-hosts", "127.0.0.1 localhost")

	mountPoint := w.mkdir("mounted/volumes/kubernetes.io~empty-dir/mem")
	w.mounted[mountPoint] = true
	below := w.file("mounted/volumes/kubernetes.io~empty-dir/mem/inside/f", "x") // "in" the mount
	emptyNext := w.mkdir("mounted/volumes/kubernetes.io~host-path/gone")

	link := filepath.Join(w.mkdir("links/volumes/kubernetes.io~empty-dir"), "l")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}

	failing := w.mkdir("unknown/volumes/kubernetes.io~local-volume/pv")
	w.failures[failing] = errors.New("stat: input/output error")

	before := hkTree(t, outside)
	problems := CleanPodDirs(w.paths, hkDesired(), hkActual(), w.isMountPoint)

	byPod := map[types.UID]Problem{}
	for _, p := range problems {
		if _, dup := byPod[p.PodUID]; dup {
			t.Errorf("pod %s reported twice", p.PodUID)
		}
		byPod[p.PodUID] = p
	}
	for uid, left := range map[types.UID][]string{
		"files":   {filepath.Dir(file), extra}, // the volume holding it, never walked
		"mounted": {mountPoint},
		"links":   {link},
		"unknown": {failing},
	} {
		p, ok := byPod[uid]
		if !ok {
			t.Errorf("pod %s not reported", uid)
			continue
		}
		delete(byPod, uid)
		if p.Path != w.paths.PodDir(uid) {
			t.Errorf("pod %s reported at %s, want its directory", uid, p.Path)
		}
		for _, l := range left {
			if !strings.Contains(p.Reason, l) {
				t.Errorf("pod %s: reason %q does not name %s", uid, p.Reason, l)
			}
			if !w.exists(l) {
				t.Errorf("%s was removed", l)
			}
		}
	}
	if !w.exists(file) {
		t.Errorf("%s was removed", file)
	}
	// The debris of an interrupted state write is the agent's own and is
	// never valid content: it goes.
	if w.exists(stateLeftover) {
		t.Errorf("%s (an interrupted atomic write) was left", stateLeftover)
	}
	for uid, p := range byPod {
		t.Errorf("unexpected problem for %s: %+v", uid, p)
	}
	if !w.exists(below) {
		t.Errorf("%s below a mount point was removed", below)
	}
	for _, p := range w.asked {
		if strings.HasPrefix(p, mountPoint+"/") {
			t.Errorf("looked below the mount point %s: %s", mountPoint, p)
		}
	}
	for _, p := range []string{emptySibling, emptyNext} {
		if w.exists(p) {
			t.Errorf("empty directory %s next to a leftover was kept", p)
		}
	}
	if after := hkTree(t, outside); !slices.Equal(before, after) {
		t.Errorf("the symbolic link's target changed: %v -> %v", before, after)
	}
	if got := mounttest.ReadFile(t, target); got != "data" {
		t.Errorf("link target content %q", got)
	}
}

// With a real tmpfs: the mount and its content survive, and so does the
// pod directory around it.
func TestCleanPodDirsRealMount(t *testing.T) {
	mounttest.RequireRoot(t)
	w := newHKWorld(t)
	mem := w.mkdir("gone/volumes/kubernetes.io~empty-dir/mem")
	mounttest.MountTmpfs(t, mem)
	data := filepath.Join(mem, "data")
	mounttest.WriteFile(t, data, "in memory")
	empty := w.mkdir("gone/volumes/kubernetes.io~empty-dir/disk")

	problems := CleanPodDirs(w.paths, hkDesired(), hkActual(), mountutil.New().IsMountPoint)
	if len(problems) != 1 || problems[0].PodUID != "gone" || !strings.Contains(problems[0].Reason, mem) {
		t.Errorf("problems: %+v", problems)
	}
	if len(mounttest.MountsAt(t, mem)) != 1 {
		t.Error("the tmpfs is gone")
	}
	if got := mounttest.ReadFile(t, data); got != "in memory" {
		t.Errorf("tmpfs content %q", got)
	}
	if w.exists(empty) {
		t.Error("empty directory next to the mount kept")
	}
	// Once unmounted (by its owner), the next pass removes the pod.
	if err := mounttest.UnmountUnder(mem); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(mem); err != nil {
		t.Fatal(err)
	}
	if problems := CleanPodDirs(w.paths, hkDesired(), hkActual(), mountutil.New().IsMountPoint); len(problems) != 0 {
		t.Errorf("second pass: %+v", problems)
	}
	if w.exists(w.paths.PodDir("gone")) {
		t.Error("pod directory kept once empty")
	}
}

func TestCleanPodDirsReportsAtMostFiveLeftovers(t *testing.T) {
	w := newHKWorld(t)
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		w.file("gone/volumes/kubernetes.io~empty-dir/"+name+"/f", "")
	}
	problems := CleanPodDirs(w.paths, hkDesired(), hkActual(), w.isMountPoint)
	if len(problems) != 1 {
		t.Fatalf("problems: %+v", problems)
	}
	r := problems[0].Reason
	if strings.Count(r, "empty-dir/") != 5 || !strings.Contains(r, "and 2 more") {
		t.Errorf("reason %q: want five paths and \"and 2 more\"", r)
	}
}

// A volume's content is the pod's: housekeeping reports a volume directory
// that is not empty and never walks into it (a pod may have left a tree
// deep enough to cost a recursive walk memory by the square of its depth).
func TestCleanPodDirsNeverWalksVolumeContent(t *testing.T) {
	w := newHKWorld(t)
	w.file("gone/volumes/kubernetes.io~empty-dir/v/"+strings.Repeat("d/", 50)+"f", "")
	var asked []string
	isMountPoint := func(p string) (bool, error) {
		asked = append(asked, p)
		return false, nil
	}
	problems := CleanPodDirs(w.paths, hkDesired(), hkActual(), isMountPoint)
	if len(problems) != 1 || !strings.HasSuffix(problems[0].Reason, "kubernetes.io~empty-dir/v") {
		t.Fatalf("problems: %+v, want the volume directory reported", problems)
	}
	for _, p := range asked {
		if strings.Contains(p, "empty-dir/v/") {
			t.Errorf("housekeeping looked inside the volume: %s", p)
		}
	}
}

func TestCleanPodDirsWithoutPodsDir(t *testing.T) {
	w := newHKWorld(t)
	if problems := CleanPodDirs(w.paths, hkDesired(), hkActual(), w.isMountPoint); problems != nil {
		t.Errorf("problems: %+v", problems)
	}
}

// --- Orphans ---

func TestOrphansReportOnceAndClear(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	o := NewOrphans(zap.New(core))
	a := Problem{Path: "/root/pods/a", PodUID: "a", Reason: "holds a file"}
	b := Problem{Path: "/root/plugins/x/mounts/y", Reason: "no state"}
	c := Problem{Path: "/root/pods/c", PodUID: "c", Reason: "unknown plugin"}

	o.Set("reconstruction", []Problem{b, a})
	if n := logs.Len(); n != 2 {
		t.Errorf("%d log lines for 2 new problems", n)
	}
	first := o.List()
	if len(first) != 2 || first[0].Problem != b || first[1].Problem != a {
		t.Fatalf("list %+v, want b and a (sorted by path)", first)
	}
	for _, e := range logs.TakeAll() {
		if e.ContextMap()["path"] == nil || e.ContextMap()["reason"] == nil {
			t.Errorf("log line without path or reason: %+v", e.ContextMap())
		}
	}

	// The same problems again (every housekeeping pass): no new lines, the
	// first sighting is kept.
	o.Set("reconstruction", []Problem{a, b})
	if n := logs.Len(); n != 0 {
		t.Errorf("repeated problems logged again: %d lines", n)
	}
	if again := o.List(); !slices.Equal(again, first) {
		t.Errorf("list changed: %+v -> %+v", first, again)
	}

	// Another kind does not replace the first.
	o.Set("housekeeping", []Problem{c})
	if got := o.List(); len(got) != 3 || logs.Len() != 1 {
		t.Errorf("after housekeeping: %+v (%d lines)", got, logs.Len())
	}
	logs.TakeAll()

	// A changed reason is a new report.
	a2 := a
	a2.Reason = "holds two files"
	o.Set("reconstruction", []Problem{a2, b})
	if lines := logs.TakeAll(); len(lines) != 1 || lines[0].ContextMap()["reason"] != a2.Reason {
		t.Errorf("changed reason: %d lines", len(lines))
	}

	// Solved problems disappear, of their kind only.
	o.Set("reconstruction", nil)
	got := o.List()
	if len(got) != 1 || got[0].Problem != c {
		t.Errorf("after clearing reconstruction: %+v", got)
	}
	o.Set("housekeeping", []Problem{})
	if got := o.List(); len(got) != 0 {
		t.Errorf("after clearing everything: %+v", got)
	}
	if n := logs.Len(); n != 0 {
		t.Errorf("clearing logged %d lines", n)
	}
	// A problem that comes back is reported again.
	o.Set("housekeeping", []Problem{c})
	if n := logs.Len(); n != 1 {
		t.Errorf("a problem that came back: %d lines", n)
	}
}

// A crash between preparing a pod's sub-paths and tearing its volume down
// (or a volume torn down by an older agent) leaves sub-path bind mounts of
// a gone pod: they are the agent's own and are removed, the volume they
// were bound from untouched; those of a pod still known are left alone.
func TestCleanPodDirsRemovesSubPathsOfGonePods(t *testing.T) {
	mounttest.RequireRoot(t)
	w := newHKWorld(t)
	vol := mounttest.TempDir(t)
	mounttest.WriteFile(t, filepath.Join(vol, "logs", "app.log"), "data")
	for _, uid := range []types.UID{"gone", "desired"} {
		for i, sub := range []string{"logs", "logs/app.log"} {
			target := w.paths.SubPathTarget(uid, "kubernetes.io/local-volume", "pv-1", "app", i)
			if err := (subpath.Host{Mounter: mountutil.New()}).Prepare(subpath.Request{VolumeDir: vol, SubPath: sub, Target: target}); err != nil {
				t.Fatal(err)
			}
		}
	}
	problems := CleanPodDirs(w.paths, hkDesired("desired"), hkActual(), w.isMountPoint)
	if len(problems) != 0 {
		t.Errorf("problems: %+v", problems)
	}
	if got := w.podDirs(); !slices.Equal(got, []string{"desired"}) {
		t.Errorf("left under pods/: %v", got)
	}
	if n := len(mounttest.MountsUnder(t, w.paths.PodSubPathsDir("desired"))); n != 2 {
		t.Errorf("%d sub-path mounts of the desired pod left, want its 2", n)
	}
	if got := mounttest.ReadFile(t, filepath.Join(vol, "logs", "app.log")); got != "data" {
		t.Errorf("the volume's file now holds %q", got)
	}
}
