package plugins_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

const testGID = 4242

func fsGroupPod(policy *v1.PodFSGroupChangePolicy) volume.PodInfo {
	gid := int64(testGID)
	return volume.PodInfo{PodRef: volume.PodRef{UID: "uid", Namespace: "ns", Name: "pod"}, FSGroup: &gid, FSGroupChangePolicy: policy}
}

type owner struct {
	mode os.FileMode
	gid  uint32
}

func ownerOf(t *testing.T, path string) owner {
	t.Helper()
	info, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return owner{mode: info.Mode(), gid: info.Sys().(*syscall.Stat_t).Gid}
}

func writeFile(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// decoy is a host directory outside the volume whose ownership must never
// change, whatever a pod does inside the volume.
func decoy(t *testing.T, tmp string) (string, map[string]owner) {
	t.Helper()
	dir := filepath.Join(tmp, "host-etc")
	writeFile(t, filepath.Join(dir, "shadow"), 0o600)
	writeFile(t, filepath.Join(dir, "sub", "key"), 0o600)
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	want := map[string]owner{}
	for _, p := range []string{dir, filepath.Join(dir, "shadow"), filepath.Join(dir, "sub"), filepath.Join(dir, "sub", "key")} {
		want[p] = ownerOf(t, p)
	}
	return dir, want
}

func checkDecoy(t *testing.T, want map[string]owner) bool {
	t.Helper()
	ok := true
	for p, w := range want {
		if got := ownerOf(t, p); got != w {
			t.Errorf("host path %s changed: mode %v gid %d, was mode %v gid %d", p, got.mode, got.gid, w.mode, w.gid)
			ok = false
		}
	}
	return ok
}

func TestApplyFSGroup(t *testing.T) {
	mounttest.RequireRoot(t)
	for _, tc := range []struct {
		name     string
		readOnly bool
		file     os.FileMode
		dir      os.FileMode
	}{
		{"read-write", false, 0o660, 0o770 | os.ModeSetgid},
		{"read-only", true, 0o440, 0o550 | os.ModeSetgid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			host, want := decoy(t, tmp)
			vol := filepath.Join(tmp, "vol")
			writeFile(t, filepath.Join(vol, "a", "b", "file"), 0o600)
			writeFile(t, filepath.Join(vol, "top"), 0o604)
			if err := os.Symlink(host, filepath.Join(vol, "a", "link-out")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(host, "shadow"), filepath.Join(vol, "link-file")); err != nil {
				t.Fatal(err)
			}
			if err := plugins.ApplyFSGroup(context.Background(), vol, fsGroupPod(nil), tc.readOnly); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{"", "a", "a/b"} {
				got := ownerOf(t, filepath.Join(vol, p))
				if got.gid != testGID || got.mode&tc.dir != tc.dir {
					t.Errorf("directory %q: mode %v gid %d, want at least %v gid %d", p, got.mode, got.gid, tc.dir, testGID)
				}
			}
			for _, p := range []string{"a/b/file", "top"} {
				got := ownerOf(t, filepath.Join(vol, p))
				if got.gid != testGID || got.mode&tc.file != tc.file || got.mode&os.ModeSetgid != 0 {
					t.Errorf("file %q: mode %v gid %d, want %v gid %d", p, got.mode, got.gid, tc.file, testGID)
				}
			}
			if got := ownerOf(t, filepath.Join(vol, "a", "link-out")); got.gid != testGID {
				t.Errorf("symbolic link's own group %d, want %d", got.gid, testGID)
			}
			checkDecoy(t, want)
		})
	}
}

// With OnRootMismatch, a root that already has the group and mode means
// nothing below it is looked at.
func TestApplyFSGroupOnRootMismatch(t *testing.T) {
	mounttest.RequireRoot(t)
	vol := t.TempDir()
	writeFile(t, filepath.Join(vol, "file"), 0o600)
	policy := v1.FSGroupChangeOnRootMismatch
	if err := os.Chown(vol, -1, testGID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(vol, 0o770|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := plugins.ApplyFSGroup(context.Background(), vol, fsGroupPod(&policy), false); err != nil {
		t.Fatal(err)
	}
	if got := ownerOf(t, filepath.Join(vol, "file")); got.gid == testGID {
		t.Error("OnRootMismatch walked a volume whose root matched")
	}
	if err := os.Chmod(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := plugins.ApplyFSGroup(context.Background(), vol, fsGroupPod(&policy), false); err != nil {
		t.Fatal(err)
	}
	if got := ownerOf(t, filepath.Join(vol, "file")); got.gid != testGID {
		t.Error("OnRootMismatch did not walk a volume whose root did not match")
	}
}

// A pod sharing the volume swaps a directory inside it with a symbolic link
// to a host directory while another pod's fsGroup is being applied: the
// host directory must never be touched.
func TestApplyFSGroupSymlinkSwapRace(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := t.TempDir()
	host, want := decoy(t, tmp)
	vol := filepath.Join(tmp, "vol")
	dir, real := filepath.Join(vol, "d"), filepath.Join(vol, "d.real")
	for i := range 8 {
		writeFile(t, filepath.Join(dir, "f"+string(rune('0'+i))), 0o600)
	}
	writeFile(t, filepath.Join(dir, "sub", "f"), 0o600)

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			// d is a directory, then a link to the host directory.
			if err := os.Rename(dir, real); err != nil {
				t.Error(err)
				return
			}
			if err := os.Symlink(host, dir); err != nil {
				t.Error(err)
				return
			}
			if err := os.Remove(dir); err != nil {
				t.Error(err)
				return
			}
			if err := os.Rename(real, dir); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	iterations := 3000
	if testing.Short() {
		iterations = 300
	}
	for i := 0; i < iterations && !t.Failed(); i++ {
		// Errors are expected: entries vanish under the walk.
		_ = plugins.ApplyFSGroup(context.Background(), vol, fsGroupPod(nil), false)
		if i%50 == 0 && !checkDecoy(t, want) {
			t.Errorf("after %d walks", i+1)
		}
	}
	stop.Store(true)
	wg.Wait()
	checkDecoy(t, want)
}

// The walk never leaves the volume's filesystem: a mount inside it (some
// other filesystem bind-mounted in by mount propagation) is left alone.
func TestApplyFSGroupStaysOnTheVolumesFilesystem(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	host, want := decoy(t, tmp)
	vol := filepath.Join(tmp, "vol")
	mnt := filepath.Join(vol, "mnt")
	writeFile(t, filepath.Join(mnt, ".keep"), 0o600)
	if err := syscall.Mount(host, mnt, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, 0) })
	if err := plugins.ApplyFSGroup(context.Background(), vol, fsGroupPod(nil), false); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Logf("ApplyFSGroup: %v", err)
	}
	if got := ownerOf(t, vol); got.gid != testGID {
		t.Errorf("volume root gid %d, want %d", got.gid, testGID)
	}
	checkDecoy(t, want)
}
