package model

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/nodeinfo"
	"github.com/volume-agent/volume-agent/csi/registration"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/internal/disklimit"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/image"
	"github.com/volume-agent/volume-agent/reconciler/housekeeping"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/ui/timeline"
	"github.com/volume-agent/volume-agent/volume"
)

// Input is everything the page shows, gathered at one moment. The caches'
// snapshots are immutable; the other lists are copies.
type Input struct {
	Now          time.Time
	Node         string
	Mode         string
	SourcesReady bool
	DSW          *cache.DesiredSnapshot
	ASW          *cache.ActualSnapshot
	Operations   []operations.OperationStatus
	Drivers      []registry.Driver
	Sockets      []registration.SocketStatus
	// NodeInfo is what the cluster knows of each driver (cluster mode).
	NodeInfo []nodeinfo.DriverStatus
	// ProbePeriod is how often drivers are probed (for their health).
	ProbePeriod time.Duration
	Orphans     []housekeeping.OrphanStatus
	// LocalVolumes is nil when the local volume provisioner is off.
	LocalVolumes *localpv.Document
	InputErrors  []source.InputError
	// Events are the recent events, oldest first.
	Events []events.Event
	// History is the operation timeline (nil: none).
	History History
	// EmptyDirLimits is how disk emptyDirs' sizeLimit is enforced.
	EmptyDirLimits disklimit.Status
	// Usage is the last measured usage of pods' volumes, by pod UID and
	// the pod's name for the volume (package usage); OverLimit the pods'
	// warnings of local storage over its limits (explain.Limits).
	Usage     map[types.UID]map[string]VolumeUsage
	OverLimit map[types.UID][]explain.Warning
}

// History is the operation timeline (timeline.Ring).
type History interface {
	ForPod(pod types.UID, volumes []volume.UniqueName) []timeline.Record
}

// MaxEvents bounds the events of a Page.
const MaxEvents = 50

// Build makes the node's page.
func Build(in Input) *Page {
	ix := index(in)
	p := &Page{
		Node: in.Node, Mode: in.Mode, Now: in.Now, SourcesReady: in.SourcesReady, EmptyDirLimits: in.EmptyDirLimits,
		Namespaces: []string{}, Pods: []Pod{}, Operations: []Operation{}, Drivers: []Driver{}, Orphans: []Orphan{},
		Events: []events.Event{},
	}
	p.Pods = ix.pods()
	p.Operations = ix.operations(func(operations.OperationStatus) bool { return true })
	p.Drivers, p.Sockets = drivers(in)
	for _, o := range in.Orphans {
		p.Orphans = append(p.Orphans, Orphan{Path: o.Path, PodUID: o.PodUID, Reason: o.Reason, Since: o.Since})
	}
	if in.LocalVolumes != nil {
		p.LocalVolumes = localVolumes(in.LocalVolumes)
	}
	for _, e := range in.InputErrors {
		p.InputErrors = append(p.InputErrors, InputError(e))
	}
	for i := len(in.Events) - 1; i >= 0 && len(p.Events) < MaxEvents; i-- {
		p.Events = append(p.Events, in.Events[i])
	}
	namespaces := map[string]bool{}
	for _, pod := range p.Pods {
		namespaces[pod.Namespace] = true
	}
	for ns := range namespaces {
		p.Namespaces = append(p.Namespaces, ns)
	}
	slices.Sort(p.Namespaces)
	p.Summary = summarize(p)
	return p
}

func summarize(p *Page) Summary {
	s := Summary{Pods: len(p.Pods), Drivers: len(p.Drivers), Orphans: len(p.Orphans), VolumeStates: []StateCount{}}
	counts := map[State]int{}
	for _, pod := range p.Pods {
		switch pod.State {
		case PodReady:
			s.PodsReady++
		case PodError:
			s.PodsError++
		case PodWaiting:
			s.PodsWaiting++
		case PodTerminating:
			s.PodsTerminating++
		}
		for _, v := range pod.Volumes {
			s.Volumes++
			counts[v.State]++
		}
	}
	for _, st := range States {
		if counts[st] > 0 {
			s.VolumeStates = append(s.VolumeStates, StateCount{State: st, Count: counts[st]})
		}
	}
	for _, o := range p.Operations {
		if o.State == "backoff" {
			s.OperationsBackoff++
		} else {
			s.OperationsRunning++
		}
	}
	for _, d := range p.Drivers {
		if d.Health != healthy {
			s.DriversUnhealthy++
		}
	}
	return s
}

