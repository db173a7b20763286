package local_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
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
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/plugins/pluginstest"
	"github.com/volume-agent/volume-agent/volume"
)

type fixture struct {
	plugin *local.Plugin
	paths  volume.Paths
	host   string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	mounttest.RequireRoot(t)
	host := mounttest.TempDir(t)
	paths := volume.Paths{Root: mounttest.TempDir(t)}
	h := plugins.Host{Paths: paths, Mounter: mountutil.New(), NodeName: "node", Log: zap.NewNop()}
	return &fixture{plugin: local.New(h), paths: paths, host: host}
}

type pvOpt func(*v1.PersistentVolume)

func fsType(fs string) pvOpt {
	return func(pv *v1.PersistentVolume) { pv.Spec.Local.FSType = &fs }
}

func mountOptions(o ...string) pvOpt {
	return func(pv *v1.PersistentVolume) { pv.Spec.MountOptions = o }
}

func spec(name, path string, readOnly bool, opts ...pvOpt) *volume.Spec {
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
			Local: &v1.LocalVolumeSource{Path: path},
		}},
	}
	for _, o := range opts {
		o(pv)
	}
	return &volume.Spec{Name: name, PV: pv, ReadOnly: readOnly, Mode: v1.PersistentVolumeFilesystem}
}

func pod(uid string) volume.PodInfo {
	return volume.PodInfo{PodRef: volume.PodRef{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid}}
}

func (f *fixture) podDir(s *volume.Spec, p volume.PodInfo) string {
	return f.paths.PodVolumeDir(p.UID, local.Name, s.Name)
}

func (f *fixture) globalPath(s *volume.Spec) string {
	return f.paths.DeviceMountPath(local.Name, s.PV.Name)
}

func (f *fixture) attributes(t *testing.T, s *volume.Spec) volume.Attributes {
	t.Helper()
	a, err := pluginstest.Attributes(t, f.plugin, s)
	if err != nil {
		t.Fatalf("Attributes: %v", err)
	}
	if a.Identity != s.PV.Name {
		t.Errorf("identity %q, want the PV name %q", a.Identity, s.PV.Name)
	}
	return a
}

func (f *fixture) setUp(s *volume.Spec, p volume.PodInfo, deviceMountPath string) error {
	return f.plugin.SetUp(context.Background(), &plugins.SetUpRequest{
		VolumeName: volume.SharedName(local.Name, s.PV.Name), Spec: s, Pod: p, Dir: f.podDir(s, p),
		DeviceMountPath: deviceMountPath, Log: zap.NewNop(),
	})
}

func (f *fixture) tearDown(s *volume.Spec, p volume.PodInfo) error {
	return f.plugin.TearDown(context.Background(), &plugins.TearDownRequest{
		VolumeName: volume.SharedName(local.Name, s.PV.Name), Spec: s, Pod: p.PodRef, Dir: f.podDir(s, p),
		DeviceMountPath: f.globalPath(s), Log: zap.NewNop(),
	})
}

func (f *fixture) deviceRequest(s *volume.Spec) *plugins.DeviceRequest {
	return &plugins.DeviceRequest{
		VolumeName: volume.SharedName(local.Name, s.PV.Name), Spec: s, Identity: s.PV.Name,
		DeviceMountPath: f.globalPath(s), Log: zap.NewNop(),
	}
}

func (f *fixture) mountDevice(s *volume.Spec) error {
	return f.plugin.MountDevice(context.Background(), f.deviceRequest(s))
}

func (f *fixture) unmountDevice(s *volume.Spec) error {
	return f.plugin.UnmountDevice(context.Background(), f.deviceRequest(s))
}

func (f *fixture) hostDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(f.host, "disk")
	mounttest.WriteFile(t, filepath.Join(dir, "host.txt"), "host data")
	return dir
}

