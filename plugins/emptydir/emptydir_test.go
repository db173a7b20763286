package emptydir_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/safefs"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/volume"
)

type fixture struct {
	plugin *emptydir.Plugin
	paths  volume.Paths
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	mounttest.RequireRoot(t)
	paths := volume.Paths{Root: mounttest.TempDir(t)}
	host := plugins.Host{Paths: paths, Mounter: mountutil.New(), NodeName: "node", Log: zap.NewNop()}
	return &fixture{plugin: emptydir.New(host), paths: paths}
}

func podInfo(uid string) volume.PodInfo {
	return volume.PodInfo{PodRef: volume.PodRef{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid}}
}

func spec(name string, src v1.EmptyDirVolumeSource) *volume.Spec {
	return &volume.Spec{Name: name, Volume: &v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: &src}}, Mode: v1.PersistentVolumeFilesystem}
}

func (f *fixture) setUp(t *testing.T, s *volume.Spec, pod volume.PodInfo) string {
	t.Helper()
	dir := f.paths.PodVolumeDir(pod.UID, emptydir.Name, s.Name)
	err := f.plugin.SetUp(context.Background(), &plugins.SetUpRequest{
		VolumeName: volume.PodScopedName(emptydir.Name, pod.UID, s.Name), Spec: s, Pod: pod, Dir: dir, Log: zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("SetUp: %v", err)
	}
	return dir
}

func (f *fixture) tearDown(s *volume.Spec, pod volume.PodInfo, dir string) error {
	return f.plugin.TearDown(context.Background(), &plugins.TearDownRequest{
		VolumeName: volume.PodScopedName(emptydir.Name, pod.UID, filepath.Base(dir)), Spec: s, Pod: pod.PodRef, Dir: dir, Log: zap.NewNop(),
	})
}

func qty(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

func statfsSize(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.TMPFS_MAGIC {
		t.Fatalf("%s is not on a tmpfs (statfs type %#x)", dir, st.Type)
	}
	return int64(st.Blocks) * st.Bsize
}

func TestAttributes(t *testing.T) {
	p := emptydir.New(plugins.Host{})
	for medium, ok := range map[v1.StorageMedium]bool{"": true, v1.StorageMediumMemory: true, v1.StorageMediumHugePages: true, "HugePages-2Mi": true, "HugePages-1Gi": true, "HugePages-big": false, "Disk": false} {
		_, err := p.Attributes(spec("v", v1.EmptyDirVolumeSource{Medium: medium}))
		if (err == nil) != ok {
			t.Errorf("medium %q: err = %v, want ok=%v", medium, err, ok)
		}
	}
}

func TestDiskMedium(t *testing.T) {
	f := newFixture(t)
	old := unix.Umask(0o022)
	defer unix.Umask(old)
	s := spec("scratch", v1.EmptyDirVolumeSource{})
	pod := podInfo("pod-1")
	dir := f.setUp(t, s, pod)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o777 {
		t.Errorf("mode %v, want a 0777 directory despite the umask", fi.Mode())
	}
	if ms := mounttest.MountsAt(t, dir); len(ms) != 0 {
		t.Errorf("a disk emptyDir must not be a mount: %+v", ms)
	}
	if want := filepath.Join(f.paths.Root, "pods", "pod-1", "volumes", "kubernetes.io~empty-dir", "scratch"); dir != want {
		t.Errorf("dir %s, want %s", dir, want)
	}
}

func TestMemoryMediumSize(t *testing.T) {
	tests := []struct {
		name      string
		sizeLimit *resource.Quantity
		memLimit  *resource.Quantity
		// nodeMemory is the node's allocatable memory (0: unknown).
		nodeMemory int64
		want       int64 // 0: kernel default
	}{
		{name: "neither, the node's memory", nodeMemory: 24 << 20, want: 24 << 20},
		{name: "memory limit above the node's memory", memLimit: qty("1Gi"), nodeMemory: 24 << 20, want: 24 << 20},
		{name: "sizeLimit only", sizeLimit: qty("8Mi"), want: 8 << 20},
		{name: "memory limit only", memLimit: qty("16Mi"), want: 16 << 20},
		{name: "sizeLimit smaller", sizeLimit: qty("4Mi"), memLimit: qty("16Mi"), want: 4 << 20},
		{name: "memory limit smaller", sizeLimit: qty("64Mi"), memLimit: qty("12Mi"), want: 12 << 20},
		{name: "neither, node's memory unknown", want: 0},
		{name: "zero sizeLimit means none", sizeLimit: qty("0"), memLimit: qty("6Mi"), want: 6 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.nodeMemory > 0 {
				f.plugin = emptydir.New(plugins.Host{Paths: f.paths, Mounter: mountutil.New(), NodeName: "node",
					NodeMemory: func() int64 { return tc.nodeMemory }, Log: zap.NewNop()})
			}
			s := spec("mem", v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory, SizeLimit: tc.sizeLimit})
			pod := podInfo("pod-1")
			pod.MemoryLimit = tc.memLimit
			dir := f.setUp(t, s, pod)
			m := mounttest.MountAt(t, dir)
			if m.FSType != "tmpfs" || !m.HasOption("nosuid") || !m.HasOption("nodev") {
				t.Errorf("mount %+v, want a nosuid,nodev tmpfs", m)
			}
			if mode, _ := m.SuperOption("mode"); mode != "777" {
				t.Errorf("tmpfs mode=%s, want 777", mode)
			}
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o777 {
				t.Errorf("tmpfs root mode %o, want 777", fi.Mode().Perm())
			}
			size := statfsSize(t, dir)
			if tc.want != 0 && size != tc.want {
				t.Errorf("tmpfs size %d, want %d", size, tc.want)
			}
			if tc.want == 0 && size <= 64<<20 {
				t.Errorf("tmpfs size %d, want the kernel default (half the RAM)", size)
			}
		})
	}
}

