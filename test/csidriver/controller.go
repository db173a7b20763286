package csidriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const (
	// sizeAlign is what volume sizes are rounded up to: loop devices work
	// in 512-byte sectors.
	sizeAlign int64 = 512
	// minVolumeSize keeps volumes big enough for a filesystem.
	minVolumeSize int64 = 1 << 20
	// listTokenPrefix marks ListVolumes tokens; the rest is the last volume
	// ID returned. Keying on the ID instead of an index keeps pagination
	// stable when volumes come and go between pages.
	listTokenPrefix = "after:"
)

type controllerServer struct {
	csi.UnimplementedControllerServer
	d *Driver
}

func (s *controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	types := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	}
	if !s.d.cfg.DisableSingleNodeMultiWriter {
		types = append(types, csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
	}
	if s.d.cfg.AttachRequired {
		types = append(types,
			csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
			csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
			csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES)
	}
	caps := make([]*csi.ControllerServiceCapability, 0, len(types))
	for _, t := range types {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// checkCapability validates one volume capability. Every access mode is
// accepted: with a single node, "multi node" modes are simply never put to
// the test.
func checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return errors.New("volume capability is missing")
	}
	mode := c.GetAccessMode().GetMode()
	if _, known := csi.VolumeCapability_AccessMode_Mode_name[int32(mode)]; !known || mode == csi.VolumeCapability_AccessMode_UNKNOWN {
		return fmt.Errorf("unsupported access mode %v", mode)
	}
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
	case *csi.VolumeCapability_Mount:
		if fs := t.Mount.GetFsType(); fs != "" && !supportedFSTypes[fs] {
			return fmt.Errorf("unsupported filesystem type %q", fs)
		}
	default:
		return errors.New("volume capability has no access type")
	}
	return nil
}

// checkAccessMode is checkCapability for the node and publish calls, which
// a CO makes with the access modes the driver says it knows: without
// SINGLE_NODE_MULTI_WRITER, the single-node modes that replace
// SINGLE_NODE_WRITER are refused, as a driver that predates them would.
func (d *Driver) checkAccessMode(c *csi.VolumeCapability) error {
	if err := checkCapability(c); err != nil {
		return err
	}
	switch m := c.GetAccessMode().GetMode(); m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		if d.cfg.DisableSingleNodeMultiWriter {
			return fmt.Errorf("access mode %v needs the SINGLE_NODE_MULTI_WRITER capability, which this driver does not have", m)
		}
	}
	return nil
}

func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return errors.New("volume capabilities are missing")
	}
	for _, c := range caps {
		if err := checkCapability(c); err != nil {
			return err
		}
	}
	return nil
}

func isReadOnlyMode(c *csi.VolumeCapability) bool {
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return true
	}
	return false
}

// volumeSize picks the size of a volume for a capacity range: the required
// bytes (def if none), rounded up to whole sectors, at least minVolumeSize,
// within the limit.
func volumeSize(cr *csi.CapacityRange, def int64) (int64, error) {
	required, limit := cr.GetRequiredBytes(), cr.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, status.Error(codes.InvalidArgument, "capacity range must not be negative")
	}
	if limit > 0 && required > limit {
		return 0, status.Errorf(codes.InvalidArgument, "required bytes %d exceed limit bytes %d", required, limit)
	}
	size := required
	if size == 0 {
		size = def
		if limit > 0 && size > limit {
			size = limit
		}
	}
	size = max(size, minVolumeSize)
	size = (size + sizeAlign - 1) / sizeAlign * sizeAlign
	if limit > 0 && size > limit {
		return 0, status.Errorf(codes.OutOfRange, "no volume size of at least %d bytes in whole sectors fits the limit of %d bytes", minVolumeSize, limit)
	}
	return size, nil
}

func (d *Driver) topology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{TopologyKey(d.cfg.Name): d.cfg.NodeID}}
}

// topologyFits reports whether this node satisfies the requisite topologies.
func (d *Driver) topologyFits(req *csi.TopologyRequirement) bool {
	if !d.cfg.Topology || len(req.GetRequisite()) == 0 {
		return true
	}
	mine := d.topology().Segments
	for _, t := range req.GetRequisite() {
		fits := true
		for k, v := range t.GetSegments() {
			if mine[k] != v {
				fits = false
				break
			}
		}
		if fits {
			return true
		}
	}
	return false
}

