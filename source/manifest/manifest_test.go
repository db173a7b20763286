package manifest

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/volume-agent/volume-agent/source"
)

func pod(name string, extra ...string) string {
	s := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name + "\n"
	for _, e := range extra {
		s += e + "\n"
	}
	return s
}

func docs(d ...string) string { return strings.Join(d, "---\n") }

func write(t testing.TB, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// replace writes content the way editors and kubectl do: to a temporary
// file, then renamed over the target. The new inode makes the change visible
// to a scan even within one timestamp tick.
func replace(t testing.TB, dir, name, content string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	write(t, dir, filepath.Base(tmp), content)
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func remove(t testing.TB, dir, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func newSource(t testing.TB, dir, node string, log *zap.Logger) *Source {
	t.Helper()
	s, err := New(Options{Dir: dir, NodeName: node, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// rescan runs one scan the way Run does, without the watcher, so tests of
// what a scan produces do not depend on timing.
func rescan(s *Source) { s.scan(nil, nil, false) }

func podNames(s source.Store) []string {
	var names []string
	for _, p := range s.Pods() {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	return names
}

func errorsOf(s *Source) string {
	var b strings.Builder
	for _, e := range s.InputErrors() {
		fmt.Fprintf(&b, "%s: %s\n", filepath.Base(e.Input), e.Error)
	}
	return b.String()
}

func drain(s *Source) bool {
	select {
	case <-s.Changed():
		return true
	default:
		return false
	}
}

func TestReadDirectory(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	write(t, dir, "a.yaml", docs(pod("b"), pod("a", "  namespace: z"),
		"apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: c}\n"))
	write(t, dir, "b.json", `{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"sc"},"provisioner":"p"}`)
	write(t, dir, "c.YML", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: PersistentVolume, metadata: {name: pv}}\n- {apiVersion: storage.k8s.io/v1, kind: CSIDriver, metadata: {name: drv}}\n")
	write(t, dir, ".hidden.yaml", pod("hidden"))
	write(t, dir, "notes.txt", pod("txt"))
	write(t, dir, "pod.yaml~", pod("backup"))
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "sub.yaml"), "nested.yaml", pod("nested"))
	write(t, outside, "linked.yaml", pod("linked"))
	for link, target := range map[string]string{
		"linked.yaml":   filepath.Join(outside, "linked.yaml"),
		"dirlink.yaml":  outside,
		"dangling.yaml": filepath.Join(outside, "missing.yaml"),
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}

	s := newSource(t, dir, "node", nil)
	if s.HasSynced() {
		t.Fatal("synced before reading")
	}
	rescan(s)
	if got, want := podNames(s), []string{"default/b", "default/linked", "z/a"}; !slices.Equal(got, want) {
		t.Errorf("pods = %q, want %q", got, want)
	}
	if e := errorsOf(s); e != "" {
		t.Errorf("unexpected errors:\n%s", e)
	}
	if _, err := s.PVC("default", "c"); err != nil {
		t.Error(err)
	}
	if _, err := s.PVC("", "c"); err != nil {
		t.Errorf("empty namespace: %v", err)
	}
	if _, err := s.PV("pv"); err != nil {
		t.Error(err)
	}
	if _, err := s.StorageClass("sc"); err != nil {
		t.Error(err)
	}
	if _, err := s.CSIDriver("drv"); err != nil {
		t.Error(err)
	}
	for what, err := range map[string]error{
		"pvc":          second(s.PVC("other", "c")),
		"pv":           second(s.PV("nope")),
		"storageclass": second(s.StorageClass("nope")),
		"csidriver":    second(s.CSIDriver("nope")),
	} {
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s: err = %v, want NotFound", what, err)
		}
	}
	// The pods slice is the caller's.
	pods := s.Pods()
	pods[0] = nil
	if s.Pods()[0] == nil {
		t.Error("Pods returned the store's own slice")
	}
}

func second[T any](_ T, err error) error { return err }

func TestStableUIDsAcrossInstances(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "p.yaml", docs(pod("web"), "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data}\n",
		"apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: vol}\n"))
	var uids [2][3]string
	for i := range uids {
		s := newSource(t, dir, "", nil)
		rescan(s)
		pvc, _ := s.PVC("default", "data")
		pv, _ := s.PV("vol")
		uids[i] = [3]string{string(s.Pods()[0].UID), string(pvc.UID), string(pv.UID)}
	}
	if uids[0] != uids[1] {
		t.Errorf("UIDs differ between instances: %q, %q", uids[0], uids[1])
	}
	if uids[0][0] == "" || uids[0][0] == uids[0][1] || uids[0][1] == uids[0][2] {
		t.Errorf("bad derived UIDs %q", uids[0])
	}
}

func TestBinding(t *testing.T) {
	const pvc = `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: ns%s}
spec: {volumeName: vol}
%s`
	const pv = `apiVersion: v1
kind: PersistentVolume
metadata: {name: vol}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  claimRef: {namespace: %s, name: %s%s}
`
	tests := []struct {
		name      string
		pvc, pv   string
		wantPhase corev1.PersistentVolumeClaimPhase
		wantPV    corev1.PersistentVolumePhase
	}{
		{"bound", fmt.Sprintf(pvc, "", ""), fmt.Sprintf(pv, "ns", "data", ""), corev1.ClaimBound, corev1.VolumeBound},
		{"bound with uids", fmt.Sprintf(pvc, ", uid: u1", ""), fmt.Sprintf(pv, "ns", "data", ", uid: u1"), corev1.ClaimBound, corev1.VolumeBound},
		{"claimRef names another claim", fmt.Sprintf(pvc, "", ""), fmt.Sprintf(pv, "ns", "other", ""), corev1.ClaimPending, corev1.VolumeAvailable},
		{"claimRef in another namespace", fmt.Sprintf(pvc, "", ""), fmt.Sprintf(pv, "default", "data", ""), corev1.ClaimPending, corev1.VolumeAvailable},
		{"claimRef uid mismatch", fmt.Sprintf(pvc, ", uid: u1", ""), fmt.Sprintf(pv, "ns", "data", ", uid: u2"), corev1.ClaimPending, corev1.VolumeAvailable},
		{"volume missing", fmt.Sprintf(pvc, "", ""), "", corev1.ClaimPending, ""},
		{"phase from the manifest", fmt.Sprintf(pvc, "", "status: {phase: Lost}"), fmt.Sprintf(pv, "ns", "data", ""), corev1.ClaimLost, corev1.VolumeBound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "pvc.yaml", tt.pvc)
			if tt.pv != "" {
				write(t, dir, "pv.yaml", tt.pv)
			}
			s := newSource(t, dir, "", nil)
			rescan(s)
			if e := errorsOf(s); e != "" {
				t.Fatalf("errors: %s", e)
			}
			c, err := s.PVC("ns", "data")
			if err != nil {
				t.Fatal(err)
			}
			if c.Status.Phase != tt.wantPhase {
				t.Errorf("claim phase = %q, want %q", c.Status.Phase, tt.wantPhase)
			}
			if tt.pv == "" {
				return
			}
			v, err := s.PV("vol")
			if err != nil {
				t.Fatal(err)
			}
			if v.Status.Phase != tt.wantPV {
				t.Errorf("volume phase = %q, want %q", v.Status.Phase, tt.wantPV)
			}
			if tt.wantPV == corev1.VolumeBound {
				if v.Spec.ClaimRef.UID != c.UID {
					t.Errorf("claimRef.uid = %q, want %q", v.Spec.ClaimRef.UID, c.UID)
				}
				if q := c.Status.Capacity[corev1.ResourceStorage]; q.String() != "1Gi" || len(c.Status.AccessModes) != 1 {
					t.Errorf("claim status not filled: %+v", c.Status)
				}
			}
		})
	}
}

func TestBindingCopiesOnWrite(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a-pvc.yaml", "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data}\nspec: {volumeName: vol}\n")
	s := newSource(t, dir, "", nil)
	rescan(s)
	before, _ := s.PVC("default", "data")
	if before.Status.Phase != corev1.ClaimPending {
		t.Fatalf("phase = %q", before.Status.Phase)
	}
	write(t, dir, "b-pv.yaml", "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: vol}\nspec: {claimRef: {name: data}}\n")
	rescan(s)
	after, _ := s.PVC("default", "data")
	if after.Status.Phase != corev1.ClaimBound {
		t.Fatalf("phase = %q", after.Status.Phase)
	}
	if before.Status.Phase != corev1.ClaimPending {
		t.Error("a published claim was modified")
	}
	// The decoded objects stay as the files say, so a later rebuild starts
	// from them again.
	for _, st := range s.files {
		for _, o := range st.objects {
			switch obj := o.obj.(type) {
			case *corev1.PersistentVolume:
				if obj.Spec.ClaimRef.UID != "" || obj.Status.Phase != "" {
					t.Error("decoded volume was modified")
				}
			case *corev1.PersistentVolumeClaim:
				if obj.Status.Phase != "" {
					t.Error("decoded claim was modified")
				}
			}
		}
	}
	// Rebuilding for an unrelated change keeps the normalised objects.
	write(t, dir, "c.yaml", pod("p"))
	rescan(s)
	if again, _ := s.PVC("default", "data"); again != after {
		t.Error("unchanged claim got a new pointer")
	}
}

