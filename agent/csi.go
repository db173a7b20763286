package agent

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/registration"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/csi/volumestats"
	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/status/nodestatus"
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
	plugin      *csiplugin.Plugin
	attachments *attachments
	nodeStatus  *nodestatus.Reporter
}

// newCSI builds the driver registry and the CSI plugin. In cluster mode it
// also watches VolumeAttachments and, when a controller attaches, keeps the
// node's volumesInUse current; tokens (nil in standalone mode) issues the
// tokens of CSIDrivers' tokenRequests.
func newCSI(cfg Config, host plugins.Host, m *mode, asw *cache.ActualStateOfWorld, tokens csiplugin.TokenIssuer) *csiParts {
	log := cfg.Log
	p := &csiParts{drivers: registry.New(log.Named("csi"))}
	p.watcher = registration.New(registration.Options{Dir: cfg.PluginRegistryDir, Registry: p.drivers, Log: log.Named("csi-registration")})
	p.stats = volumestats.New(volumestats.Options{Registry: p.drivers, ASW: asw.Snapshot, Log: log.Named("csi-stats")})
	pcfg := csiplugin.Config{
		Host: host, Drivers: p.drivers, CSIDriver: m.source.CSIDriver, AttachMode: csiplugin.AttachLocal,
		Tokens: tokens, NoTokensReason: noTokensReason,
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
		if pcfg.AttachMode == csiplugin.AttachController {
			p.nodeStatus = nodestatus.New(cfg.NodeName, c.client, c.source.Node, log.Named("nodestatus"))
			p.attachments.inUse = p.nodeStatus.ReportedInUse
		}
		pcfg.Attachments = p.attachments
	}
	p.plugin = csiplugin.New(pcfg)
	return p
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
	l.run("CSI volume statistics", untilDone(p.stats.Run))
	for _, d := range static {
		l.run("static CSI driver "+d.Name, untilDone(func(ctx context.Context) { p.drivers.Static(ctx, d.Name, d.Endpoint) }))
	}
	if p.nodeStatus != nil {
		l.run("node status", untilDone(p.nodeStatus.Run))
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

// driversCollector reports the registered drivers.
type driversCollector struct{ drivers *registry.Registry }

var driversDesc = prometheus.NewDesc(namespace+"_csi_drivers",
	"Registered CSI drivers (1 per driver), by driver, source (registration, static) and whether it stages volumes.",
	[]string{"driver", "source", "stage_unstage"}, nil)

func (c driversCollector) Describe(ch chan<- *prometheus.Desc) { ch <- driversDesc }

func (c driversCollector) Collect(ch chan<- prometheus.Metric) {
	for _, d := range c.drivers.List() {
		ch <- prometheus.MustNewConstMetric(driversDesc, prometheus.GaugeValue, 1, d.Name, d.Source, fmt.Sprint(d.StageUnstage))
	}
}

// DriversDocument is GET /debug/drivers.
type DriversDocument struct {
	Drivers             []DriverStatus              `json:"drivers"`
	RegistrationSockets []registration.SocketStatus `json:"registrationSockets"`
}

// DriverStatus is a registered driver and what its CSIDriver object (or
// its absence) makes the agent do with its volumes.
type DriverStatus struct {
	registry.Driver
	Policy csiplugin.DriverPolicy `json:"policy"`
}

func (p *csiParts) driversDocument() DriversDocument {
	doc := DriversDocument{Drivers: []DriverStatus{}, RegistrationSockets: p.watcher.Sockets()}
	for _, d := range p.drivers.List() {
		doc.Drivers = append(doc.Drivers, DriverStatus{Driver: d, Policy: p.plugin.DriverPolicy(d.Name)})
	}
	if doc.RegistrationSockets == nil {
		doc.RegistrationSockets = []registration.SocketStatus{}
	}
	return doc
}

func logDriverConfig(log *zap.Logger, static []StaticDriver, dir string) {
	for _, d := range static {
		log.Info("static CSI driver configured", zap.String("driver", d.Name), zap.String("endpoint", d.Endpoint))
	}
	log.Info("watching for CSI driver registrations", zap.String("dir", dir))
}
