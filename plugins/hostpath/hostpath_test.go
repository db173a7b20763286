package hostpath_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/volume"
)

type fixture struct {
	plugin *hostpath.Plugin
	paths  volume.Paths
	// host is a directory standing for the node's file system.
	host string
	pod  volume.PodInfo
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	mounttest.RequireRoot(t)
	// The host directory is created first so that it is removed last, after
	// the root directory's mounts are gone.
	host := mounttest.TempDir(t)
	paths := volume.Paths{Root: mounttest.TempDir(t)}
	h := plugins.Host{Paths: paths, Mounter: mountutil.New(), NodeName: "node", Log: zap.NewNop()}
	return &fixture{
		plugin: hostpath.New(h), paths: paths, host: host,
		pod: volume.PodInfo{PodRef: volume.PodRef{UID: types.UID("pod-1"), Namespace: "ns", Name: "pod"}},
	}
}

func inline(name, path string, typ *v1.HostPathType) *volume.Spec {
	return &volume.Spec{Name: name, Mode: v1.PersistentVolumeFilesystem, Volume: &v1.Volume{
		Name: name, VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path, Type: typ}},
	}}
}

func pvSpec(name, path string, typ *v1.HostPathType, readOnly bool) *volume.Spec {
	return &volume.Spec{Name: name, Mode: v1.PersistentVolumeFilesystem, ReadOnly: readOnly, PV: &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
			HostPath: &v1.HostPathVolumeSource{Path: path, Type: typ},
		}},
	}}
}

func (f *fixture) dir(s *volume.Spec) string {
	return f.paths.PodVolumeDir(f.pod.UID, hostpath.Name, s.Name)
}

func (f *fixture) setUp(s *volume.Spec) error {
	if _, err := f.plugin.Attributes(s); err != nil {
		return err
	}
	return f.plugin.SetUp(context.Background(), &plugins.SetUpRequest{
		VolumeName: volume.PodScopedName(hostpath.Name, f.pod.UID, s.Name), Spec: s, Pod: f.pod, Dir: f.dir(s), Log: zap.NewNop(),
	})
}

func (f *fixture) tearDown(s *volume.Spec) error {
	return f.tearDownSpec(s, s)
}

// tearDownSpec tears down the volume set up from s, with the spec given to
// the plugin (nil after a restart).
func (f *fixture) tearDownSpec(s, given *volume.Spec) error {
	return f.plugin.TearDown(context.Background(), &plugins.TearDownRequest{
		VolumeName: volume.PodScopedName(hostpath.Name, f.pod.UID, s.Name), Spec: given, Pod: f.pod.PodRef, Dir: f.dir(s), Log: zap.NewNop(),
	})
}

func typ(t v1.HostPathType) *v1.HostPathType { return &t }

// host paths of every kind, created lazily by name.
type hostPaths struct {
	t    *testing.T
	root string
	loop string
}

func (h *hostPaths) dir() string {
	p := filepath.Join(h.root, "dir")
	if err := os.MkdirAll(p, 0o755); err != nil {
		h.t.Fatal(err)
	}
	mounttest.WriteFile(h.t, filepath.Join(p, "host.txt"), "host dir content")
	return p
}

func (h *hostPaths) file() string {
	p := filepath.Join(h.root, "file.txt")
	mounttest.WriteFile(h.t, p, "host file content")
	return p
}

func (h *hostPaths) socket() string {
	p := filepath.Join(h.root, "app.sock")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	l, err := net.Listen("unix", p)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { l.Close() })
	return p
}

// fifo is a named pipe: no type admits it but the unset one, and opening
// it would block.
func (h *hostPaths) fifo() string {
	p := filepath.Join(h.root, "pipe")
	if err := unix.Mkfifo(p, 0o644); err != nil && !errors.Is(err, unix.EEXIST) {
		h.t.Fatal(err)
	}
	return p
}

func (h *hostPaths) charDev() string { return "/dev/null" }

func (h *hostPaths) blockDev() string {
	if h.loop == "" {
		h.loop = mounttest.LoopDevice(h.t, 16<<20)
	}
	return h.loop
}

func (h *hostPaths) missing() string { return filepath.Join(h.root, "missing") }