func TestDirectory(t *testing.T) {
	f := newFixture(t)
	src := f.hostDir(t)
	s := spec("pv-dir", src, false)
	if a := f.attributes(t, s); a.DeviceMountable {
		t.Error("a directory PV must not need a device mount")
	}
	p := pod("pod-1")
	if err := f.setUp(s, p, ""); err != nil {
		t.Fatal(err)
	}
	dir := f.podDir(s, p)
	if want := filepath.Join(f.paths.Root, "pods", "pod-1", "volumes", "kubernetes.io~local-volume", "pv-dir"); dir != want {
		t.Errorf("pod dir %s, want %s", dir, want)
	}
	m := mounttest.MountAt(t, dir)
	if m.HasOption("ro") {
		t.Errorf("read-write volume mounted %v", m.Options)
	}
	if got := mounttest.ReadFile(t, filepath.Join(dir, "host.txt")); got != "host data" {
		t.Errorf("content through the mount %q", got)
	}
	mounttest.WriteFile(t, filepath.Join(dir, "pod.txt"), "pod data")
	// A second pod shares the directory.
	p2 := pod("pod-2")
	if err := f.setUp(s, p2, ""); err != nil {
		t.Fatal(err)
	}
	if got := mounttest.ReadFile(t, filepath.Join(f.podDir(s, p2), "pod.txt")); got != "pod data" {
		t.Errorf("second pod sees %q", got)
	}
	// SetUp again: still one mount.
	if err := f.setUp(s, p, ""); err != nil {
		t.Fatal(err)
	}
	if ms := mounttest.MountsAt(t, dir); len(ms) != 1 {
		t.Errorf("%d mounts after SetUp again", len(ms))
	}
	for _, pp := range []volume.PodInfo{p, p2} {
		if err := f.tearDown(s, pp); err != nil {
			t.Fatal(err)
		}
	}
	if ms := mounttest.MountsUnder(t, f.paths.Root); len(ms) != 0 {
		t.Errorf("mounts left: %+v", ms)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pod dir left: %v", err)
	}
	for _, name := range []string{"host.txt", "pod.txt"} {
		if _, err := os.Stat(filepath.Join(src, name)); err != nil {
			t.Errorf("TearDown deleted %s: %v", name, err)
		}
	}
}

func TestDirectoryReadOnlyAndMountOptions(t *testing.T) {
	tests := []struct {
		name       string
		readOnly   bool
		options    []string
		annotation string
		wantRO     bool
		wantNoexec bool
	}{
		{"pod readOnly", true, nil, "", true, false},
		{"ro option", false, []string{"ro"}, "", true, false},
		{"noexec option", false, []string{"noexec"}, "", false, true},
		{"noexec and ro", false, []string{"noexec", "ro"}, "", true, true},
		{"annotation wins over spec", false, []string{"noexec"}, "ro", true, false},
		{"harmless options", false, []string{"rw", "defaults", "nosuid"}, "", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			src := f.hostDir(t)
			// An executable on the host, to check noexec.
			exe := filepath.Join(src, "true")
			data, err := os.ReadFile("/bin/true")
			if err != nil {
				t.Skipf("no /bin/true to copy: %v", err)
			}
			if err := os.WriteFile(exe, data, 0o755); err != nil {
				t.Fatal(err)
			}
			s := spec("pv-dir", src, tc.readOnly, mountOptions(tc.options...))
			if tc.annotation != "" {
				s.PV.Annotations = map[string]string{plugins.MountOptionsAnnotation: tc.annotation}
			}
			f.attributes(t, s)
			p := pod("pod-1")
			if err := f.setUp(s, p, ""); err != nil {
				t.Fatal(err)
			}
			dir := f.podDir(s, p)
			m := mounttest.MountAt(t, dir)
			if m.HasOption("ro") != tc.wantRO {
				t.Errorf("options %v: ro = %v, want %v", m.Options, m.HasOption("ro"), tc.wantRO)
			}
			if m.HasOption("noexec") != tc.wantNoexec {
				t.Errorf("options %v: noexec = %v, want %v", m.Options, m.HasOption("noexec"), tc.wantNoexec)
			}
			err = os.WriteFile(filepath.Join(dir, "w.txt"), []byte("x"), 0o644)
			if tc.wantRO && !errors.Is(err, unix.EROFS) {
				t.Errorf("write: %v, want EROFS", err)
			}
			if !tc.wantRO && err != nil {
				t.Errorf("write: %v", err)
			}
			err = exec.Command(filepath.Join(dir, "true")).Run()
			if tc.wantNoexec && !errors.Is(err, os.ErrPermission) {
				t.Errorf("running a program from a noexec volume: %v, want permission denied", err)
			}
			if !tc.wantNoexec && err != nil {
				t.Errorf("running a program from the volume: %v", err)
			}
			if err := os.WriteFile(filepath.Join(src, "host-w.txt"), []byte("x"), 0o644); err != nil {
				t.Errorf("the host directory became read-only: %v", err)
			}
		})
	}
}

