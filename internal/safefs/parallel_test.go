package safefs_test

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/safefs"
)

// randomTree fills dir from seed: nested directories of random width and
// depth, files with random groups and modes (setuid/setgid/sticky
// included; some already right), symbolic links inside and to out, FIFOs,
// hard links and unreadable directories. The same seed makes the same
// tree.
func randomTree(t *testing.T, dir, out string, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0))
	gids := []int{0, 1000, 1001, 4242}
	modes := []uint32{0, 0o600, 0o644, 0o755, 0o4755, 0o2755, 0o1777, 0o660, 0o2770, 0o440}
	var files []string
	var fill func(d string, depth int)
	fill = func(d string, depth int) {
		for i := range r.IntN(12) {
			p := filepath.Join(d, fmt.Sprintf("e%d", i))
			var err error
			switch k := r.IntN(20); {
			case k < 3 && depth < 7:
				if err = os.Mkdir(p, 0o755); err == nil {
					fill(p, depth+1)
				}
			case k == 3:
				err = os.Symlink(out, p)
			case k == 4:
				err = os.Symlink("../"+filepath.Base(d), p)
			case k == 5:
				err = unix.Mkfifo(p, 0o600)
			case k == 6 && len(files) > 0:
				err = os.Link(files[r.IntN(len(files))], p)
			default:
				if err = os.WriteFile(p, nil, 0o600); err == nil {
					files = append(files, p)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(p, -1, gids[r.IntN(len(gids))]); err != nil {
				t.Fatal(err)
			}
			if fi, _ := os.Lstat(p); fi.Mode()&fs.ModeSymlink == 0 {
				if err := unix.Chmod(p, modes[r.IntN(len(modes))]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	fill(dir, 0)
}

// snapshot is every entry below dir (dir included): type, permission
// bits and group.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		m[rel] = fmt.Sprintf("%o gid %d", st.Mode, st.Gid)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The parallel walk and the sequential reference leave the same groups
// and modes on the same random trees, whatever the number of workers, and
// neither touches what the trees' links point to.
func TestSetGroupParallelAgreesWithSequential(t *testing.T) {
	mounttest.RequireRoot(t) // to change groups
	for _, tc := range []struct {
		name    string
		workers int
		g       safefs.Group
	}{
		{"1 worker", 1, safefs.Group{GID: 4242, FileBits: 0o660, DirBits: 0o2770}},
		{"2 workers", 2, safefs.Group{GID: 4242, FileBits: 0o660, DirBits: 0o2770}},
		{"default workers", 0, safefs.Group{GID: 4242, FileBits: 0o660, DirBits: 0o2770}},
		{"16 workers read-only", 16, safefs.Group{GID: 1001, FileBits: 0o440, DirBits: 0o2550}},
		{"on root mismatch", 4, safefs.Group{GID: 4242, FileBits: 0o660, DirBits: 0o2770, SkipIfRootMatches: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer safefs.SetGroupWorkers(tc.workers)()
			for seed := range uint64(8) {
				tmp := t.TempDir()
				out := filepath.Join(tmp, "out")
				mounttest.WriteFile(t, filepath.Join(out, "keep"), "x")
				before := snapshot(t, out)
				seq, par := filepath.Join(tmp, "seq"), filepath.Join(tmp, "par")
				for _, d := range []string{seq, par} {
					if err := os.Mkdir(d, 0o700); err != nil {
						t.Fatal(err)
					}
					randomTree(t, d, out, seed)
				}
				if seed%2 == 1 { // the root already right: OnRootMismatch walks nothing
					for _, d := range []string{seq, par} {
						if err := os.Chown(d, -1, tc.g.GID); err != nil {
							t.Fatal(err)
						}
						if err := os.Chmod(d, os.FileMode(tc.g.DirBits&0o777)|os.ModeSetgid); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := safefs.SetGroupSequential(context.Background(), seq, tc.g); err != nil {
					t.Fatal(err)
				}
				if err := safefs.SetGroup(context.Background(), par, tc.g); err != nil {
					t.Fatal(err)
				}
				want, got := snapshot(t, seq), snapshot(t, par)
				if len(want) < 2 {
					t.Fatalf("seed %d: a tree of %d entries tests nothing", seed, len(want))
				}
				for p, w := range want {
					if got[p] != w {
						t.Errorf("seed %d: %s: parallel %q, sequential %q", seed, p, got[p], w)
					}
				}
				if len(got) != len(want) {
					t.Errorf("seed %d: %d entries after the parallel walk, %d after the sequential", seed, len(got), len(want))
				}
				for p, w := range before {
					if a := snapshot(t, out)[p]; a != w {
						t.Errorf("seed %d: %s outside the volume changed: %q, was %q", seed, p, a, w)
					}
				}
			}
		})
	}
}

// A tenant swaps directories and files for symbolic links to a host
// directory while the parallel walk runs: nothing in the host directory
// changes, whichever worker meets the swap.
func TestSetGroupParallelSwapRace(t *testing.T) {
	mounttest.RequireRoot(t) // to change groups
	defer safefs.SetGroupWorkers(8)()
	for i := 0; i < 30 && !t.Failed(); i++ {
		tmp := t.TempDir()
		host := filepath.Join(tmp, "host")
		for j := range 10 {
			mounttest.WriteFile(t, filepath.Join(host, fmt.Sprintf("keep-%d", j)), "x")
			mounttest.WriteFile(t, filepath.Join(host, "sub", fmt.Sprintf("keep-%d", j)), "x")
		}
		before := snapshot(t, host)
		dir := filepath.Join(tmp, "vol")
		for j := range 30 {
			mounttest.WriteFile(t, filepath.Join(dir, fmt.Sprintf("d%d", j%3), fmt.Sprintf("f-%d", j)), "x")
			mounttest.WriteFile(t, filepath.Join(dir, fmt.Sprintf("e-%d", j), "x", "f"), "x")
		}
		var stop atomic.Bool
		var wg sync.WaitGroup
		swap := func(name, target string) {
			defer wg.Done()
			p, aside := filepath.Join(dir, name), filepath.Join(dir, name+".aside")
			for !stop.Load() {
				if os.Rename(p, aside) != nil || os.Symlink(target, p) != nil ||
					os.Remove(p) != nil || os.Rename(aside, p) != nil {
					t.Error("the swap failed")
					return
				}
			}
		}
		for j := range 3 {
			wg.Add(2)
			go swap(fmt.Sprintf("d%d", j), host)
			go swap(fmt.Sprintf("e-%d/x/f", j), filepath.Join(host, "keep-0"))
		}
		for k := range 5 {
			g := safefs.Group{GID: 4000 + k, FileBits: 0o666, DirBits: 0o2777}
			if err := safefs.SetGroup(context.Background(), dir, g); err != nil {
				t.Errorf("iteration %d: %v", i, err)
			}
		}
		stop.Store(true)
		wg.Wait()
		for p, w := range before {
			if a := snapshot(t, host)[p]; a != w {
				t.Fatalf("iteration %d: %s in the host directory changed: %q, was %q", i, p, a, w)
			}
		}
	}
}

// The parallel walk of a 1,600-deep tree holds no more descriptors than
// its bound: the helper process runs it with RLIMIT_NOFILE set just above
// what it had open plus that bound (see TestMemoryHelperProcess), so one
// more fails the walk with EMFILE. (TestSetGroupDeepTreeMemory bounds its
// memory.)
func TestSetGroupDeepTreeDescriptors(t *testing.T) {
	mounttest.RequireRoot(t) // to change groups
	dir := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	deepTree(t, dir, 1600)
	// A wide level on top: every worker busy and the queue full.
	for i := range 64 {
		nest(t, filepath.Join(dir, fmt.Sprint("w", i)), 40)
	}
	kib := peakGrowth(t, "chgrp-fd-limit", dir)
	t.Logf("applying a group to 1600 levels and 64 x 40 under a descriptor limit: peak resident memory grew by %d KiB", kib)
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(dir, "w63", "d", "d", "f"), &st); err != nil || st.Gid != 4242 {
		t.Errorf("a file of the wide part: gid %d, %v", st.Gid, err)
	}
}
