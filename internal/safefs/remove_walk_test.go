package safefs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/safefs"
)

// A directory far wider than one read batch, with subdirectories between
// the files.
func TestRemoveWideDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	long := strings.Repeat("x", 100)
	for i := 0; i < 3000; i++ {
		p := filepath.Join(dir, fmt.Sprintf("%s-%d", long, i))
		if i%500 == 0 {
			p = filepath.Join(p, "inner", "file")
		}
		mounttest.WriteFile(t, p, "x")
	}
	if err := safefs.RemoveAll(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory still there: %v", err)
	}
}

// A mount far deeper than the walk keeps directories open: it is found,
// named, and left alone; everything else goes, on the way back up too.
func TestRemoveMountPointBelowTheOpenDirectories(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	dir := filepath.Join(tmp, "vol")
	deep := nest(t, dir, 80)
	mnt := filepath.Join(deep, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	mounttest.MountTmpfs(t, mnt)
	mounttest.WriteFile(t, filepath.Join(mnt, "theirs"), "x")
	nest(t, filepath.Join(dir, "other"), 80)

	err := safefs.RemoveAll(context.Background(), dir)
	if !errors.Is(err, safefs.ErrMountPointInside) || !strings.Contains(err.Error(), mnt) {
		t.Fatalf("RemoveAll = %v, want ErrMountPointInside naming %s", err, mnt)
	}
	if _, err := os.Stat(filepath.Join(mnt, "theirs")); err != nil {
		t.Errorf("data on the mount: %v", err)
	}
	// Only the path to the mount point is left.
	for p := deep; p != dir; p = filepath.Dir(p) {
		if names := dirNames(t, p); len(names) != 1 {
			t.Fatalf("%s holds %v, want only the way to the mount", p, names)
		}
	}
	if names := dirNames(t, dir); len(names) != 1 || names[0] != "d" {
		t.Errorf("%s holds %v, want only d", dir, names)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// While a volume is removed, something swaps a directory in it for a
// symbolic link to a host directory: nothing outside may be removed.
func TestRemoveSymlinkSwapRace(t *testing.T) {
	for i := 0; i < 40 && !t.Failed(); i++ {
		tmp := t.TempDir()
		host := filepath.Join(tmp, "host")
		for j := 0; j < 20; j++ {
			mounttest.WriteFile(t, filepath.Join(host, fmt.Sprintf("keep-%d", j)), "x")
		}
		dir := filepath.Join(tmp, "vol")
		for j := 0; j < 20; j++ {
			mounttest.WriteFile(t, filepath.Join(dir, "d", fmt.Sprintf("f-%d", j)), "x")
			mounttest.WriteFile(t, filepath.Join(dir, fmt.Sprintf("e-%d", j), "f"), "x")
		}
		var stop atomic.Bool
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := filepath.Join(dir, "d")
			for !stop.Load() {
				if os.Rename(d, filepath.Join(tmp, "moved")) != nil {
					return
				}
				if os.Symlink(host, d) != nil {
					return
				}
			}
		}()
		_ = safefs.RemoveAll(context.Background(), dir)
		stop.Store(true)
		wg.Wait()
		if n := len(dirNames(t, host)); n != 20 {
			t.Fatalf("iteration %d: %d of 20 files left in the host directory", i, n)
		}
	}
}

// A pod nests 1,600 directories with 255-character names: removing them
// must cost memory bounded by a constant, not by the square of the depth.
func TestRemoveDeepTreeMemory(t *testing.T) {
	mounttest.RequireRoot(t) // for clear_refs
	dir := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	deepTree(t, dir, 1600)
	kib := peakGrowth(t, "remove", dir)
	t.Logf("removing 1600 levels of 255-character names: peak resident memory grew by %d KiB", kib)
	if kib > maxGrowthKiB {
		t.Errorf("peak memory grew by %d KiB, more than %d KiB", kib, maxGrowthKiB)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("directory still there: %v", err)
	}
}
