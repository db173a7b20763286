// Package mounttest helps tests that make real mounts: the one place a
// test says it needs root (RequireRoot), reading the mount table, temporary
// directories that are always unmounted before they are removed, and loop
// devices that are always detached. It is only imported by tests.
package mounttest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// RequireRootEnv names the environment variable that, set to anything but
// "" or "0" (as `make test` sets it), makes RequireRoot fail a test that
// cannot run for want of root; so does CI.
const RequireRootEnv = "VOLUME_AGENT_REQUIRE_ROOT"

// RequireRoot is where every test that needs root says so. Unless it runs
// as root it skips the test, saying why, so that `go test` and `make unit`
// work as any user; but when root is required here (RequireRootEnv or CI is
// set) it fails the test instead, so that a run meant to cover everything
// cannot pass by skipping. -short (`make unit`) always skips.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	const why = "the test needs root (run the tests as root, e.g. sudo -E go test ./...)"
	if rootRequired() && !testing.Short() {
		t.Fatalf("%s; %s=%q, CI=%q: the tests that need root must run here", why, RequireRootEnv, os.Getenv(RequireRootEnv), os.Getenv("CI"))
	}
	t.Skip("skipping: " + why)
}

// rootRequired reports whether a test may not skip for want of root.
func rootRequired() bool {
	if v := os.Getenv(RequireRootEnv); v != "" && v != "0" {
		return true
	}
	return os.Getenv("CI") != ""
}

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	ID, Parent   int
	Major, Minor int
	// Root is the path inside the filesystem that is mounted (not "/" for
	// bind mounts of a subdirectory).
	Root       string
	MountPoint string
	// Options are the per-mount options (ro, nosuid, noexec...).
	Options []string
	FSType  string
	Source  string
	// SuperOptions are the filesystem's options (size=..., mode=...).
	SuperOptions []string
}

// HasOption reports whether o is a per-mount option of m.
func (m Mount) HasOption(o string) bool {
	for _, x := range m.Options {
		if x == o {
			return true
		}
	}
	return false
}

// SuperOption returns the value of a key=value filesystem option.
func (m Mount) SuperOption(key string) (string, bool) {
	for _, x := range m.SuperOptions {
		if k, v, ok := strings.Cut(x, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// ReadMounts reads /proc/self/mountinfo (through moby/sys/mountinfo, which
// also undoes the kernel's octal escapes).
func ReadMounts() ([]Mount, error) {
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, err
	}
	out := make([]Mount, 0, len(infos))
	for _, i := range infos {
		out = append(out, Mount{
			ID: i.ID, Parent: i.Parent, Major: i.Major, Minor: i.Minor,
			Root: i.Root, MountPoint: i.Mountpoint, Options: strings.Split(i.Options, ","),
			FSType: i.FSType, Source: i.Source, SuperOptions: strings.Split(i.VFSOptions, ","),
		})
	}
	return out, nil
}

// Mounts returns the mount table, failing the test if it cannot be read.
func Mounts(t testing.TB) []Mount {
	t.Helper()
	ms, err := ReadMounts()
	if err != nil {
		t.Fatalf("reading mountinfo: %v", err)
	}
	return ms
}

// MountsAt returns the mounts whose mount point is path, bottom first.
func MountsAt(t testing.TB, path string) []Mount {
	t.Helper()
	path = Real(path)
	var out []Mount
	for _, m := range Mounts(t) {
		if m.MountPoint == path {
			out = append(out, m)
		}
	}
	return out
}

// MountAt returns the one mount at path, failing the test unless there is
// exactly one.
func MountAt(t testing.TB, path string) Mount {
	t.Helper()
	ms := MountsAt(t, path)
	if len(ms) != 1 {
		t.Fatalf("%d mounts at %s, want 1: %+v", len(ms), path, ms)
	}
	return ms[0]
}

// MountsUnder returns the mounts at root or below it, except a bind mount
// of root onto itself: that is how the agent makes its root directory a
// shared mount (--shared-root-dir), and it holds no volume.
func MountsUnder(t testing.TB, root string) []Mount {
	t.Helper()
	all, err := ReadMounts()
	if err != nil {
		t.Fatalf("reading mountinfo: %v", err)
	}
	ms, err := mountsUnder(root)
	if err != nil {
		t.Fatalf("reading mountinfo: %v", err)
	}
	out := ms[:0]
	for _, m := range ms {
		if !selfBind(all, m) {
			out = append(out, m)
		}
	}
	return out
}

// selfBind reports whether m is a directory bound onto itself: the mount it
// covers is of the same filesystem, and m shows the very directory of it
// that m is mounted on.
func selfBind(all []Mount, m Mount) bool {
	var parent *Mount
	for i := range all {
		if all[i].ID == m.Parent {
			parent = &all[i]
		}
	}
	if parent == nil || parent.Major != m.Major || parent.Minor != m.Minor {
		return false
	}
	rel, err := filepath.Rel(parent.MountPoint, m.MountPoint)
	if err != nil || strings.HasPrefix(rel, "..") {
		return false
	}
	return filepath.Join(parent.Root, rel) == m.Root
}

func mountsUnder(root string) ([]Mount, error) {
	all, err := ReadMounts()
	if err != nil {
		return nil, err
	}
	root = Real(root)
	var out []Mount
	for _, m := range all {
		if m.MountPoint == root || strings.HasPrefix(m.MountPoint, root+"/") {
			out = append(out, m)
		}
	}
	return out, nil
}

// Real resolves symbolic links in path as far as it exists, so that it can
// be compared with mount points (which the kernel reports resolved).
func Real(path string) string {
	path = filepath.Clean(path)
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	dir, base := filepath.Split(path)
	if dir == "" || dir == "/" || filepath.Clean(dir) == path {
		return path
	}
	return filepath.Join(Real(filepath.Clean(dir)), base)
}

// UnmountUnder unmounts every mount at root or below it, deepest and newest
// first. A mount that refuses (busy) is detached lazily, so that the caller
// can always remove root afterwards without reaching into a mounted
// filesystem. It copes with any number of mounts: it keeps going while
// each pass leaves fewer.
func UnmountUnder(root string) error {
	// Each pass unmounts everything it sees, deepest and newest first;
	// stacked and propagated mounts may need a few passes.
	left := -1
	for pass := 0; ; pass++ {
		ms, err := mountsUnder(root)
		if err != nil {
			return err
		}
		if len(ms) == 0 {
			return nil
		}
		if pass >= 16 && len(ms) >= left {
			return fmt.Errorf("%d mounts left under %s", len(ms), root)
		}
		left = len(ms)
		sort.SliceStable(ms, func(i, j int) bool {
			di, dj := strings.Count(ms[i].MountPoint, "/"), strings.Count(ms[j].MountPoint, "/")
			if di != dj {
				return di > dj
			}
			return ms[i].ID > ms[j].ID
		})
		for _, m := range ms {
			if err := unix.Unmount(m.MountPoint, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				if err := unix.Unmount(m.MountPoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("unmounting %s: %w", m.MountPoint, err)
				}
			}
		}
	}
}

// MountPoints returns the mount points of ms, sorted.
func MountPoints(ms []Mount) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.MountPoint)
	}
	sort.Strings(out)
	return out
}

