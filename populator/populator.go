// Package populator fills the desired state of world from a Source: for every
// running pod bound to the node, every volume a container uses, resolved
// (claim, volume, plugin) into a cache.PodVolume; for every pod that is gone
// or has terminated, nothing.
//
// Two rules protect running pods. A volume that resolved once stays desired
// with its last spec while later lookups fail (the claim cannot be read
// during an API outage; a PVC manifest was removed under a running pod): the
// error is reported, the mount stays. And a pod whose volumes never resolved
// is marked so the reconciler does not unmount what it may have mounted
// before a restart — in particular while its claim or volume is not read
// yet (source.ErrNotRead: cluster mode reads them as pods need them), which
// is a wait, not an error: no event, no metric.
package populator

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

// Observer learns about populator passes (metrics).
type Observer interface {
	Populated(took time.Duration, pods int)
	PodVolumeError(err *volume.PodVolumeError)
}

// Options configures a Populator.
type Options struct {
	Source  source.Source
	DSW     *cache.DesiredStateOfWorld
	Plugins *plugins.Registry
	// Node returns this node's name and labels (labels may change in
	// cluster mode).
	Node func() Node
	// IsTerminated reports whether a pod's volumes should be torn down even
	// though the pod object is still there. Default: phase Succeeded or
	// Failed.
	IsTerminated func(*v1.Pod) bool
	// ResyncPeriod re-resolves every pod even without a change signal
	// (default 1m): host state plugins look at (paths) can change unseen.
	ResyncPeriod time.Duration
	// Recheck signals that an answer a plugin's Attributes waited for
	// (plugins.ErrNotReady) came: the pods waiting for it are resolved
	// again. Nil: never.
	Recheck <-chan struct{}
	// EnvObjects reads the ConfigMaps and Secrets that the environments
	// of containers with a subPathExpr name (the API volumes' scoped
	// watches, or the manifest directory). Nil: none can be read.
	EnvObjects EnvObjects
	// NodeAllocatable is what a resourceFieldRef to an unset limit reads
	// (nil: not known).
	NodeAllocatable func() v1.ResourceList
	// EnvChanged signals that an object EnvObjects serves changed or was
	// read: the pods whose subPathExpr waits for one are resolved again.
	EnvChanged <-chan struct{}
	Events     events.Recorder
	Observer   Observer
	// Pods, when set, is told about every pod whose volumes the DSW is
	// given (before they are desired, and again after any change to the
	// pod) and about pods that left (refresh.Refresher).
	Pods  PodObserver
	Clock clock.WithTicker
	Log   *zap.Logger
}

// EnvObjects reads objects as they are now, never waiting: NotFound when
// the object does not exist, a volume.IsWaiting error while it is not read
// yet.
type EnvObjects interface {
	ConfigMap(namespace, name string) (*v1.ConfigMap, error)
	Secret(namespace, name string) (*v1.Secret, error)
}

// PodObserver follows the pods the populator resolves.
type PodObserver interface {
	// PodUpdated: the pod is new or changed; used are the volumes its
	// containers use.
	PodUpdated(pod *v1.Pod, used []*v1.Volume)
	PodRemoved(uid types.UID)
}

// Populator fills the DSW from a Source.
type Populator struct {
	opts  Options
	ready atomic.Bool

	mu    sync.Mutex
	state map[types.UID]*podState
	// byKey and waiting follow state: the UID of the pod the populator
	// knows under each key, and the keys of the pods whose resolution
	// waits for a plugin (podState.pending), which every pass resolves
	// again.
	byKey   map[source.PodKey]types.UID
	waiting map[source.PodKey]struct{}
	// lastNode is the node as of the last pass: a label change can change
	// node-affinity decisions for every pod.
	lastNode Node
}

// podState is what the populator remembers of a pod between passes.
type podState struct {
	pod  *v1.Pod
	deps []dep
	// resolved keeps the last good resolution of each of the pod's volumes
	// (OuterName is the pod's volume name): the sticky rule. It is the
	// slice handed to the DSW, sub-paths included (cleared when reused),
	// not a map: it is made for every pod synced and read only when a
	// volume fails to resolve.
	resolved []cache.PodVolume
	errs     []*volume.PodVolumeError
	notices  []notice
	// pending: a plugin could not answer yet (plugins.ErrNotReady), or a
	// subPathExpr could not be expanded yet; the pod is resolved again on
	// the next pass whatever changed.
	pending bool
	// pinned are the pod's subPathExpr expansions, kept from the first
	// that succeeded (containerMounts).
	pinned map[mountKey]string
}

