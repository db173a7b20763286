package cache

import (
	"hash/maphash"
	"iter"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/volume"
)

// DeviceMountState is the state of a shared volume's device (staging) mount.
type DeviceMountState string

const (
	DeviceNotMounted      DeviceMountState = "NotMounted"
	DeviceMountUncertain  DeviceMountState = "Uncertain"
	DeviceGloballyMounted DeviceMountState = "GloballyMounted"
)

// MayBeMounted reports whether the device may be mounted and so must be
// unmounted before the volume can be forgotten.
func (s DeviceMountState) MayBeMounted() bool {
	return s == DeviceMountUncertain || s == DeviceGloballyMounted
}

// MountState is the state of a pod's mount of a volume. A pod that has not
// mounted the volume has no entry at all.
type MountState string

const (
	// Mounted: set up and verified.
	Mounted MountState = "Mounted"
	// MountUncertain: an operation may have left it mounted or half
	// mounted. It is retried while wanted and unmounted when not.
	MountUncertain MountState = "Uncertain"
)

// AttachState says whether an attachable volume is attached to the node.
type AttachState string

const (
	NotAttached     AttachState = "NotAttached"
	AttachUncertain AttachState = "Uncertain"
	Attached        AttachState = "Attached"
	AttachNotNeeded AttachState = "NotNeeded"
)

// ActualPodMount is one pod's mount of a volume.
type ActualPodMount struct {
	Pod volume.PodRef `json:"pod"`
	// SpecName is the inner volume name, the last element of MountPath.
	SpecName  string     `json:"specName"`
	MountPath string     `json:"mountPath"`
	State     MountState `json:"mountState"`
	// ContentGeneration is the DSW's content generation the operation that
	// set the mount up wrote (DesiredPodVolume.ContentGeneration); 0 for a
	// mount found after a restart, whose content is of unknown age.
	ContentGeneration uint64 `json:"contentGeneration,omitempty"`
	// SubPaths are the sub-paths prepared for the pod's containers, as
	// they were wanted when prepared. SubPathsOutdated says the volume was
	// set up again since: they are still in place but must be prepared
	// again (a remounted volume may have new files).
	SubPaths         []volume.SubPath `json:"subPaths,omitempty"`
	SubPathsOutdated bool             `json:"subPathsOutdated,omitempty"`
	// Reconstructed marks a mount found on disk after a restart and not yet
	// matched with a pod that wants it; FoundMounted says whether a mount
	// was in place when it was found.
	Reconstructed bool         `json:"reconstructed,omitempty"`
	FoundMounted  bool         `json:"foundMounted,omitempty"`
	Spec          *volume.Spec `json:"-"`
	// Since is when the mount reached its state.
	Since time.Time `json:"since"`
}

// ActualVolume is a volume that is (or may be) attached or mounted.
type ActualVolume struct {
	Name       volume.UniqueName `json:"name"`
	Plugin     string            `json:"plugin"`
	Attributes volume.Attributes `json:"attributes"`
	// Spec may be nil for a volume reconstructed from disk.
	Spec        *volume.Spec     `json:"-"`
	AttachState AttachState      `json:"attachState,omitempty"`
	DeviceState DeviceMountState `json:"deviceMountState"`
	DevicePath  string           `json:"devicePath,omitempty"`
	// PublishContext is what attaching returned (CSI publish context),
	// passed to the device mount and to every pod's set up.
	PublishContext  map[string]string `json:"publishContext,omitempty"`
	DeviceMountPath string            `json:"deviceMountPath,omitempty"`
	// Size is the volume size the node last made the filesystem fit.
	Size *resource.Quantity `json:"size,omitempty"`
	// DeviceReconstructed marks a device mount found on disk after a
	// restart and not yet matched; DeviceFoundMounted says whether it was
	// in place.
	DeviceReconstructed bool `json:"deviceReconstructed,omitempty"`
	DeviceFoundMounted  bool `json:"deviceFoundMounted,omitempty"`
	// ResizeBlocked holds the reason node expansion must not be retried
	// (the driver said the volume is in use) until the pods change.
	ResizeBlocked string `json:"resizeBlocked,omitempty"`
	// ExpandAfterPublish: the plugin can only grow this volume once a pod
	// has it, so pending expansion does not hold pods back.
	ExpandAfterPublish bool                   `json:"expandAfterPublish,omitempty"`
	Pods               PodSet[ActualPodMount] `json:"pods"`
}