func TestSetUpIdempotent(t *testing.T) {
	for _, medium := range []v1.StorageMedium{v1.StorageMediumDefault, v1.StorageMediumMemory} {
		t.Run("medium="+string(medium), func(t *testing.T) {
			f := newFixture(t)
			s := spec("v", v1.EmptyDirVolumeSource{Medium: medium, SizeLimit: qty("2Mi")})
			pod := podInfo("pod-1")
			dir := f.setUp(t, s, pod)
			mounttest.WriteFile(t, filepath.Join(dir, "data.txt"), "keep me")
			f.setUp(t, s, pod)
			f.setUp(t, s, pod)
			want := 0
			if medium == v1.StorageMediumMemory {
				want = 1
			}
			if ms := mounttest.MountsAt(t, dir); len(ms) != want {
				t.Errorf("%d mounts at %s after three SetUps, want %d: %+v", len(ms), dir, want, ms)
			}
			if got := mounttest.ReadFile(t, filepath.Join(dir, "data.txt")); got != "keep me" {
				t.Errorf("data after SetUp again: %q", got)
			}
		})
	}
}

func TestTearDown(t *testing.T) {
	for _, medium := range []v1.StorageMedium{v1.StorageMediumDefault, v1.StorageMediumMemory} {
		t.Run("medium="+string(medium), func(t *testing.T) {
			f := newFixture(t)
			s := spec("v", v1.EmptyDirVolumeSource{Medium: medium})
			pod := podInfo("pod-1")
			dir := f.setUp(t, s, pod)
			mounttest.WriteFile(t, filepath.Join(dir, "a.txt"), "a")
			mounttest.WriteFile(t, filepath.Join(dir, "x", "y", "z.txt"), "z")
			if err := os.Symlink("/etc", filepath.Join(dir, "x", "etc")); err != nil {
				t.Fatal(err)
			}
			if err := f.tearDown(s, pod, dir); err != nil {
				t.Fatal(err)
			}
			if ms := mounttest.MountsUnder(t, f.paths.Root); len(ms) != 0 {
				t.Errorf("mounts left: %+v", ms)
			}
			if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("volume directory left: %v", err)
			}
			if _, err := os.Stat("/etc/hostname"); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("/etc damaged? %v", err)
			}
			// Idempotent, also with a nil spec (after a restart).
			if err := f.tearDown(nil, pod, dir); err != nil {
				t.Errorf("second TearDown: %v", err)
			}
		})
	}
}

// A tmpfs mounted twice (stacked) is peeled off completely.
func TestTearDownStackedTmpfs(t *testing.T) {
	f := newFixture(t)
	s := spec("v", v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory})
	pod := podInfo("pod-1")
	dir := f.setUp(t, s, pod)
	if err := mountutil.New().MountTmpfs(dir, mountutil.TmpfsOptions{Mode: 0o777}); err != nil {
		t.Fatal(err)
	}
	if err := f.tearDown(s, pod, dir); err != nil {
		t.Fatal(err)
	}
	if ms := mounttest.MountsUnder(t, f.paths.Root); len(ms) != 0 {
		t.Errorf("mounts left: %+v", ms)
	}
}

