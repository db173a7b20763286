package tenant_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

const (
	nodeName = "tenant-node"
	// settle bounds how long the agent may take to act on a change.
	settle = 60 * time.Second
	// fsGroup is the pods' fsGroup in the setup tests.
	fsGroup = 4321
	// maxPeakRSS bounds the agent's peak resident memory (VmHWM) in every
	// test: an idle agent uses a few tens of MiB; a tenant's tree, however
	// large, must not add much to that.
	maxPeakRSS = 128 << 20
)

// agent is a standalone agent with its manifests.
type agent struct {
	*e2eutil.Agent
	*e2eutil.Manifests
	t *testing.T
}

// newAgent prepares an agent (started with Start) with a root of its own
// and the given extra flags.
func newAgent(t *testing.T, args ...string) *agent {
	t.Helper()
	e2eutil.Skip(t, skipReason)
	root := mounttest.TempDir(t)
	m := e2eutil.NewManifests(t)
	args = append([]string{
		"--pod-manifest-path", m.Dir,
		"--operation-timeout", "60s",
		"--shutdown-grace-period", "10s",
	}, args...)
	a := &agent{t: t, Manifests: m, Agent: e2eutil.NewAgent(t, e2eutil.AgentOptions{
		Binary: agentBinary, Node: nodeName, Root: root, Args: args, ReadyTimeout: 30 * time.Second,
	})}
	// Registered after the agent's own cleanup, so it runs first, while
	// the agent still runs.
	t.Cleanup(func() { a.checkPeakRSS() })
	return a
}

// pod is a pod of the tenant (namespace default) whose container mounts
// every volume, with the fsGroup if gid is not nil.
func pod(name string, gid *int64, vols ...corev1.Volume) *corev1.Pod {
	p := e2eutil.Pod("default", "", name, vols...)
	if gid != nil {
		p.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: gid}
	}
	return p
}

// waitReady waits until the pod's volumes are ready and returns its UID.
func (a *agent) waitReady(name string) string {
	a.t.Helper()
	var uid string
	e2eutil.PollErr(a.t, settle, "pod "+name+" ready", func() error {
		d, err := a.DSW()
		if err != nil {
			return err
		}
		p := d.Pod("default", name)
		if p == nil {
			return errors.New("not in /debug/dsw")
		}
		if !p.VolumesReady {
			return fmt.Errorf("not ready: %+v", p)
		}
		uid = p.UID
		return nil
	})
	return uid
}

// volumeDir is where the agent mounts a pod's volume.
func (a *agent) volumeDir(uid, plugin, name string) string {
	return e2eutil.VolumeDir(a.Root(), uid, plugin, name)
}

// waitGone waits until the pod's directory is gone and nothing is mounted
// below the agent's pods directory for it.
func (a *agent) waitGone(uid string, timeout time.Duration) {
	a.t.Helper()
	dir := e2eutil.PodDir(a.Root(), uid)
	e2eutil.PollErr(a.t, timeout, "pod directory "+uid+" removed", func() error {
		if ms := mounttest.MountsUnder(a.t, dir); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mounttest.MountPoints(ms))
		}
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s still there (%v)", dir, err)
		}
		return nil
	})
}

// peakRSS returns the agent's peak resident memory (VmHWM) in bytes.
func (a *agent) peakRSS() int64 {
	a.t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.Process().PID()))
	if err != nil {
		a.t.Fatalf("the agent's status: %v", err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				a.t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	a.t.Fatal("no VmHWM in the agent's status")
	return 0
}

// checkPeakRSS fails the test if the running agent's peak memory exceeded
// maxPeakRSS.
func (a *agent) checkPeakRSS() {
	if a.Process() == nil || a.Process().Exited() {
		return
	}
	peak := a.peakRSS()
	a.t.Logf("agent peak RSS (VmHWM): %.1f MiB", float64(peak)/(1<<20))
	if peak > maxPeakRSS {
		a.t.Errorf("the agent's peak RSS is %.1f MiB, more than %d MiB", float64(peak)/(1<<20), maxPeakRSS>>20)
	}
}

// decoy is a tree standing for the host's data that no volume contains:
// files of several owners and modes (a setuid program among them), a
// directory, a symbolic link. Its snapshot records, for every entry, what
// an attack could change: type, mode, owner, size, content, link target,
// and the change time, which moves on any chown or chmod even to the same
// values.
type decoy struct {
	dir  string
	snap map[string]string
}

func newDecoy(t *testing.T) *decoy {
	t.Helper()
	e2eutil.Skip(t, skipReason) // it chowns, and comes before newAgent
	dir := filepath.Join(mounttest.TempDir(t), "host-data")
	for _, f := range []struct {
		path     string
		mode     os.FileMode
		uid, gid int
	}{
		{"etc/passwd", 0o644, 0, 0},
		{"etc/shadow", 0o600, 0, 0},
		{"bin/su", 0o755 | os.ModeSetuid, 0, 0},
		{"home/user/notes", 0o640, 1000, 1000},
	} {
		p := filepath.Join(dir, f.path)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte("decoy "+f.path+"\n"), 0o600))
		must(t, os.Chown(p, f.uid, f.gid))
		must(t, os.Chmod(p, f.mode))
	}
	must(t, os.Chmod(filepath.Join(dir, "home", "user"), 0o700))
	must(t, os.Chown(filepath.Join(dir, "home", "user"), 1000, 1000))
	must(t, os.Symlink("passwd", filepath.Join(dir, "etc", "link")))
	d := &decoy{dir: dir}
	d.snap = d.take(t)
	t.Cleanup(func() { d.check(t) })
	return d
}