// New returns a Populator.
func New(opts Options) *Populator {
	if opts.IsTerminated == nil {
		opts.IsTerminated = PodTerminated
	}
	if opts.ResyncPeriod <= 0 {
		opts.ResyncPeriod = time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	p := &Populator{opts: opts, state: map[types.UID]*podState{}, byKey: map[source.PodKey]types.UID{}, waiting: map[source.PodKey]struct{}{}}
	return p
}

// PodTerminated: a pod in phase Succeeded or Failed runs no containers and
// never will again.
func PodTerminated(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}

// Ready reports whether the DSW reflects a complete read of the source.
func (p *Populator) Ready() bool { return p.ready.Load() }

// Run populates on every source change and periodically until ctx ends.
func (p *Populator) Run(ctx context.Context) {
	resync := p.opts.Clock.NewTicker(p.opts.ResyncPeriod)
	defer resync.Stop()
	p.Sync(false)
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.opts.Source.Changed():
			p.Sync(false)
		case <-resync.C():
			p.Sync(true)
		case <-p.opts.EnvChanged:
			// Only the pods waiting for an expansion can be concerned.
			p.Sync(false)
		case <-p.opts.Recheck:
			// An answer about the host came or changed: resolve again
			// whoever it may concern (no filesystem is touched).
			p.Sync(true)
		}
	}
}

// Sync brings the DSW in line with the source. With force, every pod is
// resolved again even if nothing it depends on changed.
func (p *Populator) Sync(force bool) {
	start := p.opts.Clock.Now()
	if !p.opts.Source.HasSynced() {
		// A partial view (some informers listed, others not yet) would
		// produce errors for objects that are merely not read yet.
		return
	}
	// The changes first, then the pods: a change made in between is seen
	// now and looked at again next pass.
	all, changed := p.opts.Source.TakePodChanges()
	node := p.opts.Node()

	p.mu.Lock()
	defer p.mu.Unlock()
	if node.Name != p.lastNode.Name || !maps.Equal(node.Labels, p.lastNode.Labels) {
		force = true
		p.lastNode = node
	}
	if force || all || !p.ready.Load() {
		p.syncAll(node, force)
	} else {
		p.syncChanged(changed, node)
	}
	p.ready.Store(true)
	if p.opts.Observer != nil {
		p.opts.Observer.Populated(p.opts.Clock.Since(start), len(p.state))
	}
}

// syncAll looks at every pod of the source. With force, every pod is
// resolved again even if nothing it depends on changed.
func (p *Populator) syncAll(node Node, force bool) {
	pods := p.opts.Source.Pods()
	seen := make(map[types.UID]bool, len(pods))
	p.opts.DSW.Batch(func() {
		for _, pod := range pods {
			if p.opts.IsTerminated(pod) {
				continue
			}
			seen[pod.UID] = true
			p.syncPod(pod, node, force)
		}
		for _, uid := range p.opts.DSW.PodUIDs() {
			if !seen[uid] {
				p.opts.DSW.DeletePod(uid)
			}
		}
	})
	for uid, st := range p.state {
		if !seen[uid] {
			p.forget(uid, st)
		}
	}
}

// syncChanged looks at the pods under the keys that changed, and at those
// waiting for a plugin. A pod under a changed key that is gone, has
// terminated or is another pod now (a new UID) leaves the DSW, unless its
// UID is still the source's under another key (its manifest moved to
// another file): a pod is removed before any is added back.
func (p *Populator) syncChanged(changed map[source.PodKey]struct{}, node Node) {
	for key := range p.waiting {
		if changed == nil {
			changed = map[source.PodKey]struct{}{}
		}
		changed[key] = struct{}{}
	}
	if len(changed) == 0 {
		return
	}
	current := make(map[source.PodKey]*v1.Pod, len(changed))
	uids := make(map[types.UID]bool, len(changed))
	for key := range changed {
		if pod, ok := p.opts.Source.Pod(key.Namespace, key.Name); ok && !p.opts.IsTerminated(pod) {
			current[key] = pod
			uids[pod.UID] = true
		}
	}
	p.opts.DSW.Batch(func() {
		for key := range changed {
			uid, known := p.byKey[key]
			if !known || (current[key] != nil && current[key].UID == uid) {
				continue
			}
			if uids[uid] {
				continue // moved to another key, looked at there
			}
			p.opts.DSW.DeletePod(uid)
			p.forget(uid, p.state[uid])
			delete(p.byKey, key)
			delete(p.waiting, key)
		}
		for _, pod := range current {
			p.syncPod(pod, node, false)
		}
	})
}

