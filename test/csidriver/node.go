package csidriver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volume-agent/volume-agent/csi/csiclient"
)

type nodeServer struct {
	csi.UnimplementedNodeServer
	d *Driver
}

func internalErr(format string, args ...any) error {
	return status.Errorf(codes.Internal, format, args...)
}

func (s *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{NodeId: s.d.cfg.NodeID, MaxVolumesPerNode: s.d.cfg.MaxVolumesPerNode}
	if s.d.cfg.Topology {
		resp.AccessibleTopology = s.d.topology()
	}
	return resp, nil
}

func (s *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	types := []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	}
	if !s.d.cfg.DisableSingleNodeMultiWriter {
		types = append(types, csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
	}
	if !s.d.cfg.DisableStaging {
		types = append(types, csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
	}
	if s.d.cfg.VolumeCondition {
		types = append(types, csiclient.NodeVolumeCondition)
	}
	caps := make([]*csi.NodeServiceCapability, 0, len(types))
	for _, t := range types {
		caps = append(caps, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// --- helpers shared by stage and publish ---

// ensureLoop attaches v's backing file to a loop device unless it already
// is, and records the device in v; the caller saves v.
func (d *Driver) ensureLoop(v *volume) (string, error) {
	file := d.backingPath(v)
	if v.LoopDevice != "" && loopBackingFile(v.LoopDevice) == file {
		return v.LoopDevice, nil
	}
	dev, err := attachLoop(file)
	if err != nil {
		return "", internalErr("attach loop device: %v", err)
	}
	d.log.Info("loop device attached", zap.String("volume", v.ID), zap.String("device", dev))
	v.LoopDevice = dev
	return dev, nil
}

// attach attaches v's backing file (see ensureLoop) and saves the device at
// once, so that a driver that dies halfway through the call can still find
// and detach it. The returned undo detaches the device again if this call
// attached it: a stage or publish that fails must not leave a loop device
// behind that no later call would release.
func (d *Driver) attach(v *volume) (string, func(), error) {
	fresh := !d.loopAttached(v)
	dev, err := d.ensureLoop(v)
	if err != nil {
		return "", nil, err
	}
	if err := d.putVolume(v); err != nil {
		return "", nil, internalErr("%v", err)
	}
	undo := func() {
		if !fresh {
			return
		}
		if err := d.releaseLoop(v); err != nil {
			d.log.Warn("cannot detach the loop device of a failed call", zap.String("volume", v.ID), zap.Error(err))
			return
		}
		_ = d.putVolume(v) // logged by putVolume
	}
	return dev, undo, nil
}

// releaseLoop detaches v's loop device; the caller saves v.
func (d *Driver) releaseLoop(v *volume) error {
	if v.LoopDevice == "" {
		return nil
	}
	if err := detachLoop(v.LoopDevice, d.backingPath(v)); err != nil {
		return internalErr("detach loop device: %v", err)
	}
	d.log.Info("loop device detached", zap.String("volume", v.ID), zap.String("device", v.LoopDevice))
	v.LoopDevice = ""
	return nil
}

// loopAttached reports whether v's recorded loop device still holds its file.
func (d *Driver) loopAttached(v *volume) bool {
	return v.LoopDevice != "" && loopBackingFile(v.LoopDevice) == d.backingPath(v)
}

// prepareFilesystem makes sure dev holds a filesystem and returns its type.
// A blank device is formatted with requested (or the default type); a
// device with a filesystem is never formatted again, and an unmounted ext
// filesystem smaller than its device is grown first.
func (d *Driver) prepareFilesystem(dev, requested string) (string, error) {
	have, err := detectFS(dev)
	if err != nil {
		return "", internalErr("probe %s: %v", dev, err)
	}
	if have == "" {
		fsType := requested
		if fsType == "" {
			fsType = d.cfg.DefaultFSType
		}
		if err := makeFS(dev, fsType); err != nil {
			return "", internalErr("format %s as %s: %v", dev, fsType, err)
		}
		d.log.Info("device formatted", zap.String("device", dev), zap.String("fsType", fsType))
		return fsType, nil
	}
	if requested != "" && have != requested {
		return "", status.Errorf(codes.FailedPrecondition, "%s already holds a %s filesystem, %s was requested", dev, have, requested)
	}
	if isExtFS(have) {
		// Never check or resize a filesystem that is in use elsewhere.
		mounted, err := deviceMounted(dev)
		if err != nil {
			return "", internalErr("%v", err)
		}
		if !mounted {
			if err := growExtOffline(dev); err != nil {
				return "", internalErr("grow filesystem on %s: %v", dev, err)
			}
		}
	}
	return have, nil
}

// mountFilesystem mounts dev at dir (created if missing) unless it already is.
func (d *Driver) mountFilesystem(dev, fsType, dir string, flags []string, readOnly bool) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return internalErr("create %s: %v", dir, err)
	}
	if mounted, err := mountedFrom(dir, dev); err != nil {
		return internalErr("%v", err)
	} else if mounted {
		return nil
	}
	if err := mountDevice(dev, dir, fsType, flags, readOnly); err != nil {
		return internalErr("%v", err)
	}
	if fsType == "xfs" && !readOnly {
		// XFS only grows while mounted, so catch up with a device that
		// grew while the volume was not staged.
		if err := growFSOnline(dev, fsType, dir); err != nil {
			d.log.Warn("cannot grow xfs after mounting", zap.String("device", dev), zap.Error(err))
		}
	}
	return nil
}

// makeTarget creates a publish target: a directory for a filesystem, a file
// for a block device bind mount.
func makeTarget(target string, block bool) error {
	if !block {
		return os.MkdirAll(target, 0o750)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

// --- stage / unstage ---

func (s *nodeServer) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	d := s.d
	if d.cfg.DisableStaging {
		return nil, status.Error(codes.Unimplemented, "staging is disabled")
	}
	id, c := req.GetVolumeId(), req.GetVolumeCapability()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path is missing")
	}
	if err := s.d.checkAccessMode(c); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	path, err := canonicalPath(req.GetStagingTargetPath())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	unlock := d.locks.lock(id)
	defer unlock()
	v := d.getVolume(id)
	if v == nil || v.Ephemeral {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	if _, ok := v.Attachments[d.cfg.NodeID]; d.cfg.AttachRequired && !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not published to node %s", id, d.cfg.NodeID)
	}
	block, readOnly, requestedFS := c.GetBlock() != nil, isReadOnlyMode(c), c.GetMount().GetFsType()
	if st := v.Staged; st != nil {
		if st.Path != path {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %s", id, st.Path)
		}
		if st.Block != block || st.ReadOnly != readOnly || (requestedFS != "" && requestedFS != st.FSType) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged at %s with another capability", id, path)
		}
		if d.stagedInPlace(v) {
			return &csi.NodeStageVolumeResponse{}, nil
		}
		d.log.Info("staged volume lost its loop device or mount; staging it again", zap.String("volume", id))
	}

	dev, undo, err := d.attach(v)
	if err != nil {
		return nil, err
	}
	st := &stageInfo{Path: path, Block: block, ReadOnly: readOnly}
	if !block {
		fsType, err := d.prepareFilesystem(dev, requestedFS)
		if err == nil {
			err = d.mountFilesystem(dev, fsType, path, c.GetMount().GetMountFlags(), readOnly)
		}
		if err != nil {
			undo()
			return nil, err
		}
		st.FSType, st.MountFlags = fsType, c.GetMount().GetMountFlags()
	}
	v.Staged = st
	if err := d.putVolume(v); err != nil {
		return nil, internalErr("%v", err)
	}
	d.log.Info("volume staged", zap.String("volume", id), zap.String("path", path), zap.Bool("block", block))
	return &csi.NodeStageVolumeResponse{}, nil
}

// stagedInPlace reports whether what v.Staged records is really there.
func (d *Driver) stagedInPlace(v *volume) bool {
	if v.Staged == nil || !d.loopAttached(v) {
		return false
	}
	if v.Staged.Block {
		return true
	}
	ok, _ := mountedFrom(v.Staged.Path, v.LoopDevice)
	return ok
}

func (s *nodeServer) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	d := s.d
	if d.cfg.DisableStaging {
		return nil, status.Error(codes.Unimplemented, "staging is disabled")
	}
	id := req.GetVolumeId()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path is missing")
	}
	path, err := canonicalPath(req.GetStagingTargetPath())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	unlock := d.locks.lock(id)
	defer unlock()
	v := d.getVolume(id)
	if v == nil || v.Ephemeral {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	if v.Staged != nil && v.Staged.Path != path {
		return &csi.NodeUnstageVolumeResponse{}, nil // not staged here: nothing to do
	}
	if len(v.Publications) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published at %v", id, d.volumeInfo(v).TargetPaths)
	}
	// Unmount what the record says was mounted here, or (no record: the
	// driver died halfway through staging) what came from our device.
	unmount := v.Staged != nil && !v.Staged.Block
	if !unmount && v.LoopDevice != "" {
		unmount, _ = mountedFrom(path, v.LoopDevice)
	}
	if unmount {
		if err := unmountAll(path); err != nil {
			return nil, internalErr("%v", err)
		}
	}
	if err := d.releaseLoop(v); err != nil {
		return nil, err
	}
	wasStaged := v.Staged != nil
	v.Staged = nil
	if err := d.putVolume(v); err != nil {
		return nil, internalErr("%v", err)
	}
	if wasStaged {
		d.log.Info("volume unstaged", zap.String("volume", id), zap.String("path", path))
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// --- publish / unpublish ---

func (s *nodeServer) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	d := s.d
	id, c := req.GetVolumeId(), req.GetVolumeCapability()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target path is missing")
	}
	if err := s.d.checkAccessMode(c); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	target, err := canonicalPath(req.GetTargetPath())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ephemeral := req.GetVolumeContext()[EphemeralContextKey] == "true"
	var ephemeralSize int64
	if ephemeral {
		if c.GetBlock() != nil {
			return nil, status.Error(codes.InvalidArgument, "ephemeral volumes cannot be block volumes")
		}
		if ephemeralSize, err = ParseSize(req.GetVolumeContext()[EphemeralSizeKey], d.cfg.DefaultEphemeralVolumeSize); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if ephemeralSize, err = volumeSize(&csi.CapacityRange{RequiredBytes: ephemeralSize}, 0); err != nil {
			return nil, err
		}
	}
	stagingPath := ""
	if !d.cfg.DisableStaging && !ephemeral {
		if req.GetStagingTargetPath() == "" {
			return nil, status.Error(codes.InvalidArgument, "staging target path is missing")
		}
		if stagingPath, err = canonicalPath(req.GetStagingTargetPath()); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}

	unlock := d.locks.lock(id)
	defer unlock()
	v := d.getVolume(id)
	if ephemeral {
		if v, err = d.ensureEphemeralVolume(v, id, ephemeralSize); err != nil {
			return nil, err
		}
	} else if v == nil || v.Ephemeral {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}

	block := c.GetBlock() != nil
	pub := publication{
		Block:        block,
		ReadOnly:     req.GetReadonly() || isReadOnlyMode(c),
		SingleWriter: c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
	}
	if p, ok := v.Publications[target]; ok {
		if p.Block != pub.Block || p.ReadOnly != pub.ReadOnly {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is published at %s with another capability", id, target)
		}
		if ok, _ := mountedFrom(target, v.LoopDevice); ok {
			return &csi.NodePublishVolumeResponse{}, nil
		}
		d.log.Info("published volume lost its mount; publishing it again", zap.String("volume", id), zap.String("target", target))
	}
	for other, p := range v.Publications {
		if other != target && (p.SingleWriter || pub.SingleWriter) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published at %s for a single writer", id, other)
		}
	}
	flags := c.GetMount().GetMountFlags()

	if stagingPath != "" {
		st := v.Staged
		switch {
		case st == nil || st.Path != stagingPath:
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", id, stagingPath)
		case st.Block != block:
			return nil, status.Errorf(codes.InvalidArgument, "volume %s is staged with another access type", id)
		case !d.stagedInPlace(v):
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s lost its staging mount or loop device; stage it again", id)
		}
		source := stagingPath
		if block {
			source = v.LoopDevice
		}
		if err := makeTarget(target, block); err != nil {
			return nil, internalErr("create target: %v", err)
		}
		if err := bindMount(source, target, flags, pub.ReadOnly); err != nil {
			return nil, internalErr("%v", err)
		}
	} else {
		// Publish-only driver or ephemeral volume: do the staging work here.
		if _, ok := v.Attachments[d.cfg.NodeID]; d.cfg.AttachRequired && !v.Ephemeral && !ok {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not published to node %s", id, d.cfg.NodeID)
		}
		dev, undo, err := d.attach(v)
		if err != nil {
			return nil, err
		}
		if block {
			if err = makeTarget(target, true); err != nil {
				err = internalErr("create target: %v", err)
			} else if err = bindMount(dev, target, flags, pub.ReadOnly); err != nil {
				err = internalErr("%v", err)
			}
		} else {
			var fsType string
			if fsType, err = d.prepareFilesystem(dev, c.GetMount().GetFsType()); err == nil {
				err = d.mountFilesystem(dev, fsType, target, flags, pub.ReadOnly)
			}
		}
		if err != nil {
			undo()
			return nil, err
		}
	}

	if v.Publications == nil {
		v.Publications = map[string]publication{}
	}
	v.Publications[target] = pub
	if err := d.putVolume(v); err != nil {
		return nil, internalErr("%v", err)
	}
	d.log.Info("volume published", zap.String("volume", id), zap.String("target", target),
		zap.Bool("block", block), zap.Bool("readOnly", pub.ReadOnly), zap.Bool("ephemeral", v.Ephemeral))
	return &csi.NodePublishVolumeResponse{}, nil
}

