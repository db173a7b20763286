package populator

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/pathcheck"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

// fakeSource is a source.Source backed by maps. Like real stores it never
// modifies an object it handed out: tests replace objects with Set*.
type fakeSource struct {
	mu      sync.Mutex
	pods    []*v1.Pod
	pvcs    map[string]*v1.PersistentVolumeClaim // "namespace/name"
	pvs     map[string]*v1.PersistentVolume
	pvcErr  map[string]error // lookup errors other than NotFound
	pvErr   map[string]error
	synced  bool
	changed chan struct{}
	// changes records pod changes by key, and any other change as one
	// that may concern every pod, as the real sources do; byKey indexes
	// the pods (nil: to be made again).
	changes source.PodChangeLog
	byKey   map[source.PodKey]*v1.Pod
}

var (
	_ source.Source = (*fakeSource)(nil)
	_ source.Source = fullSource{}
)

// fullSource names no pod changes, leaving the source's own to whoever
// takes them: the populator looks at every pod on every pass.
type fullSource struct{ source.Source }

func (fullSource) TakePodChanges() (bool, map[source.PodKey]struct{}) { return true, nil }

func newFakeSource() *fakeSource {
	return &fakeSource{
		pvcs:    map[string]*v1.PersistentVolumeClaim{},
		pvs:     map[string]*v1.PersistentVolume{},
		pvcErr:  map[string]error{},
		pvErr:   map[string]error{},
		synced:  true,
		changed: make(chan struct{}, 1),
	}
}

func (f *fakeSource) notify() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

func (f *fakeSource) Pods() []*v1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*v1.Pod(nil), f.pods...)
}

func (f *fakeSource) TakePodChanges() (bool, map[source.PodKey]struct{}) { return f.changes.Take() }

func (f *fakeSource) Pod(namespace, name string) (*v1.Pod, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byKey == nil {
		f.byKey = f.index()
	}
	p, ok := f.byKey[source.PodKey{Namespace: namespace, Name: name}]
	return p, ok
}

// index maps the pods by key. f.mu must be held.
func (f *fakeSource) index() map[source.PodKey]*v1.Pod {
	m := make(map[source.PodKey]*v1.Pod, len(f.pods))
	for _, p := range f.pods {
		m[source.KeyOf(p)] = p
	}
	return m
}

func (f *fakeSource) PVC(namespace, name string) (*v1.PersistentVolumeClaim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.pvcErr[namespace+"/"+name]; err != nil {
		return nil, err
	}
	if c, ok := f.pvcs[namespace+"/"+name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("persistentvolumeclaims"), name)
}

func (f *fakeSource) PV(name string) (*v1.PersistentVolume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.pvErr[name]; err != nil {
		return nil, err
	}
	if v, ok := f.pvs[name]; ok {
		return v, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("persistentvolumes"), name)
}

func (f *fakeSource) StorageClass(name string) (*storagev1.StorageClass, error) {
	return nil, apierrors.NewNotFound(storagev1.Resource("storageclasses"), name)
}

func (f *fakeSource) CSIDriver(name string) (*storagev1.CSIDriver, error) {
	return nil, apierrors.NewNotFound(storagev1.Resource("csidrivers"), name)
}

func (f *fakeSource) Run(ctx context.Context) error { <-ctx.Done(); return nil }

func (f *fakeSource) InputErrors() []source.InputError { return nil }

func (f *fakeSource) UnreadInputs() []string { return nil }

func (f *fakeSource) HasSynced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.synced
}

func (f *fakeSource) Changed() <-chan struct{} { return f.changed }

func (f *fakeSource) SetSynced(s bool) {
	f.mu.Lock()
	f.synced = s
	f.mu.Unlock()
	f.notify()
}

// SetPods replaces the pod list.
func (f *fakeSource) SetPods(pods ...*v1.Pod) {
	f.mu.Lock()
	before := f.index()
	f.pods = pods
	after := f.index()
	for key, p := range before {
		if after[key] != p {
			f.changes.Mark(key)
		}
	}
	for key, p := range after {
		if before[key] != p {
			f.changes.Mark(key)
		}
	}
	f.byKey = after
	f.mu.Unlock()
	f.notify()
}

