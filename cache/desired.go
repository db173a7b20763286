package cache

import (
	"iter"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/volume"
)

// PodVolume is one resolved volume of one pod, as the populator hands it in.
type PodVolume struct {
	Name       volume.UniqueName
	Plugin     string
	Attributes volume.Attributes
	// OuterName is the pod's name for the volume (pod.spec.volumes[].name).
	OuterName string
	Spec      *volume.Spec
	// DesiredSize is the size the volume should have (PV capacity) when the
	// node may need to expand it, nil otherwise.
	DesiredSize *resource.Quantity
	// SubPaths are the sub-paths of the volume the pod's containers mount,
	// sorted by container and index.
	SubPaths []volume.SubPath
}

// DesiredPodVolume is one pod's use of a desired volume.
type DesiredPodVolume struct {
	Pod        volume.PodInfo `json:"pod"`
	OuterNames []string       `json:"outerVolumeNames"`
	Spec       *volume.Spec   `json:"-"`
	// SubPaths are the sub-paths of the volume the pod's containers mount
	// (under any of OuterNames), sorted by container and index.
	SubPaths []volume.SubPath `json:"subPaths,omitempty"`
	// ContentGeneration says which content the pod's mount must hold, for
	// a volume whose content follows its sources (Attributes.RequiresRemount:
	// API volumes, CSI requiresRepublish); 0 for others. It grows when
	// what the content is built from changes or a refresh falls due
	// (RefreshPodVolume); a mount that recorded an older one is set up
	// again (cache.PodMountNeeded). Numbers come from one sequence of the
	// DSW, so a pod volume that leaves and comes back gets a newer one.
	ContentGeneration uint64 `json:"contentGeneration,omitempty"`
	// Since is when the pod first wanted this volume.
	Since time.Time `json:"since"`
}

// DesiredVolume is a volume some pod on the node wants mounted.
type DesiredVolume struct {
	Name       volume.UniqueName `json:"name"`
	Plugin     string            `json:"plugin"`
	Attributes volume.Attributes `json:"attributes"`
	// SpecName is the inner volume name (directory name under the pod).
	SpecName string `json:"specName"`
	// Spec is the spec of one of the pods, used for volume-wide operations.
	Spec        *volume.Spec             `json:"-"`
	DesiredSize *resource.Quantity       `json:"desiredSize,omitempty"`
	Pods        PodSet[DesiredPodVolume] `json:"pods"`
}

// DesiredPod is what the DSW knows about one pod.
type DesiredPod struct {
	Pod volume.PodInfo `json:"pod"`
	// Volumes are the unique names of the pod's resolved volumes.
	Volumes []volume.UniqueName `json:"volumes"`
	// Errors are the problems found resolving the pod's volumes.
	Errors []*volume.PodVolumeError `json:"-"`
	// Unresolved lists the pod's volume names that could not be resolved and
	// were never resolved before; the reconciler must not unmount anything of
	// this pod under those names (they may be mounted from before a restart).
	Unresolved []string `json:"unresolvedVolumes,omitempty"`
	// Containers are what the pod's containers mount, for the runtime API.
	Containers []volume.Container `json:"containers,omitempty"`
	// Since is when the pod was first seen.
	Since time.Time `json:"since"`
}

// DesiredSnapshot is an immutable view of the DSW. Its volumes and pods
// are read through Volume, Pod, their Len and All: a snapshot shares most
// of its entries with the one before (see view).
type DesiredSnapshot struct {
	vols view[volume.UniqueName, DesiredVolume]
	pods view[types.UID, DesiredPod]
	// Generation increases with every change.
	Generation uint64
}

// NewDesiredSnapshot returns a snapshot of vols and pods, which the caller
// must not write afterwards (for tests and tools that build a view by
// hand).
func NewDesiredSnapshot(vols map[volume.UniqueName]*DesiredVolume, pods map[types.UID]*DesiredPod, generation uint64) *DesiredSnapshot {
	return &DesiredSnapshot{vols: viewOf(vols), pods: viewOf(pods), Generation: generation}
}