// indexed is the input with its operations by key and the actual
// state's mounts by pod.
type indexed struct {
	Input
	ops    map[operations.Key]*operations.OperationStatus
	mounts map[types.UID][]actualMount
}

// actualMount is one pod's mount of a volume in the actual state.
type actualMount struct {
	name volume.UniqueName
	vol  *cache.ActualVolume
	pod  *cache.ActualPodMount
}

func index(in Input) *indexed {
	if in.DSW == nil {
		in.DSW = &cache.DesiredSnapshot{}
	}
	if in.ASW == nil {
		in.ASW = &cache.ActualSnapshot{}
	}
	ix := &indexed{Input: in, ops: make(map[operations.Key]*operations.OperationStatus, len(in.Operations))}
	for i := range in.Operations {
		o := &in.Operations[i]
		k := operations.Key{Volume: o.Volume}
		if o.Pod != nil {
			k.Pod = o.Pod.UID
		}
		ix.ops[k] = o
	}
	ix.mounts = map[types.UID][]actualMount{}
	for name, av := range in.ASW.Volumes() {
		for uid, m := range av.Pods.All() {
			ix.mounts[uid] = append(ix.mounts[uid], actualMount{name: name, vol: av, pod: m})
		}
	}
	return ix
}

// pods lists the desired pods, and the pods only the actual state still
// has (being torn down), sorted by namespace and name.
func (ix *indexed) pods() []Pod {
	out := make([]Pod, 0, ix.DSW.PodsLen())
	for _, dp := range ix.DSW.Pods() {
		out = append(out, ix.desiredPod(dp))
	}
	gone := map[types.UID]*Pod{}
	for uid, mounts := range ix.mounts {
		if ix.DSW.Pod(uid) != nil {
			continue // listed with the pod (desiredPod)
		}
		p := &Pod{PodRef: mounts[0].pod.Pod, State: PodTerminating, Reason: "gone from the desired state: its volumes are unmounted"}
		for _, m := range mounts {
			p.Volumes = append(p.Volumes, ix.unwanted(m.name, m.vol, m.pod))
		}
		gone[uid] = p
	}
	for _, p := range gone {
		sortVolumes(p.Volumes)
		for _, v := range p.Volumes {
			if v.State == Error {
				p.Reason = v.Name + ": " + v.Reason
				break
			}
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return out
}

func sortVolumes(vs []PodVolume) {
	slices.SortFunc(vs, func(a, b PodVolume) int { return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Volume, b.Volume)) })
}

// desiredPod is a pod of the DSW with its volumes as its explanation
// (explain.Explain) gives them, and mounts of volumes it no longer wants.
// The pod's state and readiness are the explanation's; the page adds where
// each volume is in its life (attached, device mounted, mounted...) and
// since when.
func (ix *indexed) desiredPod(dp *cache.DesiredPod) Pod {
	p := Pod{PodRef: dp.Pod.PodRef, Volumes: []PodVolume{}}
	uid := dp.Pod.UID
	ex := explain.Explain(dp, ix.DSW, ix.ASW, ix)
	history := ix.history(uid, dp.Volumes)
	// One entry per volume the pod's names resolve to (two names of one
	// claim share it), and one per name that does not resolve.
	byVolume := map[volume.UniqueName]int{}
	for _, e := range ex.Volumes {
		if e.Unique != "" {
			if i, ok := byVolume[e.Unique]; ok {
				v := &p.Volumes[i]
				v.Name += ", " + e.Name
				if severity(e.Status) > severity(v.Status) {
					v.Status, v.Ready, v.Reason = e.Status, false, reasonText(e)
					if e.Status == explain.Failing || e.Status == explain.NeedsChange {
						v.State = errorState(v.State)
					}
				}
				continue
			}
			if dv := ix.DSW.Volume(e.Unique); dv != nil && dv.Pods.At(uid) != nil {
				byVolume[e.Unique] = len(p.Volumes)
				p.Volumes = append(p.Volumes, ix.desiredVolume(dp, dv, dv.Pods.At(uid), e, history))
				continue
			}
		}
		v := PodVolume{Name: e.Name, Volume: e.Unique, Plugin: e.Plugin, State: Desired, Since: dp.Since,
			Status: e.Status, Ready: e.Ready(), Reason: reasonText(e), ReadOnly: e.ReadOnly}
		if e.Status == explain.NeedsChange || e.Status == explain.Failing {
			v.State = Error
		}
		p.Volumes = append(p.Volumes, v)
	}
	// Mounts of volumes the pod no longer wants.
	for _, m := range ix.mounts[uid] {
		if !ix.DSW.HasPodVolume(m.name, uid) {
			p.Volumes = append(p.Volumes, ix.unwanted(m.name, m.vol, m.pod))
		}
	}
	sortVolumes(p.Volumes)
	for i := range p.Volumes {
		if u, ok := ix.Usage[uid][p.Volumes[i].Name]; ok {
			p.Volumes[i].Usage = &u
		}
	}
	p.Warnings = ex.Warnings
	p.State, p.Since = podState(ex.Status), time.Time{}
	var worst *PodVolume
	for i := range p.Volumes {
		v := &p.Volumes[i]
		if v.Status != "" && v.Status != explain.Ready && (worst == nil || severity(v.Status) > severity(worst.Status)) {
			worst = v
		}
		if v.Ready && v.Since.After(p.Since) {
			p.Since = v.Since // ready since its last volume was
		}
	}
	switch {
	case len(ex.Problems) > 0:
		p.Since, p.Reason = dp.Since, errorText(ex.Problems[0])
	case worst != nil:
		p.Reason = worst.Name + ": " + worst.Reason
		p.Since = dp.Since
		if worst.State == Error {
			p.Since = worst.Since
		}
	case len(ex.Warnings) > 0:
		// Ready, with a warning: the reason says it.
		p.Reason = ex.Warnings[0].Reason + ": " + ex.Warnings[0].Message
	}
	if p.Since.IsZero() {
		p.Since = dp.Since
	}
	return p
}

