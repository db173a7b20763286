// Package registry keeps the CSI drivers registered on this node: how to
// reach each one, and what it said about itself (node ID, capabilities,
// topology, volume limit). Drivers arrive through kubelet-style registration
// sockets (package csi/registration) or are configured statically; the
// registry probes them periodically and drops a driver that stops answering,
// so "driver X is not registered" always reflects the truth.
package registry

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"

	"github.com/volume-agent/volume-agent/csi/csiclient"
	"github.com/volume-agent/volume-agent/internal/notify"
)

// Sources of a registration.
const (
	SourceRegistration = "registration"
	SourceStatic       = "static"
)

// Driver is a registered CSI driver.
type Driver struct {
	Name     string `json:"name"`
	Endpoint string `json:"endpoint"`
	// Source says how the driver was found; RegistrationSocket is the
	// kubelet-style registration socket it came through, if any.
	Source             string   `json:"source"`
	RegistrationSocket string   `json:"registrationSocket,omitempty"`
	SupportedVersions  []string `json:"supportedVersions,omitempty"`

	VendorVersion     string            `json:"vendorVersion,omitempty"`
	NodeID            string            `json:"nodeID"`
	MaxVolumesPerNode int64             `json:"maxVolumesPerNode,omitempty"`
	Topology          map[string]string `json:"topology,omitempty"`
	NodeCapabilities  []string          `json:"nodeCapabilities"`
	StageUnstage      bool              `json:"stageUnstage"`
	Expand            bool              `json:"expand"`
	VolumeStats       bool              `json:"volumeStats"`
	VolumeCondition   bool              `json:"volumeCondition"`
	VolumeMountGroup  bool              `json:"volumeMountGroup"`
	ControllerPublish bool              `json:"controllerPublish"`
	// SingleNodeMultiWriter and ControllerSingleNodeMultiWriter: the node
	// and controller services take the single-node access modes that
	// replace SINGLE_NODE_WRITER.
	SingleNodeMultiWriter           bool `json:"singleNodeMultiWriter"`
	ControllerSingleNodeMultiWriter bool `json:"controllerSingleNodeMultiWriter"`

	RegisteredAt time.Time `json:"registeredAt"`
	LastProbe    time.Time `json:"lastProbe"`

	Client *csiclient.Client `json:"-"`
}

// Registry holds the registered drivers. It is safe for concurrent use.
type Registry struct {
	log     *zap.Logger
	changed *notify.Signal

	mu        sync.RWMutex
	drivers   map[string]*Driver
	listeners []func(name string)
	onChange  []func()
}

// New returns an empty registry.
func New(log *zap.Logger) *Registry {
	return &Registry{log: log, changed: notify.New(), drivers: map[string]*Driver{}}
}

// Changed is signalled whenever a driver registers or goes away.
func (r *Registry) Changed() <-chan struct{} { return r.changed.C() }

// OnRegistered calls fn with the driver's name every time a driver
// registers, so work waiting for it can start at once.
func (r *Registry) OnRegistered(fn func(name string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listeners = append(r.listeners, fn)
}

// OnChanged calls fn (which must not block) whenever a driver registers,
// registers again or goes away.
func (r *Registry) OnChanged(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onChange = append(r.onChange, fn)
}

// notifyChanged tells the listeners; r.mu must not be held.
func (r *Registry) notifyChanged() {
	r.changed.Notify()
	r.mu.RLock()
	fns := append([]func(){}, r.onChange...)
	r.mu.RUnlock()
	for _, fn := range fns {
		fn()
	}
}

// Registration describes a driver to register.
type Registration struct {
	Endpoint string
	// Name, if set, must be what the driver says its name is.
	Name               string
	Source             string
	RegistrationSocket string
	SupportedVersions  []string
}

// Register connects to the driver, asks it who it is and what it can do, and
// registers it under its own name. A driver already registered at another
// endpoint is replaced (a new version of a driver took over).
func (r *Registry) Register(ctx context.Context, reg Registration) (*Driver, error) {
	// Keep the connection of a driver re-registering at the same endpoint:
	// closing it would cancel its calls in flight.
	var client *csiclient.Client
	reused := false
	if old, ok := r.ByEndpoint(reg.Endpoint); ok {
		client, reused = old.Client, true
	} else {
		c, err := csiclient.New(reg.Endpoint)
		if err != nil {
			return nil, err
		}
		client = c
	}
	closeNew := func() {
		if !reused {
			client.Close()
		}
	}
	info, err := client.Discover(ctx)
	if err != nil {
		closeNew()
		return nil, err
	}
	if reg.Name != "" && info.Name != reg.Name {
		closeNew()
		return nil, fmt.Errorf("driver at %s calls itself %q, not %q", reg.Endpoint, info.Name, reg.Name)
	}
	if info.NodeID == "" {
		closeNew()
		return nil, fmt.Errorf("driver %s returned an empty node ID", info.Name)
	}
	now := time.Now()
	d := &Driver{
		Name: info.Name, Endpoint: reg.Endpoint, Source: reg.Source, RegistrationSocket: reg.RegistrationSocket,
		SupportedVersions: reg.SupportedVersions, VendorVersion: info.VendorVersion, NodeID: info.NodeID,
		MaxVolumesPerNode: info.MaxVolumes, Topology: info.Topology, NodeCapabilities: info.NodeCapabilities,
		StageUnstage: info.StageUnstage, Expand: info.Expand, VolumeStats: info.VolumeStats, VolumeCondition: info.VolumeCondition,
		VolumeMountGroup: info.VolumeMountGroup, ControllerPublish: info.ControllerPublish,
		SingleNodeMultiWriter: info.SingleNodeMultiWriter, ControllerSingleNodeMultiWriter: info.ControllerSingleNodeMultiWriter,
		RegisteredAt: now, LastProbe: now, Client: client,
	}
	r.mu.Lock()
	old := r.drivers[d.Name]
	r.drivers[d.Name] = d
	listeners := append([]func(string){}, r.listeners...)
	r.mu.Unlock()
	if old != nil && old.Client != client {
		closeLater(old.Client)
	}
	r.log.Info("CSI driver registered", zap.String("driver", d.Name), zap.String("endpoint", d.Endpoint),
		zap.String("source", d.Source), zap.String("nodeID", d.NodeID), zap.Strings("capabilities", d.NodeCapabilities))
	r.notifyChanged()
	for _, fn := range listeners {
		fn(d.Name)
	}
	return d, nil
}

// RefreshNodeInfo asks a registered driver for its node information again
// (NodeGetInfo) and records the volume limit it reports now: drivers whose
// CSIDriver sets nodeAllocatableUpdatePeriodSeconds report a limit that
// changes as the node's attach slots are taken by others. Listeners hear of
// a change.
func (r *Registry) RefreshNodeInfo(ctx context.Context, name string) error {
	d, err := r.Client(name)
	if err != nil {
		return err
	}
	resp, err := d.Client.Node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return fmt.Errorf("NodeGetInfo of driver %s: %w", name, err)
	}
	limit := resp.GetMaxVolumesPerNode()
	r.mu.Lock()
	cur, ok := r.drivers[name]
	changed := ok && cur == d && cur.MaxVolumesPerNode != limit
	if changed {
		updated := *cur
		updated.MaxVolumesPerNode = limit
		r.drivers[name] = &updated
	}
	r.mu.Unlock()
	if changed {
		r.log.Info("CSI driver's volume limit changed", zap.String("driver", name), zap.Int64("from", d.MaxVolumesPerNode), zap.Int64("to", limit))
		r.notifyChanged()
	}
	return nil
}