func TestTypesMatching(t *testing.T) {
	tests := []struct {
		name string
		typ  *v1.HostPathType
		path func(h *hostPaths) string
		// kind is what the pod's volume must look like once set up.
		kind os.FileMode
	}{
		{"unset with a directory", nil, (*hostPaths).dir, os.ModeDir},
		{"unset with a file", nil, (*hostPaths).file, 0},
		{"unset with a FIFO", nil, (*hostPaths).fifo, os.ModeNamedPipe},
		{"explicit empty type", typ(v1.HostPathUnset), (*hostPaths).dir, os.ModeDir},
		{"DirectoryOrCreate existing", typ(v1.HostPathDirectoryOrCreate), (*hostPaths).dir, os.ModeDir},
		{"Directory", typ(v1.HostPathDirectory), (*hostPaths).dir, os.ModeDir},
		{"FileOrCreate existing", typ(v1.HostPathFileOrCreate), (*hostPaths).file, 0},
		{"File", typ(v1.HostPathFile), (*hostPaths).file, 0},
		{"Socket", typ(v1.HostPathSocket), (*hostPaths).socket, os.ModeSocket},
		{"CharDevice", typ(v1.HostPathCharDev), (*hostPaths).charDev, os.ModeDevice | os.ModeCharDevice},
		{"BlockDevice", typ(v1.HostPathBlockDev), (*hostPaths).blockDev, os.ModeDevice},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			h := &hostPaths{t: t, root: f.host}
			src := tc.path(h)
			s := inline("vol", src, tc.typ)
			if err := f.setUp(s); err != nil {
				t.Fatalf("SetUp: %v", err)
			}
			dir := f.dir(s)
			m := mounttest.MountAt(t, dir)
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Type() != tc.kind {
				t.Errorf("pod volume is %v, want type %v", fi.Mode().Type(), tc.kind)
			}
			var srcSt, dstSt unix.Stat_t
			if err := unix.Stat(src, &srcSt); err != nil {
				t.Fatal(err)
			}
			if err := unix.Stat(dir, &dstSt); err != nil {
				t.Fatal(err)
			}
			if srcSt.Dev != dstSt.Dev || srcSt.Ino != dstSt.Ino {
				t.Errorf("pod volume (%d:%d) is not the host path (%d:%d); mount %+v", dstSt.Dev, dstSt.Ino, srcSt.Dev, srcSt.Ino, m)
			}
			switch tc.kind {
			case os.ModeDir:
				if got := mounttest.ReadFile(t, filepath.Join(dir, "host.txt")); got != "host dir content" {
					t.Errorf("content through the mount: %q", got)
				}
			case 0:
				if got := mounttest.ReadFile(t, dir); got != "host file content" {
					t.Errorf("content through the mount: %q", got)
				}
			}
			// SetUp again is a no-op.
			if err := f.setUp(s); err != nil {
				t.Fatalf("second SetUp: %v", err)
			}
			if ms := mounttest.MountsAt(t, dir); len(ms) != 1 {
				t.Errorf("%d mounts after a second SetUp, want 1", len(ms))
			}
			if err := f.tearDown(s); err != nil {
				t.Fatalf("TearDown: %v", err)
			}
			if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pod volume entry left after TearDown: %v", err)
			}
			if _, err := os.Stat(src); err != nil {
				t.Errorf("host path gone after TearDown: %v", err)
			}
		})
	}
}

