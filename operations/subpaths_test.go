package operations

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/subpath"
	"github.com/volume-agent/volume-agent/volume"
)

// fakeSubPaths records what the operator asks and fails when told to. It
// notes how many plugin calls had been made at each of its calls, so a
// test can tell the order.
type fakeSubPaths struct {
	plugin *opFakePlugin

	mu      sync.Mutex
	fail    error
	calls   []string
	synced  []subpath.Mount
	dirs    []string
	atCalls []int // len(plugin.calls) when each call was made
}

func (f *fakeSubPaths) Sync(volumeDir, dir string, want []subpath.Mount) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "Sync "+volumeDir)
	f.synced, f.dirs = want, append(f.dirs, dir)
	f.atCalls = append(f.atCalls, len(f.plugin.methods()))
	return f.fail
}

func (f *fakeSubPaths) Clean(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "Clean")
	f.dirs = append(f.dirs, dir)
	f.atCalls = append(f.atCalls, len(f.plugin.methods()))
	return f.fail
}

func withFakeSubPaths(w *opWorld) *fakeSubPaths {
	f := &fakeSubPaths{plugin: w.plugin}
	w.op.SubPaths = f
	return f
}

var opSubPaths = []volume.SubPath{
	{Container: "app", Index: 1, MountPath: "/logs", Path: "logs/web"},
	{Container: "side", Index: 0, MountPath: "/conf", Path: "conf", ReadOnly: true},
}

func (w *opWorld) subPathTarget() *Target {
	t := w.podTarget()
	t.SubPaths = opSubPaths
	return t
}

func TestPrepareSubPaths(t *testing.T) {
	for _, kind := range []opKind{opPodScoped, opDeviceMountable} {
		t.Run(string(kind), func(t *testing.T) {
			w := newOpWorld(t, kind)
			f := withFakeSubPaths(w)
			w.want(t, opPod)
			if err := w.op.PrepareSubPaths(t.Context(), w.subPathTarget()); !errors.Is(err, ErrStale) {
				t.Fatalf("before the volume is set up: %v, want ErrStale", err)
			}
			w.mountPod(t)

			f.fail = errors.New("injected: symlink found")
			if err := w.op.PrepareSubPaths(t.Context(), w.subPathTarget()); !errors.Is(err, f.fail) {
				t.Fatalf("a failing preparation: %v", err)
			}
			if av, _ := w.asw.Volume(w.vol); av.Pods.At(opPod).SubPaths != nil {
				t.Error("sub-paths recorded although preparing them failed")
			}

			f.fail = nil
			if err := w.op.PrepareSubPaths(t.Context(), w.subPathTarget()); err != nil {
				t.Fatal(err)
			}
			wantMounts := []subpath.Mount{
				{Container: "app", Index: 1, MountPath: "/logs", SubPath: "logs/web"},
				{Container: "side", Index: 0, MountPath: "/conf", SubPath: "conf", ReadOnly: true},
			}
			if !reflect.DeepEqual(f.synced, wantMounts) {
				t.Errorf("asked to prepare %+v, want %+v", f.synced, wantMounts)
			}
			if want := w.paths.VolumeSubPathsDir(opPod, w.pluginName, w.spec.Name); f.dirs[len(f.dirs)-1] != want {
				t.Errorf("targets in %s, want %s", f.dirs[len(f.dirs)-1], want)
			}
			if f.calls[len(f.calls)-1] != "Sync "+w.podDir() {
				t.Errorf("calls %v: not bound into the pod's volume directory", f.calls)
			}
			av, _ := w.asw.Volume(w.vol)
			if m := av.Pods.At(opPod); !volume.SameSubPaths(m.SubPaths, opSubPaths) || m.SubPathsOutdated {
				t.Errorf("recorded %+v", m)
			}
			if err := w.op.PrepareSubPaths(t.Context(), w.subPathTarget()); !errors.Is(err, ErrStale) {
				t.Errorf("prepared again: %v, want ErrStale", err)
			}

			// None wanted any more: all removed.
			empty := w.podTarget()
			if err := w.op.PrepareSubPaths(t.Context(), empty); err != nil {
				t.Fatal(err)
			}
			if f.calls[len(f.calls)-1] != "Clean" {
				t.Errorf("calls %v, want the last to remove them all", f.calls)
			}
			if av, _ := w.asw.Volume(w.vol); len(av.Pods.At(opPod).SubPaths) != 0 {
				t.Errorf("recorded %+v after removing them", av.Pods.At(opPod).SubPaths)
			}
		})
	}
}

