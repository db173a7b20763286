package subpath

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
)

// testHost binds through the node's mount table, as the agent's does.
var testHost = Host{Mounter: mountutil.New()}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      string
	}{
		{in: "a/b", want: "a/b"},
		{in: "a//b/./c/", want: "a/b/c"},
		{in: "", want: "."},
		{in: ".", want: "."},
		{in: "..a/b..", want: "..a/b.."},
		{in: "/etc", err: "absolute"},
		{in: "a/../b", err: "'..'"},
		{in: "..", err: "'..'"},
		{in: "a/..", err: "'..'"},
		{in: "a\x00b", err: "NUL"},
	} {
		got, err := Validate(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Validate(%q) = %q, %v; want an error saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Validate(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// resolvers runs f once with openat2 and once with the descriptor walk
// that replaces it on old kernels.
func resolvers(t *testing.T, f func(t *testing.T)) {
	t.Run("openat2", f)
	t.Run("walk", func(t *testing.T) {
		noOpenat2.Store(true)
		defer noOpenat2.Store(false)
		f(t)
	})
}

// fixture is a volume directory, a decoy directory outside it holding what
// must never be reached, and a directory for targets.
type fixture struct {
	vol, decoy, targets string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	mounttest.RequireRoot(t)
	base := mounttest.TempDir(t)
	f := fixture{vol: filepath.Join(base, "vol"), decoy: filepath.Join(base, "decoy"), targets: filepath.Join(base, "pod", "volume-subpaths")}
	for _, d := range []string{f.vol, f.decoy, filepath.Join(f.decoy, "b")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mounttest.WriteFile(t, filepath.Join(f.decoy, "b", "marker"), "DECOY")
	mounttest.WriteFile(t, filepath.Join(f.decoy, "marker"), "DECOY")
	return f
}

func (f fixture) mkdir(t *testing.T, rel string) string {
	t.Helper()
	p := filepath.Join(f.vol, rel)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f fixture) symlink(t *testing.T, target, rel string) {
	t.Helper()
	if err := os.Symlink(target, filepath.Join(f.vol, rel)); err != nil {
		t.Fatal(err)
	}
}

func inode(t *testing.T, path string) [2]uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint64{st.Dev, st.Ino}
}

func mountsAt(t *testing.T, path string) int { return len(mounttest.MountsAt(t, path)) }

func TestPrepareDirectoryAndFile(t *testing.T) {
	resolvers(t, func(t *testing.T) {
		f := newFixture(t)
		f.mkdir(t, "data/logs")
		mounttest.WriteFile(t, filepath.Join(f.vol, "data/logs/app.log"), "VOLUME")
		mounttest.WriteFile(t, filepath.Join(f.vol, "data/config"), "CONFIG")

		dirTarget := filepath.Join(f.targets, "c", "0")
		if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "data/logs", Target: dirTarget}); err != nil {
			t.Fatal(err)
		}
		if got := mounttest.ReadFile(t, filepath.Join(dirTarget, "app.log")); got != "VOLUME" {
			t.Errorf("target shows %q, want the volume's file", got)
		}
		if inode(t, dirTarget) != inode(t, filepath.Join(f.vol, "data/logs")) {
			t.Error("target is not the sub-path's inode")
		}

		fileTarget := filepath.Join(f.targets, "c", "1")
		if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "data/config", Target: fileTarget, ReadOnly: true}); err != nil {
			t.Fatal(err)
		}
		if got := mounttest.ReadFile(t, fileTarget); got != "CONFIG" {
			t.Errorf("file target shows %q", got)
		}
		if err := os.WriteFile(fileTarget, []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
			t.Errorf("writing a read-only target: %v, want EROFS", err)
		}

		// Again: kept, not stacked.
		for range 2 {
			if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "data/logs", Target: dirTarget}); err != nil {
				t.Fatal(err)
			}
			if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "data/config", Target: fileTarget, ReadOnly: true}); err != nil {
				t.Fatal(err)
			}
		}
		if n, m := mountsAt(t, dirTarget), mountsAt(t, fileTarget); n != 1 || m != 1 {
			t.Errorf("mounts at the targets after preparing 3 times: %d and %d, want 1 each", n, m)
		}

		// Read-only changed: bound again with the new state.
		if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "data/logs", Target: dirTarget, ReadOnly: true}); err != nil {
			t.Fatal(err)
		}
		if ms := mounttest.MountsAt(t, dirTarget); len(ms) != 1 || !ms[0].HasOption("ro") {
			t.Errorf("after asking read-only: %+v, want one ro mount", ms)
		}

		for _, target := range []string{dirTarget, fileTarget} {
			if err := Remove(target); err != nil {
				t.Fatal(err)
			}
			if mounttest.Exists(t, target) {
				t.Errorf("%s still exists after Remove", target)
			}
		}
		if got := mounttest.ReadFile(t, filepath.Join(f.vol, "data/config")); got != "CONFIG" {
			t.Errorf("Remove touched the volume: %q", got)
		}
	})
}