// Volume returns the volume's entry, nil if no pod wants it.
func (s *DesiredSnapshot) Volume(name volume.UniqueName) *DesiredVolume {
	v, _ := s.vols.get(name)
	return v
}

// Pod returns the pod's entry, nil if the DSW does not know it.
func (s *DesiredSnapshot) Pod(uid types.UID) *DesiredPod {
	p, _ := s.pods.get(uid)
	return p
}

// VolumesLen returns the number of volumes.
func (s *DesiredSnapshot) VolumesLen() int { return s.vols.n }

// PodsLen returns the number of pods.
func (s *DesiredSnapshot) PodsLen() int { return s.pods.n }

// Volumes yields every volume, in no particular order.
func (s *DesiredSnapshot) Volumes() iter.Seq2[volume.UniqueName, *DesiredVolume] { return s.vols.all() }

// Pods yields every pod, in no particular order.
func (s *DesiredSnapshot) Pods() iter.Seq2[types.UID, *DesiredPod] { return s.pods.all() }

// EachPodChanged calls fn for every pod whose entry in s is not the one in
// prev: new and changed pods with their entry in s, gone ones with nil.
// When the two snapshots share their base (see view) only the entries
// changed since it are compared: the readiness metrics looked at every
// pod of every pass's snapshot to find the few that changed.
func (s *DesiredSnapshot) EachPodChanged(prev *DesiredSnapshot, fn func(types.UID, *DesiredPod)) {
	if !s.pods.eachChanged(&prev.pods, fn) {
		eachPodChanged(s, prev, fn)
	}
}

// eachPodChanged is EachPodChanged comparing every pod.
func eachPodChanged(s, prev *DesiredSnapshot, fn func(types.UID, *DesiredPod)) {
	for uid, p := range s.Pods() {
		if prev.Pod(uid) != p {
			fn(uid, p)
		}
	}
	for uid := range prev.Pods() {
		if s.Pod(uid) == nil {
			fn(uid, nil)
		}
	}
}

// HasPodVolume reports whether pod wants volume.
func (s *DesiredSnapshot) HasPodVolume(name volume.UniqueName, pod types.UID) bool {
	v, ok := s.vols.get(name)
	if !ok {
		return false
	}
	return v.Pods.Has(pod)
}

// PodSubPaths returns the sub-paths of a volume the pod's containers mount.
func (s *DesiredSnapshot) PodSubPaths(name volume.UniqueName, pod types.UID) []volume.SubPath {
	if v, ok := s.vols.get(name); ok {
		if p, ok := v.Pods.Get(pod); ok {
			return p.SubPaths
		}
	}
	return nil
}

// HasVolume reports whether any pod wants the volume.
func (s *DesiredSnapshot) HasVolume(name volume.UniqueName) bool {
	_, ok := s.vols.get(name)
	return ok
}

// DesiredStateOfWorld is the set of volumes the pods on this node want.
type DesiredStateOfWorld struct {
	clock   clock.PassiveClock
	changed *notify.Signal

	mu         sync.RWMutex
	volumes    map[volume.UniqueName]*DesiredVolume
	pods       map[types.UID]*DesiredPod
	generation uint64
	// contentSeq is the last content generation handed out.
	contentSeq uint64
	snapshot   *DesiredSnapshot // cached for generation
	// changes lists the volumes changed since the reconciler last took
	// them, with repeats (see touched).
	changes touched[volume.UniqueName]
	// peakVolumes and peakPods are the most entries the maps held since
	// they were last made (see shrunk).
	peakVolumes, peakPods int
	// snapVols and snapPods list the entries changed since the last
	// snapshot, which patches the one before (see view); snapPeakVols and
	// snapPeakPods are the most entries a snapshot held since its base
	// was last copied into a table of its size.
	snapVols                   touched[volume.UniqueName]
	snapPods                   touched[types.UID]
	snapPeakVols, snapPeakPods int

	// batches counts the Batch calls running; changes made meanwhile
	// signal once, when the last ends (held records that one is due).
	batches atomic.Int32
	held    atomic.Bool
}