// Something mounted inside the volume (not by the agent) must never be
// deleted: TearDown fails and the data below the mount survives.
func TestTearDownUnexpectedMountInside(t *testing.T) {
	for _, medium := range []v1.StorageMedium{v1.StorageMediumDefault, v1.StorageMediumMemory} {
		t.Run("medium="+string(medium), func(t *testing.T) {
			f := newFixture(t)
			s := spec("v", v1.EmptyDirVolumeSource{Medium: medium})
			pod := podInfo("pod-1")
			dir := f.setUp(t, s, pod)
			mounttest.WriteFile(t, filepath.Join(dir, "mine.txt"), "mine")
			inner := filepath.Join(dir, "sub", "mnt")
			if err := os.MkdirAll(inner, 0o755); err != nil {
				t.Fatal(err)
			}
			mounttest.MountTmpfs(t, inner)
			mounttest.WriteFile(t, filepath.Join(inner, "theirs.txt"), "theirs")
			mounttest.WriteFile(t, filepath.Join(inner, "d", "deep.txt"), "deep")

			err := f.tearDown(s, pod, dir)
			if err == nil {
				t.Fatal("TearDown succeeded with a mount inside the volume")
			}
			t.Logf("TearDown: %v", err)
			if medium == v1.StorageMediumDefault && !errors.Is(err, safefs.ErrMountPointInside) {
				t.Errorf("error %v is not ErrMountPointInside", err)
			}
			if medium == v1.StorageMediumMemory && !errors.Is(err, syscall.EBUSY) {
				t.Errorf("error %v is not EBUSY", err)
			}
			for _, name := range []string{"theirs.txt", "d/deep.txt"} {
				if _, err := os.Stat(filepath.Join(inner, name)); err != nil {
					t.Errorf("%s below the inner mount was deleted: %v", name, err)
				}
			}
			if ms := mounttest.MountsAt(t, inner); len(ms) != 1 {
				t.Errorf("inner mount changed: %+v", ms)
			}
		})
	}
}

func TestFSGroup(t *testing.T) {
	const gid = 4321
	for _, tc := range []struct {
		medium v1.StorageMedium
		policy *v1.PodFSGroupChangePolicy
	}{
		{v1.StorageMediumDefault, nil},
		{v1.StorageMediumMemory, nil},
		{v1.StorageMediumDefault, ptr(v1.FSGroupChangeOnRootMismatch)},
		{v1.StorageMediumMemory, ptr(v1.FSGroupChangeAlways)},
	} {
		name := "medium=" + string(tc.medium)
		if tc.policy != nil {
			name += "/" + string(*tc.policy)
		}
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			s := spec("v", v1.EmptyDirVolumeSource{Medium: tc.medium})
			pod := podInfo("pod-1")
			pod.FSGroup = ptr(int64(gid))
			pod.FSGroupChangePolicy = tc.policy
			dir := f.setUp(t, s, pod)
			checkGroup(t, dir, gid, true)
			fi, _ := os.Stat(dir)
			if fi.Mode()&os.ModeSetgid == 0 || fi.Mode().Perm() != 0o777 {
				t.Errorf("mode %v, want setgid and 0777", fi.Mode())
			}
			// A file created in the volume inherits the group (setgid).
			file := filepath.Join(dir, "new.txt")
			mounttest.WriteFile(t, file, "x")
			checkGroup(t, file, gid, false)
		})
	}
}

func TestNoFSGroup(t *testing.T) {
	f := newFixture(t)
	s := spec("v", v1.EmptyDirVolumeSource{})
	dir := f.setUp(t, s, podInfo("pod-1"))
	fi, _ := os.Stat(dir)
	if fi.Mode()&os.ModeSetgid != 0 {
		t.Errorf("setgid without fsGroup: %v", fi.Mode())
	}
	checkGroup(t, dir, os.Getgid(), false)
}

func checkGroup(t *testing.T, path string, gid int, dir bool) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Gid) != gid {
		t.Errorf("%s group %d, want %d", path, st.Gid, gid)
	}
	if dir && !fi.IsDir() {
		t.Errorf("%s is not a directory", path)
	}
}

func ptr[T any](v T) *T { return &v }