// A target bound to something else (a previous sub-path, a stale mount)
// is unmounted and bound to the sub-path.
func TestPrepareRebindsAWrongTarget(t *testing.T) {
	f := newFixture(t)
	f.mkdir(t, "old")
	f.mkdir(t, "new")
	target := filepath.Join(f.targets, "c", "0")
	if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "old", Target: target}); err != nil {
		t.Fatal(err)
	}
	if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "new", Target: target}); err != nil {
		t.Fatal(err)
	}
	if inode(t, target) != inode(t, filepath.Join(f.vol, "new")) || mountsAt(t, target) != 1 {
		t.Errorf("target is not one mount of the new sub-path (%d mounts)", mountsAt(t, target))
	}
	// A directory target replaced by a file sub-path.
	mounttest.WriteFile(t, filepath.Join(f.vol, "file"), "F")
	if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "file", Target: target}); err != nil {
		t.Fatal(err)
	}
	if got := mounttest.ReadFile(t, target); got != "F" {
		t.Errorf("target shows %q", got)
	}
}

func TestPrepareCreatesMissingDirectories(t *testing.T) {
	resolvers(t, func(t *testing.T) {
		f := newFixture(t)
		if err := os.Chmod(f.vol, os.ModeSetgid|0o775); err != nil {
			t.Fatal(err)
		}
		f.mkdir(t, "x")
		old := unix.Umask(0o077)
		defer unix.Umask(old)
		target := filepath.Join(f.targets, "c", "0")
		if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "x/y/z", Target: target}); err != nil {
			t.Fatal(err)
		}
		for _, rel := range []string{"x/y", "x/y/z"} {
			fi, err := os.Stat(filepath.Join(f.vol, rel))
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode() & (os.ModePerm | os.ModeSetgid); got != 0o775|os.ModeSetgid {
				t.Errorf("%s: mode %v, want the volume root's (2775) whatever the umask", rel, got)
			}
		}
		if inode(t, target) != inode(t, filepath.Join(f.vol, "x/y/z")) {
			t.Error("target is not the created directory")
		}
		// Not when asked not to.
		err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "x/other", Target: filepath.Join(f.targets, "c", "2"), NoCreate: true})
		if !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "no directory is created") || mounttest.Exists(t, filepath.Join(f.vol, "x/other")) {
			t.Errorf("NoCreate on a missing sub-path: %v", err)
		}
		// Through a link that stays in the volume.
		f.symlink(t, "x", "link")
		if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "link/new", Target: filepath.Join(f.targets, "c", "1")}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(f.vol, "x/new")); err != nil {
			t.Errorf("directory through an in-volume link: %v", err)
		}
	})
}

