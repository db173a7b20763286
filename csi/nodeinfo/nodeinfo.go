// Package nodeinfo tells the cluster which CSI drivers are on this node, as
// the kubelet's CSI node-info manager does on a node that has a kubelet:
// for every registered driver an entry in the node's CSINode (node ID,
// topology keys, allocatable volume count), its key in the Node's
// csi.volume.kubernetes.io/nodeid annotation and its topology as Node
// labels; and the Node's controller-managed-attach-detach annotation, which
// the attach/detach controller needs before it attaches anything to the
// node. Without them external-provisioner cannot place a volume on the
// node, external-attacher cannot attach one, and the scheduler cannot count
// volume limits.
//
// The package owns those fields and nothing else of the Node and CSINode.
// What to write is a pure function of the Node, the CSINode and the drivers
// (plan.go); the Manager reads, plans and writes in one loop, retrying
// conflicts and failures, and never removes what it cannot know is gone: a
// driver's entry goes only when its registration socket (or its static
// configuration) was seen to go while the agent ran, so a restart of the
// agent, or a driver that stops answering probes for a while, changes
// nothing the cluster sees.
package nodeinfo

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/notify"
)

// API is what the manager needs of the API server: the Node's metadata and
// the node's CSINode. *kubeclient.Client implements it.
type API interface {
	GetNode(ctx context.Context, name string) (*v1.Node, error)
	PatchNode(ctx context.Context, name string, patch []byte) (*v1.Node, error)
	GetCSINode(ctx context.Context, name string) (*storagev1.CSINode, error)
	CreateCSINode(ctx context.Context, n *storagev1.CSINode) (*storagev1.CSINode, error)
	UpdateCSINode(ctx context.Context, n *storagev1.CSINode) (*storagev1.CSINode, error)
	DeleteCSINode(ctx context.Context, name string, uid types.UID) error
}

// Sources tell the manager which drivers are on the node.
type Sources struct {
	// Registered are the drivers registered now, with what NodeGetInfo
	// said.
	Registered func() []Driver
	// Present are the names of the drivers that have a source on the node
	// (a registration socket that named them, a static configuration, a
	// registration), registered or not: a driver that is present but not
	// registered (it stopped answering probes) keeps its entry as it is.
	Present func() []string
}

// Options configure a Manager.
type Options struct {
	NodeName string
	API      API
	Sources  Sources
	// Node returns the Node as an informer last saw it (nil: the manager
	// reads it from the API server whenever it syncs). A stale copy costs
	// one conflict and a fresh read, never a lost change.
	Node func() (*v1.Node, bool)
	// AttachDetach is what to do with the controller-managed-attach-detach
	// annotation.
	AttachDetach AttachDetach
	// AttachDetachOnly leaves the CSINode and the drivers' annotation and
	// labels alone (a kubelet writes them): only AttachDetach is done.
	AttachDetachOnly bool
	// Event reports a problem on the Node object (nil: log only).
	Event func(eventType, reason, message string)
	Log   *zap.Logger
	// AllocatablePeriod returns how often a driver's allocatable volume
	// count is asked for again: its CSIDriver's
	// nodeAllocatableUpdatePeriodSeconds (0: never). RefreshAllocatable
	// asks (NodeGetInfo); a changed count reaches the manager as a changed
	// registration. Both nil: counts are written once, at registration.
	AllocatablePeriod  func(driver string) time.Duration
	RefreshAllocatable func(ctx context.Context, driver string) error
	// MinBackoff and MaxBackoff bound the wait before a failed sync is
	// tried again; Resync is the longest time between syncs (a Node or
	// CSINode changed by someone else is put right then, or at the next
	// change the manager is told of).
	MinBackoff, MaxBackoff, Resync time.Duration
}

// Event reasons.
const (
	ReasonDriverNotInstalled = "CSIDriverNodeInfoFailed"
)

// State of a driver's node information.
type State string

const (
	// StateInstalled: the driver's entry, annotation key and labels are
	// written as it last registered.
	StateInstalled State = "installed"
	// StatePending: not written yet (first sync under way or retrying).
	StatePending State = "pending"
	// StateFailed: the driver cannot be installed (LastError says why,
	// e.g. a topology label collision); retried on every change.
	StateFailed State = "failed"
)

// DriverStatus is a driver's node information, for /debug/drivers.
type DriverStatus struct {
	Driver    string    `json:"driver"`
	State     State     `json:"state"`
	NodeID    string    `json:"nodeID,omitempty"`
	LastError string    `json:"lastError,omitempty"`
	Since     time.Time `json:"since"`
}