func TestTypesMismatching(t *testing.T) {
	tests := []struct {
		name string
		typ  *v1.HostPathType
		path func(h *hostPaths) string
		// want are substrings of the error, besides the path.
		want []string
	}{
		{"unset missing", nil, (*hostPaths).missing, []string{"no such file or directory"}},
		{"Directory on a file", typ(v1.HostPathDirectory), (*hostPaths).file, []string{"is not a directory", "it is a regular file"}},
		{"Directory missing", typ(v1.HostPathDirectory), (*hostPaths).missing, []string{"no such file or directory"}},
		{"DirectoryOrCreate on a file", typ(v1.HostPathDirectoryOrCreate), (*hostPaths).file, []string{"is not a directory", "it is a regular file"}},
		{"File on a directory", typ(v1.HostPathFile), (*hostPaths).dir, []string{"is not a regular file", "it is a directory"}},
		{"File missing", typ(v1.HostPathFile), (*hostPaths).missing, []string{"no such file or directory"}},
		{"FileOrCreate on a directory", typ(v1.HostPathFileOrCreate), (*hostPaths).dir, []string{"is not a regular file", "it is a directory"}},
		{"Socket on a file", typ(v1.HostPathSocket), (*hostPaths).file, []string{"is not a socket", "it is a regular file"}},
		{"Socket on a directory", typ(v1.HostPathSocket), (*hostPaths).dir, []string{"is not a socket", "it is a directory"}},
		{"CharDevice on a block device", typ(v1.HostPathCharDev), (*hostPaths).blockDev, []string{"is not a character device", "it is a block device"}},
		{"CharDevice on a socket", typ(v1.HostPathCharDev), (*hostPaths).socket, []string{"is not a character device", "it is a socket"}},
		{"BlockDevice on a character device", typ(v1.HostPathBlockDev), (*hostPaths).charDev, []string{"is not a block device", "it is a character device"}},
		{"BlockDevice on a file", typ(v1.HostPathBlockDev), (*hostPaths).file, []string{"is not a block device", "it is a regular file"}},
		{"File on a FIFO", typ(v1.HostPathFile), (*hostPaths).fifo, []string{"is not a regular file", "it is a named pipe"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			h := &hostPaths{t: t, root: f.host}
			src := tc.path(h)
			s := inline("vol", src, tc.typ)
			err := f.setUp(s)
			if err == nil {
				t.Fatal("SetUp succeeded")
			}
			for _, w := range append([]string{src}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if _, serr := os.Lstat(f.dir(s)); !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("pod volume entry created for a mismatching host path: %v", serr)
			}
			if ms := mounttest.MountsUnder(t, f.paths.Root); len(ms) != 0 {
				t.Errorf("mounts made: %+v", ms)
			}
			if tc.name == "Directory missing" || tc.name == "File missing" || tc.name == "unset missing" {
				if _, err := os.Lstat(src); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("missing host path was created: %v", err)
				}
			}
		})
	}
}

func TestAttributesInvalid(t *testing.T) {
	p := hostpath.New(plugins.Host{})
	for _, s := range []*volume.Spec{
		inline("v", "relative/path", nil),
		inline("v", "/a/../etc", nil),
		inline("v", "/tmp", typ("Sideways")),
	} {
		if _, err := p.Attributes(s); err == nil {
			t.Errorf("Attributes(%s, %v) accepted", s.Volume.HostPath.Path, s.Volume.HostPath.Type)
		}
	}
}

func TestDirectoryOrCreate(t *testing.T) {
	f := newFixture(t)
	src := filepath.Join(f.host, "new", "nested", "dir")
	s := inline("vol", src, typ(v1.HostPathDirectoryOrCreate))
	if err := f.setUp(s); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(src)
	if err != nil || !fi.IsDir() {
		t.Fatalf("host directory not created: %v, %v", fi, err)
	}
	mounttest.MountAt(t, f.dir(s))
	mounttest.WriteFile(t, filepath.Join(f.dir(s), "from-pod.txt"), "hi")
	if got := mounttest.ReadFile(t, filepath.Join(src, "from-pod.txt")); got != "hi" {
		t.Errorf("write through the mount not on the host: %q", got)
	}
}

func TestFileOrCreate(t *testing.T) {
	f := newFixture(t)
	src := filepath.Join(f.host, "created.txt")
	s := inline("vol", src, typ(v1.HostPathFileOrCreate))
	if err := f.setUp(s); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(src)
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("host file not created: %v, %v", fi, err)
	}
	dir := f.dir(s)
	mounttest.MountAt(t, dir)
	if err := os.WriteFile(dir, []byte("from pod"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := mounttest.ReadFile(t, src); got != "from pod" {
		t.Errorf("host file content %q", got)
	}
}

func TestFileOrCreateDoesNotCreateParent(t *testing.T) {
	f := newFixture(t)
	parent := filepath.Join(f.host, "no-such-dir")
	src := filepath.Join(parent, "file.txt")
	s := inline("vol", src, typ(v1.HostPathFileOrCreate))
	err := f.setUp(s)
	if err == nil || !strings.Contains(err.Error(), src) {
		t.Fatalf("SetUp = %v, want an error naming %s", err, src)
	}
	if _, err := os.Lstat(parent); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("parent directory created: %v", err)
	}
	if ms := mounttest.MountsUnder(t, f.paths.Root); len(ms) != 0 {
		t.Errorf("mounts made: %+v", ms)
	}
}