// empty reports whether nothing is left to undo for the volume.
func (v *ActualVolume) empty() bool {
	return v.Pods.Len() == 0 && v.released()
}

// released reports whether nothing but pods' mounts is left to undo for
// the volume.
func (v *ActualVolume) released() bool {
	return !v.DeviceState.MayBeMounted() &&
		(v.AttachState == "" || v.AttachState == NotAttached || v.AttachState == AttachNotNeeded)
}

// hasReconstructed reports whether the volume holds state found on disk
// after a restart that no operation or adoption has confirmed yet.
func (v *ActualVolume) hasReconstructed() bool {
	if v.DeviceReconstructed {
		return true
	}
	for _, m := range v.Pods.All() {
		if m.Reconstructed {
			return true
		}
	}
	return false
}

// clone copies the volume; the copy shares its Pods, which are never
// written (see PodSet).
func (v *ActualVolume) clone() *ActualVolume {
	nv := *v
	return &nv
}

// ActualSnapshot is an immutable view of the ASW. Its volumes are read
// through Volume, Len and All: a snapshot shares most of its entries with
// the one before (see view).
type ActualSnapshot struct {
	vols       view[volume.UniqueName, ActualVolume]
	Generation uint64

	// reconstructed counts the volumes with unconfirmed reconstructed
	// state; valid when counted is set (snapshots the ASW made).
	reconstructed int
	counted       bool
}

// NewActualSnapshot returns a snapshot of vols, which the caller must not
// write afterwards (for tests and tools that build a view by hand).
func NewActualSnapshot(vols map[volume.UniqueName]*ActualVolume, generation uint64) *ActualSnapshot {
	return &ActualSnapshot{vols: viewOf(vols), Generation: generation}
}

// Volume returns the volume's entry, nil if there is none.
func (s *ActualSnapshot) Volume(name volume.UniqueName) *ActualVolume {
	v, _ := s.vols.get(name)
	return v
}

// VolumesLen returns the number of volumes.
func (s *ActualSnapshot) VolumesLen() int { return s.vols.n }

// Volumes yields every volume, in no particular order.
func (s *ActualSnapshot) Volumes() iter.Seq2[volume.UniqueName, *ActualVolume] { return s.vols.all() }

// HasReconstructed reports whether some volume still holds state found on
// disk after a restart that nothing has confirmed. The reconciler asks on
// every pass, so snapshots of the ASW answer from a count the ASW keeps
// instead of walking every volume.
func (s *ActualSnapshot) HasReconstructed() bool {
	if s.counted {
		return s.reconstructed > 0
	}
	for _, v := range s.Volumes() {
		if v.hasReconstructed() {
			return true
		}
	}
	return false
}

// PodMount returns the pod's mount of the volume, if any.
func (s *ActualSnapshot) PodMount(name volume.UniqueName, pod types.UID) (*ActualPodMount, bool) {
	v, ok := s.vols.get(name)
	if !ok {
		return nil, false
	}
	return v.Pods.Get(pod)
}

// VolumeIdentity is what identifies a volume when it is first recorded.
type VolumeIdentity struct {
	Name       volume.UniqueName
	Plugin     string
	Attributes volume.Attributes
	Spec       *volume.Spec
}

// ActualStateOfWorld is what is attached and mounted on the node. Only
// operations write it.
//
// Its volumes are sharded by name, each shard under its own lock: in a
// storm every operation records its outcome here, and with one lock the
// 64 workers on a 2-CPU node queued behind each other (and behind the
// reconciler's snapshot copy) until the lock was handed from waiter to
// waiter at the speed of the scheduler, which then bounded the storm.
type ActualStateOfWorld struct {
	clock  clock.PassiveClock
	seed   maphash.Seed
	shards [aswShards]aswShard
	// generation counts changes; it grows after the change, under the
	// shard's lock.
	generation atomic.Uint64

	snapMu   sync.Mutex
	snapshot *ActualSnapshot
	// snapPeak is the most volumes a snapshot held since the last full
	// copy.
	snapPeak int

	// simple has SetPodMount and DeletePodMount take the simple versions
	// of their fast paths (tests).
	simple bool
}

