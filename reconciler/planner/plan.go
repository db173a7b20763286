package planner

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// phase orders operations: unmount, then mount, then device teardown
// (operations.Kind.Phase).
func phase(op operations.Op) operations.Phase {
	return operations.KindOf(op).Phase
}

// Action is one thing the node should do, as plain data: the planner's
// output and the dispatcher's input. Its Target is what the operation works
// on: the desired spec for mount-side actions, the recorded one for teardown
// (nil if unknown after a restart); the pod for per-pod ones; the pods
// waiting for a volume-wide one (attach, device mount, expansion), so its
// failures can be reported to them.
type Action struct {
	Op operations.Op
	operations.Target
	// Reason says why, for people reading logs and tests.
	Reason string
}

// Options are the facts outside the two caches that decisions depend on.
type Options struct {
	// SourcesReady is true once every source was read completely and the
	// DSW reflects it. Until then nothing is torn down: a pod that is not in
	// the DSW yet may simply not have been read.
	SourcesReady bool
	// OrphanCleanupAllowed is true when state reconstructed from disk that
	// no pod wants may be torn down: the sources are ready and none of their
	// inputs is unreadable (a manifest that never parsed may hold the pod
	// that owns it).
	OrphanCleanupAllowed bool
}

// Plan computes what the node should do to make the actual state match the
// desired one. It is a pure function of its inputs: no I/O, no clock, no
// locks. Actions come in phase order (unmount, mount, device teardown) and,
// within a phase, sorted by volume and pod, so the result is deterministic.
// Whether an action can start now (another operation on the volume, backoff)
// is the executor's business, not the plan's.
func Plan(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, opts Options) []Action {
	var out []Action
	eachVolume(dsw, asw, func(_ volume.UniqueName, dv *cache.DesiredVolume, av *cache.ActualVolume) {
		out = planVolume(out, dsw, dv, av, opts)
	})
	return sortActions(out)
}

// eachVolume calls fn once for every volume either snapshot knows, with its
// entry in each (nil where it has none).
func eachVolume(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, fn func(volume.UniqueName, *cache.DesiredVolume, *cache.ActualVolume)) {
	for name, av := range asw.Volumes() {
		fn(name, dsw.Volume(name), av)
	}
	for name, dv := range dsw.Volumes() {
		if asw.Volume(name) == nil {
			fn(name, dv, nil)
		}
	}
}

// planVolume appends what one volume needs, given its desired entry (nil
// if no pod wants it) and its actual one (nil if nothing is recorded). A
// volume's actions depend on nothing else but the options and, for its
// pods' mounts, on whether those pods are protected (protectedPod): the
// incremental planner relies on it.
//
// The phases are planned mounts first (the order within a volume does not
// matter: callers sort): planMounts already looks up every wanted pod's
// mount, and when those are all the mounts there are, none is unwanted and
// planUnmounts need not walk them again (one map walk per volume in every
// pass of a storm).
func planVolume(out []Action, dsw *cache.DesiredSnapshot, dv *cache.DesiredVolume, av *cache.ActualVolume, opts Options) []Action {
	wantedMounts := -1
	if dv != nil {
		out, wantedMounts = planMounts(dv, av, opts.SourcesReady, out)
	}
	if opts.SourcesReady && av != nil {
		if wantedMounts != av.Pods.Len() {
			out = planUnmounts(dsw, dv, av, opts.OrphanCleanupAllowed, out)
		}
		out = planDeviceTeardown(dv != nil, av, opts.OrphanCleanupAllowed, out)
	}
	return out
}

// sortActions orders actions by phase, volume, pod and operation. A plan
// has at most one action per phase, volume and pod (one per pod mount, one
// volume-wide per volume and phase), so the order is total and an unstable
// sort gives the one result: in a storm a stable sort of thousands of
// actions was a third of every pass. It sorts indices and then moves each
// Action once, in place: an Action is a few hundred bytes, and swapping
// them through sort.SliceStable's reflection was most of a busy pass's cost.
func sortActions(actions []Action) []Action {
	var s sorter
	return s.sort(actions)
}

// sorter is sortActions with its index buffers kept for the next sort
// (the incremental planner sorts on every full pass).
type sorter struct {
	idx    []int32
	phases []operations.Phase
}

