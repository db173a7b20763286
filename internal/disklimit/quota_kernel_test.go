package disklimit

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

// quotaFS makes an ext4 with project quotas on a loop device and mounts it
// with prjquota. It skips, with the kernel's reason, only when the kernel
// refuses the quota feature (EINVAL from the mount, and the kernel's log or
// its configuration says quotas are why); any other failure fails.
func quotaFS(t *testing.T) string {
	t.Helper()
	mounttest.RequireRoot(t)
	dev := mounttest.LoopDevice(t, 128<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-O", "quota,project", dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 -O quota,project %s: %v: %s", dev, err, out)
	}
	mnt := mounttest.TempDir(t)
	before := kernelLog()
	err := unix.Mount(dev, mnt, "ext4", 0, "prjquota")
	if errors.Is(err, unix.EINVAL) {
		if why := kernelQuotaRefusal(logSince(before, kernelLog()), filepath.Base(dev)); why != "" {
			t.Skipf("the kernel refuses an ext4 with project quotas (mount -o prjquota %s: %v): %s", dev, err, why)
		}
	}
	if err != nil {
		t.Fatalf("mount -o prjquota %s %s: %v", dev, mnt, err)
	}
	return mnt
}

// kernelQuotaRefusal is why the kernel refused to mount an ext4 with the
// quota feature from loop device dev: its log's line about quotas for the
// device, else the configuration's missing CONFIG_QUOTA or
// CONFIG_QFMT_V2; "" when neither says so. log is what the kernel logged
// since the mount began.
func kernelQuotaRefusal(log []string, dev string) string {
	for _, l := range log {
		if strings.Contains(l, "EXT4-fs ("+dev+")") && strings.Contains(strings.ToLower(l), "quota") {
			_, msg, _ := strings.Cut(l, "] ")
			return "kernel log: " + msg
		}
	}
	out, err := exec.Command("sh", "-c", "zcat /proc/config.gz").Output()
	if err != nil {
		return ""
	}
	cfg := string(out)
	for _, opt := range []string{"CONFIG_QUOTA", "CONFIG_QFMT_V2"} {
		if !strings.Contains(cfg, "\n"+opt+"=y") {
			return "the kernel's configuration has no " + opt
		}
	}
	return ""
}

// kernelLog is the kernel's log, nil where it cannot be read.
func kernelLog() []string {
	out, err := exec.Command("dmesg").Output()
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// logSince is what the kernel log after has past the last line of before
// (the log is a ring others write to: counting lines does not do).
func logSince(before, after []string) []string {
	if len(before) == 0 {
		return after
	}
	last := before[len(before)-1]
	for i := len(after) - 1; i >= 0; i-- {
		if after[i] == last {
			return after[i+1:]
		}
	}
	return after
}

// The project quota backend against the kernel: a volume's project stops
// an unprivileged writer at its 16Mi limit with EDQUOT while a neighbour
// volume keeps its own room, the usage reads back from the quota, and the
// project is freed (no limit, no record) at release and stays freed after
// a restart.
func TestQuotaKernel(t *testing.T) {
	mnt := quotaFS(t)
	state := filepath.Join(mnt, "state")
	e, err := New(Options{Mode: ModeQuota, Root: mnt, StateDir: state, Log: zaptest.NewLogger(t)})
	if errors.Is(err, unix.ENOSYS) {
		t.Skipf("the kernel has no quotactl_fd: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if st := e.Status(); st.Kind != KindQuota {
		t.Fatalf("enforcement %v, want project quotas", st)
	}
	pr := e.Projects()
	// As the emptyDir plugin does: the project is set on the directory
	// being prepared, renamed into place.
	setUp := func(name string) (string, uint32) {
		vol := filepath.Join(mnt, "pods", name)
		tmp := vol + ".tmp"
		if err := os.MkdirAll(tmp, 0o777); err != nil {
			t.Fatal(err)
		}
		id, err := pr.Assign(tmp, vol, 16<<20)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, vol); err != nil {
			t.Fatal(err)
		}
		return vol, id
	}
	vol, id := setUp("hog")
	neighbour, nid := setUp("neighbour")
	if id == nid || id < FirstProject || nid < FirstProject {
		t.Fatalf("project IDs %d and %d, want two distinct from %d", id, nid, FirstProject)
	}
	for _, d := range []string{vol, neighbour, filepath.Dir(vol), mnt, filepath.Dir(mnt)} {
		if err := os.Chmod(d, 0o777); err != nil { // 65534 walks to the volumes
			t.Fatal(err)
		}
	}
	if q, err := (Kernel{}).Quota(mnt, id); err != nil || q.LimitBytes != 16<<20 {
		t.Fatalf("project %d quota %+v, %v; want a 16Mi hard limit", id, q, err)
	}

	out, err := writeAsNobody(t, filepath.Join(vol, "f"), 17)
	// The directory's own blocks count against the project too, so the
	// file ends a little short of 16 MiB.
	if err == nil || !strings.Contains(out, "Disk quota exceeded") || !strings.Contains(out, "15+1 records out") && !strings.Contains(out, "16+") {
		t.Errorf("writing 17 MiB into a 16Mi project: %v: %s; want the 17th MiB refused with EDQUOT", err, out)
	}
	if out, err := writeAsNobody(t, filepath.Join(neighbour, "f"), 8); err != nil {
		t.Errorf("the neighbour writing 8 MiB into its own 16Mi: %v: %s", err, out)
	}
	bytes, inodes, ok, err := e.Usage(vol)
	if err != nil || !ok || bytes <= 15<<20 || bytes > 16<<20 || inodes < 2 {
		t.Errorf("Usage(hog) = %d, %d, %v, %v; want its 16Mi limit nearly full, 2 inodes, from the quota", bytes, inodes, ok, err)
	}
	if bytes, _, ok, err := e.Usage(neighbour); err != nil || !ok || bytes < 8<<20 || bytes > 9<<20 {
		t.Errorf("Usage(neighbour) = %d, %v, %v; want about 8Mi", bytes, ok, err)
	}

	if err := os.RemoveAll(vol); err != nil {
		t.Fatal(err)
	}
	if err := pr.Release(vol); err != nil {
		t.Fatal(err)
	}
	if q, err := (Kernel{}).Quota(mnt, id); err != nil || q.LimitBytes != 0 || q.Bytes != 0 {
		t.Errorf("project %d after release: %+v, %v; want no limit and nothing charged", id, q, err)
	}
	if _, err := os.Stat(filepath.Join(state, "projects", itoa(int(id)))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("project %d's record after release: %v", id, err)
	}
	// A restart keeps the neighbour's project and nothing else.
	e2, err := New(Options{Mode: ModeQuota, Root: mnt, StateDir: state, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if ids := e2.Projects().IDs(); len(ids) != 1 || ids[nid] != neighbour {
		t.Errorf("projects after a restart: %v, want only %d: %s", ids, nid, neighbour)
	}
}