// Links that stay inside the volume are followed (a configMap's keys are
// links into its ..data directory); anything that leaves it is refused, and
// nothing is created outside.
func TestPrepareRefusesEscapes(t *testing.T) {
	resolvers(t, func(t *testing.T) {
		f := newFixture(t)
		f.mkdir(t, "..2024_01_01/cfg")
		mounttest.WriteFile(t, filepath.Join(f.vol, "..2024_01_01/cfg/key"), "VALUE")
		f.symlink(t, "..2024_01_01", "..data")
		f.symlink(t, "..data/cfg", "cfg")
		f.mkdir(t, "deep/er")
		f.symlink(t, f.decoy, "abs")
		f.symlink(t, "../decoy", "rel")
		f.symlink(t, "../../../decoy", "deep/er/up")
		f.symlink(t, "../../nothing", "deep/er/dangling")
		f.symlink(t, "../er/../../..", "deep/er/climb")
		f.symlink(t, filepath.Join(f.vol, "deep"), "absinside")
		f.symlink(t, "loop", "loop")

		ok := filepath.Join(f.targets, "ok", "0")
		if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "cfg/key", Target: ok}); err != nil {
			t.Fatalf("in-volume links: %v", err)
		}
		if got := mounttest.ReadFile(t, ok); got != "VALUE" {
			t.Errorf("target shows %q", got)
		}
		for i, sub := range []string{"abs", "abs/b", "rel", "rel/b/marker", "deep/er/up/b", "deep/er/climb/decoy", "absinside", "rel/b/new/dir", "abs/created"} {
			target := filepath.Join(f.targets, "bad", string(rune('0'+i)))
			err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: sub, Target: target})
			if err == nil || !strings.Contains(err.Error(), "leaves the volume") {
				t.Errorf("subPath %q: %v, want an error saying it leaves the volume", sub, err)
			}
			if mounttest.Exists(t, target) {
				t.Errorf("subPath %q: target %s left behind", sub, target)
			}
		}
		if err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "loop", Target: filepath.Join(f.targets, "loop", "0")}); !errors.Is(err, unix.ELOOP) {
			t.Errorf("link loop: %v, want ELOOP", err)
		}
		// A dangling link inside the volume is not created through.
		err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: "deep/er/dangling/x", Target: filepath.Join(f.targets, "dangling", "0")})
		if err == nil || !strings.Contains(err.Error(), "not a directory") {
			t.Errorf("through a dangling link: %v", err)
		}
		if mounttest.Exists(t, filepath.Join(f.vol, "nothing")) {
			t.Error("created the target of a dangling link")
		}
		for _, p := range []string{"b/new", "created"} {
			if mounttest.Exists(t, filepath.Join(f.decoy, p)) {
				t.Errorf("created %s outside the volume", p)
			}
		}
	})
}

// The test the issue asks for: a goroutine keeps swapping a component of
// the sub-path between a directory of the volume and a link to a decoy
// outside it while the sub-path is prepared again and again. Every
// preparation either fails or binds the volume's directory: the target
// never shows the decoy.
func TestPrepareSymlinkSwapRace(t *testing.T) {
	resolvers(t, func(t *testing.T) {
		iterations := 3000
		if testing.Short() {
			iterations = 300
		}
		f := newFixture(t)
		f.mkdir(t, "a/b")
		mounttest.WriteFile(t, filepath.Join(f.vol, "a/b/marker"), "VOLUME")
		want := inode(t, filepath.Join(f.vol, "a/b"))
		wantFile := inode(t, filepath.Join(f.vol, "a/b/marker"))
		// "a" and "swap" exchange places atomically: "a" is the real
		// directory, or a link to the decoy (absolute or relative, by
		// turns).
		links := []string{f.decoy, "../decoy"}
		if err := os.Symlink(links[0], filepath.Join(f.vol, "swap")); err != nil {
			t.Fatal(err)
		}

		var stop atomic.Bool
		var swaps atomic.Int64
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir, err := unix.Open(f.vol, unix.O_PATH|unix.O_DIRECTORY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer unix.Close(dir)
			for i := 0; !stop.Load(); i++ {
				if err := unix.Renameat2(dir, "a", dir, "swap", unix.RENAME_EXCHANGE); err != nil {
					t.Error(err)
					return
				}
				swaps.Add(1)
				if i%64 == 0 {
					// Change which kind of link it is while it is
					// not in place ("swap" is the link every other
					// exchange).
					var st unix.Stat_t
					if unix.Fstatat(dir, "swap", &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
						_ = unix.Unlinkat(dir, "swap", 0)
						_ = unix.Symlinkat(links[(i/64)%2], dir, "swap")
					}
				}
			}
		}()

		var ok, refused int
		for i := 0; i < iterations; i++ {
			sub := "a/b"
			if i%2 == 1 {
				sub = "a/b/marker"
			}
			target := filepath.Join(f.targets, "c", "0")
			err := testHost.Prepare(Request{VolumeDir: f.vol, SubPath: sub, Target: target})
			if err != nil {
				refused++
				if mounttest.Exists(t, target) && mountsAt(t, target) > 0 {
					t.Fatalf("iteration %d: failed (%v) but left a mount at the target", i, err)
				}
				continue
			}
			ok++
			got := inode(t, target)
			content := ""
			if sub == "a/b" {
				if got != want {
					t.Fatalf("iteration %d: target is inode %v, not the volume's directory %v", i, got, want)
				}
				content = mounttest.ReadFile(t, filepath.Join(target, "marker"))
			} else {
				if got != wantFile {
					t.Fatalf("iteration %d: target is inode %v, not the volume's file %v", i, got, wantFile)
				}
				content = mounttest.ReadFile(t, target)
			}
			if content != "VOLUME" {
				t.Fatalf("iteration %d: the target shows %q: the bind mount escaped the volume", i, content)
			}
			if err := Remove(target); err != nil {
				t.Fatal(err)
			}
		}
		stop.Store(true)
		wg.Wait()
		t.Logf("%d iterations: %d bound the volume's path, %d refused, %d swaps", iterations, ok, refused, swaps.Load())
		if ok == 0 || refused == 0 {
			t.Errorf("the race was not exercised: %d bound, %d refused (want both)", ok, refused)
		}
	})
}

