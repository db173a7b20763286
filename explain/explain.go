// Package explain owns the one answer to "can this pod have its volumes, and
// if not, why": for a pod, ready or not, and per volume the reason, whether
// it goes away on its own (transient) or needs a change to the pod or to
// what it refers to, and whether containers get the volume read-only.
//
// It is a pure function of the desired and actual snapshots and of the
// executor's failures. The pod condition (status/podstatus), the operator
// page and `volume-agent status` (ui/model), the runtime API
// (runtimeapi/server), the readiness metrics and the pod events all ask it;
// none of them decides on its own.
package explain

import (
	"cmp"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// Status is where a volume (or a pod) stands.
type Status string

const (
	// Ready: the pod can have it.
	Ready Status = "ready"
	// Waiting: work is under way or something outside the agent has not
	// happened yet (an attachment, a claim being read); it goes away on
	// its own.
	Waiting Status = "waiting"
	// Failing: the last attempt failed and is retried with backoff; it may
	// go away on its own (a driver that comes back) or may not.
	Failing Status = "failing"
	// NeedsChange: the pod's spec or the objects it refers to must change
	// (a claim that does not exist, a volume type the agent does not
	// serve, an invalid sub-path).
	NeedsChange Status = "needsChange"
)

// Transient reports whether a volume in this state may become ready with
// no change to the pod or to what it refers to.
func (s Status) Transient() bool { return s == Waiting || s == Failing }

// severity orders states: a pod is in the worst state of its volumes.
func (s Status) severity() int {
	switch s {
	case Waiting:
		return 1
	case Failing:
		return 2
	case NeedsChange:
		return 3
	}
	return 0
}

// Reasons a volume is not ready that the agent's own progress gives. Any
// other reason is the classification of a volume.PodVolumeError (PVCNotFound,
// InvalidSubPath, NotReadYet...), named as in the agent's events and metrics.
const (
	// ReasonWaitingForAttach: the volume is not attached to the node yet.
	ReasonWaitingForAttach = "WaitingForAttach"
	// ReasonWaitingForDevice: the volume's device is not mounted (staged)
	// yet.
	ReasonWaitingForDevice = "WaitingForDeviceMount"
	// ReasonWaitingForMount: the volume is not set up for the pod yet.
	ReasonWaitingForMount = "WaitingForMount"
	// ReasonWaitingForSubPaths: the volume is set up, the sub-paths the
	// containers mount are not prepared yet.
	ReasonWaitingForSubPaths = "WaitingForSubPaths"
	// ReasonMountFailed: the last attempt to attach, stage or set up the
	// volume failed; it is retried.
	ReasonMountFailed = "MountFailed"
	// ReasonSubPathFailed: preparing a sub-path failed; it is retried.
	ReasonSubPathFailed = "SubPathFailed"
)

// Reasons of warnings: a pod that uses more local storage than its limits
// allow, as the kubelet's eviction manager finds it (localStorageEviction).
// A node without a kubelet has nobody to evict the pod; the warning does not
// make it unready either: its volumes work, and taking its readiness away
// would stop its traffic, not its writes (enforcement, where in force, stops
// those).
const (
	// ReasonEmptyDirOverLimit: an emptyDir uses more than its sizeLimit.
	ReasonEmptyDirOverLimit = "EmptyDirOverLimit"
	// ReasonEphemeralStorageOverLimit: the pod's local ephemeral volumes
	// use more than its containers' ephemeral-storage limits summed.
	ReasonEphemeralStorageOverLimit = "EphemeralStorageOverLimit"
)

// Warning is something wrong with a pod that does not make it unready.
type Warning struct {
	// Volume is the pod's name for the volume; empty for the pod as a
	// whole.
	Volume  string `json:"volume,omitempty"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Limits says which pods use more local storage than their limits allow.
// It is an optional capability of the Failures given to Explain (the agent
// gives one value that is both), so that every surface asking Explain
// with the agent's failures sees the same warnings.
type Limits interface {
	OverLimit(pod types.UID) []Warning
}

// Failures gives the last error of an operation key that waits in backoff
// (operations.Executor). A volume.IsWaiting error is a normal wait, not a
// failure.
type Failures interface {
	LastError(key operations.Key) error
}

// Volume is one volume of a pod, by the name the pod gives it.
type Volume struct {
	// Name is the pod's name for the volume.
	Name string `json:"name"`
	// Unique is the volume it resolved to; empty while it has not.
	Unique volume.UniqueName `json:"unique,omitempty"`
	Plugin string            `json:"plugin,omitempty"`
	Status Status            `json:"status"`
	// Reason classifies a volume that is not ready (empty when it is);
	// Message says the details.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// ReadOnly: containers get the volume read-only, because the pod says
	// so or because the plugin gives its volumes read-only anyway
	// (volume.Attributes.ReadOnlyForContainers).
	ReadOnly bool `json:"readOnly,omitempty"`
	// Block: a raw block volume (volumeDevices).
	Block bool `json:"block,omitempty"`
	// NoHostPath: the runtime mounts the volume itself (an image
	// volume); ready means resolved, and there is no path on the node
	// (volume.Attributes.NoHostPath).
	NoHostPath bool `json:"noHostPath,omitempty"`
}

// Ready reports whether the pod can have the volume.
func (v *Volume) Ready() bool { return v.Status == Ready }

// Pod is the explanation of one pod.
type Pod struct {
	// Ready: every volume of the pod is ready and nothing is wrong with
	// the pod itself.
	Ready bool `json:"ready"`
	// Status is the worst state of the pod's volumes and problems.
	Status Status `json:"status"`
	// Volumes are every volume the pod names, sorted by name.
	Volumes []Volume `json:"volumes"`
	// Problems are errors of the pod that name no volume (a pod UID that
	// cannot be a directory name); each needs a change.
	Problems []*volume.PodVolumeError `json:"-"`
	// Warnings leave the pod as ready as it is: local storage over its
	// limits (failures implementing Limits).
	Warnings []Warning `json:"warnings,omitempty"`
}

// Volume finds a volume of the pod by the pod's name for it.
func (p *Pod) Volume(name string) (*Volume, bool) {
	i, ok := slices.BinarySearchFunc(p.Volumes, name, func(v Volume, n string) int { return cmp.Compare(v.Name, n) })
	if !ok {
		return nil, false
	}
	return &p.Volumes[i], true
}

// NotReady lists the volumes that are not ready, in name order.
func (p *Pod) NotReady() []Volume {
	var out []Volume
	for _, v := range p.Volumes {
		if !v.Ready() {
			out = append(out, v)
		}
	}
	return out
}

// ErrorStatus classifies a pod volume error found while resolving a
// volume: a claim or volume not read from the API server yet is a wait, a
// failed lookup is retried, anything else needs a change. Events and
// metrics of new errors ask it too.
func ErrorStatus(e *volume.PodVolumeError) Status {
	switch {
	case e.Transient && volume.IsWaiting(e.Err):
		return Waiting
	case e.Transient:
		return Failing
	}
	return NeedsChange
}

// Explain explains a pod of dsw. failures may be nil; when it implements
// Limits, the pod's warnings come from it.
func Explain(p *cache.DesiredPod, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, failures Failures) Pod {
	out := Pod{Status: Ready, Volumes: []Volume{}}
	byName := map[string]int{}
	add := func(v Volume) {
		if i, ok := byName[v.Name]; ok {
			// A name both resolved and failing now: the error wins.
			if v.Status.severity() > out.Volumes[i].Status.severity() {
				out.Volumes[i].Status, out.Volumes[i].Reason, out.Volumes[i].Message = v.Status, v.Reason, v.Message
			}
			return
		}
		byName[v.Name] = len(out.Volumes)
		out.Volumes = append(out.Volumes, v)
	}
	uid := p.Pod.UID
	for _, name := range p.Volumes {
		dv := dsw.Volume(name)
		if dv == nil || dv.Pods.At(uid) == nil {
			// Not in the same snapshot (never the case for a snapshot the
			// DSW made): not ready, under the only name known.
			add(Volume{Name: string(name), Unique: name, Status: Waiting, Reason: ReasonWaitingForMount, Message: "not resolved yet"})
			continue
		}
		dpv := dv.Pods.At(uid)
		v := resolved(p, dv, dpv, asw, failures)
		for _, n := range dpv.OuterNames {
			v.Name = n
			add(v)
		}
	}
	for _, e := range p.Errors {
		if e.Volume == "" {
			out.Problems = append(out.Problems, e)
			continue
		}
		add(Volume{Name: e.Volume, Status: ErrorStatus(e), Reason: e.Reason, Message: errMessage(e)})
	}
	for _, n := range p.Unresolved {
		add(Volume{Name: n, Status: Waiting, Reason: ReasonWaitingForMount, Message: "not resolved yet"})
	}
	slices.SortFunc(out.Volumes, func(a, b Volume) int { return cmp.Compare(a.Name, b.Name) })
	for _, v := range out.Volumes {
		if v.Status.severity() > out.Status.severity() {
			out.Status = v.Status
		}
	}
	if len(out.Problems) > 0 {
		out.Status = NeedsChange
	}
	out.Ready = out.Status == Ready
	if l, ok := failures.(Limits); ok {
		out.Warnings = l.OverLimit(uid)
	}
	return out
}

// PodReady is Explain(p, dsw, asw, nil).Ready without building the
// explanation: what is asked after every reconciler pass for every pod
// (metrics) must cost no allocation. TestPodReadyIsExplainReady keeps the two
// the same.
func PodReady(p *cache.DesiredPod, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot) bool {
	_, ready := PodReadyBlocker(p, dsw, asw)
	return ready
}

// PodReadyBlocker is PodReady, and when the pod is not ready, the first of
// its volumes found not ready ("" when the pod's own entry says so:
// errors, unresolved volumes). Until that volume's or the pod's entries
// change, the pod stays not ready: the metrics ask again only then.
func PodReadyBlocker(p *cache.DesiredPod, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot) (volume.UniqueName, bool) {
	if len(p.Errors) > 0 || len(p.Unresolved) > 0 {
		return "", false
	}
	for _, name := range p.Volumes {
		var dpv *cache.DesiredPodVolume
		if dv := dsw.Volume(name); dv != nil {
			dpv = dv.Pods.At(p.Pod.UID)
		}
		if dpv == nil {
			return name, false
		}
		m, _ := asw.PodMount(name, p.Pod.UID)
		if !cache.PodVolumeReady(dpv.SubPaths, m) {
			return name, false
		}
	}
	return "", true
}

// resolved explains a volume the pod's name resolved to.
func resolved(p *cache.DesiredPod, dv *cache.DesiredVolume, dpv *cache.DesiredPodVolume, asw *cache.ActualSnapshot, failures Failures) Volume {
	v := Volume{Unique: dv.Name, Plugin: dv.Plugin, Block: dpv.Spec != nil && dpv.Spec.IsBlock(),
		ReadOnly: dv.Attributes.ReadOnlyForContainers || (dpv.Spec != nil && dpv.Spec.ReadOnly), NoHostPath: dv.Attributes.NoHostPath}
	uid := p.Pod.UID
	av := asw.Volume(dv.Name)
	var m *cache.ActualPodMount
	if av != nil {
		m = av.Pods.At(uid)
	}
	if cache.PodVolumeReady(dpv.SubPaths, m) {
		v.Status = Ready
		return v
	}
	podErr := lastError(failures, operations.Key{Volume: dv.Name, Pod: uid})
	volErr := lastError(failures, operations.Key{Volume: dv.Name})
	// A failure of the pod's own operation says more than one of the
	// volume's; a normal wait is not a failure.
	failure, wait := podErr, error(nil)
	if failure == nil {
		failure = volErr
	}
	if failure != nil && volume.IsWaiting(failure) {
		failure, wait = nil, failure
	}
	mounted := m != nil && m.State == cache.Mounted
	switch {
	case mounted && failure != nil:
		v.Status, v.Reason, v.Message = Failing, ReasonSubPathFailed, failure.Error()
	case mounted:
		v.Status, v.Reason, v.Message = Waiting, ReasonWaitingForSubPaths, fmt.Sprintf("%d sub-paths to prepare", len(dpv.SubPaths))
	case failure != nil:
		v.Status, v.Reason, v.Message = Failing, ReasonMountFailed, failure.Error()
	case cache.AttachNeeded(dv.Attributes, av):
		v.Status, v.Reason = Waiting, ReasonWaitingForAttach
	case cache.DeviceMountNeeded(dv.Attributes, av):
		v.Status, v.Reason = Waiting, ReasonWaitingForDevice
	default:
		v.Status, v.Reason = Waiting, ReasonWaitingForMount
		switch {
		case m != nil && m.State == cache.MountUncertain:
			v.Message = "the last mount may have been left half done; it is retried"
		case m != nil:
			v.Message = "mount " + string(m.State)
		}
	}
	if wait != nil && v.Message == "" {
		v.Message = wait.Error()
	}
	return v
}

func lastError(failures Failures, key operations.Key) error {
	if failures == nil {
		return nil
	}
	return failures.LastError(key)
}

// errMessage is a pod volume error without the pod and volume it names
// (every surface shows them already).
func errMessage(e *volume.PodVolumeError) string {
	if e.Err != nil {
		return e.Err.Error()
	}
	return e.Error()
}
