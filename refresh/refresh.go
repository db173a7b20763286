// Package refresh keeps the content of pod volumes current. It knows what
// the API volumes of each pod are built from (ConfigMaps, Secrets, trust
// bundles, the pod's own labels, annotations and resources, tokens), and
// when one of those changes, or a refresh a plugin asked for falls due (a
// token at 80 % of its life, a CSI volume with requiresRepublish), it gives
// exactly the affected pod volumes a new content generation in the desired
// state (cache.DesiredStateOfWorld.RefreshPodVolume). The planner then
// plans their set up again, as for any other difference between desired
// and actual state; setting such a volume up again rewrites only its
// content, so an update reaches every pod within the time of one operation
// instead of the kubelet's next pod sync. It never writes the actual state
// nor touches the executor: the set up records the generation it wrote,
// and a newer generation is a new attempt whatever the last one's backoff.
//
// Nothing is polled: changes arrive as events (object watches, manifest
// changes, pod updates from the populator) and timers.
package refresh

import (
	"context"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/plugins/apivolume"
	"github.com/volume-agent/volume-agent/populator/containerenv"
	"github.com/volume-agent/volume-agent/volume"
)

// Desired gives a pod volume a new content generation (the DSW), reporting
// it and whether the pod wants such a volume.
type Desired interface {
	RefreshPodVolume(name volume.UniqueName, pod types.UID) (uint64, bool)
}

// Watches starts and stops the watches of what pods read (cluster mode);
// a no-op where every change is seen anyway (standalone mode).
type Watches interface {
	SetPodObjects(pod types.UID, namespace string, configMaps, secrets []string, bundles []*v1.ClusterTrustBundleProjection)
	ForgetPod(pod types.UID)
}

// TokenCache drops the tokens of pods that left.
type TokenCache interface {
	ForgetPod(pod types.UID)
}

// Observer learns how long refreshes took (metrics).
type Observer interface {
	// Refreshed: a volume's content caught up with a change after took.
	Refreshed(plugin string, took time.Duration)
}

// Options configure a Refresher.
type Options struct {
	Desired  Desired
	Watches  Watches
	Tokens   TokenCache
	Observer Observer
	Clock    clock.WithTicker
	Log      *zap.Logger
	// PodCerts drops the pod certificates' keys of pods that left.
	PodCerts TokenCache
}

// Kinds of objects, as ObjectChanged is told.
const (
	KindConfigMap          = "ConfigMap"
	KindSecret             = "Secret"
	KindClusterTrustBundle = "ClusterTrustBundle"
	// KindPodCertificateRequest: the name is the UID of the pod the
	// request is for, and every volume of the pod with a podCertificate
	// projection is marked.
	KindPodCertificateRequest = "PodCertificateRequest"
)

type podVolume struct {
	pod    types.UID
	volume volume.UniqueName
}

type object struct {
	kind, namespace, name string
}

// podState is a registered pod: its API volumes and the metadata their
// content may read.
type podState struct {
	meta    *apivolume.Pod
	volumes map[volume.UniqueName]apivolume.Refs
}

// Refresher is safe for concurrent use.
type Refresher struct {
	opts Options
	wake *notify.Signal

	mu       sync.Mutex
	pods     map[types.UID]*podState
	byObject map[object]map[podVolume]struct{}
	// stale is when a pod volume's content first fell behind, and want
	// the content generation whose writing catches it up (the last one
	// the DSW handed out for it).
	stale map[podVolume]time.Time
	want  map[podVolume]uint64
	// due are the refreshes plugins asked for.
	due map[podVolume]time.Time
}

// New returns a Refresher; Run serves its timers.
func New(o Options) *Refresher {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return &Refresher{
		opts: o, wake: notify.New(),
		pods: map[types.UID]*podState{}, byObject: map[object]map[podVolume]struct{}{},
		want: map[podVolume]uint64{}, stale: map[podVolume]time.Time{}, due: map[podVolume]time.Time{},
	}
}