// TearDown unmounts and never deletes the host's data, whatever the pod
// wrote.
func TestTearDownKeepsHostData(t *testing.T) {
	for _, kind := range []string{"dir", "file"} {
		t.Run(kind, func(t *testing.T) {
			f := newFixture(t)
			h := &hostPaths{t: t, root: f.host}
			var src string
			if kind == "dir" {
				src = h.dir()
			} else {
				src = h.file()
			}
			s := inline("vol", src, nil)
			if err := f.setUp(s); err != nil {
				t.Fatal(err)
			}
			dir := f.dir(s)
			if kind == "dir" {
				mounttest.WriteFile(t, filepath.Join(dir, "sub", "from-pod.txt"), "pod data")
			}
			if err := f.tearDown(s); err != nil {
				t.Fatal(err)
			}
			if ms := mounttest.MountsUnder(t, f.paths.Root); len(ms) != 0 {
				t.Errorf("mounts left: %+v", ms)
			}
			if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pod volume entry left: %v", err)
			}
			if kind == "dir" {
				for _, p := range []string{"host.txt", "sub/from-pod.txt"} {
					if _, err := os.Stat(filepath.Join(src, p)); err != nil {
						t.Errorf("host data %s deleted: %v", p, err)
					}
				}
			} else if got := mounttest.ReadFile(t, src); got != "host file content" {
				t.Errorf("host file content %q", got)
			}
			// Idempotent, also without a spec.
			if err := f.tearDownSpec(s, nil); err != nil {
				t.Errorf("second TearDown: %v", err)
			}
		})
	}
}

// The host directory has a mount of its own below it: the recursive bind
// shows it to the pod, and tearing down removes both mounts from the pod's
// directory while the host keeps its mount and data.
func TestRecursiveSubmount(t *testing.T) {
	f := newFixture(t)
	h := &hostPaths{t: t, root: f.host}
	src := h.dir()
	sub := filepath.Join(src, "mnt")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	mounttest.MountTmpfs(t, sub)
	mounttest.WriteFile(t, filepath.Join(sub, "sub.txt"), "sub")
	s := inline("vol", src, typ(v1.HostPathDirectory))
	if err := f.setUp(s); err != nil {
		t.Fatal(err)
	}
	dir := f.dir(s)
	if got := mounttest.ReadFile(t, filepath.Join(dir, "mnt", "sub.txt")); got != "sub" {
		t.Errorf("submount content through the pod's volume: %q", got)
	}
	if err := f.tearDown(s); err != nil {
		t.Fatalf("TearDown: %v", err)
	}
	if ms := mounttest.MountsUnder(t, f.paths.Root); len(ms) != 0 {
		t.Errorf("mounts left: %+v", ms)
	}
	if ms := mounttest.MountsAt(t, sub); len(ms) != 1 {
		t.Errorf("the host's own submount changed: %+v", ms)
	}
	if got := mounttest.ReadFile(t, filepath.Join(sub, "sub.txt")); got != "sub" {
		t.Errorf("host submount content %q", got)
	}
}

func TestReadOnlyPV(t *testing.T) {
	for _, readOnly := range []bool{true, false} {
		name := "readOnly"
		if !readOnly {
			name = "readWrite"
		}
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			h := &hostPaths{t: t, root: f.host}
			src := h.dir()
			sub := filepath.Join(src, "mnt")
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			mounttest.MountTmpfs(t, sub)
			s := pvSpec("pv-1", src, typ(v1.HostPathDirectory), readOnly)
			if !f.plugin.CanSupport(s) {
				t.Fatal("hostPath PV not supported")
			}
			if err := f.setUp(s); err != nil {
				t.Fatal(err)
			}
			dir := f.dir(s)
			if want := filepath.Join(f.paths.Root, "pods", "pod-1", "volumes", "kubernetes.io~host-path", "pv-1"); dir != want {
				t.Errorf("dir %s, want %s", dir, want)
			}
			m := mounttest.MountAt(t, dir)
			for _, d := range []string{dir, filepath.Join(dir, "mnt")} {
				err := os.WriteFile(filepath.Join(d, "w.txt"), []byte("x"), 0o644)
				if readOnly && !errors.Is(err, unix.EROFS) {
					t.Errorf("write into %s: %v, want EROFS", d, err)
				}
				if !readOnly && err != nil {
					t.Errorf("write into %s: %v", d, err)
				}
			}
			if m.HasOption("ro") != readOnly {
				t.Errorf("mount options %v, readOnly %v", m.Options, readOnly)
			}
			if err := os.WriteFile(filepath.Join(src, "host-write.txt"), []byte("x"), 0o644); err != nil {
				t.Errorf("the host path itself became read-only: %v", err)
			}
		})
	}
}

