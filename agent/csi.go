package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/volume-agent/volume-agent/agent/debug"
	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/nodeinfo"
	"github.com/volume-agent/volume-agent/csi/registration"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/status/nodestatus"
	"github.com/volume-agent/volume-agent/status/volumestats"
	"github.com/volume-agent/volume-agent/volume"
)

// StaticDriver is a CSI driver configured with --csi-driver NAME=ENDPOINT.
type StaticDriver struct {
	Name, Endpoint string
}

// ParseStaticDriver parses NAME=unix:///path.sock.
func ParseStaticDriver(s string) (StaticDriver, error) {
	name, endpoint, ok := strings.Cut(s, "=")
	if !ok || name == "" || endpoint == "" {
		return StaticDriver{}, fmt.Errorf("%q is not NAME=ENDPOINT", s)
	}
	return StaticDriver{Name: name, Endpoint: endpoint}, nil
}

// csiParts are the agent's CSI pieces.
type csiParts struct {
	drivers     *registry.Registry
	watcher     *registration.Watcher
	stats       *volumestats.Collector
	statsOff    bool // --volume-stats-agg-period < 0
	plugin      *csiplugin.Plugin
	attachments *attachments
	nodeStatus  *nodestatus.Reporter
	// nodeInfo tells the cluster which drivers are on the node (CSINode,
	// Node annotations and labels); nil in standalone mode.
	nodeInfo *nodeinfo.Manager
	// node is the informer of the node's Node (cluster mode).
	node toolscache.SharedIndexInformer
}

// csiDeps are what the CSI parts take from the rest of the agent.
type csiDeps struct {
	asw *cache.ActualStateOfWorld
	dsw *cache.DesiredStateOfWorld
	// events get the drivers' volume health and node-info problems.
	events events.Recorder
	// tokens issues the tokens of CSIDrivers' tokenRequests (nil in
	// standalone mode).
	tokens csiplugin.TokenIssuer
	// sourcesReady tells whether the desired state has been read
	// completely: the node's volumesInUse is reported only from then on.
	sourcesReady func() bool
}

// newCSI builds the driver registry and the CSI plugin, and the volume
// stats of claims (CSI and local volumes; the drivers' volume health puts
// events on pods). In cluster mode it also watches VolumeAttachments, keeps
// the node's volumesInUse current when a controller attaches, and tells the
// cluster which drivers are on the node.
func newCSI(cfg Config, host plugins.Host, m *mode, deps csiDeps) *csiParts {
	log := cfg.Log
	p := &csiParts{drivers: registry.New(log.Named("csi"))}
	var notifyNodeInfo func()
	p.watcher = registration.New(registration.Options{
		Dir: cfg.PluginRegistryDir, Registry: p.drivers, Log: log.Named("csi-registration"),
		OnChange: func() {
			if notifyNodeInfo != nil {
				notifyNodeInfo()
			}
		},
	})
	p.stats = volumestats.New(volumestats.Options{Registry: p.drivers, ASW: deps.asw.Snapshot, DSW: deps.dsw.Snapshot, Events: deps.events,
		Period: cfg.VolumeStatsAggPeriod, Log: log.Named("volume-stats")})
	p.statsOff = cfg.VolumeStatsAggPeriod < 0
	pcfg := csiplugin.Config{
		Host: host, Drivers: p.drivers, CSIDriver: m.source.CSIDriver, AttachMode: csiplugin.AttachLocal,
		Tokens: deps.tokens, NoTokensReason: noTokensReason,
	}
	if c := m.cluster; c != nil {
		pcfg.AttachMode = cfg.AttachMode
		if pcfg.AttachMode == "" {
			pcfg.AttachMode = csiplugin.AttachController
		}
		pcfg.Secrets = c.objectsClient().SecretData
		// The source watches the attachment of each CSI volume the
		// node's pods use, by name.
		p.attachments = &attachments{client: c.client, get: c.source.VolumeAttachment, changed: &c.attachmentChanged}
		p.node = c.source.NodeInformer()
		if pcfg.AttachMode == csiplugin.AttachController {
			p.nodeStatus = nodestatus.New(cfg.NodeName, c.client, c.source.Node, deps.sourcesReady, log.Named("nodestatus"))
			p.attachments.inUse = p.nodeStatus.ReportedInUse
		}
		pcfg.Attachments = p.attachments
		if cfg.CSINodeInfo || cfg.AttachDetachAnnotation {
			p.nodeInfo = p.newNodeInfo(cfg, c, pcfg.AttachMode, deps.events)
			notifyNodeInfo = p.nodeInfo.Notify
			pcfg.OutOfAttachSlots = p.nodeInfo.RefreshAllocatable
		}
	}
	p.plugin = csiplugin.New(pcfg)
	return p
}