// NewDesiredStateOfWorld returns an empty DSW.
func NewDesiredStateOfWorld(c clock.PassiveClock) *DesiredStateOfWorld {
	return &DesiredStateOfWorld{
		clock:    c,
		changed:  notify.New(),
		volumes:  map[volume.UniqueName]*DesiredVolume{},
		pods:     map[types.UID]*DesiredPod{},
		changes:  touched[volume.UniqueName]{all: true},
		snapVols: touched[volume.UniqueName]{all: true},
		snapPods: touched[types.UID]{all: true},
	}
}

// Changed is signalled after every change.
func (d *DesiredStateOfWorld) Changed() <-chan struct{} { return d.changed.C() }

// SetPod makes the pod want exactly vols (replacing what it wanted before)
// and records errs and the names of volumes that could not be resolved.
// It reports whether anything changed.
func (d *DesiredStateOfWorld) SetPod(pod volume.PodInfo, vols []PodVolume, errs []*volume.PodVolumeError, unresolved []string) bool {
	return d.SetPodWithContainers(pod, vols, errs, unresolved, nil)
}

// SetPodWithContainers is SetPod that also records what the pod's
// containers mount. It neither writes nor keeps vols (the populator keeps
// it as the pod's last resolutions).
func (d *DesiredStateOfWorld) SetPodWithContainers(pod volume.PodInfo, vols []PodVolume, errs []*volume.PodVolumeError, unresolved []string, containers []volume.Container) bool {
	now := d.clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()

	old := d.pods[pod.UID]
	changed := old == nil || !samePodInfo(old.Pod, pod) || !slices.Equal(old.Unresolved, unresolved) || !sameErrors(old.Errors, errs) ||
		!equality.Semantic.DeepEqual(old.Containers, containers)

	// Group the pod's volumes by unique name: two pod volumes may resolve to
	// the same volume (two names for one claim).
	names := make([]volume.UniqueName, 0, len(vols))
	// The pod's entries and their outer names come from one allocation
	// each, not one per volume: a storm sets thousands of pods. An entry
	// that gets a second outer name has its own slice then (cap 1).
	// entries[i] is vols[i]'s entry when vols[i] is the first with its
	// name; the others' entries stay zero (OuterNames nil).
	entries, outer := make([]DesiredPodVolume, len(vols)), make([]string, len(vols))
	// A pod with a few volumes finds an earlier one by looking through
	// them (the first match is the first with the name), which costs
	// less than a map (TestDesiredDedupeOracle).
	var first map[volume.UniqueName]int
	if len(vols) > dedupeScanMax {
		first = make(map[volume.UniqueName]int, len(vols))
	}
	for i := range vols {
		pv := &vols[i]
		j := -1
		if first != nil {
			if k, ok := first[pv.Name]; ok {
				j = k
			} else {
				first[pv.Name] = i
			}
		} else {
			for k := range i {
				if vols[k].Name == pv.Name {
					j = k
					break
				}
			}
		}
		if j >= 0 {
			dp := &entries[j]
			dp.OuterNames = append(dp.OuterNames, pv.OuterName)
			dp.SubPaths = append(dp.SubPaths, pv.SubPaths...)
			continue
		}
		outer[i] = pv.OuterName
		entries[i] = DesiredPodVolume{Pod: pod, OuterNames: outer[i : i+1 : i+1], Spec: pv.Spec, SubPaths: slices.Clone(pv.SubPaths)}
		names = append(names, pv.Name)
	}
	slices.Sort(names)

	if old != nil {
		// Both lists are sorted and without repeats.
		k := 0
		for _, name := range old.Volumes {
			for k < len(names) && names[k] < name {
				k++
			}
			if k == len(names) || names[k] != name {
				d.removePodFromVolume(name, pod.UID)
				changed = true
			}
		}
	}
	var fresh []DesiredVolume // the volumes' new entries, allocated together
	for i := range vols {
		dp := &entries[i]
		if dp.OuterNames == nil {
			continue // merged into an earlier entry
		}
		pv := &vols[i]
		v := d.volumes[pv.Name]
		since, gen := now, uint64(0)
		if v != nil {
			if existing, ok := v.Pods.Get(pod.UID); ok {
				since, gen = existing.Since, existing.ContentGeneration
			}
		}
		if gen == 0 && pv.Attributes.RequiresRemount {
			// The first content: newer than any a mount found after a
			// restart recorded (none), so such a mount is written again.
			d.contentSeq++
			gen = d.contentSeq
		}
		dp.Since, dp.ContentGeneration = since, gen
		volume.SortSubPaths(dp.SubPaths)
		if d.setPodVolume(v, pv, dp, &fresh, len(vols)-i) {
			changed = true
		}
	}

	if !changed {
		return false
	}
	if protects(old) != (len(unresolved) > 0) {
		// Whether the pod's mounts may be unmounted changed, for volumes
		// the DSW may not know (mounts from before a restart).
		d.changes.markAll()
	}
	since := now
	if old != nil {
		since = old.Since
	}
	d.pods[pod.UID] = &DesiredPod{Pod: pod, Volumes: names, Errors: errs, Unresolved: unresolved, Containers: containers, Since: since}
	d.snapPods.mark(pod.UID, changeLimit(len(d.pods)))
	d.bump()
	return true
}

