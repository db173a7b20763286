package local_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/plugins/pluginstest"
	"github.com/volume-agent/volume-agent/volume"
)

// The plugin's decisions, with a fake mounter (no root needed): what it
// mounts with which options, and which failures leave the outcome
// uncertain. The real mounts are tested in local_test.go.

// newFakeFixture returns a fixture with a fake mounter and the host's root
// at a temporary directory (its path in host, the PV's directory
// /mnt/disks/d1 in it), so that paths from the PV are looked up below it.
func newFakeFixture(t *testing.T) (*fixture, *pluginstest.Mounter) {
	t.Helper()
	m := pluginstest.NewMounter()
	paths := volume.Paths{Root: t.TempDir()}
	host := t.TempDir()
	if err := os.MkdirAll(filepath.Join(host, "mnt", "disks", "d1"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := plugins.Host{Paths: paths, Mounter: m, NodeName: "node", HostRoot: host, Log: zap.NewNop()}
	return &fixture{plugin: local.New(h), paths: paths, host: host}, m
}

func TestMountDeviceDecisions(t *testing.T) {
	errMount := errors.New("mount: wrong fs type, bad option, bad superblock")
	cases := []struct {
		name    string
		opts    []pvOpt
		mounted bool // the global mount is in place already
		fault   *pluginstest.Fault
		// wantMount is the one FormatAndMount call after "FormatAndMount
		// /host/dev/disk1 <global> ", "" for none.
		wantMount     string
		wantErr       error
		wantUncertain bool
	}{
		{name: "default filesystem", wantMount: "ext4"},
		{name: "PV's filesystem and mount options, sorted and unique", opts: []pvOpt{fsType("xfs"), mountOptions("noatime", "discard", "noatime")}, wantMount: "xfs discard,noatime"},
		{name: "mounted before", mounted: true},
		{name: "mount fails, nothing mounted", fault: &pluginstest.Fault{Op: "FormatAndMount", Err: errMount}, wantMount: "ext4", wantErr: errMount},
		{name: "mount fails, something mounted", fault: &pluginstest.Fault{Op: "FormatAndMount", Err: errMount, Applied: true}, wantMount: "ext4", wantErr: errMount, wantUncertain: true},
		{name: "mount check fails", fault: &pluginstest.Fault{Op: "IsMountPoint", Err: errMount, Times: 1}, wantErr: errMount},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, m := newFakeFixture(t)
			s := spec("pv-1", "/dev/disk1", false, c.opts...)
			global := f.globalPath(s)
			if c.mounted {
				if err := os.MkdirAll(global, 0o750); err != nil {
					t.Fatal(err)
				}
				m.SetMounted(f.host+"/dev/disk1", global)
			}
			if c.fault != nil {
				m.Fail(*c.fault)
			}
			err := f.mountDevice(s)
			if !errors.Is(err, c.wantErr) || volume.IsUncertain(err) != c.wantUncertain {
				t.Fatalf("MountDevice: %v (uncertain %v), want %v (uncertain %v)", err, volume.IsUncertain(err), c.wantErr, c.wantUncertain)
			}
			var want []string
			if c.wantMount != "" {
				want = []string{"FormatAndMount " + f.host + "/dev/disk1 " + global + " " + c.wantMount}
			}
			if got := m.CallStrings(); !slices.Equal(got, want) {
				t.Errorf("mounter calls %q, want %q", got, want)
			}
		})
	}
}

func TestUnmountDeviceDecisions(t *testing.T) {
	errBusy := errors.New("device or resource busy")
	cases := []struct {
		name string
		// mounted: the global mount is in place; podBound: a pod's bind
		// mount of it too.
		mounted, podBound bool
		fault             *pluginstest.Fault
		wantErr           string
		wantUnmount       bool
		wantKept          bool // the global mount point is left
	}{
		{name: "mounted", mounted: true, wantUnmount: true},
		{name: "not mounted (after a restart)", wantUnmount: true},
		{name: "a pod still uses it", mounted: true, podBound: true, wantErr: "is still used by", wantKept: true},
		{name: "unmount fails", mounted: true, fault: &pluginstest.Fault{Op: "UnmountAll", Err: errBusy}, wantErr: errBusy.Error(), wantUnmount: true, wantKept: true},
		{name: "mount check fails", mounted: true, fault: &pluginstest.Fault{Op: "IsMountPoint", Err: errBusy}, wantErr: errBusy.Error(), wantKept: true},
		{name: "listing other mounts fails", mounted: true, fault: &pluginstest.Fault{Op: "MountRefs", Err: errBusy}, wantErr: errBusy.Error(), wantKept: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, m := newFakeFixture(t)
			s := spec("pv-1", "/dev/disk1", false)
			global := f.globalPath(s)
			if err := os.MkdirAll(global, 0o750); err != nil {
				t.Fatal(err)
			}
			if c.mounted {
				m.SetMounted(f.host+"/dev/disk1", global)
			}
			podDir := f.podDir(s, pod("p1"))
			if c.podBound {
				if err := os.MkdirAll(podDir, 0o750); err != nil {
					t.Fatal(err)
				}
				m.SetMounted(global, podDir)
			}
			if c.fault != nil {
				m.Fail(*c.fault)
			}
			err := f.unmountDevice(s)
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("UnmountDevice: %v, want %q", err, c.wantErr)
			}
			var want []string
			if c.wantUnmount {
				want = []string{"UnmountAll " + global}
			}
			if got := m.CallStrings(); !slices.Equal(got, want) {
				t.Errorf("mounter calls %q, want %q", got, want)
			}
			if _, err := os.Stat(global); (err == nil) != c.wantKept {
				t.Errorf("global mount point kept: %v, want %v", err == nil, c.wantKept)
			}
			if c.podBound && !slices.Contains(m.Mounted(), podDir) {
				t.Error("the pod's mount is gone")
			}
		})
	}
}

