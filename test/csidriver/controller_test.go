package csidriver

import (
	"os"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// The controller side only creates sparse files, so these tests need no root.

func TestCreateVolume(t *testing.T) {
	dir := newTestDir(t)
	d, conn := startDriver(t, dir, Config{Capacity: 256 << 20})
	ctrl := csi.NewControllerClient(conn)
	ctx := testCtx(t)
	create := func(name string, cr *csi.CapacityRange) (*csi.Volume, error) {
		resp, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: cr})
		return resp.GetVolume(), err
	}

	v, err := create("default", nil)
	mustOK(t, err)
	if v.CapacityBytes != DefaultVolumeSize {
		t.Errorf("default size %d", v.CapacityBytes)
	}
	info, _ := d.Volume(v.VolumeId)
	if fi, err := os.Stat(info.BackingFile); err != nil || fi.Size() != DefaultVolumeSize {
		t.Errorf("backing file: %v %v", fi, err)
	}

	// Idempotent by name, as long as the capacity fits.
	again, err := create("default", &csi.CapacityRange{RequiredBytes: 32 << 20})
	mustOK(t, err)
	if again.VolumeId != v.VolumeId {
		t.Errorf("second CreateVolume made a new volume")
	}
	_, err = create("default", &csi.CapacityRange{RequiredBytes: 100 << 20})
	expectCode(t, err, codes.AlreadyExists)

	// Capacity ranges.
	v2, err := create("limited", &csi.CapacityRange{LimitBytes: 10 << 20})
	mustOK(t, err)
	if v2.CapacityBytes != 10<<20 {
		t.Errorf("size under a limit: %d", v2.CapacityBytes)
	}
	v3, err := create("odd", &csi.CapacityRange{RequiredBytes: 3<<20 + 1})
	mustOK(t, err)
	if v3.CapacityBytes != 3<<20+512 {
		t.Errorf("rounded size %d", v3.CapacityBytes)
	}
	_, err = create("inverted", &csi.CapacityRange{RequiredBytes: 2 << 20, LimitBytes: 1 << 20})
	expectCode(t, err, codes.InvalidArgument)
	_, err = create("tiny", &csi.CapacityRange{LimitBytes: 4096})
	expectCode(t, err, codes.OutOfRange)

	// Capacity accounting: 256 MiB total, 64+10+3 used.
	capResp, err := ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{})
	mustOK(t, err)
	if want := int64(256<<20 - (64<<20 + 10<<20 + 3<<20 + 512)); capResp.AvailableCapacity != want {
		t.Errorf("available %d, want %d", capResp.AvailableCapacity, want)
	}
	_, err = create("too-big", &csi.CapacityRange{RequiredBytes: 200 << 20})
	expectCode(t, err, codes.ResourceExhausted)

	// Unsupported requests.
	_, err = ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "fs", VolumeCapabilities: []*csi.VolumeCapability{
		mountCap("ntfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}})
	expectCode(t, err, codes.InvalidArgument)
	_, err = ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "snap", VolumeCapabilities: []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "s"}}}})
	expectCode(t, err, codes.InvalidArgument)

	// Expansion grows the file and never shrinks it.
	exp, err := ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v2.VolumeId, CapacityRange: &csi.CapacityRange{RequiredBytes: 20 << 20}})
	mustOK(t, err)
	if exp.CapacityBytes != 20<<20 || !exp.NodeExpansionRequired {
		t.Errorf("expand: %v", exp)
	}
	exp, err = ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v2.VolumeId, CapacityRange: &csi.CapacityRange{RequiredBytes: 5 << 20}})
	mustOK(t, err)
	if exp.CapacityBytes != 20<<20 {
		t.Errorf("shrunk to %d", exp.CapacityBytes)
	}
	_, err = ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "nope", CapacityRange: &csi.CapacityRange{RequiredBytes: 5 << 20}})
	expectCode(t, err, codes.NotFound)

	for _, vol := range []*csi.Volume{v, v2, v3} {
		info, _ := d.Volume(vol.VolumeId)
		_, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId})
		mustOK(t, err)
		if _, err := os.Stat(info.BackingFile); !os.IsNotExist(err) {
			t.Errorf("backing file of %s left: %v", vol.VolumeId, err)
		}
	}
	_, err = ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.VolumeId})
	mustOK(t, err)
}

func TestListVolumesPagination(t *testing.T) {
	dir := newTestDir(t)
	d, conn := startDriver(t, dir, Config{AttachRequired: true})
	ctrl := csi.NewControllerClient(conn)
	ctx := testCtx(t)
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		createVolume(t, conn, name, 1<<20)
	}
	all := d.Volumes()
	_, err := ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: all[0].ID, NodeId: "node-1", VolumeCapability: rwo})
	mustOK(t, err)

	page1, err := ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 2})
	mustOK(t, err)
	if len(page1.Entries) != 2 || page1.NextToken == "" {
		t.Fatalf("page 1: %v", page1)
	}
	if got := page1.Entries[0].GetStatus().GetPublishedNodeIds(); len(got) != 1 || got[0] != "node-1" {
		t.Errorf("published nodes of the first volume: %v", got)
	}
	// Deleting the last volume of a page does not break the token.
	_, err = ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: page1.Entries[1].Volume.VolumeId})
	mustOK(t, err)
	rest, err := ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: page1.NextToken})
	mustOK(t, err)
	if len(rest.Entries) != 3 || rest.NextToken != "" {
		t.Errorf("rest: %v", rest)
	}
	seen := map[string]bool{}
	for _, e := range append(page1.Entries, rest.Entries...) {
		if seen[e.Volume.VolumeId] {
			t.Errorf("%s listed twice", e.Volume.VolumeId)
		}
		seen[e.Volume.VolumeId] = true
	}
	_, err = ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "bogus"})
	expectCode(t, err, codes.Aborted)
	_, err = ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: -1})
	expectCode(t, err, codes.InvalidArgument)
}

func TestControllerPublish(t *testing.T) {
	dir := newTestDir(t)
	_, conn := startDriver(t, dir, Config{AttachRequired: true, MaxVolumesPerNode: 1})
	ctrl := csi.NewControllerClient(conn)
	ctx := testCtx(t)
	a := createVolume(t, conn, "a", 0).VolumeId
	b := createVolume(t, conn, "b", 0).VolumeId
	pub := func(id, node string, ro bool) error {
		_, err := ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, VolumeCapability: rwo, Readonly: ro})
		return err
	}
	mustOK(t, pub(a, "node-1", false))
	mustOK(t, pub(a, "node-1", false))
	expectCode(t, pub(a, "node-1", true), codes.AlreadyExists)
	expectCode(t, pub(a, "node-2", false), codes.NotFound)
	expectCode(t, pub("nope", "node-1", false), codes.NotFound)
	expectCode(t, pub(b, "node-1", false), codes.ResourceExhausted)
	_, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: a})
	expectCode(t, err, codes.FailedPrecondition)
	for range 2 {
		_, err = ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: a, NodeId: "node-1"})
		mustOK(t, err)
	}
	mustOK(t, pub(b, "node-1", false))
	_, err = ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: b})
	mustOK(t, err)
	_, err = ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: a})
	mustOK(t, err)
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"": 7, "1024": 1024, "16Mi": 16 << 20, "2Gi": 2 << 30, "5M": 5e6, "3k": 3000, "1Ti": 1 << 40} {
		if got, err := ParseSize(in, 7); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"x", "-1", "0", "1.5Gi", "Mi", "1Pi"} {
		if got, err := ParseSize(bad, 0); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", bad, got)
		}
	}
}
