package safefs_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/safefs"
)

// deepTree makes depth nested directories with 255-character names below
// dir (far beyond PATH_MAX, so it is built relative to file descriptors, as
// a pod would), with a file at every level, and returns the name used.
func deepTree(t testing.TB, dir string, depth int) string {
	t.Helper()
	name := strings.Repeat("d", 255)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < depth; i++ {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatalf("level %d: %v", i, err)
		}
		ffd, err := unix.Openat(fd, strings.Repeat("f", 200), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(ffd)
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	return name
}

// The memory helper process removes the directory in $SAFEFS_REMOVE_DIR
// and prints how much its resident memory grew at the peak.
func TestMemoryHelperProcess(t *testing.T) {
	dir := os.Getenv("SAFEFS_REMOVE_DIR")
	if dir == "" {
		t.Skip("helper process for TestRemoveDeepTreeMemory")
	}
	// Reset the peak resident size to the current one (clear_refs "5").
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	before := procStatus(t, "VmRSS")
	var err error
	switch os.Getenv("SAFEFS_OP") {
	case "remove":
		err = safefs.RemoveAll(context.Background(), dir)
	case "chgrp":
		err = safefs.SetGroup(context.Background(), dir, safefs.Group{GID: 4242, FileBits: 0o660, DirBits: 0o2770})
	case "usage":
		var du safefs.DiskUsage
		du, err = safefs.Usage(context.Background(), dir, safefs.UsageOptions{})
		fmt.Printf("INODES %d\n", du.Inodes)
	case "chgrp-fd-limit":
		limitOpenFiles(t, safefs.GroupFDBound()+1) // +1: the root
		err = safefs.SetGroup(context.Background(), dir, safefs.Group{GID: 4242, FileBits: 0o660, DirBits: 0o2770})
	}
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("PEAK-GROWTH-KB %d\n", procStatus(t, "VmHWM")-before)
}

// limitOpenFiles lets the process open at most n more descriptors than it
// has open now: the limit is on descriptor numbers, and the kernel hands
// out the lowest free one, so it goes just past the n-th free number.
func limitOpenFiles(t *testing.T, n int) {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	open := map[int]bool{}
	for _, e := range fds {
		if fd, err := strconv.Atoi(e.Name()); err == nil {
			open[fd] = true
		}
	}
	lim := 0
	for free := 0; free < n; lim++ {
		if !open[lim] {
			free++
		}
	}
	// The descriptor ReadDir used is closed again: one more free number.
	lim--
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(lim), Max: uint64(lim)}); err != nil {
		t.Fatal(err)
	}
}

func procStatus(t *testing.T, key string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), key+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", key)
	return 0
}

// peakGrowth runs op on dir in a fresh process and returns how much its
// resident memory grew at the peak, in KiB.
func peakGrowth(t *testing.T, op, dir string) int64 {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "SAFEFS_REMOVE_DIR="+dir, "SAFEFS_OP="+op)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "PEAK-GROWTH-KB "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("helper printed no measurement:\n%s", out)
	return 0
}

// maxGrowthKiB bounds what walking any tree may cost. The tree below would
// cost the old recursive walk hundreds of MiB (a path string per level,
// each one longer than the last); the race detector's shadow memory is
// included.
const maxGrowthKiB = 24 << 10

// nest makes depth nested directories "d" below dir, a file in each, and
// returns the deepest.
func nest(t *testing.T, dir string, depth int) string {
	t.Helper()
	p := dir
	for i := 0; i < depth; i++ {
		p = filepath.Join(p, "d")
		mounttest.WriteFile(t, filepath.Join(p, "f"), "x")
	}
	return p
}