// podState is the page's word for a pod in the explanation's state.
func podState(s explain.Status) PodState {
	switch s {
	case explain.Ready:
		return PodReady
	case explain.Waiting:
		return PodWaiting
	}
	return PodError
}

func severity(s explain.Status) int {
	return slices.Index([]explain.Status{explain.Ready, explain.Waiting, explain.Failing, explain.NeedsChange}, s)
}

// errorState: a volume that fails is shown as an error unless it is still
// mounted (it stays mounted while its pod wants it).
func errorState(s State) State {
	if s == Mounted {
		return s
	}
	return Error
}

// reasonText is an explained volume's reason with its details.
func reasonText(e explain.Volume) string {
	if e.Message == "" {
		return e.Reason
	}
	return e.Reason + ": " + e.Message
}

// OverLimit implements explain.Limits from the warnings gathered.
func (ix *indexed) OverLimit(pod types.UID) []explain.Warning { return ix.Input.OverLimit[pod] }

// LastError implements explain.Failures from the operations listed (so the
// pods and the operations of a page agree).
func (ix *indexed) LastError(key operations.Key) error {
	o := ix.ops[key]
	if o == nil || o.State != "backoff" || o.LastError == "" {
		return nil
	}
	err := errors.New(o.LastError)
	if o.Waiting {
		return volume.Waiting(err)
	}
	return err
}

func (ix *indexed) history(pod types.UID, vols []volume.UniqueName) []timeline.Record {
	if ix.History == nil {
		return nil
	}
	return ix.History.ForPod(pod, vols)
}