// forget drops what the populator knew of a pod that left.
func (p *Populator) forget(uid types.UID, st *podState) {
	delete(p.state, uid)
	if st != nil {
		key := source.KeyOf(st.pod)
		if p.byKey[key] == uid {
			delete(p.byKey, key)
			delete(p.waiting, key)
		}
	}
	if p.opts.Pods != nil {
		p.opts.Pods.PodRemoved(uid)
	}
}

func (p *Populator) syncPod(pod *v1.Pod, node Node, force bool) {
	st := p.state[pod.UID]
	if st != nil && !force && !st.pending && st.pod == pod && p.depsUnchanged(st.deps) {
		return
	}
	info := podInfo(pod)
	r := &resolver{store: p.opts.Source, plugins: p.opts.Plugins, node: node}
	var prev []cache.PodVolume
	var pinned map[mountKey]string
	if st != nil {
		prev, pinned = st.resolved, st.pinned
	}
	// Sized for every volume of the pod: one allocation each.
	next := &podState{pod: pod}

	vols := make([]cache.PodVolume, 0, len(pod.Spec.Volumes))
	var unresolved []string
	var mounts podContainers
	if err := volume.ValidatePathElement(string(pod.UID)); err != nil {
		next.errs = append(next.errs, &volume.PodVolumeError{Pod: info.PodRef, Reason: ReasonPodUIDUnusable, Err: err})
	} else {
		usage := volumeUsage(pod)
		if p.opts.Pods != nil && (st == nil || st.pod != pod) {
			p.opts.Pods.PodUpdated(pod, usedVolumes(pod, usage))
		}
		mounts = containerMounts(pod, p.envInputs(pod, node), pinned)
		next.pinned = mounts.expanded
		next.pending = mounts.unpinned
		for i := range pod.Spec.Volumes {
			vol := &pod.Spec.Volumes[i]
			use, used := usage[vol.Name]
			if !used {
				continue
			}
			pv, verr := r.resolve(pod, info, vol, use)
			if verr == nil {
				vols = append(vols, withSubPaths(pv, mounts.subPaths[vol.Name]))
				continue
			}
			if errors.Is(verr, plugins.ErrNotReady) {
				// Not the pod's problem, and the answer comes without
				// it doing anything: not reported, tried again then.
				next.pending = true
			} else {
				next.errs = append(next.errs, verr)
			}
			if i := slices.IndexFunc(prev, func(pv cache.PodVolume) bool { return pv.OuterName == vol.Name }); i >= 0 {
				old := prev[i]
				old.SubPaths = nil // the pod's mounts now say which
				vols = append(vols, withSubPaths(old, mounts.subPaths[vol.Name]))
			} else {
				unresolved = append(unresolved, vol.Name)
			}
		}
	}
	next.resolved = vols
	next.errs = append(next.errs, mounts.errs...)
	next.deps = r.deps
	sort.Strings(unresolved)
	next.notices = r.notices
	p.reportNewErrors(st, next.errs)
	p.reportNewNotices(st, next.notices)
	p.state[pod.UID] = next
	key := source.KeyOf(pod)
	if st != nil {
		if old := source.KeyOf(st.pod); old != key && p.byKey[old] == pod.UID {
			delete(p.byKey, old)
			delete(p.waiting, old)
		}
	}
	p.byKey[key] = pod.UID
	if next.pending {
		p.waiting[key] = struct{}{}
	} else {
		delete(p.waiting, key)
	}
	p.opts.DSW.SetPodWithContainers(info, vols, next.errs, unresolved, mounts.containers)
}

// envInputs is what the environments of the pod's containers are built
// from besides the pod.
func (p *Populator) envInputs(pod *v1.Pod, node Node) envInputs {
	in := envInputs{NodeName: node.Name, HostIPs: node.HostIPs, Allocatable: p.opts.NodeAllocatable}
	if !expandsSubPaths(pod) {
		// Nothing builds an environment: the lookups, two allocations
		// per pod, are never called.
		return in
	}
	objs := p.opts.EnvObjects
	in.ConfigMap = func(name string) (*v1.ConfigMap, error) {
		if objs == nil {
			return nil, apierrors.NewNotFound(v1.Resource("configmaps"), name)
		}
		return objs.ConfigMap(pod.Namespace, name)
	}
	in.Secret = func(name string) (*v1.Secret, error) {
		if objs == nil {
			return nil, apierrors.NewNotFound(v1.Resource("secrets"), name)
		}
		return objs.Secret(pod.Namespace, name)
	}
	return in
}

