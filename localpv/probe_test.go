package localpv

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/hostroot"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
)

// TestProbeHost inspects real mounts, devices and links below a host root
// that is not "/", as the DaemonSet sees the node at /host.
func TestProbeHost(t *testing.T) {
	mounttest.RequireRoot(t)
	root := mounttest.TempDir(t)
	disks := filepath.Join(root, "mnt", "disks")
	for _, d := range []string{"tmpfs", "plain", "bind"} {
		if err := os.MkdirAll(filepath.Join(disks, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("tmpfs", filepath.Join(disks, "tmpfs"), "tmpfs", 0, "size=8m"); err != nil {
		t.Fatal(err)
	}
	// A directory bind-mounted onto itself is a mount point too.
	if err := unix.Mount(filepath.Join(disks, "bind"), filepath.Join(disks, "bind"), "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	mounttest.WriteFile(t, filepath.Join(disks, "file"), "x")

	// A block device node of the host at /devs/disk0, linked from the
	// discovery directory by its node path (absolute) and by a relative
	// path that tries to climb out of the host root.
	dev := mounttest.LoopDevice(t, 64<<20)
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "devs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(root, "devs", "disk0"), unix.S_IFBLK|0o600, int(st.Rdev)); err != nil {
		t.Fatal(err)
	}
	must(t, os.Symlink("/devs/disk0", filepath.Join(disks, "linked")))
	must(t, os.Symlink("../../../../../../devs/disk0", filepath.Join(disks, "climbing")))
	must(t, os.Symlink("/devs/nothing", filepath.Join(disks, "dangling")))
	must(t, os.Symlink("/mnt/disks/tmpfs", filepath.Join(disks, "dirlink")))

	// The node's /mnt/links is a link to its /mnt/disks: paths through it
	// resolve on the node, not in the agent's own file system.
	must(t, os.Symlink("/mnt/disks", filepath.Join(root, "mnt", "links")))

	pr := &hostProber{root: hostroot.New(root), mounter: mountutil.New()}
	for _, tc := range []struct {
		entry      string
		kind       Kind
		mountPoint bool
		symlink    bool
		capacity   int64
	}{
		{"tmpfs", KindDirectory, true, false, 8 << 20},
		{"bind", KindDirectory, true, false, -1},
		{"plain", KindDirectory, false, false, 0},
		{"file", KindOther, false, false, 0},
		{"linked", KindBlockDevice, false, true, 64 << 20},
		{"climbing", KindBlockDevice, false, true, 64 << 20},
		{"dangling", KindMissing, false, true, 0},
		{"dirlink", KindDirectory, false, true, 0},
		{"absent", KindMissing, false, false, 0},
	} {
		t.Run(tc.entry, func(t *testing.T) {
			p := pr.probe("/mnt/disks/" + tc.entry)
			if p.Err != nil {
				t.Fatal(p.Err)
			}
			if p.Kind != tc.kind || p.MountPoint != tc.mountPoint || p.Symlink != tc.symlink || (tc.capacity >= 0 && p.Capacity != tc.capacity) {
				t.Fatalf("%+v", p)
			}
			if through := pr.probe("/mnt/links/" + tc.entry); through.Kind != p.Kind || through.MountPoint != p.MountPoint || through.Identity != p.Identity {
				t.Fatalf("through /mnt/links: %+v, want %+v", through, p)
			}
			if tc.kind == KindBlockDevice && p.Device != filepath.Join(root, "devs", "disk0") {
				t.Fatalf("device %s", p.Device)
			}
			if (tc.mountPoint || tc.kind == KindBlockDevice) && p.Identity == "" {
				t.Fatal("no identity")
			}
		})
	}

	// Unmounting changes the verdict on a PV made from the tmpfs.
	pv := &v1.PersistentVolume{Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/disks/tmpfs"}}}}
	if r := missingReason(pv, pr.probe("/mnt/disks/tmpfs")); r != "" {
		t.Fatalf("mounted: %s", r)
	}
	must(t, unix.Unmount(filepath.Join(disks, "tmpfs"), 0))
	if r := missingReason(pv, pr.probe("/mnt/disks/tmpfs")); r == "" {
		t.Fatal("unmounted disk not missing")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