// ensureEphemeralVolume returns the inline ephemeral volume id, creating it
// (and its backing file) if needed. v is what the store holds for id.
func (d *Driver) ensureEphemeralVolume(v *volume, id string, size int64) (*volume, error) {
	if v != nil {
		if !v.Ephemeral {
			return nil, status.Errorf(codes.InvalidArgument, "volume %s is not an ephemeral volume", id)
		}
		return v, nil
	}
	// Kubelet's IDs for inline volumes are long and not meant as file names.
	sum := sha256.Sum256([]byte(id))
	v = &volume{ID: id, Ephemeral: true, CapacityBytes: size, BackingFile: "eph-" + hex.EncodeToString(sum[:12]) + ".img"}
	// The file may be left from an attempt that died before saving the state.
	if err := createBackingFile(d.backingPath(v), size); err != nil && !os.IsExist(err) {
		return nil, internalErr("create backing file: %v", err)
	}
	if err := d.putVolume(v); err != nil {
		return nil, internalErr("%v", err)
	}
	d.log.Info("ephemeral volume created", zap.String("volume", id), zap.Int64("bytes", size))
	return v, nil
}

// ParseSize parses a size in bytes with an optional suffix: K, M, G, T
// (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024). "" gives def.
func ParseSize(s string, def int64) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return def, nil
	}
	units := []struct {
		suffix string
		mult   int64
	}{
		{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
		{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
	}
	mult := int64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return n * mult, nil
}

func (s *nodeServer) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target path is missing")
	}
	target, err := canonicalPath(req.GetTargetPath())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	unlock := d.locks.lock(id)
	defer unlock()
	v := d.getVolume(id)
	if v == nil {
		// An ephemeral volume is gone after its first unpublish; a retry
		// must still succeed.
		if _, err := os.Lstat(target); errors.Is(err, os.ErrNotExist) {
			return &csi.NodeUnpublishVolumeResponse{}, nil
		}
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	_, ours := v.Publications[target]
	if !ours {
		// Published, but the driver died before recording it?
		ours, _ = mountedFrom(target, v.LoopDevice)
	}
	if ours {
		if err := unmountAll(target); err != nil {
			return nil, internalErr("%v", err)
		}
		if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, internalErr("remove target: %v", err)
		}
		delete(v.Publications, target)
		d.log.Info("volume unpublished", zap.String("volume", id), zap.String("target", target))
	}
	if len(v.Publications) == 0 && (d.cfg.DisableStaging || v.Ephemeral) {
		// Publish-only driver or ephemeral volume: undo the staging work.
		if err := d.releaseLoop(v); err != nil {
			return nil, err
		}
		if v.Ephemeral {
			if err := os.Remove(d.backingPath(v)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, internalErr("remove backing file: %v", err)
			}
			if err := d.removeVolume(id); err != nil {
				return nil, internalErr("%v", err)
			}
			d.log.Info("ephemeral volume deleted", zap.String("volume", id))
			return &csi.NodeUnpublishVolumeResponse{}, nil
		}
	}
	if err := d.putVolume(v); err != nil {
		return nil, internalErr("%v", err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// --- stats / expand ---

// nodePath finds how v is present at path on this node: staged there or
// published there. ok is false if it is neither.
func nodePath(v *volume, path string) (block, ok bool) {
	if p, found := v.Publications[path]; found {
		return p.Block, true
	}
	if st := v.Staged; st != nil && st.Path == path {
		return st.Block, true
	}
	return false, false
}

func (s *nodeServer) NodeGetVolumeStats(_ context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	case req.GetVolumePath() == "":
		return nil, status.Error(codes.InvalidArgument, "volume path is missing")
	}
	v := d.getVolume(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	path, err := canonicalPath(req.GetVolumePath())
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume path %s: %v", req.GetVolumePath(), err)
	}
	block, ok := nodePath(v, path)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s is neither staged nor published at %s", id, path)
	}
	if mounted, err := mountedFrom(path, v.LoopDevice); err != nil {
		return nil, internalErr("%v", err)
	} else if !mounted && !(block && d.loopAttached(v)) {
		return nil, status.Errorf(codes.NotFound, "volume %s is not mounted at %s", id, path)
	}
	if block {
		size, err := deviceSize(v.LoopDevice)
		if err != nil {
			return nil, internalErr("%v", err)
		}
		return d.withCondition(id, &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Total: size, Unit: csi.VolumeUsage_BYTES}}}), nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, internalErr("statfs %s: %v", path, err)
	}
	bsize := st.Bsize
	return d.withCondition(id, &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{
			Unit:      csi.VolumeUsage_BYTES,
			Total:     int64(st.Blocks) * bsize,
			Available: int64(st.Bavail) * bsize,
			Used:      int64(st.Blocks-st.Bfree) * bsize,
		},
		{
			Unit:      csi.VolumeUsage_INODES,
			Total:     int64(st.Files),
			Available: int64(st.Ffree),
			Used:      int64(st.Files - st.Ffree),
		},
	}}), nil
}