// expandsSubPaths reports whether a container of the pod mounts a
// subPathExpr, the only use of an environment here.
func expandsSubPaths(pod *v1.Pod) bool {
	some := func(mounts []v1.VolumeMount) bool {
		return slices.ContainsFunc(mounts, func(m v1.VolumeMount) bool { return m.SubPathExpr != "" })
	}
	for i := range pod.Spec.InitContainers {
		if some(pod.Spec.InitContainers[i].VolumeMounts) {
			return true
		}
	}
	for i := range pod.Spec.Containers {
		if some(pod.Spec.Containers[i].VolumeMounts) {
			return true
		}
	}
	for i := range pod.Spec.EphemeralContainers {
		if some(pod.Spec.EphemeralContainers[i].VolumeMounts) {
			return true
		}
	}
	return false
}

// withSubPaths gives a resolved volume the sub-paths the pod's containers
// mount of it: read-only when the mount or the volume is, or when
// containers get the volume read-only anyway.
func withSubPaths(pv cache.PodVolume, subPaths []volume.SubPath) cache.PodVolume {
	if len(subPaths) == 0 || pv.Attributes.NoHostPath {
		// The runtime resolves a sub-path of a volume it mounts itself
		// (the CRI mount's image_sub_path): nothing to prepare here.
		return pv
	}
	pv.SubPaths = make([]volume.SubPath, len(subPaths))
	for i, s := range subPaths {
		s.ReadOnly = s.ReadOnly || pv.Spec.ReadOnly || pv.Attributes.ReadOnlyForContainers
		pv.SubPaths[i] = s
	}
	return pv
}

// depsUnchanged reports whether every object a pod's resolution read is
// still the same object.
func (p *Populator) depsUnchanged(deps []dep) bool {
	for _, d := range deps {
		var cur any
		switch d.kind {
		case "pvc":
			if o, err := p.opts.Source.PVC(d.namespace, d.name); err == nil {
				cur = o
			} else {
				cur = (*v1.PersistentVolumeClaim)(nil)
			}
		case "pv":
			if o, err := p.opts.Source.PV(d.name); err == nil {
				cur = o
			} else {
				cur = (*v1.PersistentVolume)(nil)
			}
		case "csidriver":
			o, _ := p.opts.Source.CSIDriver(d.name)
			cur = o
		}
		if cur != d.obj {
			return false
		}
	}
	return true
}

func usedVolumes(pod *v1.Pod, usage map[string]usage) []*v1.Volume {
	var out []*v1.Volume
	for i := range pod.Spec.Volumes {
		if _, ok := usage[pod.Spec.Volumes[i].Name]; ok {
			out = append(out, &pod.Spec.Volumes[i])
		}
	}
	return out
}

// reportNewErrors emits an event and a metric for errors that are new since
// the pod's last pass: a stuck volume is reported once, not on every pass.
func (p *Populator) reportNewErrors(old *podState, errs []*volume.PodVolumeError) {
	known := map[string]bool{}
	if old != nil {
		for _, e := range old.errs {
			known[e.Error()] = true
		}
	}
	for _, e := range errs {
		if known[e.Error()] {
			continue
		}
		if explain.ErrorStatus(e) == explain.Waiting {
			// Waiting for a watch that started a moment ago: not a
			// problem of the pod (the source logs one that lasts).
			if p.opts.Log != nil {
				p.opts.Log.Debug("pod volume waits for its claim or volume to be read", zap.String("pod", e.Pod.String()), zap.String("volume", e.Volume), zap.Error(e.Err))
			}
			continue
		}
		if p.opts.Log != nil {
			p.opts.Log.Warn("pod volume cannot be used", zap.String("pod", e.Pod.String()), zap.String("volume", e.Volume),
				zap.String("reason", e.Reason), zap.Error(e.Err))
		}
		if p.opts.Events != nil {
			p.opts.Events.Event(events.PodObject(e.Pod), events.Warning, events.FailedMount, e.Error())
		}
		if p.opts.Observer != nil {
			p.opts.Observer.PodVolumeError(e)
		}
	}
}