func TestMalformedFileKeepsObjects(t *testing.T) {
	dir := t.TempDir()
	core, logs := observer.New(zapcore.InfoLevel)
	s := newSource(t, dir, "", zap.New(core))
	replace(t, dir, "a.yaml", docs(pod("x"), pod("w")))
	write(t, dir, "b.yaml", pod("other"))
	rescan(s)
	if !drain(s) {
		t.Error("no change notified")
	}
	want := []string{"default/other", "default/w", "default/x"}

	for _, broken := range []struct{ name, content, err string }{
		{"syntax", docs(pod("x"), "kind: [\n"), "a.yaml: document 2 (line 5): invalid YAML"},
		{"half written", "apiVersion: v1\nkind: Pod\nmeta", "a.yaml: document 1 (line 1)"},
		{"empty", "", "a.yaml: file is empty"},
		{"nameless pod", docs(pod("x"), "apiVersion: v1\nkind: Pod\n"), "a.yaml: document 2 (line 5): Pod: metadata.name is required"},
	} {
		replace(t, dir, "a.yaml", broken.content)
		rescan(s)
		if got := podNames(s); !slices.Equal(got, want) {
			t.Errorf("%s: pods = %q, want %q", broken.name, got, want)
		}
		e := errorsOf(s)
		if !strings.HasPrefix(e, broken.err) || !strings.Contains(e, "keeping the 2 objects") {
			t.Errorf("%s: errors = %q, want %q", broken.name, e, broken.err)
		}
		if s.InputErrors()[0].Input != filepath.Join(s.Dir(), "a.yaml") {
			t.Errorf("input = %q", s.InputErrors()[0].Input)
		}
	}
	if !drain(s) {
		t.Error("no change notified for the error")
	}
	warnings := logs.FilterMessageSnippet("Malformed").Len()
	if warnings != 4 {
		t.Errorf("%d warnings logged for 4 changes", warnings)
	}
	// Rescans of an unchanged broken file are silent.
	s.scan(map[string]bool{"a.yaml": true}, nil, true)
	rescan(s)
	if n := logs.FilterMessageSnippet("Malformed").Len(); n != warnings {
		t.Errorf("rescans logged %d more warnings", n-warnings)
	}
	if drain(s) {
		t.Error("rescan of an unchanged directory notified")
	}

	replace(t, dir, "a.yaml", pod("x"))
	rescan(s)
	if got := podNames(s); !slices.Equal(got, []string{"default/other", "default/x"}) {
		t.Errorf("fixed: pods = %q", got)
	}
	if e := errorsOf(s); e != "" {
		t.Errorf("fixed file still has errors: %s", e)
	}

	// A file that was never good has no objects to keep.
	write(t, dir, "c.yaml", "kind: [")
	rescan(s)
	if got := podNames(s); len(got) != 2 {
		t.Errorf("pods = %q", got)
	}
	if e := errorsOf(s); !strings.HasPrefix(e, "c.yaml: document 1 (line 1): invalid YAML") || strings.Contains(e, "keeping") {
		t.Errorf("errors = %q", e)
	}
}