func (d *decoy) take(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(d.dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("mode %o uid %d gid %d size %d ctime %d.%09d", st.Mode, st.Uid, st.Gid, st.Size, st.Ctim.Sec, st.Ctim.Nsec)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			desc += " sha256 " + hex.EncodeToString(sum[:])
		case unix.S_IFLNK:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[path] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot of the decoy tree: %v", err)
	}
	return out
}

// check fails the test for every difference from the first snapshot.
func (d *decoy) check(t *testing.T) {
	t.Helper()
	now := d.take(t)
	var paths []string
	for p := range d.snap {
		paths = append(paths, p)
	}
	for p := range now {
		if _, ok := d.snap[p]; !ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	for _, p := range paths {
		if d.snap[p] != now[p] {
			t.Errorf("decoy %s changed:\n  was %q\n  now %q", p, d.snap[p], now[p])
		}
	}
}

// plantLinks plants in dir symbolic links out of the volume: to the decoy
// tree, its files, its directories, the root, and relative ones climbing
// out.
func (d *decoy) plantLinks(t *testing.T, dir string) {
	t.Helper()
	for name, target := range map[string]string{
		"to-decoy":      d.dir,
		"to-shadow":     filepath.Join(d.dir, "etc", "shadow"),
		"to-su":         filepath.Join(d.dir, "bin", "su"),
		"to-home":       filepath.Join(d.dir, "home", "user"),
		"to-root":       "/",
		"climb":         strings.Repeat("../", 32) + strings.TrimPrefix(d.dir, "/"),
		"dir/to-passwd": filepath.Join(d.dir, "etc", "passwd"),
	} {
		p := filepath.Join(dir, name)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.Symlink(target, p))
	}
}

// plantSpecial plants a FIFO, a character device, a block device node (of
// dev, a loop device with content), a socket, a directory no one may
// enter, a file with a newline and one with a 255-byte name.
func plantSpecial(t *testing.T, dir, blockDev string) {
	t.Helper()
	must(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o666))
	must(t, unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	var st unix.Stat_t
	must(t, unix.Stat(blockDev, &st))
	must(t, unix.Mknod(filepath.Join(dir, "disk"), unix.S_IFBLK|0o666, int(st.Rdev)))
	// A socket path is limited to 108 bytes: bind through the directory's
	// descriptor.
	dirFD, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	must(t, err)
	must(t, unix.Bind(sock, &unix.SockaddrUnix{Name: fmt.Sprintf("/proc/self/fd/%d/sock", dirFD)}))
	unix.Close(sock)
	unix.Close(dirFD)
	locked := filepath.Join(dir, "locked")
	must(t, os.MkdirAll(filepath.Join(locked, "inner"), 0o755))
	must(t, os.WriteFile(filepath.Join(locked, "inner", "f"), []byte("x"), 0o644))
	must(t, os.Chmod(locked, 0))
	must(t, os.WriteFile(filepath.Join(dir, "new\nline"), []byte("x"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, strings.Repeat("n", 255)), []byte("x"), 0o644))
}

// deviceSum is a checksum of the first MiB of a block device.
func deviceSum(t *testing.T, dev string) string {
	t.Helper()
	f, err := os.Open(dev)
	must(t, err)
	defer f.Close()
	buf := make([]byte, 1<<20)
	_, err = f.ReadAt(buf, 0)
	must(t, err)
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:])
}

// deepTree makes a chain of depth directories with 255-byte names below
// dir, working on file descriptors (the path is far longer than PATH_MAX).
func deepTree(t *testing.T, dir string, depth int) {
	t.Helper()
	name := strings.Repeat("d", 255)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	for i := 0; i < depth; i++ {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			unix.Close(fd)
			t.Fatalf("mkdir at depth %d: %v", i, err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatalf("open at depth %d: %v", i, err)
		}
		fd = next
	}
	// A file at the bottom.
	f, err := unix.Openat(fd, "bottom", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	must(t, err)
	unix.Close(f)
	unix.Close(fd)
}

// wideTree makes n empty files with names of about 250 bytes in dir.
func wideTree(t *testing.T, dir string, n int) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(fd)
	for i := 0; i < n; i++ {
		f, err := unix.Openat(fd, wideName(i), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
		unix.Close(f)
	}
}

// wideName is the name of wideTree's file i.
func wideName(i int) string { return fmt.Sprintf("%s%010d", strings.Repeat("w", 240), i) }

// deepBottomGID returns the group of the file at the bottom of deepTree.
func deepBottomGID(t *testing.T, dir string, depth int) uint32 {
	t.Helper()
	name := strings.Repeat("d", 255)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	for i := 0; i < depth; i++ {
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		must(t, err)
		fd = next
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	must(t, unix.Fstatat(fd, "bottom", &st, unix.AT_SYMLINK_NOFOLLOW))
	return st.Gid
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
