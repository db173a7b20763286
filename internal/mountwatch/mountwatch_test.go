package mountwatch

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

// noticeWithin bounds how long a change may take to be reported. A change
// the watcher misses is never reported at all here (there is no rescan),
// so this only bounds how long a failing test waits; it is far below the
// 30 s rescan period that would otherwise hide a miss.
const noticeWithin = 5 * time.Second

func start(t *testing.T) (*Watcher, <-chan struct{}, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	woke := make(chan struct{}, 1)
	w, err := Start(ctx, zaptest.NewLogger(t), func() {
		select {
		case woke <- struct{}{}:
		default:
		}
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		<-w.Done()
	})
	return w, woke, cancel
}

func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// TestEveryChangeReported mounts and unmounts a tmpfs 50 times in a row
// and requires each change to be reported on its own. The first mount
// comes right after Start returns, before the watcher's goroutine may have
// reached poll(2). It runs in its own mount namespace: other tests'
// mounts would wake the watcher too and could hide a miss.
func TestEveryChangeReported(t *testing.T) {
	if !mounttest.OwnMountNamespace(t) {
		return
	}
	dir := filepath.Join(mounttest.TempDir(t), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, woke, _ := start(t)
	var slowest time.Duration
	for i := range 50 {
		for _, c := range []struct {
			what   string
			change func() error
		}{
			{"mount", func() error { return unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m") }},
			{"unmount", func() error { return unix.Unmount(dir, 0) }},
		} {
			drain(woke)
			begin := time.Now()
			if err := c.change(); err != nil {
				t.Fatalf("%s %d: %v", c.what, i+1, err)
			}
			select {
			case <-woke:
				slowest = max(slowest, time.Since(begin))
			case <-time.After(noticeWithin):
				t.Fatalf("%s %d of 50 was not reported within %v", c.what, i+1, noticeWithin)
			}
		}
	}
	t.Logf("100 changes reported, the slowest after %v", slowest)
}

// TestDescriptorOnlyPolledHere checks the cause of lost changes: the
// watcher's descriptor must be in no epoll set (the Go runtime's poller
// would take the change flag). A file from os.Open is the control: Go
// puts it into its poller's epoll set, which is what lost 8-46 % of
// changes before.
func TestDescriptorOnlyPolledHere(t *testing.T) {
	w, _, _ := start(t)
	if sets := epollSetsHolding(t, w.table); len(sets) > 0 {
		t.Errorf("the mount table descriptor %d is in epoll set(s) %v: another poller can take its changes", w.table, sets)
	}
	f, err := os.Open(mountTable)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if sets := epollSetsHolding(t, int(f.Fd())); len(sets) == 0 {
		t.Errorf("control: %s opened with os.Open is in no epoll set; either the Go runtime stopped registering such files or this check is broken", mountTable)
	}
}

// epollSetsHolding returns the epoll descriptors of this process that
// watch fd (from /proc/self/fdinfo).
func epollSetsHolding(t *testing.T, fd int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var sets []int
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			// tfd:        4 events:       19 data: ...
			if f := strings.Fields(line); len(f) > 1 && f[0] == "tfd:" && f[1] == strconv.Itoa(fd) {
				n, _ := strconv.Atoi(e.Name())
				sets = append(sets, n)
			}
		}
	}
	return sets
}

// TestStopsAndClosesWhenContextEnds: the goroutine ends and both
// descriptors are closed.
func TestStopsAndClosesWhenContextEnds(t *testing.T) {
	w, _, cancel := start(t)
	table, quit := w.table, w.quit
	cancel()
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not stop")
	}
	if err := w.Err(); err != nil {
		t.Errorf("Err after ctx ended: %v", err)
	}
	for _, fd := range []int{table, quit} {
		// Another test's file may reuse the number; it must not be ours.
		if l, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err == nil && (l == "anon_inode:[eventfd]" || strings.HasSuffix(l, "mountinfo")) {
			t.Errorf("descriptor %d (%s) still open", fd, l)
		}
	}
}