func TestUnreadableFileKeepsObjects(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads files whatever their mode")
	}
	dir := t.TempDir()
	write(t, dir, "a.yaml", pod("x"))
	s := newSource(t, dir, "", nil)
	rescan(s)
	if err := os.Chmod(filepath.Join(dir, "a.yaml"), 0); err != nil {
		t.Fatal(err)
	}
	rescan(s)
	if got := podNames(s); len(got) != 1 {
		t.Errorf("pods = %q", got)
	}
	if e := errorsOf(s); !strings.Contains(e, "cannot read file") {
		t.Errorf("errors = %q", e)
	}
}

func TestNoChangeNoNotification(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", docs(pod("x"), pod("w")))
	write(t, dir, "other-node.yaml", pod("z", "spec: {nodeName: elsewhere}"))
	s := newSource(t, dir, "here", nil)
	rescan(s)
	drain(s)
	before := s.Pods()

	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "a.yaml"), later, later); err != nil {
		t.Fatal(err)
	}
	rescan(s)
	// Same objects, other bytes: re-parsed, but nothing changes.
	replace(t, dir, "a.yaml", "# reformatted\n"+docs(pod("x"), pod("w")))
	rescan(s)
	// A pod of another node changed: not ours.
	replace(t, dir, "other-node.yaml", pod("z2", "spec: {nodeName: elsewhere}"))
	rescan(s)
	if drain(s) {
		t.Error("notified without a change")
	}
	if after := s.Pods(); !slices.Equal(before, after) {
		t.Error("unchanged pods got new pointers")
	}

	replace(t, dir, "a.yaml", docs(pod("x"), pod("w", "  labels: {a: b}")))
	rescan(s)
	if !drain(s) {
		t.Error("no notification for a change")
	}
	after := s.Pods()
	if after[0] == before[0] || after[1] != before[1] {
		t.Error("only the changed pod should get a new pointer")
	}
}