func (s *sorter) sort(actions []Action) []Action {
	if len(actions) < 2 {
		return actions
	}
	// Each action's phase is looked up in the table once, not in every
	// comparison.
	s.idx, s.phases = slices.Grow(s.idx[:0], len(actions)), slices.Grow(s.phases[:0], len(actions))
	idx, phases := s.idx[:len(actions)], s.phases[:len(actions)]
	for i := range idx {
		idx[i], phases[i] = int32(i), phase(actions[i].Op)
	}
	slices.SortFunc(idx, func(i, j int32) int { return compareActions(phases[i], &actions[i], phases[j], &actions[j]) })
	// Apply the permutation in place, cycle by cycle: actions[i] takes
	// actions[idx[i]]; a done slot is marked by idx[i] == i.
	for start := range idx {
		if idx[start] == int32(start) {
			continue
		}
		held := actions[start]
		i := start
		for {
			j := int(idx[i])
			idx[i] = int32(i)
			if j == start {
				actions[i] = held
				break
			}
			actions[i] = actions[j]
			i = j
		}
	}
	return actions
}

// compareActions is the order of sortActions; pa and pb are the phases of
// a and b.
func compareActions(pa operations.Phase, a *Action, pb operations.Phase, b *Action) int {
	if c := cmp.Compare(pa, pb); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Volume, b.Volume); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Pod.UID, b.Pod.UID); c != 0 {
		return c
	}
	return cmp.Compare(a.Op, b.Op)
}

// planUnmounts: phase 1. Every mounted or uncertain pod mount that no pod
// wants is unmounted, except for pods that still exist but have volumes that
// could not be resolved (an API outage must never unmount a running pod's
// volume because its claim could not be read). dv is the volume's desired
// entry, nil if no pod wants it.
func planUnmounts(dsw *cache.DesiredSnapshot, dv *cache.DesiredVolume, av *cache.ActualVolume, orphans bool, out []Action) []Action {
	for uid, m := range av.Pods.All() {
		wanted := false
		if dv != nil {
			_, wanted = dv.Pods.Get(uid)
		}
		if !cache.PodUnmountNeeded(wanted, m) {
			continue
		}
		if protectedPod(dsw, uid) || (m.Reconstructed && !orphans) {
			continue
		}
		out = append(out, Action{
			Op: operations.ForMode(operations.OpUnmountVolume, av.Attributes.Block), Target: operations.Target{Volume: av.Name, Plugin: av.Plugin, Attributes: av.Attributes,
				Pod: volume.PodInfo{PodRef: m.Pod}, Spec: m.Spec, SpecName: m.SpecName, MountPath: m.MountPath},
			Reason: unmountReason(m.State),
		})
	}
	return out
}

// unmountReason is the Reason of an unmount, built without allocating for
// the known states: a storm plans thousands per pass.
func unmountReason(s cache.MountState) string {
	switch s {
	case cache.Mounted:
		return "no longer desired (mount Mounted)"
	case cache.MountUncertain:
		return "no longer desired (mount Uncertain)"
	}
	return "no longer desired (mount " + string(s) + ")"
}

func protectedPod(dsw *cache.DesiredSnapshot, uid types.UID) bool {
	p := dsw.Pod(uid)
	ok := p != nil
	return ok && len(p.Unresolved) > 0
}