// A pod that no longer wants the volume gets no sub-paths prepared.
func TestPrepareSubPathsStaleWhenNotWanted(t *testing.T) {
	w := newOpWorld(t, opPodScoped)
	withFakeSubPaths(w)
	w.mountPod(t)
	if err := w.op.PrepareSubPaths(t.Context(), w.subPathTarget()); !errors.Is(err, ErrStale) {
		t.Errorf("%v, want ErrStale", err)
	}
}

// The sub-paths go before the volume: a volume is never torn down under a
// bind mount of a part of it, and when they cannot be removed the volume
// stays mounted, as it was.
func TestUnmountVolumeRemovesSubPathsFirst(t *testing.T) {
	w := newOpWorld(t, opPodScoped)
	f := withFakeSubPaths(w)
	w.mountPod(t)
	w.asw.SetSubPaths(w.vol, opPod, opSubPaths)

	f.fail = errors.New("injected: busy")
	if err := w.op.UnmountVolume(t.Context(), w.unmountTarget()); !errors.Is(err, f.fail) {
		t.Fatalf("%v, want the sub-path error", err)
	}
	if got := w.plugin.methods(); len(got) != 0 {
		t.Errorf("plugin called %v although the sub-paths are still there", got)
	}
	if av, _ := w.asw.Volume(w.vol); av.Pods.At(opPod).State != cache.Mounted {
		t.Errorf("mount is %s, want it still Mounted", av.Pods.At(opPod).State)
	}

	f.fail = nil
	if err := w.op.UnmountVolume(t.Context(), w.unmountTarget()); err != nil {
		t.Fatal(err)
	}
	if f.calls[len(f.calls)-1] != "Clean" || f.atCalls[len(f.atCalls)-1] != 0 {
		t.Errorf("calls %v at plugin calls %v: want Clean before TearDown", f.calls, f.atCalls)
	}
	if got := w.plugin.methods(); len(got) != 1 || got[0] != "TearDown" {
		t.Errorf("plugin calls %v", got)
	}
}

// A volume set up again keeps its sub-paths in place (the pod stays ready)
// but marks them to be prepared again.
func TestRemountMarksSubPathsOutdated(t *testing.T) {
	w := newOpWorld(t, opPodScoped)
	withFakeSubPaths(w)
	w.want(t, opPod)
	w.mountPod(t)
	w.asw.SetSubPaths(w.vol, opPod, opSubPaths)
	w.gen++ // the content is outdated
	if err := w.op.MountVolume(t.Context(), w.podTarget()); err != nil {
		t.Fatal(err)
	}
	av, _ := w.asw.Volume(w.vol)
	m := av.Pods.At(opPod)
	if !volume.SameSubPaths(m.SubPaths, opSubPaths) || !m.SubPathsOutdated {
		t.Errorf("after a remount: %+v, want the sub-paths kept and outdated", m)
	}
	if !cache.PodVolumeReady(opSubPaths, m) || !cache.SubPathsNeeded(opSubPaths, m, w.gen) {
		t.Error("after a remount the volume must stay ready and its sub-paths be prepared again")
	}
}