// desiredVolume is a volume a pod wants: where it is in its life, with
// the explanation's readiness and reason.
func (ix *indexed) desiredVolume(dp *cache.DesiredPod, dv *cache.DesiredVolume, dpv *cache.DesiredPodVolume, e explain.Volume, history []timeline.Record) PodVolume {
	uid := dp.Pod.UID
	v := PodVolume{
		Name: e.Name, Volume: dv.Name, Plugin: dv.Plugin,
		Source: Describe(dpv.Spec, dv.Plugin), State: Desired, Since: dpv.Since,
		Status: e.Status, Ready: e.Ready(), Reason: reasonText(e), ReadOnly: e.ReadOnly,
	}
	av := ix.ASW.Volume(dv.Name)
	var m *cache.ActualPodMount
	if av != nil {
		m = av.Pods.At(uid)
		v.DevicePath, v.DeviceMountPath = av.DevicePath, av.DeviceMountPath
	}
	if m != nil {
		v.MountPath = m.MountPath
	}
	podOp, volOp := ix.ops[operations.Key{Volume: dv.Name, Pod: uid}], ix.ops[operations.Key{Volume: dv.Name}]
	failed := podOp
	if failed == nil || failed.State != "backoff" {
		failed = volOp
	}
	switch {
	case m != nil && m.State == cache.Mounted:
		v.State, v.Since = Mounted, m.Since
	case e.Status == explain.Failing || e.Status == explain.NeedsChange:
		v.State, v.Since = Error, dp.Since
		if failed != nil && failed.State == "backoff" {
			v.Since = failingSince(history, failed, uid)
		}
	case m != nil && m.State == cache.MountUncertain:
		v.State, v.Since = Uncertain, m.Since
	case av != nil && av.DeviceState == cache.DeviceMountUncertain:
		v.State, v.Reason = Uncertain, "the last device mount may have been left half done; it is retried"
		v.Since = lastSuccess(history, operations.ForMode(operations.OpMountDevice, dv.Attributes.Block), "", dv.Name, dpv.Since)
	case av != nil && av.DeviceState == cache.DeviceGloballyMounted:
		v.State = DeviceMounted
		v.Since = lastSuccess(history, operations.ForMode(operations.OpMountDevice, dv.Attributes.Block), "", dv.Name, dpv.Since)
	case av != nil && av.AttachState == cache.Attached:
		v.State = Attached
		v.Since = lastSuccess(history, operations.OpVerifyAttached, "", dv.Name, dpv.Since)
	}
	for _, o := range []*operations.OperationStatus{podOp, volOp} {
		if o != nil {
			v.Operation = o.Operation + " " + o.State
			if o.RetryAt != nil {
				t := *o.RetryAt
				v.RetryAt = &t
			}
			break
		}
	}
	if v.Status == explain.Waiting && e.Message == "" && v.Operation != "" {
		v.Reason += ": " + v.Operation // what the wait is doing
	}
	if v.Status == explain.Waiting && v.Operation == "" && !ix.SourcesReady {
		v.Reason += " (waiting for the sources to be read)"
	}
	return v
}

// unwanted is a pod's mount of a volume no pod of that UID wants any more.
func (ix *indexed) unwanted(name volume.UniqueName, av *cache.ActualVolume, m *cache.ActualPodMount) PodVolume {
	v := PodVolume{
		Name: m.SpecName, Volume: name, Plugin: av.Plugin, Source: Describe(m.Spec, av.Plugin),
		State: Unmounting, MountPath: m.MountPath, DevicePath: av.DevicePath, DeviceMountPath: av.DeviceMountPath,
		Reason: "no longer wanted",
	}
	if o := ix.ops[operations.Key{Volume: name, Pod: m.Pod.UID}]; o != nil {
		v.Operation, v.Since = o.Operation+" "+o.State, o.Since
		if o.State == "backoff" {
			v.State, v.Reason = Error, o.Operation+" failed: "+o.LastError
			v.Since = failingSince(ix.history(m.Pod.UID, nil), o, m.Pod.UID)
			if o.RetryAt != nil {
				t := *o.RetryAt
				v.RetryAt = &t
			}
		}
	}
	if m.Reconstructed {
		v.Reason = "found on disk after a restart; no pod wants it"
	}
	return v
}

// failingSince is when the failures of op began: the first of the
// failures in a row the timeline still holds, or the last one.
func failingSince(history []timeline.Record, op *operations.OperationStatus, pod types.UID) time.Time {
	since := op.Since
	if op.Pod == nil {
		pod = ""
	}
	for i := len(history) - 1; i >= 0; i-- {
		r := history[i]
		if r.Volume != op.Volume || r.Pod.UID != pod || string(r.Op) != op.Operation {
			continue
		}
		if r.Outcome == timeline.Succeeded {
			break
		}
		since = r.End
	}
	return since
}

// lastSuccess is when op last succeeded on the volume (for pod, or
// volume-wide), or fallback.
func lastSuccess(history []timeline.Record, op operations.Op, pod types.UID, vol volume.UniqueName, fallback time.Time) time.Time {
	for i := len(history) - 1; i >= 0; i-- {
		r := history[i]
		if r.Volume == vol && r.Pod.UID == pod && r.Op == op && r.Outcome == timeline.Succeeded {
			return r.End
		}
	}
	return fallback
}

// errorText is a pod volume error without the pod and volume it names
// (the page shows them already), with its reason.
func errorText(e *volume.PodVolumeError) string {
	msg := e.Error()
	if e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Reason == "" {
		return msg
	}
	return e.Reason + ": " + msg
}