// Manager keeps the Node and CSINode in step with the drivers. Create it
// with New, tell it about changes with Notify, run it with Run.
type Manager struct {
	opts Options
	log  *zap.Logger
	wake *notify.Signal

	// Owned by Run. node is the Node as last read or written; csiNode is
	// the CSINode as last read or written (nobody else writes it; it is
	// read again after a conflict and on every full sync).
	node    *v1.Node
	csiNode *storagev1.CSINode
	// seen are the drivers that were present at some point of this run:
	// the only ones whose entries may be removed.
	seen map[string]bool

	// nextRefresh is when each driver's allocatable count is asked for
	// again (owned by Run).
	nextRefresh map[string]time.Time

	mu       sync.Mutex
	statuses map[string]*DriverStatus
	// refreshNow are drivers whose count is to be asked for at once (an
	// attachment failed for want of attach slots).
	refreshNow map[string]bool
	synced     chan struct{} // closed after the first successful sync
	syncs      int
}

// New returns a manager; nothing is written until Run.
func New(opts Options) *Manager {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 500 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(time.Minute, opts.MinBackoff)
	}
	if opts.Resync <= 0 {
		opts.Resync = 5 * time.Minute
	}
	m := &Manager{
		opts: opts, log: opts.Log, wake: notify.New(),
		seen: map[string]bool{}, statuses: map[string]*DriverStatus{}, synced: make(chan struct{}),
		nextRefresh: map[string]time.Time{}, refreshNow: map[string]bool{},
	}
	return m
}

// Notify asks for a sync: a driver registered or went away, the Node
// changed.
func (m *Manager) Notify() { m.wake.Notify() }

// RefreshAllocatable asks for the driver's allocatable volume count at once,
// if its CSIDriver asks for periodic updates at all (as the kubelet does
// when an attachment fails with ResourceExhausted).
func (m *Manager) RefreshAllocatable(driver string) {
	m.mu.Lock()
	m.refreshNow[driver] = true
	m.mu.Unlock()
	m.wake.Notify()
}

// Synced is closed once the manager has written the node's information for
// the first time.
func (m *Manager) Synced() <-chan struct{} { return m.synced }

// Statuses returns the drivers' states, sorted by driver.
func (m *Manager) Statuses() []DriverStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]DriverStatus, 0, len(m.statuses))
	for _, s := range m.statuses {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Driver < out[j].Driver })
	return out
}

// Run syncs at start, on every Notify, after failures (with backoff) and
// every Resync, and refreshes allocatable counts when due, until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	backoff := time.Duration(0)
	full := true
	for {
		if full {
			m.csiNode = nil
		}
		m.refreshDue(ctx)
		err := m.Sync(ctx)
		wait := m.opts.Resync
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, m.opts.MinBackoff), m.opts.MaxBackoff)
			wait = backoff
			m.log.Warn("updating the node's CSI driver information failed; will retry", zap.Duration("retryIn", wait), zap.Error(err))
		} else {
			backoff = 0
		}
		if next, ok := m.nextRefreshAt(); ok {
			wait = min(wait, max(time.Until(next), 0))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-m.wake.C():
			t.Stop()
			full = false
		case <-t.C:
			full = err == nil
		}
	}
}

// refreshDue asks the drivers whose allocatable count is due (or asked for)
// for it again, and schedules the next time for every registered driver
// with a period.
func (m *Manager) refreshDue(ctx context.Context) {
	if m.opts.AllocatablePeriod == nil || m.opts.RefreshAllocatable == nil || m.opts.AttachDetachOnly {
		return
	}
	m.mu.Lock()
	now := m.refreshNow
	m.refreshNow = map[string]bool{}
	m.mu.Unlock()
	registered := map[string]bool{}
	for _, d := range m.opts.Sources.Registered() {
		registered[d.Name] = true
		period := m.opts.AllocatablePeriod(d.Name)
		if period <= 0 {
			delete(m.nextRefresh, d.Name)
			continue
		}
		next, scheduled := m.nextRefresh[d.Name]
		switch {
		case !scheduled:
			// Counted at registration: the first refresh is one period on.
			m.nextRefresh[d.Name] = time.Now().Add(period)
		case now[d.Name] || !time.Now().Before(next):
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := m.opts.RefreshAllocatable(rctx, d.Name); err != nil {
				m.log.Warn("cannot refresh a CSI driver's allocatable volume count", zap.String("driver", d.Name), zap.Error(err))
			}
			cancel()
			m.nextRefresh[d.Name] = time.Now().Add(period)
		}
	}
	for name := range m.nextRefresh {
		if !registered[name] {
			delete(m.nextRefresh, name)
		}
	}
}