// newNodeInfo builds the manager of the node's CSINode and CSI annotations
// and labels. It writes with the node's identity when the agent has it
// (the Node authorizer and NodeRestriction then allow exactly the node's own
// Node and CSINode, as for the kubelet), else with the agent's own, which
// deploy/'s admission policies hold to the same.
func (p *csiParts) newNodeInfo(cfg Config, c *clusterParts, attachMode string, rec events.Recorder) *nodeinfo.Manager {
	ad := nodeinfo.AttachDetachLeave
	if cfg.AttachDetachAnnotation {
		ad = nodeinfo.AttachDetachSelf
		if attachMode == csiplugin.AttachController {
			ad = nodeinfo.AttachDetachController
		}
	}
	static := make([]string, 0, len(cfg.CSIDrivers))
	for _, d := range cfg.CSIDrivers {
		static = append(static, d.Name)
	}
	api := c.client
	if c.nodeClient != nil {
		api = c.nodeClient
	}
	m := nodeinfo.New(nodeinfo.Options{
		NodeName: cfg.NodeName, API: api, Node: c.source.Node,
		AttachDetach: ad, AttachDetachOnly: !cfg.CSINodeInfo,
		Sources: nodeinfo.Sources{
			Registered: p.registeredDrivers,
			Present: func() []string {
				names := append(slices.Clone(static), p.watcher.Drivers()...)
				for _, d := range p.drivers.List() {
					names = append(names, d.Name)
				}
				return names
			},
		},
		Event: func(eventType, reason, message string) {
			rec.Event(events.Object{Kind: "Node", Name: cfg.NodeName}, eventType, reason, message)
		},
		AllocatablePeriod: func(driver string) time.Duration {
			d, err := c.source.CSIDriver(driver)
			if err != nil || d.Spec.NodeAllocatableUpdatePeriodSeconds == nil {
				return 0
			}
			return time.Duration(*d.Spec.NodeAllocatableUpdatePeriodSeconds) * time.Second
		},
		RefreshAllocatable: p.drivers.RefreshNodeInfo,
		Log:                cfg.Log.Named("nodeinfo"),
	})
	p.drivers.OnChanged(m.Notify)
	_, _ = c.source.NodeInformer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { m.Notify() },
		UpdateFunc: func(_, _ any) { m.Notify() },
	})
	return m
}

// registeredDrivers are the registered drivers as the node-info manager
// needs them.
func (p *csiParts) registeredDrivers() []nodeinfo.Driver {
	list := p.drivers.List()
	out := make([]nodeinfo.Driver, 0, len(list))
	for _, d := range list {
		out = append(out, nodeinfo.Driver{Name: d.Name, NodeID: d.NodeID, Topology: d.Topology, MaxVolumes: d.MaxVolumesPerNode})
	}
	return out
}

// retryOnChange wires the wake-ups: a driver registering, an attachment
// changing or the node's reported volumes changing retries the CSI
// operations waiting for them at once instead of after their backoff.
func (p *csiParts) retryOnChange(exec *operations.Executor, wake *notify.Signal) {
	retry := func(match func(op *operations.Operation) bool) {
		exec.ResetBackoffWhere(match)
		wake.Notify()
	}
	p.drivers.OnRegistered(func(string) {
		retry(func(op *operations.Operation) bool { return op.Plugin == csiplugin.Name })
	})
	if p.attachments != nil {
		waitingForAttach := func(op *operations.Operation) bool { return op.Name == operations.OpVerifyAttached }
		onChange := func(string) { retry(waitingForAttach) }
		p.attachments.changed.Store(&onChange)
	}
	if p.nodeStatus != nil {
		// An attachment is relied on only once the node reports the volume
		// in use: when the Node says so, the wait is over.
		_, _ = p.node.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*v1.Node)
			n, ok2 := cur.(*v1.Node)
			if ok1 && ok2 && !slices.Equal(o.Status.VolumesInUse, n.Status.VolumesInUse) {
				retry(func(op *operations.Operation) bool { return op.Name == operations.OpVerifyAttached })
			}
		}})
	}
}