// dedupeScanMax is the most volumes of a pod SetPodWithContainers looks
// through for an earlier one with the same name; above, it keeps a map.
var dedupeScanMax = 16

// setPodVolume adds or replaces one pod's use of a volume, whose entry is v
// (nil if none); it reports whether anything changed. A new entry for the
// volume is appended to *fresh, made with room for left entries the first
// time.
func (d *DesiredStateOfWorld) setPodVolume(v *DesiredVolume, pv *PodVolume, dp *DesiredPodVolume, fresh *[]DesiredVolume, left int) bool {
	ok := v != nil
	if ok {
		if cur, ok := v.Pods.Get(dp.Pod.UID); ok && sameSpec(cur.Spec, dp.Spec) && slices.Equal(cur.OuterNames, dp.OuterNames) &&
			volume.SameSubPaths(cur.SubPaths, dp.SubPaths) && samePodInfo(cur.Pod, dp.Pod) && v.Plugin == pv.Plugin && v.Attributes == pv.Attributes &&
			sameSize(v.DesiredSize, pv.DesiredSize) {
			return false
		}
	}
	if *fresh == nil {
		*fresh = make([]DesiredVolume, 0, left)
	}
	*fresh = append(*fresh, DesiredVolume{
		Name:        pv.Name,
		Plugin:      pv.Plugin,
		Attributes:  pv.Attributes,
		SpecName:    pv.Spec.Name,
		Spec:        pv.Spec,
		DesiredSize: pv.DesiredSize,
	})
	nv := &(*fresh)[len(*fresh)-1]
	if ok {
		// Keep the volume's spec unless it was this pod's old one: it must
		// stay the spec of a pod that wants the volume now.
		if cur, had := v.Pods.Get(dp.Pod.UID); !had || cur.Spec != v.Spec {
			nv.Spec = v.Spec
		}
		nv.Pods = v.Pods
	}
	nv.Pods = nv.Pods.With(dp.Pod.UID, dp)
	d.volumes[pv.Name] = nv
	d.changes.mark(pv.Name, changeLimit(len(d.volumes)))
	d.snapVols.mark(pv.Name, changeLimit(len(d.volumes)))
	return true
}