func TestDirectoryUnsupportedMountOption(t *testing.T) {
	f := newFixture(t)
	src := f.hostDir(t)
	for _, opts := range [][]string{{"discard"}, {"noexec", "nfsvers=4"}, {"size=1m"}} {
		s := spec("pv-dir", src, false, mountOptions(opts...))
		_, err := pluginstest.Attributes(t, f.plugin, s)
		if err == nil {
			t.Errorf("Attributes accepted mount options %v", opts)
			continue
		}
		if !strings.Contains(err.Error(), "pv-dir") || !strings.Contains(err.Error(), opts[len(opts)-1]) {
			t.Errorf("error %q does not name the PV and the option %q", err, opts[len(opts)-1])
		}
		// SetUp refuses as well, and mounts nothing.
		if err := f.setUp(s, pod("pod-1"), ""); err == nil {
			t.Errorf("SetUp accepted mount options %v", opts)
		}
	}
	if ms := mounttest.MountsUnder(t, f.paths.Root); len(ms) != 0 {
		t.Errorf("mounts made: %+v", ms)
	}
}

func TestAttributesInvalid(t *testing.T) {
	f := newFixture(t)
	file := filepath.Join(f.host, "file")
	mounttest.WriteFile(t, file, "")
	for _, s := range []*volume.Spec{
		spec("pv", "relative", false),
		spec("pv", filepath.Join(f.host, "missing"), false),
		spec("pv", file, false),
		spec("pv", "/dev/null", false),
	} {
		if _, err := pluginstest.Attributes(t, f.plugin, s); err == nil || !strings.Contains(err.Error(), "pv") {
			t.Errorf("Attributes(%s) = %v, want an error naming the PV", s.PV.Spec.Local.Path, err)
		}
	}
}

// loopSize is enough for ext4 and for the 300 MB xfs minimum; the backing
// file is sparse.
const loopSize = 512 << 20

func requireTool(t *testing.T, tool string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("skipping: %s is not installed", tool)
	}
}

func devNumbers(t *testing.T, dev string) (int, int) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	return int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev))
}

func TestBlockDeviceFormatsBlankDevice(t *testing.T) {
	tests := []struct {
		name   string
		fsType *string
		want   string
	}{
		{"default is ext4", nil, "ext4"},
		{"ext4", ptr("ext4"), "ext4"},
		{"xfs", ptr("xfs"), "xfs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			requireTool(t, "mkfs."+tc.want)
			f := newFixture(t)
			dev := mounttest.LoopDevice(t, loopSize)
			var opts []pvOpt
			if tc.fsType != nil {
				opts = append(opts, fsType(*tc.fsType))
			}
			s := spec("pv-block", dev, false, opts...)
			if a := f.attributes(t, s); !a.DeviceMountable {
				t.Fatal("a block device PV must need a device mount")
			}
			if got := mounttest.DiskFormat(t, dev); got != "" {
				t.Fatalf("fresh loop device has a filesystem: %q", got)
			}
			if err := f.mountDevice(s); err != nil {
				t.Fatal(err)
			}
			if got := mounttest.DiskFormat(t, dev); got != tc.want {
				t.Errorf("device formatted as %q, want %q", got, tc.want)
			}
			global := f.globalPath(s)
			if want := filepath.Join(f.paths.Root, "plugins", "kubernetes.io~local-volume", "mounts", "pv-block", "globalmount"); global != want {
				t.Errorf("global path %s, want %s", global, want)
			}
			m := mounttest.MountAt(t, global)
			maj, min := devNumbers(t, dev)
			if m.FSType != tc.want || m.Major != maj || m.Minor != min {
				t.Errorf("global mount %+v, want %s from %s (%d:%d)", m, tc.want, dev, maj, min)
			}
			// MountDevice again is a no-op.
			if err := f.mountDevice(s); err != nil {
				t.Fatal(err)
			}
			if ms := mounttest.MountsAt(t, global); len(ms) != 1 {
				t.Errorf("%d mounts at the global path after MountDevice again", len(ms))
			}
		})
	}
}