// PodUpdated registers a pod (again, after any change to it) with the
// volumes its containers use. A change of labels, annotations or
// resources that a downwardAPI item reads marks that volume.
func (r *Refresher) PodUpdated(pod *v1.Pod, used []*v1.Volume) {
	next := &podState{volumes: map[volume.UniqueName]apivolume.Refs{}}
	var all apivolume.Refs
	for _, vol := range used {
		plugin := apivolume.PluginName(&vol.VolumeSource)
		if plugin == "" {
			continue
		}
		refs := apivolume.RefsOf(&vol.VolumeSource)
		next.volumes[volume.PodScopedName(plugin, pod.UID, vol.Name)] = refs
		all.ConfigMaps = append(all.ConfigMaps, refs.ConfigMaps...)
		all.Secrets = append(all.Secrets, refs.Secrets...)
		all.TrustBundles = append(all.TrustBundles, refs.TrustBundles...)
		all.Labels, all.Annotations = all.Labels || refs.Labels, all.Annotations || refs.Annotations
	}

	// The objects that containers' subPathExpr read are watched for the
	// pod too (one set of keys per pod); they refresh no volume.
	envConfigMaps, envSecrets := containerenv.Refs(pod)

	r.mu.Lock()
	old := r.pods[pod.UID]
	if len(next.volumes) == 0 {
		r.mu.Unlock()
		if old != nil {
			r.PodRemoved(pod.UID)
		}
		if r.opts.Watches != nil && len(envConfigMaps)+len(envSecrets) > 0 {
			r.opts.Watches.SetPodObjects(pod.UID, pod.Namespace, unique(envConfigMaps), unique(envSecrets), nil)
		}
		return
	}
	next.meta = apivolume.PodOf(pod, all)
	if old != nil {
		r.unindex(pod.UID, old)
	}
	r.pods[pod.UID] = next
	r.index(pod.UID, next)
	var marked []podVolume
	if old != nil {
		for name, refs := range next.volumes {
			if apivolume.PodChangeMatters(refs, old.meta, next.meta) {
				marked = append(marked, podVolume{pod.UID, name})
			}
		}
	}
	r.mu.Unlock()

	if r.opts.Watches != nil {
		r.opts.Watches.SetPodObjects(pod.UID, pod.Namespace, unique(append(envConfigMaps, all.ConfigMaps...)), unique(append(envSecrets, all.Secrets...)), all.TrustBundles)
	}
	r.mark(marked, "pod metadata changed")
}

