package safefs_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/safefs"
)

// du is the oracle: GNU du on one filesystem (-x), hard links once,
// symbolic links not followed; mode is --block-size=1 or --inodes.
func du(t *testing.T, mode, dir string) int64 {
	t.Helper()
	out, err := exec.Command("du", "-s", "-x", mode, dir).Output()
	if err != nil {
		t.Fatalf("du %s %s: %v", mode, dir, err)
	}
	n, err := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// usageTree is a tenant's volume with everything a measuring walk must not
// be fooled by, on a tmpfs of its own (so that the mount inside is another
// device). It returns the volume and the bytes that must not be counted.
func usageTree(t *testing.T) string {
	t.Helper()
	vol := filepath.Join(mounttest.TempDir(t), "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", vol, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mounttest.UnmountUnder(vol) })
	for i, size := range []int{0, 1, 4096, 100 << 10, 3 << 20} {
		mounttest.WriteFile(t, filepath.Join(vol, "a", "b", strconv.Itoa(i)), strings.Repeat("x", size))
	}
	// A hard link to the 3 MiB file, in another directory: counted once.
	mounttest.WriteFile(t, filepath.Join(vol, "c", "keep"), "")
	if err := os.Link(filepath.Join(vol, "a", "b", "4"), filepath.Join(vol, "c", "link")); err != nil {
		t.Fatal(err)
	}
	// A sparse file: 1 GiB long, nothing allocated.
	f, err := os.Create(filepath.Join(vol, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// Symbolic links out of the volume and to a big file in it: counted
	// as links, never followed.
	big := filepath.Join(mounttest.TempDir(t), "host-big")
	mounttest.WriteFile(t, big, strings.Repeat("h", 1<<20))
	for name, target := range map[string]string{"to-host": big, "to-etc": "/etc", "to-own": "a/b/4", "dangling": "/nowhere"} {
		if err := os.Symlink(target, filepath.Join(vol, name)); err != nil {
			t.Fatal(err)
		}
	}
	// A FIFO nobody writes: opening it would block the walk forever.
	if err := unix.Mkfifo(filepath.Join(vol, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A mount inside the volume with 2 MiB in it: not counted, not entered.
	inner := filepath.Join(vol, "c", "mnt")
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", inner, "tmpfs", 0, "size=8m"); err != nil {
		t.Fatal(err)
	}
	mounttest.WriteFile(t, filepath.Join(inner, "elsewhere"), strings.Repeat("m", 2<<20))
	return vol
}

// The walk counts what du counts on one filesystem, in bytes allocated
// and inodes: a hard link once, a sparse file by its blocks, symbolic
// links as themselves, nothing of a mount inside; and never opens a FIFO.
func TestUsageCountsAsDu(t *testing.T) {
	mounttest.RequireRoot(t) // to mount tmpfs
	vol := usageTree(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := safefs.Usage(ctx, vol, safefs.UsageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// du -x leaves the mount point out altogether, as the walk does.
	wantBytes, wantInodes := du(t, "--block-size=1", vol), du(t, "--inodes", vol)
	if got.Bytes != wantBytes || got.Inodes != wantInodes {
		t.Errorf("Usage = %d bytes, %d inodes; du says %d bytes, %d inodes", got.Bytes, got.Inodes, wantBytes, wantInodes)
	}
	// The 3 MiB file and its link count once; neither the host's 1 MiB
	// file nor the inner mount's 2 MiB are in.
	if got.Bytes < 3<<20 || got.Bytes >= 4<<20 {
		t.Errorf("Usage = %d bytes, want about 3.1 MiB", got.Bytes)
	}
	if got.LinksOverflow {
		t.Error("LinksOverflow with one linked inode")
	}
}

// Beyond MaxLinks remembered inodes, links are counted each time: more,
// never less.
func TestUsageLinksOverflow(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a", "b"} {
		mounttest.WriteFile(t, filepath.Join(dir, n), strings.Repeat("x", 8192))
		for i := range 3 {
			if err := os.Link(filepath.Join(dir, n), filepath.Join(dir, n+strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	exact, err := safefs.Usage(context.Background(), dir, safefs.UsageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	over, err := safefs.Usage(context.Background(), dir, safefs.UsageOptions{MaxLinks: 1})
	if err != nil {
		t.Fatal(err)
	}
	if exact.Inodes != 3 || exact.LinksOverflow {
		t.Errorf("exact: %d inodes (overflow %v), want 3 (the directory and two files)", exact.Inodes, exact.LinksOverflow)
	}
	if !over.LinksOverflow || over.Inodes != 6 || over.Bytes <= exact.Bytes {
		t.Errorf("one link remembered: %+v, want 6 inodes (a once, b's four links each) and more bytes than %d", over, exact.Bytes)
	}
}

// countingBudget records what a walk asks for; it refuses once limit
// entries were granted.
type countingBudget struct {
	mu      sync.Mutex
	granted int
	limit   int
}

var errSpent = errors.New("budget spent")

func (b *countingBudget) Take(_ context.Context, n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limit > 0 && b.granted+n > b.limit {
		return errSpent
	}
	b.granted += n
	return nil
}

// Every entry looked at was paid for before, and a budget that refuses
// stops the walk at once with what it counted.
func TestUsageBudget(t *testing.T) {
	dir := t.TempDir()
	for i := range 1000 {
		mounttest.WriteFile(t, filepath.Join(dir, strconv.Itoa(i%10), strconv.Itoa(i)), "x")
	}
	b := &countingBudget{}
	got, err := safefs.Usage(context.Background(), dir, safefs.UsageOptions{Budget: b})
	if err != nil {
		t.Fatal(err)
	}
	if got.Entries != 1010 || int64(b.granted) < got.Entries || int64(b.granted) > got.Entries+64 {
		t.Errorf("%d entries looked at, %d granted: want 1010, paid in advance in batches", got.Entries, b.granted)
	}
	short := &countingBudget{limit: 256}
	got, err = safefs.Usage(context.Background(), dir, safefs.UsageOptions{Budget: short})
	if !errors.Is(err, errSpent) {
		t.Fatalf("err = %v, want the budget's", err)
	}
	if got.Entries != 256 {
		t.Errorf("%d entries looked at on a budget of 256", got.Entries)
	}
}

// A deadline ends the walk with what it counted so far.
func TestUsageDeadline(t *testing.T) {
	dir := t.TempDir()
	mounttest.WriteFile(t, filepath.Join(dir, "f"), "x")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := safefs.Usage(ctx, dir, safefs.UsageOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// A pod nests 1,600 directories with 255-character names: measuring them
// costs memory bounded by a constant, and counts every level.
func TestUsageDeepTreeMemory(t *testing.T) {
	mounttest.RequireRoot(t) // for clear_refs
	dir := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	deepTree(t, dir, 1600)
	kib := peakGrowth(t, "usage", dir)
	t.Logf("measuring 1600 levels of 255-character names: peak resident memory grew by %d KiB", kib)
	if kib > maxGrowthKiB {
		t.Errorf("peak memory grew by %d KiB, more than %d KiB", kib, maxGrowthKiB)
	}
	got, err := safefs.Usage(context.Background(), dir, safefs.UsageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Inodes != 1+2*1600 {
		t.Errorf("%d inodes, want %d (the root, and a directory and a file per level)", got.Inodes, 1+2*1600)
	}
}