// registerStatic gives static drivers a first chance before any volume
// needs them, so a healthy start does not report "driver not registered"
// once.
func (p *csiParts) registerStatic(ctx context.Context, static []StaticDriver) {
	for _, d := range static {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, _ = p.drivers.Register(rctx, registry.Registration{Endpoint: d.Endpoint, Name: d.Name, Source: registry.SourceStatic})
		cancel()
	}
}

// start adds the CSI loops: probing drivers, watching registration sockets,
// volume statistics, keeping static drivers registered, node status.
func (p *csiParts) start(l *loops, static []StaticDriver, probePeriod time.Duration) {
	l.run("CSI driver prober", untilDone(func(ctx context.Context) { p.drivers.Run(ctx, probePeriod, 3) }))
	l.run("CSI registration watcher", p.watcher.Run)
	if !p.statsOff {
		l.run("volume statistics", untilDone(p.stats.Run))
	}
	for _, d := range static {
		l.run("static CSI driver "+d.Name, untilDone(func(ctx context.Context) { p.drivers.Static(ctx, d.Name, d.Endpoint) }))
	}
	if p.nodeStatus != nil {
		l.run("node status", untilDone(p.nodeStatus.Run))
	}
	if p.nodeInfo != nil {
		l.run("CSI node information", untilDone(p.nodeInfo.Run))
	}
}

// attachments is the VolumeAttachment API over the source's per-object
// watches and the REST client.
type attachments struct {
	client *kubeclient.Client
	get    func(name string) (*storagev1.VolumeAttachment, bool)
	// changed is called when a watched attachment changes.
	changed *atomic.Pointer[func(name string)]
	inUse   func(volume.UniqueName) bool
}

// Get implements csiplugin.Attachments: false until the attachment exists
// and its watch has read it.
func (a *attachments) Get(name string) (*storagev1.VolumeAttachment, bool) { return a.get(name) }

func (a *attachments) Create(ctx context.Context, va *storagev1.VolumeAttachment) error {
	return a.client.CreateVolumeAttachment(ctx, va)
}

func (a *attachments) PatchStatus(ctx context.Context, name string, s storagev1.VolumeAttachmentStatus) error {
	return a.client.PatchVolumeAttachmentStatus(ctx, name, s)
}

func (a *attachments) Delete(ctx context.Context, name string) error {
	return a.client.DeleteVolumeAttachment(ctx, name)
}

func (a *attachments) ReportedInUse(name volume.UniqueName) bool {
	return a.inUse == nil || a.inUse(name)
}

func (p *csiParts) driversDocument() debug.DriversDocument {
	doc := debug.DriversDocument{Drivers: []debug.DriverStatus{}, RegistrationSockets: p.watcher.Sockets()}
	for _, d := range p.drivers.List() {
		doc.Drivers = append(doc.Drivers, debug.DriverStatus{Driver: d, Policy: p.plugin.DriverPolicy(d.Name)})
	}
	if doc.RegistrationSockets == nil {
		doc.RegistrationSockets = []registration.SocketStatus{}
	}
	if p.nodeInfo != nil {
		doc.NodeInfo = p.nodeInfo.Statuses()
	}
	return doc
}

func logDriverConfig(log *zap.Logger, static []StaticDriver, dir string) {
	for _, d := range static {
		log.Info("static CSI driver configured", zap.String("driver", d.Name), zap.String("endpoint", d.Endpoint))
	}
	log.Info("watching for CSI driver registrations", zap.String("dir", dir))
}