// Deregister removes the driver if it is still registered at endpoint (an
// old socket going away must not remove a newer registration).
func (r *Registry) Deregister(name, endpoint, why string) {
	r.mu.Lock()
	d, ok := r.drivers[name]
	if ok && (endpoint == "" || d.Endpoint == endpoint) {
		delete(r.drivers, name)
	} else {
		ok = false
	}
	r.mu.Unlock()
	if !ok {
		return
	}
	if _, still := r.ByEndpoint(d.Endpoint); !still {
		closeLater(d.Client)
	}
	r.log.Warn("CSI driver deregistered", zap.String("driver", name), zap.String("endpoint", d.Endpoint), zap.String("reason", why))
	r.notifyChanged()
}

// Get returns a registered driver.
func (r *Registry) Get(name string) (*Driver, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	d, ok := r.drivers[name]
	return d, ok
}

// ByEndpoint returns the driver registered at an endpoint.
func (r *Registry) ByEndpoint(endpoint string) (*Driver, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, d := range r.drivers {
		if d.Endpoint == endpoint {
			return d, true
		}
	}
	return nil, false
}

// List returns copies of the registered drivers, sorted by name.
func (r *Registry) List() []Driver {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Driver, 0, len(r.drivers))
	for _, d := range r.drivers {
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// NotRegisteredError says a volume's driver is not (or no longer) registered.
type NotRegisteredError struct{ Driver string }

func (e *NotRegisteredError) Error() string {
	return fmt.Sprintf("CSI driver %q is not registered on this node", e.Driver)
}

// Client returns the client of a registered driver, or a NotRegisteredError.
func (r *Registry) Client(name string) (*Driver, error) {
	d, ok := r.Get(name)
	if !ok {
		return nil, &NotRegisteredError{Driver: name}
	}
	return d, nil
}

// Run probes every registered driver each period until ctx ends. A driver
// that fails failuresAllowed probes in a row is deregistered; it comes back
// when its registration socket (or static configuration) registers it again.
func (r *Registry) Run(ctx context.Context, period time.Duration, failuresAllowed int) {
	failures := map[string]int{}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, d := range r.List() {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := d.Client.Probe(pctx)
			cancel()
			if err == nil {
				delete(failures, d.Name)
				r.mu.Lock()
				if cur, ok := r.drivers[d.Name]; ok && cur.Endpoint == d.Endpoint {
					cur.LastProbe = time.Now()
				}
				r.mu.Unlock()
				continue
			}
			failures[d.Name]++
			r.log.Warn("CSI driver probe failed", zap.String("driver", d.Name), zap.Int("failures", failures[d.Name]), zap.Error(err))
			if failures[d.Name] >= failuresAllowed {
				delete(failures, d.Name)
				r.Deregister(d.Name, d.Endpoint, "stopped answering probes: "+err.Error())
			}
		}
	}
}

// Static keeps a statically configured driver registered: it retries with
// backoff until the driver answers, and again after it is deregistered
// (checked every 10 s).
func (r *Registry) Static(ctx context.Context, name, endpoint string) {
	backoff := 500 * time.Millisecond
	for {
		wait := 10 * time.Second
		if _, ok := r.Get(name); !ok {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := r.Register(rctx, Registration{Endpoint: endpoint, Name: name, Source: SourceStatic})
			cancel()
			if err != nil {
				r.log.Warn("static CSI driver not reachable yet", zap.String("driver", name), zap.String("endpoint", endpoint),
					zap.Duration("retryIn", backoff), zap.Error(err))
				wait = backoff
				backoff = min(2*backoff, 30*time.Second)
			} else {
				backoff = 500 * time.Millisecond
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// closeLater closes a replaced or deregistered driver's connection after the
// longest a call on it may still run, so no call in flight is cancelled by
// a registration change.
func closeLater(c *csiclient.Client) {
	time.AfterFunc(3*time.Minute, func() { c.Close() })
}