const aswShards = 32

type aswShard struct {
	mu      sync.Mutex
	volumes map[volume.UniqueName]*ActualVolume
	// reconstructed counts the volumes for which hasReconstructed holds.
	reconstructed int
	// changes lists the volumes changed since the reconciler last took
	// them (TakeChanges, which drops the repeats).
	changes touched[volume.UniqueName]
	// snapChanges lists the volumes changed since the last snapshot,
	// which patches a copy of the one before instead of copying every
	// entry anew.
	snapChanges touched[volume.UniqueName]
}

// touched lists the entries changed since its one consumer (the next
// snapshot, or the reconciler) last took them, in order and with repeats:
// patching a snapshot with a volume twice does no harm, the reconciler's
// list is sorted once per take (see Changes), and appending to a slice is
// cheaper than the set a changelog.Log keeps (a map insert per change was
// a tenth of every ASW write in a storm). Repeats count towards the limit.
type touched[K comparable] struct {
	names []K
	// all: past the limit, or nothing listed yet; every entry is looked at.
	all bool
}

// markAll says that any entry may have changed (nothing, until the list's
// consumer first takes it: its first take says All anyway).
func (t *touched[K]) markAll() { t.all, t.names = true, nil }

func (t *touched[K]) mark(name K, limit int) {
	if t.all {
		return
	}
	if n := len(t.names); n > 0 && t.names[n-1] == name {
		// An operation writes its volume's entry two or three times in
		// a row; listing it once is the same to every consumer.
		return
	}
	if len(t.names) >= limit {
		t.all, t.names = true, nil
		return
	}
	t.names = append(t.names, name)
}

// take returns what was marked and starts a new list, which reuses
// names' array: the caller is done with names before it lets go of the
// shard's lock.
func (t *touched[K]) take() (all bool, names []K) {
	all, names = t.all, t.names
	t.all, t.names = false, names[:0]
	return all, names
}

// NewActualStateOfWorld returns an empty ASW.
func NewActualStateOfWorld(c clock.PassiveClock) *ActualStateOfWorld {
	a := &ActualStateOfWorld{clock: c, seed: maphash.MakeSeed()}
	for i := range a.shards {
		a.shards[i].volumes = map[volume.UniqueName]*ActualVolume{}
		// Nothing is listed until a consumer first takes the list,
		// which then says All.
		a.shards[i].changes.all = true
		a.shards[i].snapChanges.all = true
	}
	return a
}

func (a *ActualStateOfWorld) shard(name volume.UniqueName) *aswShard {
	return &a.shards[maphash.String(a.seed, string(name))%aswShards]
}

// update applies fn to a copy of the volume's entry (a new one if absent)
// and publishes the result, dropping the entry when nothing is left of it.
func (a *ActualStateOfWorld) update(id VolumeIdentity, fn func(v *ActualVolume)) {
	sh := a.shard(id.Name)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var v *ActualVolume
	if old, ok := sh.volumes[id.Name]; ok {
		if sh.reconstructed > 0 && old.hasReconstructed() {
			sh.reconstructed--
		}
		v = old.clone()
		if v.Spec == nil && id.Spec != nil {
			// A volume reconstructed from disk learns its spec, and the
			// attributes the plugin derives from it, from the first
			// operation that knows them.
			v.Spec, v.Attributes = id.Spec, id.Attributes
		}
	} else {
		if id.Plugin == "" {
			return // nothing known about it and nothing to record
		}
		v = &ActualVolume{
			Name: id.Name, Plugin: id.Plugin, Attributes: id.Attributes, Spec: id.Spec,
			DeviceState: DeviceNotMounted,
		}
	}
	fn(v)
	if v.empty() {
		delete(sh.volumes, id.Name)
	} else {
		sh.volumes[id.Name] = v
		if v.hasReconstructed() {
			sh.reconstructed++
		}
	}
	a.marked(sh, id.Name)
}

// marked records a change of the volume's entry; the caller holds sh.mu.
func (a *ActualStateOfWorld) marked(sh *aswShard, name volume.UniqueName) {
	limit := changeLimit(len(sh.volumes))
	sh.changes.mark(name, limit)
	sh.snapChanges.mark(name, limit)
	a.generation.Add(1)
}