func (d *DesiredStateOfWorld) removePodFromVolume(name volume.UniqueName, pod types.UID) {
	v, ok := d.volumes[name]
	if !ok {
		return
	}
	old, ok := v.Pods.Get(pod)
	if !ok {
		return
	}
	d.changes.mark(name, changeLimit(len(d.volumes)))
	d.snapVols.mark(name, changeLimit(len(d.volumes)))
	if v.Pods.Len() == 1 {
		delete(d.volumes, name)
		return
	}
	nv := *v
	nv.Pods = v.Pods.Without(pod)
	if nv.Spec == old.Spec {
		nv.Spec = nv.Pods.Any().Spec
	}
	d.volumes[name] = &nv
}

// RefreshPodVolume gives a pod's use of a volume whose content follows its
// sources a new content generation: what the content is built from
// changed, or a refresh fell due, and the planner has the content written
// again. It returns the new generation, and false when the pod does not
// want the volume or its content does not follow sources (nothing to do:
// a volume set up later reads its sources then).
func (d *DesiredStateOfWorld) RefreshPodVolume(name volume.UniqueName, pod types.UID) (uint64, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.volumes[name]
	if !ok || !v.Attributes.RequiresRemount {
		return 0, false
	}
	dp, ok := v.Pods.Get(pod)
	if !ok {
		return 0, false
	}
	d.contentSeq++
	ndp := *dp
	ndp.ContentGeneration = d.contentSeq
	nv := *v
	nv.Pods = v.Pods.With(pod, &ndp)
	d.volumes[name] = &nv
	d.changes.mark(name, changeLimit(len(d.volumes)))
	d.snapVols.mark(name, changeLimit(len(d.volumes)))
	d.bump()
	return ndp.ContentGeneration, true
}

// DeletePod forgets the pod and every volume only it wanted.
func (d *DesiredStateOfWorld) DeletePod(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.pods[uid]
	if !ok {
		return false
	}
	if protects(p) {
		d.changes.markAll()
	}
	for _, name := range p.Volumes {
		d.removePodFromVolume(name, uid)
	}
	delete(d.pods, uid)
	d.snapPods.mark(uid, changeLimit(len(d.pods)))
	d.bump()
	return true
}

// protects reports whether the pod's mounts are protected from unmounting:
// it has volumes that could not be resolved (see DesiredPod.Unresolved).
func protects(p *DesiredPod) bool { return p != nil && len(p.Unresolved) > 0 }

// TakeChanges returns the volumes whose entries changed since the last
// call, for one consumer: the reconciler, which plans only those again.
// A consumer takes them before the snapshot it plans from, so that a
// change made in between is in both the snapshot and the next call's list.
func (d *DesiredStateOfWorld) TakeChanges() Changes {
	d.mu.Lock()
	defer d.mu.Unlock()
	all, names := d.changes.take()
	if all {
		return Changes{All: true}
	}
	return Changes{names: sortedOnce(slices.Clone(names))} // names is reused
}

// PodUIDs lists the pods the DSW knows.
func (d *DesiredStateOfWorld) PodUIDs() []types.UID {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]types.UID, 0, len(d.pods))
	for uid := range d.pods {
		out = append(out, uid)
	}
	return out
}

// Pod returns what the DSW knows about one pod.
func (d *DesiredStateOfWorld) Pod(uid types.UID) (*DesiredPod, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	p, ok := d.pods[uid]
	return p, ok
}

// HasPodVolume reports whether the pod currently wants the volume.
func (d *DesiredStateOfWorld) HasPodVolume(name volume.UniqueName, pod types.UID) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	v, ok := d.volumes[name]
	if !ok {
		return false
	}
	return v.Pods.Has(pod)
}