// operations lists the pending operations that keep says, with the inner
// volume name.
func (ix *indexed) operations(keep func(operations.OperationStatus) bool) []Operation {
	out := []Operation{}
	for _, o := range ix.Operations {
		if !keep(o) {
			continue
		}
		op := Operation{
			Volume: o.Volume, Pod: o.Pod, Operation: o.Operation, Plugin: o.Plugin, State: o.State,
			Since: o.Since, LastError: o.LastError, RetryAt: o.RetryAt,
		}
		if dv := ix.DSW.Volume(o.Volume); dv != nil {
			op.VolumeName = dv.SpecName
		} else if av := ix.ASW.Volume(o.Volume); av != nil && av.Spec != nil {
			op.VolumeName = av.Spec.Name
		}
		out = append(out, op)
	}
	return out
}

const (
	healthy      = "healthy"
	unresponsive = "unresponsive"
)

func drivers(in Input) ([]Driver, []Socket) {
	out := []Driver{}
	for _, d := range in.Drivers {
		dr := Driver{
			Name: d.Name, Endpoint: d.Endpoint, Source: d.Source, Version: d.VendorVersion, Health: healthy,
			RegisteredAt: d.RegisteredAt, LastProbe: d.LastProbe, Capabilities: d.NodeCapabilities,
		}
		for _, n := range in.NodeInfo {
			if n.Driver == d.Name {
				dr.InCluster, dr.InClusterError = string(n.State), n.LastError
			}
		}
		last := d.LastProbe
		if last.IsZero() {
			last = d.RegisteredAt
		}
		// A probe can take 10 s; a driver that missed one is already
		// worth a look.
		if in.ProbePeriod > 0 && !last.IsZero() && in.Now.Sub(last) > in.ProbePeriod+in.ProbePeriod/2+10*time.Second {
			dr.Health = unresponsive
		}
		out = append(out, dr)
	}
	var sockets []Socket
	for _, s := range in.Sockets {
		if s.State == registration.StateRegistered || s.State == registration.StateIgnored {
			continue
		}
		so := Socket{Path: s.Path, State: string(s.State), Driver: s.Driver, LastError: s.LastError, Since: s.Since}
		if !s.NextRetry.IsZero() {
			t := s.NextRetry
			so.NextRetry = &t
		}
		sockets = append(sockets, so)
	}
	return out, sockets
}

func localVolumes(doc *localpv.Document) *LocalVolumes {
	lv := &LocalVolumes{Error: doc.Error, Volumes: []LocalVolume{}}
	for _, v := range doc.Volumes {
		lv.Volumes = append(lv.Volumes, LocalVolume{
			Class: v.Class, Path: v.Path, PV: v.PV, Claim: v.Claim, State: string(v.State), Since: v.Since,
			Reason: v.Reason, LastError: v.LastError, Capacity: v.Capacity,
		})
	}
	return lv
}

// Describe says what a volume is, the way a pod's author wrote it.
func Describe(spec *volume.Spec, plugin string) string {
	switch {
	case spec == nil:
		return plugin
	case spec.PV != nil:
		s := "PV " + spec.PV.Name
		if spec.PVC != nil {
			s = "PVC " + spec.ClaimRef() + " → " + s
		}
		switch src := spec.PV.Spec; {
		case src.Local != nil:
			s += " (local " + src.Local.Path + ")"
		case src.CSI != nil:
			s += " (CSI " + src.CSI.Driver + ")"
		}
		if spec.IsBlock() {
			s += ", block"
		}
		return s
	case spec.Volume != nil:
		return describeInline(spec, plugin)
	}
	return plugin
}

func describeInline(spec *volume.Spec, plugin string) string {
	switch v := spec.Volume.VolumeSource; {
	case v.EmptyDir != nil:
		if v.EmptyDir.Medium != "" {
			return fmt.Sprintf("emptyDir (%s)", v.EmptyDir.Medium)
		}
		return "emptyDir"
	case v.HostPath != nil:
		return "hostPath " + v.HostPath.Path
	case v.CSI != nil:
		return "CSI ephemeral (" + v.CSI.Driver + ")"
	case v.ConfigMap != nil:
		return "configMap " + v.ConfigMap.Name
	case v.Secret != nil:
		return "secret " + v.Secret.SecretName
	case v.DownwardAPI != nil:
		return "downwardAPI"
	case v.Projected != nil:
		return "projected"
	case v.Ephemeral != nil:
		return "ephemeral"
	case v.Image != nil:
		// No path on the node: the runtime pulls and mounts it.
		return fmt.Sprintf("image %s (pull %s, mounted by the runtime)", v.Image.Reference, image.PullPolicy(v.Image))
	}
	return plugin
}