func unique(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func (r *Refresher) objectsOf(uid types.UID, ns string, refs apivolume.Refs) []object {
	var out []object
	if refs.PodCertificates {
		out = append(out, object{kind: KindPodCertificateRequest, name: string(uid)})
	}
	for _, n := range refs.ConfigMaps {
		out = append(out, object{KindConfigMap, ns, n})
	}
	for _, n := range refs.Secrets {
		out = append(out, object{KindSecret, ns, n})
	}
	if len(refs.TrustBundles) > 0 {
		// Trust bundles change rarely and are selected by name or by
		// signer: any change refreshes every volume that has one.
		out = append(out, object{kind: KindClusterTrustBundle})
	}
	return out
}

func (r *Refresher) index(uid types.UID, st *podState) {
	for name, refs := range st.volumes {
		for _, o := range r.objectsOf(uid, st.meta.Namespace, refs) {
			set, ok := r.byObject[o]
			if !ok {
				set = map[podVolume]struct{}{}
				r.byObject[o] = set
			}
			set[podVolume{uid, name}] = struct{}{}
		}
	}
}

func (r *Refresher) unindex(uid types.UID, st *podState) {
	for name, refs := range st.volumes {
		for _, o := range r.objectsOf(uid, st.meta.Namespace, refs) {
			if set, ok := r.byObject[o]; ok {
				delete(set, podVolume{uid, name})
				if len(set) == 0 {
					delete(r.byObject, o)
				}
			}
		}
	}
}

// PodRemoved forgets a pod that left the node (or terminated): its
// watches, tokens and pending refreshes.
func (r *Refresher) PodRemoved(uid types.UID) {
	r.mu.Lock()
	st, ok := r.pods[uid]
	if ok {
		r.unindex(uid, st)
		delete(r.pods, uid)
	}
	for _, m := range []map[podVolume]time.Time{r.stale, r.due} {
		for pv := range m {
			if pv.pod == uid {
				delete(m, pv)
			}
		}
	}
	for pv := range r.want {
		if pv.pod == uid {
			delete(r.want, pv)
		}
	}
	r.mu.Unlock()
	if r.opts.Watches != nil {
		r.opts.Watches.ForgetPod(uid)
	}
	if r.opts.Tokens != nil {
		r.opts.Tokens.ForgetPod(uid)
	}
	if r.opts.PodCerts != nil {
		r.opts.PodCerts.ForgetPod(uid)
	}
}

// Pod implements apivolume.PodMetadata.
func (r *Refresher) Pod(uid types.UID) (*apivolume.Pod, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.pods[uid]
	if !ok {
		return nil, false
	}
	return st.meta, true
}

// ObjectChanged marks every pod volume built from the object. For
// ClusterTrustBundles the name is ignored; for PodCertificateRequests it
// is the UID of the pod they are for.
func (r *Refresher) ObjectChanged(kind, namespace, name string) {
	o := object{kind, namespace, name}
	switch kind {
	case KindClusterTrustBundle:
		o = object{kind: kind}
	case KindPodCertificateRequest:
		o = object{kind: kind, name: name}
	}
	r.mu.Lock()
	set := r.byObject[o]
	pvs := make([]podVolume, 0, len(set))
	for pv := range set {
		pvs = append(pvs, pv)
	}
	r.mu.Unlock()
	if len(pvs) > 0 {
		r.opts.Log.Debug("object changed", zap.String("kind", kind), zap.String("namespace", namespace), zap.String("name", name), zap.Int("podVolumes", len(pvs)))
	}
	r.mark(pvs, kind+" changed")
}

// mark gives each pod volume a new content generation in the DSW, which
// has the planner set it up again, and notes since when its content is
// behind. A pod volume the DSW does not have yet is set up later from
// the sources as they are then.
func (r *Refresher) mark(pvs []podVolume, why string) {
	if len(pvs) == 0 {
		return
	}
	now := r.opts.Clock.Now()
	// Under r.mu, so that a set up of the new generation cannot report
	// (MountDone) before the generation is known here. The DSW never
	// calls back into the Refresher, and its signal does not block.
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pv := range pvs {
		gen, ok := r.opts.Desired.RefreshPodVolume(pv.volume, pv.pod)
		if !ok {
			continue
		}
		r.want[pv] = gen
		if _, ok := r.stale[pv]; !ok {
			r.stale[pv] = now
		}
	}
}

// MountDone is told that SetUp of a pod volume succeeded and wrote content
// generation gen: if that is the last generation handed out for it, its
// refresh is complete (an older one is followed by another set up, which
// the planner plans from the DSW). refreshAt, if set, schedules the next
// refresh.
func (r *Refresher) MountDone(name volume.UniqueName, pod types.UID, gen uint64, refreshAt time.Time) {
	pv := podVolume{pod, name}
	r.mu.Lock()
	var took time.Duration
	since, wasStale := r.stale[pv]
	caughtUp := wasStale && gen >= r.want[pv]
	if caughtUp {
		// The clock only when it is needed: most set ups were never stale.
		took = r.opts.Clock.Now().Sub(since)
		delete(r.stale, pv)
		delete(r.want, pv)
	}
	if !refreshAt.IsZero() {
		r.due[pv] = refreshAt
	} else {
		delete(r.due, pv)
	}
	r.mu.Unlock()
	if caughtUp && r.opts.Observer != nil {
		r.opts.Observer.Refreshed(pluginOf(name), took)
	}
	if !refreshAt.IsZero() {
		r.wake.Notify()
	}
}

// pluginOf is the plugin part of a pod-scoped unique name.
func pluginOf(name volume.UniqueName) string {
	s := string(name)
	// "<plugin>/<uid>-<spec>" where plugin is "kubernetes.io/<x>".
	n := 0
	for i := range len(s) {
		if s[i] == '/' {
			n++
			if n == 2 {
				return s[:i]
			}
		}
	}
	return s
}

// Run fires the scheduled refreshes until ctx ends.
func (r *Refresher) Run(ctx context.Context) {
	for {
		next, ok := r.fireDue()
		var timer clock.Timer
		var timerC <-chan time.Time
		if ok {
			timer = r.opts.Clock.NewTimer(next.Sub(r.opts.Clock.Now()))
			timerC = timer.C()
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-r.wake.C():
		case <-timerC:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// fireDue marks the pod volumes whose refresh is due and returns when the
// next one is.
func (r *Refresher) fireDue() (time.Time, bool) {
	now := r.opts.Clock.Now()
	var fire []podVolume
	var next time.Time
	r.mu.Lock()
	for pv, at := range r.due {
		if !at.After(now) {
			fire = append(fire, pv)
			delete(r.due, pv)
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	r.mu.Unlock()
	r.mark(fire, "refresh due")
	return next, !next.IsZero()
}

// Stats counts what the Refresher tracks.
type Stats struct {
	Pods      int `json:"pods"`
	Volumes   int `json:"volumes"`
	Objects   int `json:"objects"`
	Stale     int `json:"stale"`
	Scheduled int `json:"scheduled"`
}

// Stats returns the current counts.
func (r *Refresher) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{Pods: len(r.pods), Objects: len(r.byObject), Stale: len(r.stale), Scheduled: len(r.due)}
	for _, st := range r.pods {
		s.Volumes += len(st.volumes)
	}
	return s
}
