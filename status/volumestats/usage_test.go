package volumestats

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

// The kubelet's arithmetic (pkg/volume/util/fs.Info): block counts times
// f_bsize, used = blocks - bfree, inodes used = files - ffree.
func TestFromStatfs(t *testing.T) {
	cases := []struct {
		name string
		st   unix.Statfs_t
		want Usage
	}{
		{
			name: "ext4 with reserved blocks: used + available < capacity",
			st:   unix.Statfs_t{Bsize: 4096, Frsize: 4096, Blocks: 1000, Bfree: 800, Bavail: 750, Files: 256, Ffree: 245},
			want: Usage{CapacityBytes: 4096000, AvailableBytes: 3072000, UsedBytes: 819200, Inodes: 256, InodesFree: 245, InodesUsed: 11},
		},
		{
			name: "f_bsize, not f_frsize, as the kubelet",
			st:   unix.Statfs_t{Bsize: 65536, Frsize: 4096, Blocks: 10, Bfree: 4, Bavail: 4, Files: 0, Ffree: 0},
			want: Usage{CapacityBytes: 655360, AvailableBytes: 262144, UsedBytes: 393216},
		},
		{
			name: "empty",
			st:   unix.Statfs_t{Bsize: 4096, Blocks: 0},
			want: Usage{},
		},
		{
			name: "full",
			st:   unix.Statfs_t{Bsize: 1024, Blocks: 100, Bfree: 0, Bavail: 0, Files: 10, Ffree: 0},
			want: Usage{CapacityBytes: 102400, UsedBytes: 102400, Inodes: 10, InodesUsed: 10},
		},
		{
			name: "large (16 TiB)",
			st:   unix.Statfs_t{Bsize: 4096, Blocks: 1 << 32, Bfree: 1 << 31, Bavail: 1 << 30, Files: 1 << 30, Ffree: 1 << 29},
			want: Usage{CapacityBytes: 1 << 44, AvailableBytes: 1 << 42, UsedBytes: 1 << 43, Inodes: 1 << 30, InodesFree: 1 << 29, InodesUsed: 1 << 29},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := fromStatfs(&c.st); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// What the kubelet makes of a NodeGetVolumeStats response (pkg/volume/csi
// NodeGetVolumeStats): figures by unit, 0 where absent, the condition only
// for drivers with VOLUME_CONDITION, no usage an error unless the driver
// reports conditions.
func TestFromCSI(t *testing.T) {
	bytes := &csi.VolumeUsage{Unit: csi.VolumeUsage_BYTES, Total: 1000, Available: 600, Used: 400}
	inodes := &csi.VolumeUsage{Unit: csi.VolumeUsage_INODES, Total: 100, Available: 90, Used: 10}
	resp := func(u ...*csi.VolumeUsage) *csi.NodeGetVolumeStatsResponse {
		return &csi.NodeGetVolumeStatsResponse{Usage: u}
	}
	cases := []struct {
		name          string
		resp          *csi.NodeGetVolumeStatsResponse
		withCondition bool
		want          Usage
		health        *Health
		err           string
	}{
		{name: "bytes and inodes", resp: resp(bytes, inodes),
			want: Usage{CapacityBytes: 1000, AvailableBytes: 600, UsedBytes: 400, Inodes: 100, InodesFree: 90, InodesUsed: 10}},
		{name: "bytes only (a block volume): inodes 0", resp: resp(bytes),
			want: Usage{CapacityBytes: 1000, AvailableBytes: 600, UsedBytes: 400}},
		{name: "inodes only", resp: resp(inodes), want: Usage{Inodes: 100, InodesFree: 90, InodesUsed: 10}},
		{name: "unknown unit ignored", resp: resp(&csi.VolumeUsage{Unit: csi.VolumeUsage_UNKNOWN, Total: 7}, bytes),
			want: Usage{CapacityBytes: 1000, AvailableBytes: 600, UsedBytes: 400}},
		{name: "the last entry of a unit wins", resp: resp(bytes, &csi.VolumeUsage{Unit: csi.VolumeUsage_BYTES, Total: 5, Available: 3, Used: 2}),
			want: Usage{CapacityBytes: 5, AvailableBytes: 3, UsedBytes: 2}},
		{name: "no usage", resp: resp(), err: "no usage"},
		{name: "no usage but a condition capability: zeros and healthy", resp: resp(), withCondition: true, health: &Health{}},
		{name: "condition ignored without the capability", resp: withCondition(resp(bytes), true, "broken"),
			want: Usage{CapacityBytes: 1000, AvailableBytes: 600, UsedBytes: 400}},
		{name: "abnormal", resp: withCondition(resp(bytes, inodes), true, "broken"), withCondition: true,
			want:   Usage{CapacityBytes: 1000, AvailableBytes: 600, UsedBytes: 400, Inodes: 100, InodesFree: 90, InodesUsed: 10},
			health: &Health{Abnormal: true, Message: "broken"}},
		{name: "condition absent with the capability: healthy", resp: resp(bytes), withCondition: true,
			want: Usage{CapacityBytes: 1000, AvailableBytes: 600, UsedBytes: 400}, health: &Health{}},
		{name: "negative figure", resp: resp(&csi.VolumeUsage{Unit: csi.VolumeUsage_BYTES, Total: 10, Available: -1, Used: 11}), err: "negative BYTES usage"},
		{name: "malformed condition", resp: func() *csi.NodeGetVolumeStatsResponse {
			r := resp(bytes)
			r.ProtoReflect().SetUnknown([]byte{0x12, 0x05, 0x08})
			return r
		}(), withCondition: true, err: "malformed volume_condition"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, health, err := fromCSI(c.resp, c.withCondition)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %+v, %v; want an error with %q", got, err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("usage %+v, want %+v", got, c.want)
			}
			if (health == nil) != (c.health == nil) || (health != nil && *health != *c.health) {
				t.Errorf("health %+v, want %+v", health, c.health)
			}
		})
	}
}

// HostFS against real filesystems: statfs of a tmpfs of known size and
// inode count, the size of a loop device, and refusals (a symbolic link
// as the mount point, an access point without a device).
func TestHostFS(t *testing.T) {
	mounttest.RequireRoot(t)
	dir := mounttest.TempDir(t)
	mnt := filepath.Join(dir, "tmpfs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=4m,nr_inodes=1000"); err != nil {
		t.Fatal(err)
	}
	mounttest.WriteFile(t, filepath.Join(mnt, "f"), strings.Repeat("x", 64<<10))

	st, err := HostFS{}.Statfs(mnt)
	if err != nil {
		t.Fatal(err)
	}
	u := fromStatfs(&st)
	page := int64(os.Getpagesize())
	if u.CapacityBytes != 4<<20 || u.Inodes != 1000 || u.InodesUsed != 2 || u.InodesFree != 998 {
		t.Errorf("tmpfs size=4m,nr_inodes=1000 with one file: %+v", u)
	}
	if u.UsedBytes != 64<<10 || u.AvailableBytes != 4<<20-64<<10 {
		t.Errorf("64 KiB written (pages of %d): used %d, available %d", page, u.UsedBytes, u.AvailableBytes)
	}

	link := filepath.Join(dir, "link")
	if err := os.Symlink(mnt, link); err != nil {
		t.Fatal(err)
	}
	if _, err := (HostFS{}).Statfs(link); err == nil {
		t.Error("statfs followed a symbolic link at the mount point")
	}

	dev := mounttest.LoopDevice(t, 3<<20)
	if size, err := (HostFS{}).DeviceSize(dev); err != nil || size != 3<<20 {
		t.Errorf("size of a 3 MiB loop device: %d, %v", size, err)
	}
	if _, err := (HostFS{}).DeviceSize(filepath.Join(mnt, "f")); err == nil || !strings.Contains(err.Error(), "not a block device") {
		t.Errorf("size of a regular file: %v, want not a block device", err)
	}
}
