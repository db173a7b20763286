package local_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/volume"
)

func blockSpec(name, path string, readOnly bool) *volume.Spec {
	s := spec(name, path, readOnly)
	s.Mode = v1.PersistentVolumeBlock
	return s
}

// accessPoint is where the operator has the plugin map the device for a pod
// (it creates the parent directory).
func (f *fixture) accessPoint(t *testing.T, s *volume.Spec, p volume.PodInfo) string {
	t.Helper()
	ap := f.paths.PodDevicePath(p.UID, local.Name, s.Name)
	if err := os.MkdirAll(filepath.Dir(ap), 0o750); err != nil {
		t.Fatal(err)
	}
	return ap
}

func (f *fixture) mapFor(t *testing.T, s *volume.Spec, p volume.PodInfo) (string, error) {
	t.Helper()
	ap := f.accessPoint(t, s, p)
	return ap, f.plugin.MapPodDevice(context.Background(), &plugins.SetUpRequest{Spec: s, Pod: p, Dir: ap, Log: zap.NewNop()})
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return buf
}

func rdev(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		t.Fatalf("%s is not a block device (mode %o)", path, st.Mode)
	}
	return st.Rdev
}

// A Block local PV: the device is bind-mounted onto each pod's access point,
// data flows between pods and the device, and nothing is ever formatted or
// written by the plugin.
func TestBlockMapSharesTheDeviceAndNeverFormats(t *testing.T) {
	f := newFixture(t)
	dev := mounttest.LoopDevice(t, 16<<20)
	head := make([]byte, 1<<20)
	if _, err := rand.Read(head); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dev, head, 0); err != nil {
		t.Fatal(err)
	}
	s := blockSpec("pv-blk", dev, false)
	if a := f.attributes(t, s); !a.Block || a.DeviceMountable || a.Identity != "pv-blk" {
		t.Errorf("attributes %+v, want a shared Block volume without a device phase", a)
	}

	apA, err := f.mapFor(t, s, pod("a"))
	if err != nil {
		t.Fatal(err)
	}
	apB, err := f.mapFor(t, s, pod("b"))
	if err != nil {
		t.Fatal(err)
	}
	// Mapping again changes nothing (no stacked mount).
	if _, err := f.mapFor(t, s, pod("a")); err != nil {
		t.Fatal(err)
	}
	for _, ap := range []string{apA, apB} {
		if got, want := rdev(t, ap), rdev(t, dev); got != want {
			t.Errorf("%s is device %d, want %s's %d", ap, got, dev, want)
		}
		if n := len(mounttest.MountsAt(t, ap)); n != 1 {
			t.Errorf("%d mounts at %s, want 1", n, ap)
		}
	}

	data := []byte("written through pod a's access point")
	fa, err := os.OpenFile(apA, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fa.WriteAt(data, 4<<20); err != nil {
		t.Fatal(err)
	}
	if err := fa.Sync(); err != nil {
		t.Fatal(err)
	}
	fa.Close()
	if got := readAt(t, apB, 4<<20, len(data)); !bytes.Equal(got, data) {
		t.Errorf("pod b reads %q", got)
	}
	if got := readAt(t, dev, 4<<20, len(data)); !bytes.Equal(got, data) {
		t.Errorf("the device reads %q", got)
	}

	for _, ap := range []string{apA, apB} {
		if err := f.plugin.UnmapPodDevice(context.Background(), &plugins.TearDownRequest{Spec: s, Dir: ap, Log: zap.NewNop()}); err != nil {
			t.Fatal(err)
		}
		if mounttest.Exists(t, ap) {
			t.Errorf("%s left after unmapping", ap)
		}
	}
	if err := f.plugin.UnmapPodDevice(context.Background(), &plugins.TearDownRequest{Spec: s, Dir: apA, Log: zap.NewNop()}); err != nil {
		t.Errorf("unmapping again: %v", err)
	}
	if ms := mounttest.MountsUnder(t, f.paths.Root); len(ms) != 0 {
		t.Errorf("mounts left: %v", mounttest.MountPoints(ms))
	}
	if got := readAt(t, dev, 0, len(head)); !bytes.Equal(got, head) {
		t.Error("the device's first MiB changed: a Block volume must never be formatted or written by the agent")
	}
	if fs := mounttest.DiskFormat(t, dev); fs != "" {
		t.Errorf("device holds a %s filesystem", fs)
	}
}