// withCondition adds the volume's condition to a NodeGetVolumeStats
// response when the driver plays one built with CSI spec 1.12: as field 2,
// which the generated code of spec 1.13 only knows as unknown bytes.
func (d *Driver) withCondition(id string, resp *csi.NodeGetVolumeStatsResponse) *csi.NodeGetVolumeStatsResponse {
	if d.cfg.VolumeCondition {
		resp.ProtoReflect().SetUnknown(csiclient.AppendVolumeCondition(nil, d.volumeCondition(id)))
	}
	return resp
}

func (s *nodeServer) NodeExpandVolume(_ context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	case req.GetVolumePath() == "":
		return nil, status.Error(codes.InvalidArgument, "volume path is missing")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := s.d.checkAccessMode(c); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}

	unlock := d.locks.lock(id)
	defer unlock()
	v := d.getVolume(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	path, err := canonicalPath(req.GetVolumePath())
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume path %s: %v", req.GetVolumePath(), err)
	}
	block, ok := nodePath(v, path)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s is neither staged nor published at %s", id, path)
	}
	if !d.loopAttached(v) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s has no loop device on this node", id)
	}
	dev := v.LoopDevice
	if err := refreshLoopCapacity(dev); err != nil {
		return nil, internalErr("%v", err)
	}
	size, err := deviceSize(dev)
	if err != nil {
		return nil, internalErr("%v", err)
	}
	if required := req.GetCapacityRange().GetRequiredBytes(); required > size {
		return nil, status.Errorf(codes.OutOfRange, "volume %s has only %d bytes, %d required: expand it on the controller first", id, size, required)
	}
	if !block {
		if mounted, err := mountedFrom(path, dev); err != nil {
			return nil, internalErr("%v", err)
		} else if !mounted {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not mounted at %s", id, path)
		}
		fsType, err := detectFS(dev)
		if err != nil {
			return nil, internalErr("probe %s: %v", dev, err)
		}
		if err := growFSOnline(dev, fsType, path); err != nil {
			if errors.Is(err, errOnlineResizeRefused) {
				return nil, status.Errorf(codes.FailedPrecondition, "volume %s: %v", id, err)
			}
			return nil, internalErr("grow filesystem of volume %s: %v", id, err)
		}
	}
	d.log.Info("volume expanded on node", zap.String("volume", id), zap.Int64("bytes", size))
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