// Add stores objects (pods are appended, or replace a pod with the same UID).
func (f *fakeSource) Add(objs ...any) {
	f.mu.Lock()
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Pod:
			if f.byKey == nil {
				f.byKey = f.index()
			}
			replaced := false
			for i, p := range f.pods {
				if p.UID == o.UID {
					f.changes.Mark(source.KeyOf(p))
					if f.byKey[source.KeyOf(p)] == p {
						delete(f.byKey, source.KeyOf(p))
					}
					f.pods[i], replaced = o, true
				}
			}
			f.changes.Mark(source.KeyOf(o))
			f.byKey[source.KeyOf(o)] = o
			if !replaced {
				f.pods = append(f.pods, o)
			}
		case *v1.PersistentVolumeClaim:
			f.pvcs[o.Namespace+"/"+o.Name] = o
			f.changes.MarkAll()
		case *v1.PersistentVolume:
			f.pvs[o.Name] = o
			f.changes.MarkAll()
		default:
			panic("fakeSource: unknown object")
		}
	}
	f.mu.Unlock()
	f.notify()
}

// Delete removes the pod with pod's UID.
func (f *fakeSource) Delete(pod *v1.Pod) {
	f.mu.Lock()
	f.pods = slices.DeleteFunc(f.pods, func(p *v1.Pod) bool { return p.UID == pod.UID })
	f.changes.Mark(source.KeyOf(pod))
	if f.byKey != nil && f.byKey[source.KeyOf(pod)] == pod {
		delete(f.byKey, source.KeyOf(pod))
	}
	f.mu.Unlock()
	f.notify()
}

func (f *fakeSource) DeletePVC(namespace, name string) {
	f.mu.Lock()
	delete(f.pvcs, namespace+"/"+name)
	f.changes.MarkAll()
	f.mu.Unlock()
	f.notify()
}

func (f *fakeSource) DeletePV(name string) {
	f.mu.Lock()
	delete(f.pvs, name)
	f.changes.MarkAll()
	f.mu.Unlock()
	f.notify()
}

func (f *fakeSource) SetPVCError(namespace, name string, err error) {
	f.mu.Lock()
	if err == nil {
		delete(f.pvcErr, namespace+"/"+name)
	} else {
		f.pvcErr[namespace+"/"+name] = err
	}
	f.changes.MarkAll()
	f.mu.Unlock()
	f.notify()
}

func (f *fakeSource) SetPVError(name string, err error) {
	f.mu.Lock()
	if err == nil {
		delete(f.pvErr, name)
	} else {
		f.pvErr[name] = err
	}
	f.changes.MarkAll()
	f.mu.Unlock()
	f.notify()
}

// countingPlugin wraps a real plugin and counts Attributes calls: one per
// resolution of a volume of its kind.
type countingPlugin struct {
	plugins.Plugin
	calls *atomic.Int64
}

// A plugin that looks at the host in the background (local) is asked
// again until it answers, so that a pass of these tests sees the answer, as
// the agent's next pass would (TestSyncNeverWaitsOnTheHost tests the
// waiting).
func (c countingPlugin) Attributes(spec *volume.Spec) (volume.Attributes, error) {
	c.calls.Add(1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, err := c.Plugin.Attributes(spec)
		if !errors.Is(err, plugins.ErrNotReady) || time.Now().After(deadline) {
			return a, err
		}
		time.Sleep(time.Millisecond)
	}
}

// countingLocal is countingPlugin for the local plugin, keeping its optional
// capabilities (raw block volumes).
type countingLocal struct {
	*local.Plugin
	calls *atomic.Int64
}

func (c countingLocal) Attributes(spec *volume.Spec) (volume.Attributes, error) {
	return countingPlugin{c.Plugin, c.calls}.Attributes(spec)
}

// testPlugins returns the real emptyDir, hostPath and local plugins, each
// counting its Attributes calls in *calls.
func testPlugins(t *testing.T, calls *atomic.Int64) *plugins.Registry {
	t.Helper()
	return testPluginsWrappingHostPath(t, calls, nil)
}