func (m *Manager) nextRefreshAt() (time.Time, bool) {
	var next time.Time
	for _, t := range m.nextRefresh {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	return next, !next.IsZero()
}

// conflictRetries is how often a sync whose write lost a race reads afresh
// and tries again at once.
const conflictRetries = 5

// Sync brings the Node and the CSINode in step with the drivers once. A
// driver that cannot be installed (bad node ID, label collision) does not
// make Sync fail: it is reported in its status and retried on the next
// change. Errors are the API server's.
func (m *Manager) Sync(ctx context.Context) error {
	var present []string
	var registered []Driver
	if !m.opts.AttachDetachOnly {
		present, registered = m.opts.Sources.Present(), m.opts.Sources.Registered()
	}
	d := m.desired(present, registered)

	var installed []Driver
	var failed []DriverError
	var err error
	m.node = nil
	// The first sync reads the Node from the API server, as the kubelet
	// does at start: the informer may not have it yet, and a stale copy
	// would cost a conflict.
	if m.opts.Node != nil && m.syncCount() > 0 {
		if n, ok := m.opts.Node(); ok {
			m.node = n
		}
	}
	for try := 0; ; try++ {
		installed, failed, err = m.syncNode(ctx, d)
		if err == nil || !apierrors.IsConflict(err) || try == conflictRetries {
			break
		}
		m.node = nil // read afresh
	}
	if err != nil {
		m.setStatuses(d, nil, err)
		return fmt.Errorf("node %s: %w", m.opts.NodeName, err)
	}
	if m.opts.AttachDetachOnly {
		m.markSynced()
		return nil
	}
	// The CSINode is written after the Node, as the kubelet does: the
	// provisioner and attacher act on the CSINode entry and expect the
	// Node's labels and annotation to be there by then. A driver is
	// removed from the CSINode before its annotation key goes, which the
	// Node sync above did; the order only matters for readers that look at
	// both, and none of them needs the annotation once the entry is gone.
	for try := 0; ; try++ {
		err = m.syncCSINode(ctx, installed, d.Remove)
		if err == nil || !apierrors.IsConflict(err) || try == conflictRetries {
			break
		}
		m.csiNode = nil
	}
	if err != nil {
		m.setStatuses(d, failed, err)
		return fmt.Errorf("CSINode %s: %w", m.opts.NodeName, err)
	}
	for _, name := range d.Remove {
		delete(m.seen, name)
	}
	m.setStatuses(d, failed, nil)
	m.markSynced()
	return nil
}

func (m *Manager) syncCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncs
}

func (m *Manager) markSynced() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.syncs++
	if m.syncs == 1 {
		close(m.synced)
	}
}

// desired works out what to install and what to remove from what is
// present and registered now, and what was present before in this run.
func (m *Manager) desired(present []string, registered []Driver) Desired {
	d := Desired{AttachDetach: m.opts.AttachDetach}
	isPresent := map[string]bool{}
	for _, name := range present {
		isPresent[name] = true
		m.seen[name] = true
	}
	for _, drv := range registered {
		isPresent[drv.Name] = true
		m.seen[drv.Name] = true
		d.Install = append(d.Install, drv)
	}
	for name := range m.seen {
		if !isPresent[name] {
			d.Remove = append(d.Remove, name)
		}
	}
	sort.Strings(d.Remove)
	return d
}

// syncNode patches the Node's metadata and returns the drivers it could
// install.
func (m *Manager) syncNode(ctx context.Context, d Desired) ([]Driver, []DriverError, error) {
	if m.node == nil {
		n, err := m.opts.API.GetNode(ctx, m.opts.NodeName)
		if err != nil {
			return nil, nil, fmt.Errorf("reading the Node: %w", err)
		}
		m.node = n
	}
	change, failed, err := PlanNode(m.node, d)
	if err != nil {
		return nil, nil, err
	}
	if !change.Empty() {
		patch, err := change.MergePatch(m.node.ResourceVersion)
		if err != nil {
			return nil, nil, err
		}
		n, err := m.opts.API.PatchNode(ctx, m.opts.NodeName, patch)
		if err != nil {
			return nil, nil, fmt.Errorf("updating the Node's CSI annotation and topology labels: %w", err)
		}
		m.node = n
		m.log.Info("node's CSI driver information updated", zap.Any("setAnnotations", change.SetAnnotations),
			zap.Strings("deleteAnnotations", change.DeleteAnnotations), zap.Any("setLabels", change.SetLabels))
	}
	bad := map[string]bool{}
	for _, f := range failed {
		bad[f.Driver] = true
	}
	var ok []Driver
	for _, drv := range d.Install {
		if !bad[drv.Name] {
			ok = append(ok, drv)
		}
	}
	return ok, failed, nil
}