// Exists reports whether path exists (without following a last symbolic
// link), failing the test if that cannot be told.
func Exists(t testing.TB, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// CleanupMounts registers a cleanup that unmounts everything under dir.
// Cleanups run last-registered first: call it after creating dir (so that
// the unmount runs before dir is removed) and before mounting anything.
// Loop devices backed by files under dir (the agent's pins of raw block
// volumes, a CSI driver's devices) are detached first: they hold their
// mounts busy, and a lazy unmount would leave them attached for good.
func CleanupMounts(t testing.TB, dir string) {
	t.Helper()
	t.Cleanup(func() {
		DetachLoopsUnder(t, dir)
		if err := UnmountUnder(dir); err != nil {
			t.Errorf("cleaning up mounts: %v", err)
		}
	})
}

// TempDir returns a new temporary directory whose mounts are all unmounted
// before it is removed, even when the test fails.
func TempDir(t testing.TB) string {
	t.Helper()
	dir := Real(t.TempDir())
	CleanupMounts(t, dir)
	return dir
}

// LoopDevice creates a sparse backing file of size bytes and attaches it to
// a free loop device, which is detached when the test ends (after unmounting
// anything still mounted from it).
func LoopDevice(t testing.TB, size int64) string {
	t.Helper()
	backing := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(backing)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", backing).CombinedOutput()
	if err != nil {
		t.Skipf("skipping: cannot attach a loop device (losetup -f --show: %v: %s)", err, strings.TrimSpace(string(out)))
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { DetachLoop(t, dev) })
	return dev
}

// DetachLoop unmounts every mount of dev and detaches it.
func DetachLoop(t testing.TB, dev string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err == nil {
		maj, min := int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev))
		for range 16 {
			ms, err := ReadMounts()
			if err != nil {
				t.Errorf("reading mountinfo: %v", err)
				break
			}
			found := false
			for i := len(ms) - 1; i >= 0; i-- {
				if ms[i].Major == maj && ms[i].Minor == min {
					found = true
					if err := unix.Unmount(ms[i].MountPoint, 0); err != nil {
						_ = unix.Unmount(ms[i].MountPoint, unix.MNT_DETACH)
					}
				}
			}
			if !found {
				break
			}
		}
	}
	if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil && attached(dev) {
		// A device attached with autoclear (the agent's emptyDir images)
		// detaches itself with its last unmount: only one still attached
		// is an error.
		t.Errorf("losetup -d %s: %v: %s", dev, err, strings.TrimSpace(string(out)))
	}
}

// attached reports whether the loop device dev has a backing file (true
// when that cannot be told).
func attached(dev string) bool {
	out, err := exec.Command("losetup", "--noheadings", "--output", "BACK-FILE", dev).CombinedOutput()
	return err == nil && strings.TrimSpace(string(out)) != "" || err != nil && !strings.Contains(string(out), "No such device")
}