func TestRemovedFileDeletesObjects(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", docs(pod("x"), "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: c}\n"))
	write(t, dir, "b.yaml", pod("w"))
	s := newSource(t, dir, "", nil)
	rescan(s)
	remove(t, dir, "a.yaml")
	rescan(s)
	if got := podNames(s); !slices.Equal(got, []string{"default/w"}) {
		t.Errorf("pods = %q", got)
	}
	if _, err := s.PVC("default", "c"); !apierrors.IsNotFound(err) {
		t.Errorf("claim of a removed file: %v", err)
	}
}

func TestDuplicates(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", docs(pod("web", "  labels: {from: a}"), pod("web", "  labels: {from: a2}")))
	write(t, dir, "b.yaml", docs(pod("solo"), pod("web", "  labels: {from: b}")))
	write(t, dir, "c.yaml", pod("same-uid", "  uid: fixed")+"---\n"+pod("uid-twin", "  uid: fixed"))
	s := newSource(t, dir, "", nil)
	rescan(s)
	if got := podNames(s); !slices.Equal(got, []string{"default/same-uid", "default/solo", "default/web"}) {
		t.Errorf("pods = %q", got)
	}
	if web := s.Pods()[2]; web.Labels["from"] != "a" {
		t.Errorf("web comes from %q, want the first document of a.yaml", web.Labels["from"])
	}
	want := "a.yaml: document 2 (line 6): duplicate Pod default/web, already defined in a.yaml document 1 (line 1); ignored\n" +
		"b.yaml: document 2 (line 5): duplicate Pod default/web, already defined in a.yaml document 1 (line 1); ignored\n" +
		"c.yaml: document 2 (line 6): Pod default/uid-twin has the same metadata.uid \"fixed\" as Pod default/same-uid in c.yaml document 1 (line 1); ignored\n"
	if e := errorsOf(s); e != want {
		t.Errorf("errors:\n%s\nwant:\n%s", e, want)
	}

	remove(t, dir, "a.yaml")
	rescan(s)
	if web := s.Pods()[2]; web.Labels["from"] != "b" {
		t.Errorf("web comes from %q after a.yaml went, want b", web.Labels["from"])
	}
	if e := errorsOf(s); strings.Contains(e, "duplicate") {
		t.Errorf("duplicate error stayed: %s", e)
	}
}

func TestUnknownKindKeepsRest(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", docs(pod("x"), "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"))
	s := newSource(t, dir, "", nil)
	rescan(s)
	if got := podNames(s); !slices.Equal(got, []string{"default/x"}) {
		t.Errorf("pods = %q", got)
	}
	if e := errorsOf(s); e != "a.yaml: document 2 (line 5): unsupported kind \"Deployment\" (apiVersion \"apps/v1\"); ignored\n" {
		t.Errorf("errors = %q", e)
	}
}

func TestUnsafeUIDRejected(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", pod("x"))
	s := newSource(t, dir, "", nil)
	rescan(s)
	replace(t, dir, "a.yaml", pod("x", "  uid: ../../../etc"))
	rescan(s)
	if e := errorsOf(s); !strings.Contains(e, `metadata.uid "../../../etc"`) {
		t.Errorf("errors = %q", e)
	}
	if p := s.Pods(); len(p) != 1 || p[0].UID != derivedUID(kindPod, "default", "x") {
		t.Errorf("pods = %v", p)
	}
}

func TestNodeFilter(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", docs(pod("mine", "spec: {nodeName: n1}"), pod("any"), pod("theirs", "spec: {nodeName: n2}")))
	s := newSource(t, dir, "n1", nil)
	rescan(s)
	if got := podNames(s); !slices.Equal(got, []string{"default/any", "default/mine"}) {
		t.Errorf("pods = %q", got)
	}
	if e := errorsOf(s); e != "" {
		t.Errorf("errors = %q", e)
	}
}

func TestDirectoryMissing(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope")
	if _, err := New(Options{Dir: missing}); err == nil || !strings.Contains(err.Error(), missing+" does not exist") {
		t.Errorf("New: err = %v", err)
	}
	write(t, dir, "file", "")
	if _, err := New(Options{Dir: filepath.Join(dir, "file")}); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("New on a file: err = %v", err)
	}

	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	s := newSource(t, sub, "", nil)
	if err := os.Remove(sub); err != nil {
		t.Fatal(err)
	}
	if err := s.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Run: err = %v", err)
	}

	// Losing the directory later keeps what was read from it.
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, sub, "a.yaml", pod("x"))
	s = newSource(t, sub, "", nil)
	rescan(s)
	if err := os.RemoveAll(sub); err != nil {
		t.Fatal(err)
	}
	rescan(s)
	if got := podNames(s); len(got) != 1 {
		t.Errorf("pods = %q", got)
	}
	if e := s.InputErrors(); len(e) != 1 || e[0].Input != sub || !strings.Contains(e[0].Error, "cannot read directory") {
		t.Errorf("errors = %+v", e)
	}
}