// availableCapacity is what GetCapacity reports and CreateVolume enforces.
func (d *Driver) availableCapacity() (int64, error) {
	if d.cfg.Capacity > 0 {
		d.mu.Lock()
		defer d.mu.Unlock()
		used := int64(0)
		for _, v := range d.state.Volumes {
			used += v.CapacityBytes
		}
		return max(d.cfg.Capacity-used, 0), nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d.volumesDir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

func (d *Driver) csiVolume(v *volume) *csi.Volume {
	cv := &csi.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes}
	if d.cfg.Topology {
		cv.AccessibleTopology = []*csi.Topology{d.topology()}
	}
	return cv
}

// controllerVolume returns the volume for a controller call: ephemeral
// volumes exist only on the node side and are invisible here.
func (d *Driver) controllerVolume(id string) *volume {
	v := d.getVolume(id)
	if v == nil || v.Ephemeral {
		return nil
	}
	return v
}

func (s *controllerServer) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	d := s.d
	name := req.GetName()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name is missing")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume content sources (snapshots, clones) are not supported")
	}
	size, err := volumeSize(req.GetCapacityRange(), d.cfg.DefaultVolumeSize)
	if err != nil {
		return nil, err
	}
	if !d.topologyFits(req.GetAccessibilityRequirements()) {
		return nil, status.Errorf(codes.ResourceExhausted, "this driver only serves node %q", d.cfg.NodeID)
	}

	unlock := d.locks.lock("name/" + name)
	defer unlock()

	if v := d.volumeByName(name); v != nil {
		required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
		if v.CapacityBytes < required || (limit > 0 && v.CapacityBytes > limit) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with %d bytes", name, v.CapacityBytes)
		}
		return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
	}
	if d.cfg.Capacity > 0 {
		avail, err := d.availableCapacity()
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if size > avail {
			return nil, status.Errorf(codes.ResourceExhausted, "%d bytes requested, %d available", size, avail)
		}
	}

	v := &volume{ID: newVolumeID(), Name: name, CapacityBytes: size, Parameters: req.GetParameters()}
	v.BackingFile = v.ID + ".img"
	if err := createBackingFile(d.backingPath(v), size); err != nil {
		return nil, status.Errorf(codes.Internal, "create backing file: %v", err)
	}
	if err := d.putVolume(v); err != nil {
		os.Remove(d.backingPath(v))
		return nil, status.Error(codes.Internal, err.Error())
	}
	d.log.Info("volume created", zap.String("volume", v.ID), zap.String("name", name), zap.Int64("bytes", size))
	return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
}

// createBackingFile creates a sparse file of size bytes.
func createBackingFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

func (d *Driver) volumeByName(name string) *volume {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, v := range d.state.Volumes {
		if v.Name == name && !v.Ephemeral {
			return v.clone()
		}
	}
	return nil
}

func (s *controllerServer) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	}
	unlock := d.locks.lock(id)
	defer unlock()
	v := d.controllerVolume(id)
	if v == nil {
		return &csi.DeleteVolumeResponse{}, nil
	}
	if v.Staged != nil || len(v.Publications) > 0 || d.loopAttached(v) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still staged or published on node %s", id, d.cfg.NodeID)
	}
	if len(v.Attachments) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published to %v", id, d.volumeInfo(v).AttachedNodes)
	}
	if err := os.Remove(d.backingPath(v)); err != nil && !os.IsNotExist(err) {
		return nil, status.Errorf(codes.Internal, "remove backing file: %v", err)
	}
	if err := d.removeVolume(id); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	d.log.Info("volume deleted", zap.String("volume", id))
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *controllerServer) ControllerPublishVolume(_ context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	d := s.d
	if !d.cfg.AttachRequired {
		return nil, status.Error(codes.Unimplemented, "ControllerPublishVolume is disabled (no attach required)")
	}
	id, node := req.GetVolumeId(), req.GetNodeId()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	case node == "":
		return nil, status.Error(codes.InvalidArgument, "node ID is missing")
	}
	if err := d.checkAccessMode(req.GetVolumeCapability()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	unlock := d.locks.lock(id)
	defer unlock()
	v := d.controllerVolume(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	if node != d.cfg.NodeID {
		return nil, status.Errorf(codes.NotFound, "node %q not found (this driver serves %q)", node, d.cfg.NodeID)
	}
	pubCtx := map[string]string{PublishContextAttachedTo: node}
	if a, ok := v.Attachments[node]; ok {
		if a.ReadOnly != req.GetReadonly() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is already published to %s with readonly=%v", id, node, a.ReadOnly)
		}
		return &csi.ControllerPublishVolumeResponse{PublishContext: pubCtx}, nil
	}
	if limit := d.cfg.MaxVolumesPerNode; limit > 0 && d.attachedCount(node) >= limit {
		return nil, status.Errorf(codes.ResourceExhausted, "node %s already has %d volumes attached", node, limit)
	}
	if v.Attachments == nil {
		v.Attachments = map[string]attachment{}
	}
	v.Attachments[node] = attachment{ReadOnly: req.GetReadonly()}
	if err := d.putVolume(v); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	d.log.Info("volume attached", zap.String("volume", id), zap.String("node", node))
	return &csi.ControllerPublishVolumeResponse{PublishContext: pubCtx}, nil
}