func TestBlockMapReadOnly(t *testing.T) {
	f := newFixture(t)
	dev := mounttest.LoopDevice(t, 8<<20)
	ap, err := f.mapFor(t, blockSpec("pv-ro", dev, true), pod("a"))
	if err != nil {
		t.Fatal(err)
	}
	if m := mounttest.MountAt(t, ap); !m.HasOption("ro") {
		t.Errorf("read-only access point mounted %v", m.Options)
	}
}

func TestBlockMapRefusesWhatIsNotABlockDevice(t *testing.T) {
	f := newFixture(t)
	file := filepath.Join(f.host, "file")
	mounttest.WriteFile(t, file, "not a device")
	for _, tc := range []struct{ name, path, want string }{
		{"a directory", f.host, "is not a block device"},
		{"a regular file", file, "is not a block device"},
		{"a missing path", filepath.Join(f.host, "missing"), "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ap, err := f.mapFor(t, blockSpec("pv-x", tc.path, false), pod("a"))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "pv-x") {
				t.Errorf("MapPodDevice = %v, want an error naming the PV and saying %q", err, tc.want)
			}
			if len(mounttest.MountsAt(t, ap)) != 0 {
				t.Error("something was mounted")
			}
		})
	}
}

// The PV's path is resolved inside --host-root: a link inside the host root
// may lead to a device inside it, never out of it.
func TestBlockMapResolvesLinksInsideTheHostRoot(t *testing.T) {
	mounttest.RequireRoot(t)
	dev := mounttest.LoopDevice(t, 8<<20)
	hostRoot := mounttest.TempDir(t)
	paths := volume.Paths{Root: mounttest.TempDir(t)}
	f := &fixture{paths: paths, host: hostRoot,
		plugin: local.New(plugins.Host{Paths: paths, Mounter: mountutil.New(), HostRoot: hostRoot, Log: zap.NewNop()})}
	if err := os.MkdirAll(filepath.Join(hostRoot, "dev/disk/by-id"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(hostRoot, "dev/blk0"), unix.S_IFBLK|0o600, int(rdev(t, dev))); err != nil {
		t.Skipf("skipping: cannot make a device node under %s: %v", hostRoot, err)
	}
	if err := os.Symlink("/dev/blk0", filepath.Join(hostRoot, "dev/disk/by-id/inside")); err != nil {
		t.Fatal(err)
	}
	// Absolute, as udev makes them: resolved against the host root, so it
	// names <hostRoot>/<dev>, which does not exist, not the agent's dev.
	if err := os.Symlink(dev, filepath.Join(hostRoot, "dev/disk/by-id/escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../../.."+dev, filepath.Join(hostRoot, "dev/disk/by-id/dotdot")); err != nil {
		t.Fatal(err)
	}

	ap, err := f.mapFor(t, blockSpec("pv-in", "/dev/disk/by-id/inside", false), pod("a"))
	if err != nil {
		t.Fatal(err)
	}
	if rdev(t, ap) != rdev(t, dev) {
		t.Error("the access point is not the linked device")
	}
	for _, link := range []string{"escape", "dotdot"} {
		if _, err := f.mapFor(t, blockSpec("pv-"+link, "/dev/disk/by-id/"+link, false), pod("a")); err == nil {
			t.Errorf("a link out of the host root (%s) was followed", link)
		}
	}
}

// An access point that already holds another device is not replaced under
// the pod: the mapping is uncertain (retried while wanted, unmapped when not).
func TestBlockMapKeepsAnotherDeviceInPlace(t *testing.T) {
	f := newFixture(t)
	dev1 := mounttest.LoopDevice(t, 8<<20)
	dev2 := mounttest.LoopDevice(t, 8<<20)
	ap, err := f.mapFor(t, blockSpec("pv-1", dev1, false), pod("a"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.mapFor(t, blockSpec("pv-1", dev2, false), pod("a"))
	if err == nil || !volume.IsUncertain(err) || !strings.Contains(err.Error(), "already holds device") {
		t.Errorf("MapPodDevice over another device = %v, want an uncertain error", err)
	}
	if rdev(t, ap) != rdev(t, dev1) {
		t.Error("the access point's device was replaced")
	}
}