// run starts s and waits for its first read.
func run(t *testing.T, s *Source) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitFor(t, s, "first sync", s.HasSynced)
}

// waitFor polls cond until it holds or a deadline passes, waking early on
// every change notification.
func waitFor(t *testing.T, s *Source, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-s.Changed():
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; pods %q, errors %q", what, podNames(s), errorsOf(s))
		}
	}
}

func hasPods(s *Source, want ...string) func() bool {
	return func() bool { return slices.Equal(podNames(s), want) }
}

func TestWatch(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", pod("a"))
	s := newSource(t, dir, "", nil)
	run(t, s)
	if got := podNames(s); !slices.Equal(got, []string{"default/a"}) {
		t.Fatalf("pods after sync = %q", got)
	}
	if err := s.Run(t.Context()); err == nil {
		t.Error("second Run succeeded")
	}

	write(t, dir, "b.yaml", pod("b"))
	waitFor(t, s, "created file", hasPods(s, "default/a", "default/b"))

	write(t, dir, "b.yaml", docs(pod("b"), pod("b2")))
	waitFor(t, s, "file written in place", hasPods(s, "default/a", "default/b", "default/b2"))

	replace(t, dir, "b.yaml", pod("b3"))
	waitFor(t, s, "file renamed into place", hasPods(s, "default/a", "default/b3"))

	write(t, dir, "b.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: [")
	waitFor(t, s, "error on a broken file", func() bool { return strings.Contains(errorsOf(s), "b.yaml: document 1") })
	if got := podNames(s); !slices.Equal(got, []string{"default/a", "default/b3"}) {
		t.Errorf("pods of a broken file = %q", got)
	}

	write(t, dir, "b.yaml", pod("b4"))
	waitFor(t, s, "fixed file", hasPods(s, "default/a", "default/b4"))
	if e := errorsOf(s); e != "" {
		t.Errorf("errors after fix: %q", e)
	}

	remove(t, dir, "a.yaml")
	waitFor(t, s, "removed file", hasPods(s, "default/b4"))

	if err := os.Rename(filepath.Join(dir, "b.yaml"), filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "renamed file", func() bool {
		p := s.Pods()
		return len(p) == 1 && p[0].Name == "b4" && s.InputErrors() == nil
	})
	if err := os.Rename(filepath.Join(dir, "c.yaml"), filepath.Join(dir, "c.yaml.disabled")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "file renamed away", hasPods(s))
}

// TestWatchSymlinkSwap follows a directory laid out like a mounted
// ConfigMap: the files are symlinks through "..data", which is replaced
// atomically; no event names the files themselves.
func TestWatchSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	v1, v2 := filepath.Join(dir, "..v1"), filepath.Join(dir, "..v2")
	for _, d := range []string{v1, v2} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, v1, "pods.yaml", pod("one"))
	write(t, v2, "pods.yaml", docs(pod("one"), pod("two")))
	mustSymlink(t, "..v1", filepath.Join(dir, "..data"))
	mustSymlink(t, "..data/pods.yaml", filepath.Join(dir, "pods.yaml"))

	s := newSource(t, dir, "", nil)
	run(t, s)
	waitFor(t, s, "first version", hasPods(s, "default/one"))

	mustSymlink(t, "..v2", filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "second version", hasPods(s, "default/one", "default/two"))
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestWatchDirectoryRecreated(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the watch to be retried")
	}
	parent := t.TempDir()
	dir := filepath.Join(parent, "manifests")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, dir, "a.yaml", pod("a"))
	s := newSource(t, dir, "", nil)
	run(t, s)

	// Moved away in one step: removing the files first would rightly
	// delete their pods.
	if err := os.Rename(dir, filepath.Join(parent, "old")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "directory error", func() bool { return strings.Contains(errorsOf(s), "cannot read directory") })
	if got := podNames(s); !slices.Equal(got, []string{"default/a"}) {
		t.Errorf("pods after the directory went = %q", got)
	}

	// Replaced by a rename, as a deployment tool would.
	next := filepath.Join(parent, "next")
	if err := os.Mkdir(next, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, next, "b.yaml", pod("b"))
	if err := os.Rename(next, dir); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "new directory", hasPods(s, "default/b"))
	if e := errorsOf(s); e != "" {
		t.Errorf("errors = %q", e)
	}
	write(t, dir, "c.yaml", pod("c"))
	waitFor(t, s, "events from the new directory", hasPods(s, "default/b", "default/c"))
}

