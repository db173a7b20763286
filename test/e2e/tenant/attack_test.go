package tenant_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// hostPath volumes name paths of the node, which the agent sees below
// --host-root. A link on the node is the node's: an absolute target starts
// at the node's root. Resolved by the agent's root instead, a tenant who
// can place a link on the node (through an earlier hostPath or local
// volume) reaches the agent's own filesystem, outside the node's. Here the
// node's /data links to an absolute path that names the decoy outside the
// host root and an empty directory of the node below it: mounting
// /data/etc must not mount the decoy's etc (the node has none), and
// creating /data/new (DirectoryOrCreate) must create it in the node's
// directory, not in the decoy.
func TestHostPathStaysWithinHostRoot(t *testing.T) {
	t.Parallel()
	d := newDecoy(t)
	hostRoot := mounttest.TempDir(t)
	must(t, os.Symlink(d.dir, filepath.Join(hostRoot, "data")))
	within := filepath.Join(hostRoot, strings.TrimPrefix(d.dir, "/"))
	// The link's target on the node (a DirectoryOrCreate path below a
	// dangling link fails on the node too, as the kubelet's MkdirAll does).
	must(t, os.MkdirAll(within, 0o755))
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

// A memory emptyDir without sizeLimit is a tmpfs sized as the kubelet
// sizes it: the pod's memory limit, else the node's memory for pods
// (standalone: MemTotal). The kernel's default, half of the node's RAM,
// promises a pod without a limit less than the node has, and one with a
// limit more than its cgroup allows: either way the tenant's writes end in
// something other than a full volume (an OOM kill, or ENOSPC early). The
// tmpfs's pages count against the pod's memory cgroup, so it is the pod's
// memory limit (LimitRange, ResourceQuota) that bounds what a tenant can
// hold in memory; the agent only makes the volume say the same.
func TestMemoryEmptyDirDefaultSize(t *testing.T) {
	t.Parallel()
	a := newAgent(t)
	a.Write("unlimited.yaml", pod("unlimited", nil, e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "")))
	limited := pod("limited", nil, e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, ""))
	limited.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("48Mi")}
	a.Write("limited.yaml", limited)
	a.Start()
	tmpfsSize := func(name string) int64 {
		var st unix.Statfs_t
		must(t, unix.Statfs(a.volumeDir(a.waitReady(name), e2eutil.EmptyDirPlugin, "mem"), &st))
		return int64(st.Blocks) * st.Bsize
	}
	page := int64(os.Getpagesize())
	for _, tc := range []struct {
		pod  string
		want int64
	}{
		{"limited", 48 << 20},
		{"unlimited", memTotal(t)},
	} {
		// The kernel rounds a tmpfs's size up to whole pages.
		want := (tc.want + page - 1) / page * page
		if got := tmpfsSize(tc.pod); got != want {
			t.Errorf("pod %s: the memory emptyDir's size is %d MiB (%d bytes), want %d MiB (%d bytes)", tc.pod, got>>20, got, want>>20, want)
		}
	}
}

// memTotal is the node's memory as /proc/meminfo says (MemTotal).
func memTotal(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/meminfo")
	must(t, err)
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			must(t, err)
			return kib << 10
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

// A neighbour on the pod network opens many connections to the metrics
// port and never finishes a request (slowloris). The agent keeps serving,
// holds a bounded number of them, and closes those that idle.
func TestConnectionFlood(t *testing.T) {
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