func TestBlockDeviceNeverReformatted(t *testing.T) {
	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			requireTool(t, "mkfs."+fs)
			f := newFixture(t)
			dev := mounttest.LoopDevice(t, loopSize)
			s := spec("pv-block", dev, false, fsType(fs))
			if err := f.mountDevice(s); err != nil {
				t.Fatal(err)
			}
			global := f.globalPath(s)
			mounttest.WriteFile(t, filepath.Join(global, "data.txt"), "survives")
			if err := f.unmountDevice(s); err != nil {
				t.Fatal(err)
			}
			if ms := mounttest.MountsAt(t, global); len(ms) != 0 {
				t.Fatalf("still mounted: %+v", ms)
			}
			if err := f.mountDevice(s); err != nil {
				t.Fatal(err)
			}
			if got := mounttest.ReadFile(t, filepath.Join(global, "data.txt")); got != "survives" {
				t.Errorf("data after mounting again: %q", got)
			}
		})
	}
}

// A device with another filesystem than the PV says is neither mounted nor
// reformatted.
func TestBlockDeviceFilesystemMismatch(t *testing.T) {
	for _, tc := range []struct{ has, want string }{{"ext4", "xfs"}, {"xfs", "ext4"}} {
		t.Run(tc.has+" as "+tc.want, func(t *testing.T) {
			requireTool(t, "mkfs."+tc.has)
			requireTool(t, "mkfs."+tc.want)
			f := newFixture(t)
			dev := mounttest.LoopDevice(t, loopSize)
			mounttest.Mkfs(t, tc.has, dev)
			probe := filepath.Join(f.host, "probe")
			if err := os.Mkdir(probe, 0o755); err != nil {
				t.Fatal(err)
			}
			mounttest.MountDevice(t, dev, probe, tc.has)
			mounttest.WriteFile(t, filepath.Join(probe, "data.txt"), "existing")
			if err := mounttest.UnmountUnder(probe); err != nil {
				t.Fatal(err)
			}

			s := spec("pv-block", dev, false, fsType(tc.want))
			err := f.mountDevice(s)
			if err == nil {
				t.Fatal("MountDevice succeeded")
			}
			t.Logf("MountDevice: %v", err)
			for _, w := range []string{dev, tc.has, tc.want} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q", w)
				}
			}
			if volume.IsUncertain(err) {
				t.Errorf("a failed mount with nothing mounted must not be uncertain: %v", err)
			}
			if ms := mounttest.MountsAt(t, f.globalPath(s)); len(ms) != 0 {
				t.Errorf("mounted: %+v", ms)
			}
			if got := mounttest.DiskFormat(t, dev); got != tc.has {
				t.Errorf("device now has %q, want %q untouched", got, tc.has)
			}
			mounttest.MountDevice(t, dev, probe, tc.has)
			if got := mounttest.ReadFile(t, filepath.Join(probe, "data.txt")); got != "existing" {
				t.Errorf("data on the device: %q", got)
			}
		})
	}
}

