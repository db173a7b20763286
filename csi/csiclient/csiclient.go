// Package csiclient is the agent's gRPC client for CSI drivers: one
// connection per driver endpoint, the identity, node and controller calls the
// agent makes, and the CSI rule for what an error means. An error whose gRPC
// code says the call may still be in progress or may have taken effect
// (DeadlineExceeded, Unavailable, Canceled, Aborted, ResourceExhausted) — or
// that is not a gRPC status at all — leaves the operation uncertain; any other
// code is final.
package csiclient

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/volume-agent/volume-agent/volume"
)

// Client talks to one CSI driver.
type Client struct {
	Endpoint string
	conn     *grpc.ClientConn

	Identity   csi.IdentityClient
	Node       csi.NodeClient
	Controller csi.ControllerClient
}

// SocketPath turns an endpoint ("unix:///path", "unix:/path" or "/path")
// into the socket's path.
func SocketPath(endpoint string) (string, error) {
	p := endpoint
	switch {
	case strings.HasPrefix(p, "unix://"):
		p = strings.TrimPrefix(p, "unix://")
	case strings.HasPrefix(p, "unix:"):
		p = strings.TrimPrefix(p, "unix:")
	}
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("CSI endpoint %q is not a unix socket path", endpoint)
	}
	return p, nil
}

// New connects to a driver. The connection is made lazily and re-made by
// gRPC when the driver restarts, so a Client outlives driver restarts.
func New(endpoint string) (*Client, error) {
	path, err := SocketPath(endpoint)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("connecting to CSI driver at %s: %w", endpoint, err)
	}
	return &Client{
		Endpoint: endpoint, conn: conn,
		Identity: csi.NewIdentityClient(conn), Node: csi.NewNodeClient(conn), Controller: csi.NewControllerClient(conn),
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// IsFinal reports whether a CSI error means the call definitely did not take
// effect (and will not later).
func IsFinal(err error) bool {
	if err == nil {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return false
	}
	return true
}

// Classify wraps a non-final error so the operation is recorded as
// uncertain: retried while wanted, undone when not.
func Classify(err error) error {
	if err == nil || IsFinal(err) {
		return err
	}
	return volume.Uncertain(err)
}

// Code returns the gRPC code of err (codes.Unknown for non-gRPC errors).
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	return status.Code(err)
}

// Info is what a driver says about itself and this node.
type Info struct {
	Name          string
	VendorVersion string
	NodeID        string
	MaxVolumes    int64
	Topology      map[string]string
	// Node capabilities. VolumeCondition is VOLUME_CONDITION (value 4, removed in spec 1.13).
	StageUnstage     bool
	Expand           bool
	VolumeStats      bool
	VolumeCondition  bool
	VolumeMountGroup bool
	// SingleNodeMultiWriter: the node service knows the
	// SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER access modes,
	// which then take the place of SINGLE_NODE_WRITER.
	SingleNodeMultiWriter bool
	NodeCapabilities      []string
	// ControllerPublish: the driver serves ControllerPublish/Unpublish (the
	// agent uses it only in self-attach mode).
	ControllerPublish bool
	ControllerExpand  bool
	// ControllerSingleNodeMultiWriter: SINGLE_NODE_MULTI_WRITER of the
	// controller service (what ControllerPublishVolume's access mode
	// follows).
	ControllerSingleNodeMultiWriter bool
}

// Discover asks the driver who it is, whether it is ready, and what it can
// do on this node: GetPluginInfo, Probe, NodeGetInfo, NodeGetCapabilities,
// and the controller capabilities when it has a controller service.
func (c *Client) Discover(ctx context.Context) (*Info, error) {
	pi, err := c.Identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetPluginInfo: %w", err)
	}
	info := &Info{Name: pi.GetName(), VendorVersion: pi.GetVendorVersion()}
	if err := c.Probe(ctx); err != nil {
		return nil, err
	}
	ni, err := c.Node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("NodeGetInfo: %w", err)
	}
	info.NodeID, info.MaxVolumes = ni.GetNodeId(), ni.GetMaxVolumesPerNode()
	if t := ni.GetAccessibleTopology(); t != nil {
		info.Topology = t.GetSegments()
	}
	nc, err := c.Node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		return nil, fmt.Errorf("NodeGetCapabilities: %w", err)
	}
	for _, cap := range nc.GetCapabilities() {
		t := cap.GetRpc().GetType()
		info.NodeCapabilities = append(info.NodeCapabilities, NodeCapabilityName(t))
		switch t {
		case csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME:
			info.StageUnstage = true
		case csi.NodeServiceCapability_RPC_EXPAND_VOLUME:
			info.Expand = true
		case csi.NodeServiceCapability_RPC_GET_VOLUME_STATS:
			info.VolumeStats = true
		case NodeVolumeCondition:
			info.VolumeCondition = true
		case csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP:
			info.VolumeMountGroup = true
		case csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER:
			info.SingleNodeMultiWriter = true
		}
	}
	pc, err := c.Identity.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetPluginCapabilities: %w", err)
	}
	controller := false
	for _, cap := range pc.GetCapabilities() {
		if cap.GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE {
			controller = true
		}
	}
	if controller {
		cc, err := c.Controller.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
		if err != nil {
			return nil, fmt.Errorf("ControllerGetCapabilities: %w", err)
		}
		for _, cap := range cc.GetCapabilities() {
			switch cap.GetRpc().GetType() {
			case csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME:
				info.ControllerPublish = true
			case csi.ControllerServiceCapability_RPC_EXPAND_VOLUME:
				info.ControllerExpand = true
			case csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER:
				info.ControllerSingleNodeMultiWriter = true
			}
		}
	}
	return info, nil
}

// Probe asks whether the driver is ready. A driver that answers "not ready"
// is treated like one that does not answer.
func (c *Client) Probe(ctx context.Context) error {
	resp, err := c.Identity.Probe(ctx, &csi.ProbeRequest{})
	if err != nil {
		return fmt.Errorf("Probe: %w", err)
	}
	if r := resp.GetReady(); r != nil && !r.GetValue() {
		return errors.New("Probe: driver says it is not ready")
	}
	return nil
}