// Whatever happens to the path after it was resolved cannot change what is
// mounted: the mount follows the descriptor.
func TestPrepareSwapAfterResolve(t *testing.T) {
	f := newFixture(t)
	f.mkdir(t, "a/b")
	mounttest.WriteFile(t, filepath.Join(f.vol, "a/b/marker"), "VOLUME")
	h := testHost
	h.afterResolve = func() {
		if err := os.Rename(filepath.Join(f.vol, "a"), filepath.Join(f.vol, "moved")); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(f.decoy, filepath.Join(f.vol, "a")); err != nil {
			t.Error(err)
		}
	}
	target := filepath.Join(f.targets, "c", "0")
	if err := h.Prepare(Request{VolumeDir: f.vol, SubPath: "a/b", Target: target}); err != nil {
		t.Fatal(err)
	}
	if got := mounttest.ReadFile(t, filepath.Join(target, "marker")); got != "VOLUME" {
		t.Errorf("the target shows %q after the swap, want the volume's directory", got)
	}
}

func TestSyncAndClean(t *testing.T) {
	f := newFixture(t)
	for _, d := range []string{"one", "two", "three"} {
		f.mkdir(t, d)
	}
	dir := filepath.Join(f.targets, "vol")
	first := []Mount{{Container: "app", Index: 0, SubPath: "one"}, {Container: "app", Index: 2, SubPath: "two"}, {Container: "side", Index: 1, SubPath: "three", ReadOnly: true}}
	if err := testHost.Sync(f.vol, dir, first); err != nil {
		t.Fatal(err)
	}
	for _, m := range first {
		if inode(t, m.Target(dir)) != inode(t, filepath.Join(f.vol, m.SubPath)) {
			t.Errorf("%+v not prepared", m)
		}
	}
	// A changed set: app/2 now binds "three", side/1 goes, a bad one fails
	// without stopping the others.
	second := []Mount{{Container: "app", Index: 0, SubPath: "one"}, {Container: "app", Index: 2, SubPath: "three"}, {Container: "app", Index: 3, MountPath: "/x", SubPath: "../x"}}
	err := testHost.Sync(f.vol, dir, second)
	var me *MountError
	if !errors.As(err, &me) || me.Mount.Index != 3 || !strings.Contains(err.Error(), `failed to prepare subPath "../x" for the volumeMount at /x of container "app"`) {
		t.Fatalf("Sync with a bad sub-path: %v, want a MountError naming it", err)
	}
	if inode(t, filepath.Join(dir, "app", "2")) != inode(t, filepath.Join(f.vol, "three")) {
		t.Error("app/2 not bound again")
	}
	if mounttest.Exists(t, filepath.Join(dir, "side")) {
		t.Error("the targets of a container no longer wanted are left")
	}
	if err := Clean(dir); err != nil {
		t.Fatal(err)
	}
	if mounttest.Exists(t, dir) || len(mounttest.MountsUnder(t, f.targets)) != 0 {
		t.Error("Clean left targets or mounts")
	}
	// A target that is not ours is left and reported.
	mounttest.WriteFile(t, filepath.Join(dir, "app", "0"), "data")
	if err := Clean(dir); err == nil || !strings.Contains(err.Error(), "left in place") {
		t.Errorf("Clean over a file with content: %v", err)
	}
	if got := mounttest.ReadFile(t, filepath.Join(dir, "app", "0")); got != "data" {
		t.Error("Clean removed a file it did not make")
	}
}
