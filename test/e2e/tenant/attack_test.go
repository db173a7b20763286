package tenant_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// hostPath volumes name paths of the node, which the agent sees below
// --host-root. A link on the node is the node's: an absolute target starts
// at the node's root. Resolved by the agent's root instead, a tenant who
// can place a link on the node (through an earlier hostPath or local
// volume) reaches the agent's own filesystem, outside the node's. Here the
// node's /data links to an absolute path that exists only outside the host
// root (the decoy): mounting /data/etc must not mount the decoy's etc, and
// creating /data/new (DirectoryOrCreate) must create it below the host
// root.
func TestHostPathStaysWithinHostRoot(t *testing.T) {
	needsFix(t, "4 (i13-harden: host paths resolved within --host-root)")
	t.Parallel()
	d := newDecoy(t)
	hostRoot := mounttest.TempDir(t)
	must(t, os.Symlink(d.dir, filepath.Join(hostRoot, "data")))
	within := filepath.Join(hostRoot, strings.TrimPrefix(d.dir, "/"))
	a := newAgent(t, "--host-root", hostRoot)
	dirType := corev1.HostPathDirectory
	createType := corev1.HostPathDirectoryOrCreate
	a.Write("reader.yaml", pod("reader", nil, e2eutil.HostPathVolume("etc", "/data/etc", &dirType)))
	a.Write("creator.yaml", pod("creator", nil, e2eutil.HostPathVolume("new", "/data/new", &createType)))
	a.Start()
	uid := a.waitReady("creator")
	if _, err := os.Stat(filepath.Join(within, "new")); err != nil {
		t.Errorf("/data/new was not created below the host root: %v", err)
	}
	got, want := a.volumeDir(uid, e2eutil.HostPathPlugin, "new"), filepath.Join(within, "new")
	if same, err := sameInode(got, want); err != nil || !same {
		t.Errorf("the creator's volume %s is not %s (%v)", got, want, err)
	}
	// The reader's /data/etc does not exist below the host root: an error,
	// never the decoy's etc.
	e2eutil.PollErr(t, settle, "the reader's volume refused", func() error {
		evs, err := a.Events()
		if err != nil {
			return err
		}
		for _, e := range evs.Events {
			if e.Object.Name == "reader" && e.Type == corev1.EventTypeWarning {
				t.Logf("reader: %s: %s", e.Reason, e.Message)
				return nil
			}
		}
		return fmt.Errorf("no warning for the reader among %d events", len(evs.Events))
	})
	if ms := mounttest.MountsUnder(t, a.Root()); len(ms) != 1 {
		t.Errorf("mounts under the root: %v, want only the creator's", mounttest.MountPoints(ms))
	}
	d.check(t)
}

func sameInode(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// A memory emptyDir without sizeLimit in a pod without a memory limit: the
// kernel's default tmpfs size is half of the node's memory, which one
// tenant could fill. The agent gives it a bounded default.
func TestMemoryEmptyDirIsBounded(t *testing.T) {
	needsFix(t, "10 (i13-harden: a default size for memory emptyDirs)")
	t.Parallel()
	a := newAgent(t)
	a.Write("greedy.yaml", pod("greedy", nil, e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "")))
	a.Start()
	uid := a.waitReady("greedy")
	var st unix.Statfs_t
	must(t, unix.Statfs(a.volumeDir(uid, e2eutil.EmptyDirPlugin, "mem"), &st))
	var si unix.Sysinfo_t
	must(t, unix.Sysinfo(&si))
	size, half := int64(st.Blocks)*st.Bsize, int64(si.Totalram)*int64(si.Unit)/2
	t.Logf("tmpfs size %d MiB; half of the node's memory is %d MiB", size>>20, half>>20)
	// The kernel's default is half of the memory, rounded to pages.
	if size > half*9/10 {
		t.Errorf("the memory emptyDir may grow to %d MiB, the kernel's default", size>>20)
	}
}

// A neighbour on the pod network opens many connections to the metrics
// port and never finishes a request (slowloris). The agent keeps serving,
// holds a bounded number of them, and closes those that idle.
func TestConnectionFlood(t *testing.T) {
	needsFix(t, "5 (i13-harden: HTTP timeouts and a connection cap)")
	t.Parallel()
	a := newAgent(t)
	a.Start()
	addr := strings.TrimPrefix(a.MetricsURL(), "http://")
	const conns = 1500
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for range conns {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			continue // refused or dropped: fine
		}
		_, _ = c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: agent\r\n"))
		held = append(held, c)
	}
	t.Logf("%d connections open", len(held))
	fds := func() int {
		entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", a.Process().PID()))
		must(t, err)
		return len(entries)
	}
	if n := fds(); n > 1024 {
		t.Errorf("the agent holds %d file descriptors with %d connections open: no cap", n, len(held))
	}
	// Still serving.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.MetricsURL()+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("metrics during the flood: %v", err)
	}
	resp.Body.Close()
	// Idle connections are closed.
	e2eutil.Poll(t, 2*time.Minute, "idle connections closed", func(context.Context) (bool, string) {
		n := fds()
		return n < 100, fmt.Sprintf("%d file descriptors", n)
	})
}