// SetAttachState records whether the volume is attached and, when it is,
// what attaching returned.
func (a *ActualStateOfWorld) SetAttachState(id VolumeIdentity, state AttachState, devicePath string, publishContext map[string]string) {
	a.update(id, func(v *ActualVolume) {
		v.AttachState = state
		if devicePath != "" {
			v.DevicePath = devicePath
		}
		if publishContext != nil {
			v.PublishContext = publishContext
		}
	})
}

// SetDeviceState records the device mount state. An empty devicePath or
// deviceMountPath keeps the recorded one: unmounting must not forget where
// the device was.
func (a *ActualStateOfWorld) SetDeviceState(id VolumeIdentity, state DeviceMountState, devicePath, deviceMountPath string) {
	a.update(id, func(v *ActualVolume) {
		v.DeviceState = state
		// An operation has now acted on the device: what it recorded is
		// the agent's own knowledge, no longer a guess from a restart
		// (otherwise HasReconstructed would hold housekeeping back until
		// the volume leaves the ASW).
		v.DeviceReconstructed, v.DeviceFoundMounted = false, false
		if devicePath != "" {
			v.DevicePath = devicePath
		}
		if deviceMountPath != "" {
			v.DeviceMountPath = deviceMountPath
		}
	})
}

// SetPodMount records a pod's mount (state Mounted or MountUncertain).
func (a *ActualStateOfWorld) SetPodMount(id VolumeIdentity, m ActualPodMount) {
	m.Since = a.clock.Now()
	if a.simple {
		a.setPodMountSimple(id, m)
		return
	}
	// The fast path of setPodMountSimple, which it must agree with
	// (TestActualFastPathsOracle): the new entry and its mount are one
	// allocation, which the Pods of most volumes (one pod) hold inline.
	sh := a.shard(id.Name)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	old, ok := sh.volumes[id.Name]
	if !ok && id.Plugin == "" {
		return // nothing known about it and nothing to record
	}
	e := &volumeMount{}
	v := &e.v
	oldRecon := false
	if ok {
		oldRecon = sh.reconstructed > 0 && old.hasReconstructed()
		*v = *old
		if v.Spec == nil && id.Spec != nil {
			v.Spec, v.Attributes = id.Spec, id.Attributes // see updateWith
		}
		if prev, had := old.Pods.Get(m.Pod.UID); had && prev.State == m.State {
			m.Since = prev.Since
		} else if !had {
			v.ResizeBlocked = "" // see setPodMountSimple
		}
	} else {
		*v = ActualVolume{
			Name: id.Name, Plugin: id.Plugin, Attributes: id.Attributes, Spec: id.Spec,
			DeviceState: DeviceNotMounted,
		}
	}
	e.m = m
	v.Pods = v.Pods.With(m.Pod.UID, &e.m)
	if oldRecon {
		sh.reconstructed--
	}
	// Reconstructed state comes only from the mount set here or from what
	// the old entry held.
	if (oldRecon || m.Reconstructed) && v.hasReconstructed() {
		sh.reconstructed++
	}
	sh.volumes[id.Name] = v
	a.marked(sh, id.Name)
}

// volumeMount is a volume's entry and one pod's mount allocated together:
// SetPodMount makes both, and most volumes in a storm have one pod. A
// mount that outlives its entry (another pod's mount replaced the entry)
// keeps the old entry's memory with it: one entry per mount at most.
type volumeMount struct {
	v ActualVolume
	m ActualPodMount
}

// setPodMountSimple is SetPodMount through update.
func (a *ActualStateOfWorld) setPodMountSimple(id VolumeIdentity, m ActualPodMount) {
	a.update(id, func(v *ActualVolume) {
		old, ok := v.Pods.Get(m.Pod.UID)
		if ok && old.State == m.State {
			m.Since = old.Since
		}
		if !ok {
			// A refusal to expand "while in use" holds until the pods
			// using the volume change.
			v.ResizeBlocked = ""
		}
		mm := m
		v.Pods = v.Pods.With(m.Pod.UID, &mm)
	})
}