// Under --host-root, a node path is resolved as the node would resolve it:
// a symbolic link's absolute target starts again at the host root and ".."
// never climbs above it. Resolving in the agent's own file system would
// bind-mount (or create) the agent container's files instead.
func TestHostRootSymlinks(t *testing.T) {
	mounttest.RequireRoot(t)
	escape := "/volume-agent-test-escape-" + strings.ReplaceAll(t.Name(), "/", "-")
	t.Cleanup(func() { _ = os.RemoveAll(escape) })
	for _, tc := range []struct {
		name string
		// host makes the host tree below root.
		host func(t *testing.T, root string)
		path string
		typ  *v1.HostPathType
		// want is the file the pod must see in its volume (for a
		// directory) or the host path that must now exist.
		seen, created string
	}{
		{name: "absolute link", path: "/var/run", typ: typ(v1.HostPathDirectory), seen: "marker", host: func(t *testing.T, root string) {
			mounttest.WriteFile(t, filepath.Join(root, "run", "marker"), "host's /run")
			symlink(t, "/run", filepath.Join(root, "var", "run"))
		}},
		{name: "relative link climbing above the root", path: "/up", seen: "marker", host: func(t *testing.T, root string) {
			mounttest.WriteFile(t, filepath.Join(root, "etc", "marker"), "host's /etc")
			symlink(t, "../../../../../../../../etc", filepath.Join(root, "up"))
		}},
		{name: "DirectoryOrCreate through an absolute link", path: "/data/sub", typ: typ(v1.HostPathDirectoryOrCreate), created: escape + "/sub", host: func(t *testing.T, root string) {
			bothRoots(t, root, escape)
			symlink(t, escape, filepath.Join(root, "data"))
		}},
		{name: "FileOrCreate below an absolute link", path: "/conf/app.conf", typ: typ(v1.HostPathFileOrCreate), created: escape + "/app.conf", host: func(t *testing.T, root string) {
			bothRoots(t, root, escape)
			symlink(t, escape, filepath.Join(root, "conf"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixtureInRoot(t)
			tc.host(t, f.host)
			s := inline("vol", tc.path, tc.typ)
			if err := f.setUp(s); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := f.tearDown(s); err != nil {
					t.Error(err)
				}
			}()
			if tc.seen != "" {
				if _, err := os.Stat(filepath.Join(f.dir(s), tc.seen)); err != nil {
					t.Errorf("the pod does not see the host's %s: %v", tc.seen, err)
				}
			}
			if tc.created != "" {
				if _, err := os.Lstat(filepath.Join(f.host, tc.created)); err != nil {
					t.Errorf("not created below the host root: %v", err)
				}
				if _, err := os.Lstat(tc.created); !errors.Is(err, os.ErrNotExist) {
					_ = os.RemoveAll(tc.created)
					t.Errorf("created in the agent's own file system: %s (%v)", tc.created, err)
				}
			}
		})
	}
}

// bothRoots makes the directory p on the host (below root) and in the
// agent's own file system, as a container's /run and the host's /run.
func bothRoots(t *testing.T, root, p string) {
	t.Helper()
	for _, d := range []string{filepath.Join(root, p), p} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// newFixtureInRoot is newFixture with the host's root at f.host, as with
// --host-root in a container: volumes name paths below it.
func newFixtureInRoot(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t)
	f.plugin = hostpath.New(plugins.Host{Paths: f.paths, Mounter: mountutil.New(), NodeName: "node", HostRoot: f.host, Log: zap.NewNop()})
	return f
}