func TestBlockDeviceSetUpAndUnmountDevice(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	f := newFixture(t)
	dev := mounttest.LoopDevice(t, loopSize)
	s := spec("pv-block", dev, false)
	if err := f.mountDevice(s); err != nil {
		t.Fatal(err)
	}
	global := f.globalPath(s)
	mounttest.WriteFile(t, filepath.Join(global, "from-global.txt"), "global")

	p1, p2 := pod("pod-1"), pod("pod-2")
	ro := *s
	ro.ReadOnly = true
	if err := f.setUp(s, p1, global); err != nil {
		t.Fatal(err)
	}
	if err := f.setUp(&ro, p2, global); err != nil {
		t.Fatal(err)
	}
	maj, min := devNumbers(t, dev)
	for _, p := range []volume.PodInfo{p1, p2} {
		dir := f.podDir(s, p)
		m := mounttest.MountAt(t, dir)
		if m.Major != maj || m.Minor != min || m.Root != "/" {
			t.Errorf("pod mount %+v is not the device's root", m)
		}
		if got := mounttest.ReadFile(t, filepath.Join(dir, "from-global.txt")); got != "global" {
			t.Errorf("pod sees %q", got)
		}
	}
	mounttest.WriteFile(t, filepath.Join(f.podDir(s, p1), "from-pod.txt"), "pod")
	if got := mounttest.ReadFile(t, filepath.Join(global, "from-pod.txt")); got != "pod" {
		t.Errorf("global sees %q", got)
	}
	if err := os.WriteFile(filepath.Join(f.podDir(s, p2), "w.txt"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into the read-only pod mount: %v, want EROFS", err)
	}

	// Refused while a pod uses it; nothing is unmounted.
	err := f.unmountDevice(s)
	if err == nil || !strings.Contains(err.Error(), "still used") {
		t.Fatalf("UnmountDevice with pods mounted = %v, want a refusal", err)
	}
	if ms := mounttest.MountsAt(t, global); len(ms) != 1 {
		t.Errorf("global mount changed: %+v", ms)
	}
	if err := f.tearDown(s, p1); err != nil {
		t.Fatal(err)
	}
	if err := f.unmountDevice(s); err == nil {
		t.Fatal("UnmountDevice with one pod still mounted succeeded")
	}
	if err := f.tearDown(s, p2); err != nil {
		t.Fatal(err)
	}
	if err := f.unmountDevice(s); err != nil {
		t.Fatalf("UnmountDevice after TearDown: %v", err)
	}
	if ms := mounttest.MountsUnder(t, f.paths.Root); len(ms) != 0 {
		t.Errorf("mounts left: %+v", ms)
	}
	if _, err := os.Lstat(global); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("global mount point left: %v", err)
	}
	// Idempotent.
	if err := f.unmountDevice(s); err != nil {
		t.Errorf("UnmountDevice again: %v", err)
	}
	// The data stays on the device.
	if err := f.mountDevice(s); err != nil {
		t.Fatal(err)
	}
	if got := mounttest.ReadFile(t, filepath.Join(global, "from-pod.txt")); got != "pod" {
		t.Errorf("data after remount: %q", got)
	}
}

func TestBlockDeviceReadOnlyMountOption(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	f := newFixture(t)
	dev := mounttest.LoopDevice(t, loopSize)
	s := spec("pv-block", dev, false, mountOptions("ro"))
	// A blank device is not formatted to be mounted read-only.
	if err := f.mountDevice(s); err == nil {
		t.Fatal("MountDevice formatted a blank device for a read-only mount")
	}
	if got := mounttest.DiskFormat(t, dev); got != "" {
		t.Errorf("device formatted: %q", got)
	}
	mounttest.Mkfs(t, "ext4", dev)
	if err := f.mountDevice(s); err != nil {
		t.Fatal(err)
	}
	m := mounttest.MountAt(t, f.globalPath(s))
	if !m.HasOption("ro") {
		t.Errorf("global mount options %v lack ro", m.Options)
	}
}

func ptr[T any](v T) *T { return &v }

// Under --host-root, the PV's directory is resolved as the node resolves
// it: an absolute link in the path starts again at the host root, never in
// the agent's own file system (where a directory of the same name would be
// bind-mounted into the pod instead).
func TestDirectoryThroughAnAbsoluteLinkOnTheHost(t *testing.T) {
	f := newFixture(t)
	f.plugin = local.New(plugins.Host{Paths: f.paths, Mounter: mountutil.New(), NodeName: "node", HostRoot: f.host, Log: zap.NewNop()})
	agentOwn := "/volume-agent-test-disks-" + t.Name()
	t.Cleanup(func() { _ = os.RemoveAll(agentOwn) })
	if err := os.MkdirAll(filepath.Join(agentOwn, "d1"), 0o755); err != nil {
		t.Fatal(err)
	}
	mounttest.WriteFile(t, filepath.Join(f.host, agentOwn, "d1", "host.txt"), "the node's disk")
	if err := os.MkdirAll(filepath.Join(f.host, "mnt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(agentOwn, filepath.Join(f.host, "mnt", "disks")); err != nil {
		t.Fatal(err)
	}
	s := spec("pv-link", "/mnt/disks/d1", false)
	p := pod("p1")
	if err := f.setUp(s, p, ""); err != nil {
		t.Fatal(err)
	}
	dir := f.podDir(s, p)
	defer func() {
		if err := f.tearDown(s, p); err != nil {
			t.Error(err)
		}
	}()
	if got, err := os.ReadFile(filepath.Join(dir, "host.txt")); err != nil || string(got) != "the node's disk" {
		t.Errorf("the pod sees %q, %v; want the node's disk", got, err)
	}
}