// SetSubPaths records the sub-paths prepared for a pod's mount of a volume,
// if the pod still has one.
func (a *ActualStateOfWorld) SetSubPaths(name volume.UniqueName, pod types.UID, subPaths []volume.SubPath) {
	a.update(VolumeIdentity{Name: name}, func(v *ActualVolume) {
		m, ok := v.Pods.Get(pod)
		if !ok {
			return
		}
		mm := *m
		mm.SubPaths, mm.SubPathsOutdated = subPaths, false
		v.Pods = v.Pods.With(pod, &mm)
	})
}

// DeletePodMount records that the pod's mount is gone.
func (a *ActualStateOfWorld) DeletePodMount(name volume.UniqueName, pod types.UID) {
	if a.simple {
		a.deletePodMountSimple(name, pod)
		return
	}
	// The fast path of deletePodMountSimple, which it must agree with
	// (TestActualFastPathsOracle): in a teardown most volumes lose their
	// last pod and go, and are not copied first; a pod that has no mount
	// changes nothing and is not marked.
	sh := a.shard(name)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	old, ok := sh.volumes[name]
	if !ok {
		return
	}
	_, had := old.Pods.Get(pod)
	if !had && !old.empty() {
		return
	}
	oldRecon := sh.reconstructed > 0 && old.hasReconstructed()
	if oldRecon {
		sh.reconstructed--
	}
	if n := old.Pods.Len(); n == 0 || (n == 1 && had && old.released()) {
		delete(sh.volumes, name)
		a.marked(sh, name)
		return
	}
	v := old.clone()
	v.ResizeBlocked = ""
	v.Pods = old.Pods.Without(pod)
	if oldRecon && v.hasReconstructed() {
		sh.reconstructed++
	}
	sh.volumes[name] = v
	a.marked(sh, name)
}

// deletePodMountSimple is DeletePodMount through update.
func (a *ActualStateOfWorld) deletePodMountSimple(name volume.UniqueName, pod types.UID) {
	a.update(VolumeIdentity{Name: name}, func(v *ActualVolume) {
		if !v.Pods.Has(pod) {
			return
		}
		v.ResizeBlocked = ""
		v.Pods = v.Pods.Without(pod)
	})
}

// SetSize records the size the node made the volume's filesystem fit.
func (a *ActualStateOfWorld) SetSize(name volume.UniqueName, size *resource.Quantity) {
	a.update(VolumeIdentity{Name: name}, func(v *ActualVolume) {
		if size != nil {
			s := size.DeepCopy()
			v.Size = &s
		}
	})
}

// SetExpandAfterPublish records that the volume can only grow once
// published.
func (a *ActualStateOfWorld) SetExpandAfterPublish(name volume.UniqueName) {
	a.update(VolumeIdentity{Name: name}, func(v *ActualVolume) { v.ExpandAfterPublish = true })
}

// SetResizeBlocked records (or clears, with "") why expansion must not be
// retried.
func (a *ActualStateOfWorld) SetResizeBlocked(name volume.UniqueName, reason string) {
	a.update(VolumeIdentity{Name: name}, func(v *ActualVolume) { v.ResizeBlocked = reason })
}

// Volume returns the current entry of a volume.
func (a *ActualStateOfWorld) Volume(name volume.UniqueName) (*ActualVolume, bool) {
	sh := a.shard(name)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v, ok := sh.volumes[name]
	return v, ok
}

// PodMounts lists every mount of the pod, sorted by volume name.
func (a *ActualStateOfWorld) PodMounts(pod types.UID) []*ActualPodMount {
	var out []*ActualPodMount
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		for _, v := range sh.volumes {
			if m, ok := v.Pods.Get(pod); ok {
				out = append(out, m)
			}
		}
		sh.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].MountPath < out[j].MountPath })
	return out
}

// TakeChanges returns the volumes whose entries changed since the last
// call, for one consumer: the reconciler, which plans only those again.
// A consumer takes them before the snapshot it plans from, so that a
// change made in between is in both the snapshot and the next call's list
// (a change counts in Generation before its shard's lock is released).
func (a *ActualStateOfWorld) TakeChanges() Changes {
	var c Changes
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		all, names := sh.changes.take()
		if !c.All && !all {
			c.names = append(c.names, names...) // names is reused
		}
		sh.mu.Unlock()
		c.All = c.All || all
	}
	if c.All {
		return Changes{All: true}
	}
	c.names = sortedOnce(c.names)
	return c
}