// testPluginsWrappingHostPath is testPlugins with the host path plugin
// wrapped by wrap, if not nil.
func testPluginsWrappingHostPath(t *testing.T, calls *atomic.Int64, wrap func(plugins.Plugin) plugins.Plugin) *plugins.Registry {
	t.Helper()
	if calls == nil {
		calls = &atomic.Int64{}
	}
	host := plugins.Host{Paths: volume.Paths{Root: t.TempDir()}, Mounter: mountutil.New(), NodeName: testNode}
	var hostPath plugins.Plugin = countingPlugin{hostpath.New(host), calls}
	if wrap != nil {
		hostPath = wrap(hostPath)
	}
	return plugins.NewRegistry(
		countingPlugin{emptydir.New(host), calls},
		hostPath,
		// Every answer about a path is checked again in the background
		// at once: host changes reach the next pass but one.
		countingLocal{local.NewWithOptions(host, pathcheck.Options{MaxAge: time.Nanosecond}), calls},
	)
}

// recorder collects events.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) Event(obj events.Object, eventType, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, obj.Kind+" "+obj.Namespace+"/"+obj.Name+" "+eventType+" "+reason+": "+message)
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// observer collects populator observations.
type observer struct {
	mu     sync.Mutex
	passes []int
	errs   []*volume.PodVolumeError
}

func (o *observer) Populated(_ time.Duration, pods int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.passes = append(o.passes, pods)
}

func (o *observer) PodVolumeError(err *volume.PodVolumeError) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, err)
}

func (o *observer) errors() []*volume.PodVolumeError {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*volume.PodVolumeError(nil), o.errs...)
}

// Object builders.

const (
	testNode = "node-1"
	testNS   = "ns"
)

// podOpt changes a pod fixture.
type podOpt func(p *v1.Pod)

// newPod returns a running pod whose one container mounts every volume
// given with withVolume (unless told otherwise).
func newPod(name string, opts ...podOpt) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, UID: types.UID(name + "-uid")},
		Spec: v1.PodSpec{
			NodeName:   testNode,
			Containers: []v1.Container{{Name: "main", Image: "busybox"}},
		},
		Status: v1.PodStatus{Phase: v1.PodRunning},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// withVolume adds a volume mounted by the main container.
func withVolume(vol v1.Volume) podOpt {
	return func(p *v1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, vol)
		c := &p.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: vol.Name, MountPath: "/mnt/" + vol.Name})
	}
}

// withDevice adds a volume used as a raw block device by the main container.
func withDevice(vol v1.Volume) podOpt {
	return func(p *v1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, vol)
		c := &p.Spec.Containers[0]
		c.VolumeDevices = append(c.VolumeDevices, v1.VolumeDevice{Name: vol.Name, DevicePath: "/dev/" + vol.Name})
	}
}

// withUnusedVolume adds a volume no container uses.
func withUnusedVolume(vol v1.Volume) podOpt {
	return func(p *v1.Pod) { p.Spec.Volumes = append(p.Spec.Volumes, vol) }
}

func withPhase(phase v1.PodPhase) podOpt {
	return func(p *v1.Pod) { p.Status.Phase = phase }
}

func emptyDirVol(name string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}
}

func hostPathVol(name, path string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path}}}
}

func claimVol(name, claim string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{
		PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}}
}

func ephemeralVol(name string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{
		VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{},
	}}}
}

// boundPair returns a PVC and a local PV at path bound to each other.
func boundPair(claim, pvName, path string) (*v1.PersistentVolumeClaim, *v1.PersistentVolume) {
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: claim, UID: types.UID(claim + "-uid")},
		Spec:       v1.PersistentVolumeClaimSpec{VolumeName: pvName},
		Status:     v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound},
	}
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: v1.PersistentVolumeSpec{
			Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: path}},
			ClaimRef:               &v1.ObjectReference{Namespace: testNS, Name: claim, UID: pvc.UID},
			VolumeMode:             ptr.To(v1.PersistentVolumeFilesystem),
		},
	}
	return pvc, pv
}

// ownPVC makes pod the controller of pvc (a generic ephemeral volume's
// claim).
func ownPVC(pvc *v1.PersistentVolumeClaim, pod *v1.Pod) *v1.PersistentVolumeClaim {
	pvc.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true),
	}}
	return pvc
}
