package emptydir_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
)

func reserveHugePages(t *testing.T, n int) {
	t.Helper()
	mounttest.ReserveHugePages(t, n)
}

func mountAt(t *testing.T, dir string) *mountinfo.Info {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 {
		return nil
	}
	return ms[len(ms)-1]
}

// A HugePages emptyDir is a hugetlbfs with the pod's page size that a
// pod can map pages of; set up again it is kept; a medium with another
// size is refused on it; torn down (by a plugin that never set it up, as
// after a restart) nothing is left.
func TestHugePagesMount(t *testing.T) {
	f := newFixture(t)
	reserveHugePages(t, 4)
	pod := podInfo("huge-1")
	pod.HugePageSizes = "2Mi"
	s := spec("huge", v1.EmptyDirVolumeSource{Medium: v1.StorageMediumHugePages})
	dir := f.setUp(t, s, pod)

	m := mountAt(t, dir)
	if m == nil || m.FSType != "hugetlbfs" || !strings.Contains(","+m.VFSOptions+",", ",pagesize=2M,") {
		t.Fatalf("mount at %s: %+v, want hugetlbfs with pagesize=2M", dir, m)
	}

	// A pod maps a huge page of a file in the volume and writes to it.
	file, err := os.OpenFile(filepath.Join(dir, "buf"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	const page = 2 << 20
	mem, err := unix.Mmap(int(file.Fd()), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap of a huge page in the volume: %v", err)
	}
	copy(mem[page-5:], "hello")
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	file.Close()

	f.setUp(t, s, pod) // again: kept
	if ms := mountsAt(t, dir); ms != 1 {
		t.Errorf("%d mounts at %s after a second set up, want 1", ms, dir)
	}
	other := podInfo("huge-1")
	other.HugePageSizes = "1Gi"
	err = f.plugin.SetUp(t.Context(), &plugins.SetUpRequest{Spec: spec("huge", v1.EmptyDirVolumeSource{Medium: "HugePages-1Gi"}), Pod: other, Dir: dir, Log: zap.NewNop()})
	if err == nil || !strings.Contains(err.Error(), "differ") {
		t.Errorf("set up with another page size on the mounted volume: %v", err)
	}

	restarted := emptydir.New(plugins.Host{Paths: f.paths, Mounter: mountutil.New(), Log: zap.NewNop()})
	if err := restarted.TearDown(t.Context(), &plugins.TearDownRequest{Spec: s, Pod: pod.PodRef, Dir: dir, Log: zap.NewNop()}); err != nil {
		t.Fatal(err)
	}
	if m := mountAt(t, dir); m != nil {
		t.Errorf("still mounted after tear down: %+v", m)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("volume directory left: %v", err)
	}
}

// Without a hugepages request the kubelet's error, and nothing mounted.
func TestHugePagesWithoutRequest(t *testing.T) {
	f := newFixture(t)
	pod := podInfo("huge-2")
	s := spec("huge", v1.EmptyDirVolumeSource{Medium: "HugePages-2Mi"})
	dir := f.paths.PodVolumeDir(pod.UID, emptydir.Name, "huge")
	err := f.plugin.SetUp(t.Context(), &plugins.SetUpRequest{Spec: s, Pod: pod, Dir: dir, Log: zap.NewNop()})
	if err == nil || !strings.Contains(err.Error(), "there is no resource request for huge pages") {
		t.Errorf("SetUp: %v", err)
	}
	if m := mountAt(t, dir); m != nil {
		t.Errorf("mounted: %+v", m)
	}
}

func mountsAt(t *testing.T, dir string) int {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	return len(ms)
}