// Snapshot returns an immutable view of the ASW.
//
// It is copied shard by shard, so operations recording their outcomes are
// held up by one shard's copy at a time. Each volume's entry is as one
// operation left it; an operation that finishes during the copy may or may
// not be in it, as if it had finished just before or after, and the
// snapshot's Generation (read before the copy) is then older than its
// content, so the next call copies again.
//
// A snapshot is the one before it with the volumes changed since written
// over (see view): in a storm the reconciler snapshots the ASW after every
// few operations, and copying every entry anew was most of a pass.
func (a *ActualStateOfWorld) Snapshot() *ActualSnapshot {
	gen := a.generation.Load()
	a.snapMu.Lock()
	defer a.snapMu.Unlock()
	prev := a.snapshot
	if prev != nil && prev.Generation == gen {
		return prev
	}
	s := &ActualSnapshot{Generation: gen, counted: true}
	var p *patcher[volume.UniqueName, ActualVolume]
	if prev != nil {
		p = newPatcher(prev.vols, 0)
	}
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		all, names := sh.snapChanges.take()
		if all {
			p = nil
		}
		if p != nil {
			for _, name := range names {
				p.set(name, sh.volumes[name]) // nil when gone
			}
		}
		s.reconstructed += sh.reconstructed
		sh.mu.Unlock()
	}
	if p != nil {
		s.vols = p.done(&a.snapPeak)
	} else {
		// The first snapshot, or a shard's list was too long to keep:
		// every entry is copied.
		vols := make(map[volume.UniqueName]*ActualVolume, a.snapPeak)
		s.reconstructed = 0
		for i := range a.shards {
			sh := &a.shards[i]
			sh.mu.Lock()
			for k, v := range sh.volumes {
				vols[k] = v
			}
			s.reconstructed += sh.reconstructed
			sh.mu.Unlock()
		}
		a.snapPeak = len(vols)
		s.vols = viewOf(vols)
	}
	a.snapshot = s
	return s
}

// AddReconstructed records volumes found on disk after a restart. Volumes
// already known are left alone (the running agent knows better).
func (a *ActualStateOfWorld) AddReconstructed(vols []*ActualVolume) {
	now := a.clock.Now()
	for _, v := range vols {
		sh := a.shard(v.Name)
		sh.mu.Lock()
		if _, ok := sh.volumes[v.Name]; ok {
			sh.mu.Unlock()
			continue
		}
		nv := v.clone()
		for uid, m := range v.Pods.All() {
			mm := *m
			mm.Since = now
			nv.Pods = nv.Pods.With(uid, &mm)
		}
		sh.volumes[v.Name] = nv
		if nv.hasReconstructed() {
			sh.reconstructed++
		}
		a.marked(sh, v.Name)
		// Counted under the shard's lock, as every change: a consumer
		// that took the change then finds a newer snapshot.
		sh.mu.Unlock()
	}
}

// Adopt confirms reconstructed state that a pod wants: device mounts become
// GloballyMounted, pod mounts Mounted, without any mount operation. The
// desired identity (spec, attributes) replaces what was guessed from disk;
// pods gives each adopted pod's reference and spec.
func (a *ActualStateOfWorld) Adopt(id VolumeIdentity, device bool, pods map[types.UID]ActualPodMount) {
	a.update(VolumeIdentity{Name: id.Name}, func(v *ActualVolume) {
		if id.Spec != nil {
			v.Spec, v.Attributes = id.Spec, id.Attributes
		}
		if device && v.DeviceReconstructed {
			v.DeviceState, v.DeviceReconstructed = DeviceGloballyMounted, false
		}
		for uid, p := range pods {
			m, ok := v.Pods.Get(uid)
			if !ok || !m.Reconstructed {
				continue
			}
			mm := *m
			mm.Pod, mm.Spec, mm.State, mm.Reconstructed = p.Pod, p.Spec, Mounted, false
			// Content that follows its sources (API volumes, CSI
			// requiresRepublish) may have gone stale while the agent was
			// down: its generation stays 0 (unknown), older than any the
			// DSW hands out, so it is set up again, which rewrites only
			// what changed.
			mm.ContentGeneration = 0
			v.Pods = v.Pods.With(uid, &mm)
		}
	})
}