// syncCSINode creates the CSINode if there is none (or replaces one left by
// an earlier Node of the same name) and writes the drivers' entries.
func (m *Manager) syncCSINode(ctx context.Context, install []Driver, remove []string) error {
	if m.csiNode == nil {
		n, err := m.opts.API.GetCSINode(ctx, m.opts.NodeName)
		switch {
		case apierrors.IsNotFound(err):
			n = nil
		case err != nil:
			return fmt.Errorf("reading: %w", err)
		}
		m.csiNode = n
	}
	if m.csiNode != nil && !OwnedBy(m.csiNode, m.node.Name, m.node.UID) {
		// The kubelet does the same: entries of a Node that was deleted
		// and made again describe another machine, or another life of it.
		m.log.Info("CSINode belongs to an earlier Node of this name; replacing it", zap.String("csiNode", m.csiNode.Name),
			zap.String("nodeUID", string(m.node.UID)))
		if err := m.opts.API.DeleteCSINode(ctx, m.csiNode.Name, m.csiNode.UID); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting the CSINode of an earlier Node: %w", err)
		}
		m.csiNode = nil
	}
	if m.csiNode == nil {
		n, err := m.opts.API.CreateCSINode(ctx, NewCSINode(m.node))
		if apierrors.IsAlreadyExists(err) {
			return apierrors.NewConflict(storagev1.Resource("csinodes"), m.opts.NodeName, err)
		}
		if err != nil {
			return fmt.Errorf("creating: %w", err)
		}
		m.csiNode = n
		m.log.Info("CSINode created", zap.String("csiNode", n.Name))
	}
	drivers, changed := PlanCSINode(m.csiNode.Spec.Drivers, install, remove)
	if !changed {
		return nil
	}
	updated := m.csiNode.DeepCopy()
	updated.Spec.Drivers = drivers
	n, err := m.opts.API.UpdateCSINode(ctx, updated)
	if err != nil {
		return fmt.Errorf("updating the drivers' entries: %w", err)
	}
	m.csiNode = n
	names := make([]string, 0, len(drivers))
	for _, e := range drivers {
		names = append(names, e.Name)
	}
	m.log.Info("CSINode updated", zap.Strings("drivers", names), zap.Strings("removed", remove))
	return nil
}

// setStatuses records each driver's state after a sync; err is the sync's
// own failure, which leaves drivers not yet installed pending.
func (m *Manager) setStatuses(d Desired, failed []DriverError, err error) {
	now := time.Now()
	why := map[string]string{}
	for _, f := range failed {
		why[f.Driver] = f.Err.Error()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	keep := map[string]bool{}
	for _, drv := range d.Install {
		keep[drv.Name] = true
		s := m.statuses[drv.Name]
		if s == nil {
			s = &DriverStatus{Driver: drv.Name, State: StatePending, Since: now}
			m.statuses[drv.Name] = s
		}
		next, msg := StateInstalled, ""
		switch {
		case why[drv.Name] != "":
			next, msg = StateFailed, why[drv.Name]
		case err != nil:
			if s.State == StateInstalled && s.NodeID == drv.NodeID {
				next = StateInstalled // written earlier; only a refresh failed
			} else {
				next, msg = StatePending, err.Error()
			}
		}
		if next == StateFailed && (s.State != StateFailed || s.LastError != msg) {
			m.log.Error("cannot tell the cluster that a CSI driver is on this node", zap.String("driver", drv.Name), zap.String("reason", msg))
			if m.opts.Event != nil {
				m.opts.Event("Warning", ReasonDriverNotInstalled, fmt.Sprintf("CSI driver %s is registered but cannot be installed on node %s: %s", drv.Name, m.opts.NodeName, msg))
			}
		}
		if next != s.State {
			s.Since = now
		}
		s.State, s.LastError = next, msg
		if next == StateInstalled {
			s.NodeID = drv.NodeID
		}
	}
	for name := range m.statuses {
		if !keep[name] && !slices.Contains(d.Remove, name) && m.seen[name] {
			keep[name] = true // present, not registered: its entry stays as it was
		}
	}
	for name := range m.statuses {
		if !keep[name] {
			delete(m.statuses, name)
		}
	}
}