// planMounts: phase 2. For a desired volume: attach, then mount the device
// once, then set it up for every pod that does not have it mounted (for a raw
// block volume: map the device, then map it for every pod). State
// reconstructed after a restart is left alone until the sources are ready:
// the first ready pass adopts what is in place, without any operation.
// It also returns how many of the volume's actual pod mounts belong to pods
// that want it, or -1 if it did not look at the pods.
func planMounts(dv *cache.DesiredVolume, av *cache.ActualVolume, ready bool, out []Action) ([]Action, int) {
	if !ready && av != nil && av.DeviceReconstructed {
		return out, -1
	}
	volumeAction := func(op operations.Op, reason string) Action {
		return Action{Op: op, Target: operations.Target{Volume: dv.Name, Plugin: dv.Plugin, Attributes: dv.Attributes, Spec: dv.Spec, SpecName: dv.SpecName,
			Waiting: podRefs(dv), DesiredSize: dv.DesiredSize}, Reason: reason}
	}
	if cache.AttachNeeded(dv.Attributes, av) {
		return append(out, volumeAction(operations.OpVerifyAttached, "not attached")), -1
	}
	if cache.DeviceMountNeeded(dv.Attributes, av) {
		reason := "device not mounted"
		if av != nil && av.DeviceState == cache.DeviceMountUncertain {
			reason = "device mount uncertain"
		}
		return append(out, volumeAction(operations.ForMode(operations.OpMountDevice, dv.Attributes.Block), reason)), -1
	}
	expand := cache.ExpansionNeeded(dv.DesiredSize, dv.Attributes, av)
	if expand && dv.Attributes.DeviceMountable && !av.ExpandAfterPublish && !cache.AnyPodMounted(av) {
		// Offline expansion: grow the staged filesystem before any pod
		// gets it.
		return append(out, volumeAction(operations.OpExpandVolume, expansionReason(dv, av)+" (before publishing)")), -1
	}
	wantedMounts := 0
	for uid, dp := range dv.Pods.All() {
		var m *cache.ActualPodMount
		if av != nil {
			m = av.Pods.At(uid)
		}
		if m != nil {
			wantedMounts++
		}
		if !cache.PodMountNeeded(m, dp.ContentGeneration) {
			if cache.SubPathsNeeded(dp.SubPaths, m, dp.ContentGeneration) {
				out = append(out, Action{
					Op: operations.OpPrepareSubPaths, Target: operations.Target{Volume: dv.Name, Plugin: dv.Plugin, Attributes: dv.Attributes,
						Pod: dp.Pod, Spec: dp.Spec, SpecName: dv.SpecName, SubPaths: dp.SubPaths, ContentGeneration: dp.ContentGeneration}, Reason: subPathsReason(dp, m),
				})
			}
			continue
		}
		// Its content is older than the DSW's (what it is built from
		// changed, or it was found after a restart).
		reason := "remount required"
		switch {
		case m == nil:
			reason = "not mounted"
		case m.State != cache.Mounted:
			if m.Reconstructed && !ready {
				continue
			}
			reason = "mount uncertain"
		}
		out = append(out, Action{
			Op: operations.ForMode(operations.OpMountVolume, dv.Attributes.Block), Target: operations.Target{Volume: dv.Name, Plugin: dv.Plugin, Attributes: dv.Attributes,
				Pod: dp.Pod, Spec: dp.Spec, SpecName: dv.SpecName, ContentGeneration: dp.ContentGeneration}, Reason: reason,
		})
	}
	if expand {
		out = append(out, volumeAction(operations.OpExpandVolume, expansionReason(dv, av)))
	}
	return out, wantedMounts
}

func subPathsReason(dp *cache.DesiredPodVolume, m *cache.ActualPodMount) string {
	if m.SubPathsOutdated {
		return "volume set up again since its sub-paths were prepared"
	}
	return fmt.Sprintf("sub-paths changed (%d wanted, %d prepared)", len(dp.SubPaths), len(m.SubPaths))
}

func expansionReason(dv *cache.DesiredVolume, av *cache.ActualVolume) string {
	have := "unknown"
	if av.Size != nil {
		have = volume.SizeString(av.Size)
	}
	return "filesystem must grow to " + volume.SizeString(dv.DesiredSize) + " (node made it fit " + have + ")"
}

// planDeviceTeardown: phase 3. A volume no pod wants and no pod has mounted
// gets its device unmounted, then is detached.
func planDeviceTeardown(wanted bool, av *cache.ActualVolume, orphans bool, out []Action) []Action {
	if av.DeviceReconstructed && !orphans {
		return out
	}
	a := Action{Target: operations.Target{Volume: av.Name, Plugin: av.Plugin, Attributes: av.Attributes, Spec: av.Spec}}
	switch {
	case cache.DeviceUnmountNeeded(wanted, av):
		a.Op, a.Reason = operations.ForMode(operations.OpUnmountDevice, av.Attributes.Block), "no pod uses it (device "+string(av.DeviceState)+")"
	case cache.DetachNeeded(wanted, av):
		a.Op, a.Reason = operations.OpDetachVolume, "no pod uses it (attach "+string(av.AttachState)+")"
	default:
		return out
	}
	return append(out, a)
}

// podRefs lists the pods of a desired volume in a stable order.
func podRefs(dv *cache.DesiredVolume) []volume.PodRef {
	out := make([]volume.PodRef, 0, dv.Pods.Len())
	for _, p := range dv.Pods.All() {
		out = append(out, p.Pod.PodRef)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out
}