func (d *Driver) attachedCount(node string) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := int64(0)
	for _, v := range d.state.Volumes {
		if _, ok := v.Attachments[node]; ok {
			n++
		}
	}
	return n
}

func (s *controllerServer) ControllerUnpublishVolume(_ context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	d := s.d
	if !d.cfg.AttachRequired {
		return nil, status.Error(codes.Unimplemented, "ControllerUnpublishVolume is disabled (no attach required)")
	}
	id, node := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	}
	unlock := d.locks.lock(id)
	defer unlock()
	// The spec asks for OK when the volume or node is unknown: it is then
	// unpublished as far as anyone can tell.
	v := d.controllerVolume(id)
	if v == nil || len(v.Attachments) == 0 {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if node == "" {
		v.Attachments = nil
	} else if _, ok := v.Attachments[node]; ok {
		delete(v.Attachments, node)
	} else {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if err := d.putVolume(v); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	d.log.Info("volume detached", zap.String("volume", id), zap.String("node", node))
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

func (s *controllerServer) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities are missing")
	}
	if d.controllerVolume(id) == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

func (s *controllerServer) ListVolumes(_ context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	d := s.d
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	after := ""
	if tok := req.GetStartingToken(); tok != "" {
		var ok bool
		if after, ok = strings.CutPrefix(tok, listTokenPrefix); !ok || after == "" {
			return nil, status.Errorf(codes.Aborted, "invalid starting token %q", tok)
		}
	}

	d.mu.Lock()
	var vols []*volume
	for _, v := range d.state.Volumes {
		if !v.Ephemeral && v.ID > after {
			vols = append(vols, v.clone())
		}
	}
	d.mu.Unlock()
	sort.Slice(vols, func(i, j int) bool { return vols[i].ID < vols[j].ID })

	resp := &csi.ListVolumesResponse{}
	if n := int(req.GetMaxEntries()); n > 0 && len(vols) > n {
		vols = vols[:n]
		resp.NextToken = listTokenPrefix + vols[n-1].ID
	}
	for _, v := range vols {
		entry := &csi.ListVolumesResponse_Entry{Volume: d.csiVolume(v)}
		if d.cfg.AttachRequired {
			entry.Status = &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: d.volumeInfo(v).AttachedNodes}
		}
		resp.Entries = append(resp.Entries, entry)
	}
	return resp, nil
}

func (s *controllerServer) GetCapacity(_ context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	d := s.d
	if len(req.GetVolumeCapabilities()) > 0 {
		if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
			return &csi.GetCapacityResponse{}, nil // such volumes cannot be created at all
		}
	}
	if !d.topologyFits(&csi.TopologyRequirement{Requisite: []*csi.Topology{req.GetAccessibleTopology()}}) {
		return &csi.GetCapacityResponse{}, nil
	}
	avail, err := d.availableCapacity()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	resp := &csi.GetCapacityResponse{AvailableCapacity: avail, MinimumVolumeSize: wrapperspb.Int64(minVolumeSize)}
	if d.cfg.Capacity > 0 {
		resp.MaximumVolumeSize = wrapperspb.Int64(d.cfg.Capacity)
	}
	return resp, nil
}

func (s *controllerServer) ControllerExpandVolume(_ context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity range is missing")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkCapability(c); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	unlock := d.locks.lock(id)
	defer unlock()
	v := d.controllerVolume(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	size, err := volumeSize(req.GetCapacityRange(), v.CapacityBytes)
	if err != nil {
		return nil, err
	}
	// The node has to make the loop device re-read the file's size even for
	// block volumes, so node expansion is always required.
	resp := &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: true}
	if size <= v.CapacityBytes {
		return resp, nil // never shrink; already big enough
	}
	if d.cfg.Capacity > 0 {
		avail, err := d.availableCapacity()
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if size-v.CapacityBytes > avail {
			return nil, status.Errorf(codes.ResourceExhausted, "%d more bytes requested, %d available", size-v.CapacityBytes, avail)
		}
	}
	if err := os.Truncate(d.backingPath(v), size); err != nil {
		return nil, status.Errorf(codes.Internal, "grow backing file: %v", err)
	}
	v.CapacityBytes = size
	if err := d.putVolume(v); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	d.log.Info("volume expanded", zap.String("volume", id), zap.Int64("bytes", size))
	resp.CapacityBytes = size
	return resp, nil
}