// reportNewNotices emits each notice once (per pod), on the pod and on the
// claim.
func (p *Populator) reportNewNotices(old *podState, notices []notice) {
	for _, n := range notices {
		if old != nil && slices.ContainsFunc(old.notices, func(o notice) bool { return o.message == n.message }) {
			continue
		}
		if p.opts.Log != nil {
			p.opts.Log.Warn(n.message, zap.String("pod", n.pod.String()), zap.String("volume", n.volume), zap.String("reason", n.reason))
		}
		if p.opts.Events != nil {
			p.opts.Events.Event(events.PodObject(n.pod), events.Warning, n.reason, n.message)
			if n.pvc != nil {
				p.opts.Events.Event(events.Object{Kind: "PersistentVolumeClaim", Namespace: n.pvc.Namespace, Name: n.pvc.Name, UID: string(n.pvc.UID)},
					events.Warning, n.reason, n.message)
			}
		}
	}
}

// podInfo copies what plugins need out of the pod.
func podInfo(pod *v1.Pod) volume.PodInfo {
	info := volume.PodInfo{
		PodRef:         volume.PodRef{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name},
		ServiceAccount: pod.Spec.ServiceAccountName,
		HugePageSizes:  hugePageSizes(pod),
	}
	info.MemoryLimit, info.EphemeralStorageLimit = podLimits(pod)
	if sc := pod.Spec.SecurityContext; sc != nil {
		info.FSGroup = sc.FSGroup
		info.FSGroupChangePolicy = sc.FSGroupChangePolicy
	}
	return info
}

// podLimits returns the pod's memory and ephemeral-storage limits, from
// one sum of its containers' limits (they differ in which containers
// count, not in the sum).
//
// The memory limit is the kubelet's for the pod's cgroup (and from it the
// size of Memory emptyDirs): containers and sidecars summed, the largest
// init container if larger, a pod-level limit instead when set, plus the
// pod's overhead; nil when a container (or init container) has no memory
// limit and there is no pod-level one.
//
// The ephemeral-storage limit is the eviction manager's sum
// (podEphemeralStorageLimitEviction, PodLimits with default options):
// declared limits only, the largest init container if larger, a
// pod-level limit, overhead; nil when nothing declares one.
func podLimits(pod *v1.Pod) (memory, ephemeral *resource.Quantity) {
	if !declaresLimits(pod) {
		// Nothing to sum: the helper's maps would be five allocations
		// per pod to find it. TestPodLimitsUndeclared holds this to it.
		return nil, nil
	}
	declared := true
	limits := resourcehelper.PodLimits(pod, resourcehelper.PodResourcesOptions{
		ContainerFn: func(res v1.ResourceList, _ resourcehelper.ContainerType) {
			if res.Memory().IsZero() {
				declared = false
			}
		},
	})
	if resourcehelper.IsPodLevelResourcesSet(pod) && !pod.Spec.Resources.Limits.Memory().IsZero() {
		declared = true
	}
	if q, ok := limits[v1.ResourceMemory]; declared && ok && !q.IsZero() {
		memory = &q
	}
	if q, ok := limits[v1.ResourceEphemeralStorage]; ok {
		ephemeral = &q
	}
	return memory, ephemeral
}

// declaresLimits reports whether anything podLimits sums declares a limit:
// a container, init container, the pod level or its overhead.
func declaresLimits(pod *v1.Pod) bool {
	if len(pod.Spec.Overhead) > 0 || pod.Spec.Resources != nil && len(pod.Spec.Resources.Limits) > 0 {
		return true
	}
	for _, cs := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if len(cs[i].Resources.Limits) > 0 {
				return true
			}
		}
	}
	return false
}

// hugePageSizes lists the sizes of the pod's hugepages-<size> requests,
// in the kubelet's order (pod-level, containers, init containers), each
// once.
func hugePageSizes(pod *v1.Pod) string {
	lists := make([]v1.ResourceList, 0, 1+len(pod.Spec.Containers)+len(pod.Spec.InitContainers))
	if pod.Spec.Resources != nil {
		lists = append(lists, pod.Spec.Resources.Requests)
	}
	for _, cs := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			lists = append(lists, cs[i].Resources.Requests)
		}
	}
	var out []string
	for _, l := range lists {
		names := make([]string, 0, len(l))
		for name := range l {
			if size, ok := strings.CutPrefix(string(name), v1.ResourceHugePagesPrefix); ok && !slices.Contains(out, size) && !slices.Contains(names, size) {
				names = append(names, size)
			}
		}
		sort.Strings(names)
		out = append(out, names...)
	}
	return strings.Join(out, ",")
}