func TestSetUpDecisions(t *testing.T) {
	cases := []struct {
		name     string
		readOnly bool
		opts     []pvOpt
		device   bool // staged at the global mount
		mounted  bool
		fault    *pluginstest.Fault
		// wantBind is the one BindMount call after "BindMount <source>
		// <dir>", "-" for none.
		wantBind string
		wantErr  string
	}{
		{name: "directory", wantBind: ""},
		{name: "directory read-only", readOnly: true, wantBind: " ro"},
		{name: "directory with mount options", opts: []pvOpt{mountOptions("ro", "noexec", "nosuid")}, wantBind: " ro flags=0xa"},
		{name: "directory with an option a bind mount cannot honour", opts: []pvOpt{mountOptions("discard")}, wantBind: "-", wantErr: `"discard" cannot be applied`},
		// The device's mount options were applied when it was mounted.
		{name: "device", device: true, opts: []pvOpt{mountOptions("noexec")}, wantBind: ""},
		{name: "device read-only", device: true, readOnly: true, wantBind: " ro"},
		{name: "set up before", mounted: true, wantBind: "-"},
		{name: "bind fails", fault: &pluginstest.Fault{Op: "BindMount", Err: errors.New("no such device")}, wantBind: "", wantErr: "no such device"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, m := newFakeFixture(t)
			s := spec("pv-1", "/mnt/disks/d1", c.readOnly, c.opts...)
			p := pod("p1")
			dir := f.podDir(s, p)
			source, deviceMountPath := f.host+"/mnt/disks/d1", ""
			if c.device {
				source, deviceMountPath = f.globalPath(s), f.globalPath(s)
			}
			if c.mounted {
				if err := os.MkdirAll(dir, 0o750); err != nil {
					t.Fatal(err)
				}
				m.SetMounted(source, dir)
			}
			if c.fault != nil {
				m.Fail(*c.fault)
			}
			err := f.setUp(s, p, deviceMountPath)
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("SetUp: %v, want %q", err, c.wantErr)
			}
			if volume.IsUncertain(err) {
				t.Errorf("SetUp: %v is uncertain; nothing was mounted", err)
			}
			var want []string
			if c.wantBind != "-" {
				want = []string{"BindMount " + source + " " + dir + c.wantBind}
			}
			if got := m.CallStrings(); !slices.Equal(got, want) {
				t.Errorf("mounter calls %q, want %q", got, want)
			}
		})
	}
}

// Tearing down never removes the mount point while it may still be
// mounted: it would be the source's data below it.
func TestTearDownDecisions(t *testing.T) {
	for _, fail := range []bool{false, true} {
		f, m := newFakeFixture(t)
		s := spec("pv-1", "/mnt/disks/d1", false)
		p := pod("p1")
		dir := f.podDir(s, p)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		m.SetMounted(f.host+"/mnt/disks/d1", dir)
		if fail {
			m.Fail(pluginstest.Fault{Op: "UnmountAll", Err: errors.New("busy")})
		}
		err := f.tearDown(s, p)
		if (err != nil) != fail {
			t.Errorf("TearDown with a failing unmount %v: %v", fail, err)
		}
		if _, serr := os.Stat(dir); (serr == nil) != fail {
			t.Errorf("failing unmount %v: mount point kept %v", fail, serr == nil)
		}
	}
}

// A device named by a link (/dev/disk/by-id/...) whose target is absolute
// is the node's device: the link resolves within the host root. Resolved
// in the agent's own file system it would name the container's device
// node of that name, and format the wrong disk.
func TestMountDeviceResolvesLinksWithinTheHostRoot(t *testing.T) {
	f, m := newFakeFixture(t)
	byID := filepath.Join(f.host, "dev", "disk", "by-id")
	if err := os.MkdirAll(byID, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/sdz", filepath.Join(byID, "wwn-1")); err != nil {
		t.Fatal(err)
	}
	s := spec("pv-1", "/dev/disk/by-id/wwn-1", false)
	if err := f.mountDevice(s); err != nil {
		t.Fatal(err)
	}
	want := []string{"FormatAndMount " + f.host + "/dev/sdz " + f.globalPath(s) + " ext4"}
	if got := m.CallStrings(); !slices.Equal(got, want) {
		t.Errorf("mounter calls %q, want %q", got, want)
	}
}