// Snapshot returns an immutable view of the DSW.
func (d *DesiredStateOfWorld) Snapshot() *DesiredSnapshot {
	d.mu.RLock()
	if s := d.snapshot; s != nil && s.Generation == d.generation {
		d.mu.RUnlock()
		return s
	}
	d.mu.RUnlock()

	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.snapshot; s != nil && s.Generation == d.generation {
		return s
	}
	d.volumes, d.pods = shrunk(d.volumes, &d.peakVolumes), shrunk(d.pods, &d.peakPods)
	s := &DesiredSnapshot{Generation: d.generation}
	s.vols = nextView(d.snapshot, (*DesiredSnapshot).volView, d.volumes, &d.snapVols, &d.snapPeakVols)
	s.pods = nextView(d.snapshot, (*DesiredSnapshot).podView, d.pods, &d.snapPods, &d.snapPeakPods)
	d.snapshot = s
	return s
}

func (s *DesiredSnapshot) volView() view[volume.UniqueName, DesiredVolume] { return s.vols }
func (s *DesiredSnapshot) podView() view[types.UID, DesiredPod]            { return s.pods }

// nextView returns the view of live after the one in prev: prev's patched
// with the entries changed since, or a copy of live when there is no prev
// or the list of changes ran past its limit. maps.Clone copies the live
// table as it is, without hashing every key again.
func nextView[K comparable, T any](prev *DesiredSnapshot, of func(*DesiredSnapshot) view[K, T], live map[K]*T, changed *touched[K], peak *int) view[K, T] {
	all, names := changed.take()
	if prev == nil || all {
		*peak = len(live)
		return viewOf(maps.Clone(live))
	}
	p := newPatcher(of(prev), len(names))
	for _, k := range names {
		p.set(k, live[k]) // nil when gone
	}
	return p.done(peak)
}

func (d *DesiredStateOfWorld) bump() {
	d.generation++
	if d.batches.Load() > 0 {
		d.held.Store(true)
		return
	}
	d.changed.Notify()
}

// Batch runs fn, which changes the DSW, and signals Changed once when it
// returns instead of after every change. The populator resolves every pod
// of a burst in one: woken by the first pod, the reconciler planned and
// started operations that then competed for the CPU with resolving the
// rest, and a 500-pod burst reached the DSW in three or four slices, each
// a planning pass of its own. Snapshots taken meanwhile see the changes
// made so far, as before.
func (d *DesiredStateOfWorld) Batch(fn func()) {
	d.batches.Add(1)
	defer func() {
		if d.batches.Add(-1) == 0 && d.held.Swap(false) {
			d.changed.Notify()
		}
	}()
	fn()
}

func sameErrors(a, b []*volume.PodVolumeError) bool {
	return slices.EqualFunc(a, b, func(x, y *volume.PodVolumeError) bool {
		return x.Volume == y.Volume && x.Reason == y.Reason && x.Error() == y.Error()
	})
}

// samePodInfo compares pod infos by value: the populator builds them afresh
// for every pass, so their pointer fields differ even when nothing changed.
func samePodInfo(a, b volume.PodInfo) bool {
	return a == b || equality.Semantic.DeepEqual(a, b)
}

// sameSpec compares specs by value: a re-resolved volume gets a new Spec
// (and, for inline volumes, a Volume from the new pod object) even when
// nothing about it changed.
func sameSpec(a, b *volume.Spec) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	return a.Name == b.Name && a.ReadOnly == b.ReadOnly && a.Mode == b.Mode && a.InlineEphemeral == b.InlineEphemeral &&
		sameObject(a.Volume, b.Volume) && sameObject(a.PV, b.PV) && sameObject(a.PVC, b.PVC)
}

func sameObject[T any](a, b *T) bool {
	return a == b || (a != nil && b != nil && equality.Semantic.DeepEqual(a, b))
}

func sameSize(a, b *resource.Quantity) bool {
	if a == nil || b == nil {
		return a == b
	}
	return volume.SizeCmp(a, b) == 0
}

// HasVolume reports whether any pod wants the volume.
func (d *DesiredStateOfWorld) HasVolume(name volume.UniqueName) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	_, ok := d.volumes[name]
	return ok
}