// Through the real sub-path code: prepared bind mounts, then everything
// under volume-subpaths gone when the pod's volume is torn down.
func TestSubPathsOnTheNode(t *testing.T) {
	mounttest.RequireRoot(t)
	w := newOpWorld(t, opPodScoped)
	w.paths = volume.Paths{Root: mounttest.TempDir(t)}
	w.op.Paths = w.paths
	w.op.SubPaths = subpath.Host{Mounter: mountutil.New()}
	w.want(t, opPod)
	w.mountPod(t)
	if err := os.MkdirAll(filepath.Join(w.podDir(), "conf"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.op.PrepareSubPaths(t.Context(), w.subPathTarget()); err != nil {
		t.Fatal(err)
	}
	for _, s := range opSubPaths {
		target := w.paths.SubPathTarget(opPod, w.pluginName, w.spec.Name, s.Container, s.Index)
		if len(mounttest.MountsAt(t, target)) != 1 {
			t.Errorf("%s is not mounted", target)
		}
	}
	if _, err := os.Stat(filepath.Join(w.podDir(), "logs", "web")); err != nil {
		t.Errorf("missing sub-directory not created: %v", err)
	}
	w.dsw.DeletePod(opPod)
	if err := w.op.UnmountVolume(t.Context(), w.unmountTarget()); err != nil {
		t.Fatal(err)
	}
	if mounttest.Exists(t, w.paths.PodSubPathsDir(opPod)) {
		t.Error("volume-subpaths left after the volume was torn down")
	}
	if ms := mounttest.MountsUnder(t, w.paths.Root); len(ms) != 0 {
		t.Errorf("mounts left: %v", mounttest.MountPoints(ms))
	}
}

// In a volume its plugin gives containers read-only (configMap, secret,
// downwardAPI, projected) a missing sub-path is not created: that content
// is kept in sync with its sources.
func TestPrepareSubPathsNoCreateInAPIVolumes(t *testing.T) {
	for _, noCreate := range []bool{true, false} {
		plugin := fmt.Sprintf("read-only for containers: %v", noCreate)
		w := newOpWorld(t, opPodScoped)
		w.attrs.ReadOnlyForContainers = noCreate
		f := withFakeSubPaths(w)
		w.want(t, opPod)
		w.mountPod(t)
		if err := w.op.PrepareSubPaths(t.Context(), w.subPathTarget()); err != nil {
			t.Fatal(err)
		}
		for _, m := range f.synced {
			if m.NoCreate != noCreate {
				t.Errorf("%s: %+v, want NoCreate %v", plugin, m, noCreate)
			}
		}
	}
}

// Teardown skips the sub-path clean-up only when nothing can be left: no
// sub-path recorded and no sub-path directory for the pod on disk. One a
// crash kept from being recorded (the directory exists) is still cleaned.
func TestUnmountVolumeSubPathCleanupSkippedOnlyWhenNoneCanExist(t *testing.T) {
	// The pod directory's link count stands for the lstat of each of its
	// other directories (onlyVolumesDir): a state file left there is still
	// removed, and the pod directory with it.
	tests := []struct {
		name      string
		recorded  bool
		onDisk    bool
		state     bool
		wantClean bool
	}{
		{"none recorded, none on disk", false, false, false, false},
		{"none recorded, the pod's sub-path directory on disk", false, true, false, true},
		{"none recorded, a state file on disk", false, false, true, false},
		{"none recorded, both on disk", false, true, true, true},
		{"recorded", true, false, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newOpWorld(t, opPodScoped)
			f := withFakeSubPaths(w)
			w.mountPod(t)
			if tc.recorded {
				w.asw.SetSubPaths(w.vol, opPod, opSubPaths)
			}
			if tc.onDisk {
				if err := os.MkdirAll(w.paths.PodSubPathsDir(opPod), 0o750); err != nil {
					t.Fatal(err)
				}
			}
			state := w.paths.PodVolumeStateFile(opPod, w.pluginName, w.spec.Name)
			if tc.state {
				w.makeDir(t, filepath.Dir(state))
				if err := os.WriteFile(state, []byte("{}"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.op.UnmountVolume(t.Context(), w.unmountTarget()); err != nil {
				t.Fatal(err)
			}
			if cleaned := slices.Contains(f.calls, "Clean"); cleaned != tc.wantClean {
				t.Errorf("sub-paths cleaned: %v, want %v (calls %v)", cleaned, tc.wantClean, f.calls)
			}
			if _, err := os.Lstat(state); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("state file after unmount: %v, want it removed", err)
			}
			if _, err := os.Lstat(w.paths.PodDir(opPod)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pod directory after unmount: %v, want it removed", err)
			}
		})
	}
}