func TestConcurrentReaders(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "pvc.yaml", "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: c}\nspec: {volumeName: v}\n")
	s := newSource(t, dir, "", nil)
	run(t, s)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, p := range s.Pods() {
					_ = p.Spec.Volumes
				}
				if c, err := s.PVC("default", "c"); err == nil {
					_ = c.Status.Phase
				}
				if v, err := s.PV("v"); err == nil {
					_ = v.Spec.ClaimRef.UID
				}
				_ = s.InputErrors()
			}
		})
	}
	for i := range 20 {
		write(t, dir, fmt.Sprintf("p%d.yaml", i%5), pod(fmt.Sprintf("p%d", i)))
		if i%2 == 0 {
			replace(t, dir, "pv.yaml", "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: v}\nspec: {claimRef: {name: c}}\n")
		} else {
			remove(t, dir, "pv.yaml")
		}
	}
	waitFor(t, s, "last writes", hasPods(s, "default/p15", "default/p16", "default/p17", "default/p18", "default/p19"))
	close(stop)
	wg.Wait()
}

func TestConfigMapsAndSecrets(t *testing.T) {
	dir := t.TempDir()
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\ndata: {app.conf: \"x=1\"}\nbinaryData: {raw: AAEC}\n"
	secret := "apiVersion: v1\nkind: Secret\nmetadata: {name: creds, namespace: team}\ndata: {user: YWRtaW4=}\nstringData: {password: hunter2}\n"
	write(t, dir, "objects.yaml", docs(cm, secret))
	s := newSource(t, dir, "here", nil)
	type change struct{ kind, ns, name string }
	var changes []change
	s.OnObjectChange(func(kind, ns, name string) { changes = append(changes, change{kind, ns, name}) })
	rescan(s)

	c, err := s.ConfigMap("default", "app")
	if err != nil || c.Data["app.conf"] != "x=1" || string(c.BinaryData["raw"]) != "\x00\x01\x02" {
		t.Fatalf("ConfigMap = %+v, %v", c, err)
	}
	sec, err := s.Secret("team", "creds")
	if err != nil || string(sec.Data["user"]) != "admin" || string(sec.Data["password"]) != "hunter2" || sec.StringData != nil {
		t.Fatalf("Secret = %+v, %v (stringData must be merged into data, as the API server does)", sec, err)
	}
	if _, err := s.Secret("default", "creds"); !apierrors.IsNotFound(err) {
		t.Errorf("a Secret of another namespace: %v, want NotFound", err)
	}
	if len(changes) != 2 {
		t.Errorf("changes after the first read: %v", changes)
	}

	// Reformatted, same objects: no change reported.
	changes = nil
	replace(t, dir, "objects.yaml", "# comment\n"+docs(cm, secret))
	rescan(s)
	if len(changes) != 0 {
		t.Errorf("unchanged objects reported as changed: %v", changes)
	}

	// One key edited: only that object.
	replace(t, dir, "objects.yaml", docs(strings.Replace(cm, "x=1", "x=2", 1), secret))
	rescan(s)
	if len(changes) != 1 || changes[0] != (change{"ConfigMap", "default", "app"}) {
		t.Errorf("changes after an edit: %v", changes)
	}

	// Removed: reported, NotFound.
	changes = nil
	replace(t, dir, "objects.yaml", docs(strings.Replace(cm, "x=1", "x=2", 1)))
	rescan(s)
	if len(changes) != 1 || changes[0] != (change{"Secret", "team", "creds"}) {
		t.Errorf("changes after removing the secret: %v", changes)
	}
	if _, err := s.Secret("team", "creds"); !apierrors.IsNotFound(err) {
		t.Errorf("removed Secret: %v", err)
	}
}

func TestInvalidConfigMapKey(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "bad.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad}\ndata: {\"../x\": \"1\"}\n")
	s := newSource(t, dir, "here", nil)
	rescan(s)
	if e := errorsOf(s); !strings.Contains(e, `key "../x"`) {
		t.Errorf("errors = %q", e)
	}
	if _, err := s.ConfigMap("default", "bad"); !apierrors.IsNotFound(err) {
		t.Errorf("a ConfigMap with an invalid key was served: %v", err)
	}
}

// A scan of many files publishes as it goes, so that the first pods are
// being set up while the rest are read; the number of publications grows
// with the logarithm of the files (each rebuild is over all of them).
func TestScanPublishesBeforeTheLastFile(t *testing.T) {
	dir := t.TempDir()
	const files = 200
	for i := range files {
		cm := fmt.Sprintf("{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"cm-%03d\",\"namespace\":\"ns\"}}", i)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("cm-%03d.json", i)), []byte(cm), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := newSource(t, dir, "node-1", nil)
	var seen []int // ConfigMaps published, at each publication
	s.OnObjectChange(func(kind, ns, name string) {
		n := len(s.snap.Load().configMaps)
		if len(seen) == 0 || seen[len(seen)-1] != n {
			seen = append(seen, n)
		}
	})
	rescan(s)
	if len(seen) < 2 || seen[0] >= files || seen[len(seen)-1] != files {
		t.Fatalf("ConfigMaps visible at each publication: %v; want a first one before all %d and the last with all", seen, files)
	}
	if len(seen) > 10 {
		t.Errorf("%d publications for %d files: %v", len(seen), files, seen)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Errorf("publications not growing: %v", seen)
		}
	}
}

