package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/volume-agent/volume-agent/csi/registration"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/csi/volumestats"
	"github.com/volume-agent/volume-agent/internal/kubeclient"
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
	log         *zap.Logger
}

// setupCSI builds the driver registry and the CSI plugin. In cluster mode it
// also watches VolumeAttachments and, when a controller attaches, keeps the
// node's volumesInUse current.
func (a *Agent) setupCSI(host plugins.Host) *csiParts {
	p := &csiParts{drivers: registry.New(a.log.Named("csi"))}
	p.log = a.log
	p.watcher = registration.New(registration.Options{Dir: a.cfg.PluginRegistryDir, Registry: p.drivers, Log: a.log.Named("csi-registration")})
	p.stats = volumestats.New(volumestats.Options{Registry: p.drivers, ASW: a.asw.Snapshot, Log: a.log.Named("csi-stats")})
	cfg := csiplugin.Config{
		Host: host, Drivers: p.drivers, CSIDriver: a.source.CSIDriver, AttachMode: csiplugin.AttachLocal,
	}
	if a.cluster != nil {
		client := a.cluster.client
		cfg.AttachMode = a.cfg.AttachMode
		if cfg.AttachMode == "" {
			cfg.AttachMode = csiplugin.AttachController
		}
		cfg.Secrets = client.SecretData
		inf := cache.NewSharedIndexInformer(kubeclient.ListWatch(client.Storage, "volumeattachments", "", nil),
			&storagev1.VolumeAttachment{}, 0, cache.Indexers{})
		a.cluster.source.AddInformer(inf)
		p.attachments = &attachments{client: client, informer: inf}
		if cfg.AttachMode == csiplugin.AttachController {
			p.nodeStatus = nodestatus.New(a.cfg.NodeName, client, a.cluster.source.Node, a.log.Named("nodestatus"))
			p.attachments.inUse = p.nodeStatus.ReportedInUse
		}
		cfg.Attachments = p.attachments
	}
	p.plugin = csiplugin.New(cfg)
	return p
}

// start wires the wake-ups: a driver registering, an attachment changing or
// the node's reported volumes changing retries the CSI operations waiting for
// them at once instead of after their backoff.
func (p *csiParts) start(exec *operations.Executor, trigger func()) {
	retry := func(match func(op *operations.Operation) bool) {
		exec.ResetBackoffWhere(match)
		trigger()
	}
	p.drivers.OnRegistered(func(string) {
		retry(func(op *operations.Operation) bool { return op.Plugin == csiplugin.Name })
	})
	if p.attachments != nil {
		waitingForAttach := func(op *operations.Operation) bool { return op.Name == operations.OpVerifyAttached }
		_, _ = p.attachments.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { retry(waitingForAttach) },
			UpdateFunc: func(any, any) { retry(waitingForAttach) },
			DeleteFunc: func(any) { retry(waitingForAttach) },
		})
	}
}

// run starts the background loops: probing drivers, static drivers, node
// status.
func (p *csiParts) run(ctx context.Context, static []StaticDriver, probePeriod time.Duration) {
	// Give static drivers a first chance before any volume needs them, so
	// a healthy start does not report "driver not registered" once.
	for _, d := range static {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, _ = p.drivers.Register(rctx, registry.Registration{Endpoint: d.Endpoint, Name: d.Name, Source: registry.SourceStatic})
		cancel()
	}
	go p.drivers.Run(ctx, probePeriod, 3)
	go func() {
		if err := p.watcher.Run(ctx); err != nil && ctx.Err() == nil {
			p.log.Error("CSI registration watcher stopped", zap.Error(err))
		}
	}()
	go p.stats.Run(ctx)
	for _, d := range static {
		go p.drivers.Static(ctx, d.Name, d.Endpoint)
	}
	if p.nodeStatus != nil {
		go p.nodeStatus.Run(ctx)
	}
}

// attachments is the VolumeAttachment API over the informer cache and the
// REST client.
type attachments struct {
	client   *kubeclient.Client
	informer cache.SharedIndexInformer
	inUse    func(volume.UniqueName) bool
}

func (a *attachments) Get(name string) (*storagev1.VolumeAttachment, bool) {
	o, ok, err := a.informer.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, false
	}
	return o.(*storagev1.VolumeAttachment), true
}

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
	Drivers             []registry.Driver           `json:"drivers"`
	RegistrationSockets []registration.SocketStatus `json:"registrationSockets"`
}

func logDriverConfig(log *zap.Logger, static []StaticDriver, dir string) {
	for _, d := range static {
		log.Info("static CSI driver configured", zap.String("driver", d.Name), zap.String("endpoint", d.Endpoint))
	}
	log.Info("watching for CSI driver registrations", zap.String("dir", dir))
}