// LoopDevicesUnder returns the loop devices whose backing file is below
// dir, with their backing files.
func LoopDevicesUnder(t testing.TB, dir string) map[string]string {
	t.Helper()
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		t.Fatalf("losetup --list: %v", err)
	}
	devs := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.HasPrefix(f[1], dir+"/") {
			devs[f[0]] = f[1]
		}
	}
	return devs
}

// DetachLoopsUnder unmounts and detaches every loop device whose backing
// file is below dir: what a CSI driver that attaches loop devices left.
func DetachLoopsUnder(t testing.TB, dir string) {
	t.Helper()
	for dev, file := range LoopDevicesUnder(t, dir) {
		t.Logf("detaching %s (backed by %s)", dev, file)
		DetachLoop(t, dev)
	}
}

// GrowLoop grows the backing file of the loop device dev to size bytes and
// makes the device see it, as a storage backend grows a disk.
func GrowLoop(t testing.TB, dev string, size int64) {
	t.Helper()
	out, err := exec.Command("losetup", "--noheadings", "--output", "BACK-FILE", dev).Output()
	if err != nil {
		t.Fatalf("losetup %s: %v", dev, err)
	}
	if err := os.Truncate(strings.TrimSpace(string(out)), size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "--set-capacity", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup --set-capacity %s: %v: %s", dev, err, out)
	}
}

// DiskFormat returns the filesystem type blkid finds on dev, "" if none.
func DiskFormat(t testing.TB, dev string) string {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-s", "TYPE", "-o", "value", dev).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return ""
	}
	if err != nil {
		t.Fatalf("blkid %s: %v", dev, err)
	}
	return strings.TrimSpace(string(out))
}

// Mkfs formats dev, skipping the test if the tool is not installed.
func Mkfs(t testing.TB, fsType, dev string) {
	t.Helper()
	tool := "mkfs." + fsType
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("skipping: %s is not installed", tool)
	}
	args := []string{dev}
	switch fsType {
	case "ext4", "ext3", "ext2":
		args = []string{"-F", "-q", dev}
	case "xfs":
		args = []string{"-f", "-q", dev}
	}
	if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", tool, dev, err, out)
	}
}

// MountDevice mounts dev at target with mount(8) and registers its unmount.
func MountDevice(t testing.TB, dev, target, fsType string) {
	t.Helper()
	if out, err := exec.Command("mount", "-t", fsType, dev, target).CombinedOutput(); err != nil {
		t.Fatalf("mount %s %s: %v: %s", dev, target, err, out)
	}
	t.Cleanup(func() { _ = UnmountUnder(target) })
}

// MountTmpfs mounts a small tmpfs at target (which must exist) and registers
// its unmount.
func MountTmpfs(t testing.TB, target string) {
	t.Helper()
	if err := unix.Mount("tmpfs", target, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting tmpfs at %s: %v", target, err)
	}
	t.Cleanup(func() { _ = UnmountUnder(target) })
}

// WriteFile writes a file, failing the test on error.
func WriteFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// ReadFile returns a file's content, failing the test on error.
func ReadFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return string(b)
}

// FSSize is the size statfs reports for the filesystem at path.
func FSSize(t testing.TB, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatalf("statfs %s: %v", path, err)
	}
	return int64(st.Blocks) * st.Bsize
}

// ReserveHugePages makes n more huge pages of the default size available
// to the test, and gives the old reservation back when it ends. The
// reservation is machine-wide, and test binaries of several packages run
// at once: an exclusive lock on a file every caller shares keeps one
// test's restore from taking the pages of another still using them. Skips
// only when the kernel has no hugetlbfs.
func ReserveHugePages(t testing.TB, n int) {
	t.Helper()
	fss, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(fss), "\thugetlbfs\n") {
		t.Skip("the kernel has no hugetlbfs (not in /proc/filesystems)")
	}
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "volume-agent-tests-hugepages.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		t.Fatalf("locking the hugepage reservation: %v", err)
	}
	t.Cleanup(func() { lock.Close() }) // runs last: after the restore
	const knob = "/proc/sys/vm/nr_hugepages"
	read := func() int {
		data, err := os.ReadFile(knob)
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			t.Fatalf("%s: %v", knob, err)
		}
		return v
	}
	old := read()
	t.Cleanup(func() {
		if err := os.WriteFile(knob, []byte(strconv.Itoa(old)), 0o644); err != nil {
			t.Errorf("restoring %s to %d: %v", knob, old, err)
		}
	})
	if err := os.WriteFile(knob, []byte(strconv.Itoa(old+n)), 0o644); err != nil {
		t.Fatalf("reserving %d hugepages: %v", n, err)
	}
	if got := read(); got < old+n {
		t.Fatalf("the kernel reserved %d hugepages, want %d (memory too fragmented?)", got, old+n)
	}
}