// When files went in the same scan, the new state is published at once: a
// pod moved from a removed file to a new one must not be seen twice.
func TestScanWithRemovalsPublishesOnce(t *testing.T) {
	dir := t.TempDir()
	write := func(name, cm string) {
		t.Helper()
		data := fmt.Sprintf("{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":%q,\"namespace\":\"ns\"}}", cm)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("zz-old.json", "moved")
	s := newSource(t, dir, "node-1", nil)
	rescan(s)
	if err := os.Remove(filepath.Join(dir, "zz-old.json")); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		write(fmt.Sprintf("cm-%03d.json", i), fmt.Sprintf("cm-%03d", i))
	}
	write("aa-new.json", "moved")
	publications := map[int]bool{}
	s.OnObjectChange(func(kind, ns, name string) { publications[len(s.snap.Load().configMaps)] = true })
	rescan(s)
	if len(publications) != 1 || !publications[101] {
		t.Errorf("ConfigMaps at each publication: %v, want one publication of 101", publications)
	}
	if errs := s.InputErrors(); len(errs) != 0 {
		t.Errorf("input errors: %v", errs)
	}
}

// Files written to a temporary name and renamed into place, a few at a
// time, are read by name: the directory is not read again for each batch
// (with 2,000 files that cost seconds of stats after the last one).
func TestWatchBurstReadsOnlyChangedFiles(t *testing.T) {
	dir := t.TempDir()
	s := newSource(t, dir, "", nil)
	run(t, s)
	before := s.wholeScans.Load()
	var want []string
	for i := range 60 {
		name := fmt.Sprintf("p%02d", i)
		replace(t, dir, name+".yaml", pod(name))
		want = append(want, "default/"+name)
	}
	waitFor(t, s, "all pods", hasPods(s, want...))
	if n := s.wholeScans.Load() - before; n != 0 {
		t.Errorf("%d reads of the whole directory for files renamed into place", n)
	}
	// Removing one file removes its pod and only it.
	if err := os.Remove(filepath.Join(dir, "p07.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "pod of the removed file gone", hasPods(s, slices.Delete(slices.Clone(want), 7, 8)...))
}

// scanFiles looks at the files it is given and no other: a change without
// an event waits for a whole scan.
func TestScanFilesIsPartial(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", pod("a"))
	write(t, dir, "b.yaml", pod("b"))
	s := newSource(t, dir, "", nil)
	rescan(s)
	replace(t, dir, "a.yaml", pod("a2"))
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	s.scanFiles(map[string]bool{"a.yaml": true})
	if got, want := podNames(s), []string{"default/a2", "default/b"}; !slices.Equal(got, want) {
		t.Errorf("after reading a.yaml alone: %q, want %q", got, want)
	}
	rescan(s)
	if got, want := podNames(s), []string{"default/a2"}; !slices.Equal(got, want) {
		t.Errorf("after a whole scan: %q, want %q", got, want)
	}
}

// A manifest that resolves through a symlink goes when the symlink does,
// although no event names the manifest.
func TestWatchSymlinkRemoved(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "..v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "..v1"), "pods.yaml", pod("one"))
	mustSymlink(t, "..v1", filepath.Join(dir, "..data"))
	mustSymlink(t, "..data/pods.yaml", filepath.Join(dir, "pods.yaml"))
	s := newSource(t, dir, "", nil)
	run(t, s)
	waitFor(t, s, "pod", hasPods(s, "default/one"))
	if err := os.Remove(filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "pod gone with the symlink", hasPods(s))
}

// TestNamesFollowFiles: the sorted names a rebuild visits stay the keys of
// the file states through any sequence of additions and removals.
func TestNamesFollowFiles(t *testing.T) {
	s := &Source{files: map[string]*fileState{}}
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		name := fmt.Sprintf("f%02d.yaml", r.IntN(40))
		if r.IntN(2) == 0 {
			if s.files[name] == nil {
				s.addFile(name, &fileState{})
			}
		} else {
			s.removeFile(name)
		}
		if want := slices.Sorted(maps.Keys(s.files)); !slices.Equal(s.names, want) {
			t.Fatalf("step %d: names %v, files %v", i, s.names, want)
		}
	}
}

// TestPatchedSnapshotMatchesFullRebuild holds the patched snapshots (only
// the pods of changed files replaced) to what rebuilding the whole store
// gives, over random changes to a directory: pods coming and going, pods
// moving between files, duplicate names and UIDs, claims, ConfigMaps,
// warnings and malformed files.
func TestPatchedSnapshotMatchesFullRebuild(t *testing.T) {
	dir := t.TempDir()
	s := newSource(t, dir, "", zap.NewNop())
	r := rand.New(rand.NewPCG(11, 12))
	randomDoc := func() string {
		switch r.IntN(40) {
		case 0:
			return "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: c" + fmt.Sprint(r.IntN(3)) + "\nspec:\n  volumeName: pv0\n"
		case 1:
			return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm" + fmt.Sprint(r.IntN(3)) + "\ndata:\n  k: v" + fmt.Sprint(r.IntN(2)) + "\n"
		case 2:
			return "apiVersion: v1\nkind: Unsupported\nmetadata:\n  name: x\n" // a warning
		case 3:
			return pod(fmt.Sprintf("p%d", r.IntN(100)), fmt.Sprintf("  uid: shared-%d", r.IntN(2))) // UIDs shared now and then
		}
		return pod(fmt.Sprintf("p%d", r.IntN(100)), fmt.Sprintf("  namespace: ns%d", r.IntN(2)), fmt.Sprintf("  labels: {v: \"%d\"}", r.IntN(2)))
	}
	patched, listed := 0, 0
	s.TakePodChanges() // the first take says all
	for step := range 600 {
		prev := s.snap.Load()
		names := map[string]bool{}
		for range r.IntN(3) + 1 {
			name := fmt.Sprintf("f%02d.yaml", r.IntN(24))
			names[name] = true
			switch k := r.IntN(30); {
			case k < 6:
				_ = os.Remove(filepath.Join(dir, name))
			case k == 6:
				replace(t, dir, name, "kind: [") // malformed: its last good objects stay
			default:
				var d []string
				for range r.IntN(3) + 1 {
					d = append(d, randomDoc())
				}
				replace(t, dir, name, docs(d...))
			}
		}
		before := s.patches
		if r.IntN(3) == 0 {
			rescan(s)
		} else {
			s.scanFiles(names)
		}
		patched += s.patches - before
		got := s.snap.Load()
		want := s.built(got)
		if !got.equal(want) || !slices.Equal(got.unread, want.unread) {
			t.Fatalf("step %d: the published snapshot differs from a full rebuild:\npods %v\nwant %v\nerrors %v\nwant   %v",
				step, podKeys(got.pods), podKeys(want.pods), got.errors, want.errors)
		}
		// Every pod that came, went or changed is among the pod changes,
		// unless they say all; the current pods are found by key.
		all, keys := s.TakePodChanges()
		if !all {
			listed++
			for key, p := range podsByKey(prev.pods) {
				if q, _ := s.Pod(key.Namespace, key.Name); q != p {
					if _, ok := keys[key]; !ok {
						t.Fatalf("step %d: pod %v changed but is not among the changes %v", step, key, keys)
					}
				}
			}
		}
		for key, p := range podsByKey(got.pods) {
			if q, ok := s.Pod(key.Namespace, key.Name); !ok || q != p {
				t.Fatalf("step %d: Pod(%v) = %v, %v", step, key, q, ok)
			}
			if _, was := podsByKey(prev.pods)[key]; !all && !was {
				if _, ok := keys[key]; !ok {
					t.Fatalf("step %d: pod %v came but is not among the changes %v", step, key, keys)
				}
			}
		}
	}
	t.Logf("%d of 600 snapshots patched, %d steps' pod changes listed", patched, listed)
	if listed < 100 {
		t.Fatalf("only %d steps listed their pod changes: the test proves little", listed)
	}
	if patched < 100 {
		t.Fatalf("only %d snapshots were patched: the test proves little", patched)
	}
}

func podsByKey(pods []*corev1.Pod) map[source.PodKey]*corev1.Pod {
	m := map[source.PodKey]*corev1.Pod{}
	for _, p := range pods {
		m[source.KeyOf(p)] = p
	}
	return m
}

func podKeys(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name+"@"+string(p.UID))
	}
	return out
}

// readCounts records what a Source tells its Reads.
type readCounts []int

func (r *readCounts) Reading(files int) { *r = append(*r, files) }

// Reads hears of every read that parses files, with their number, before
// they are parsed; a scan that parses nothing says nothing.
func TestReadsTold(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a.yaml", "b.yaml", "c.json"} {
		write(t, dir, n, pod(strings.TrimSuffix(n, filepath.Ext(n))))
	}
	var reads readCounts
	s, err := New(Options{Dir: dir, NodeName: "node", Reads: &reads})
	if err != nil {
		t.Fatal(err)
	}
	rescan(s)
	rescan(s)
	replace(t, dir, "a.yaml", pod("a2"))
	rescan(s)
	if want := (readCounts{3, 1}); !slices.Equal(reads, want) {
		t.Fatalf("reads told of %v files, want %v", reads, want)
	}
}
