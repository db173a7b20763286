package refresh

import (
	"context"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/volume"
)

// recorder fakes the DSW (RefreshPodVolume hands out generations, except
// for the pod volumes in absent) and records what else the Refresher does.
type recorder struct {
	mu      sync.Mutex
	marked  []string
	gen     uint64
	absent  map[volume.UniqueName]bool
	objects map[types.UID][]string
	forgot  []types.UID
	tokens  []types.UID
	took    []time.Duration
}

func (r *recorder) RefreshPodVolume(name volume.UniqueName, pod types.UID) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.absent[name] {
		return 0, false
	}
	r.marked = append(r.marked, string(name))
	r.gen++
	return r.gen, true
}

func (r *recorder) SetPodObjects(pod types.UID, ns string, cms, secrets []string, bundles []*v1.ClusterTrustBundleProjection) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all []string
	for _, c := range cms {
		all = append(all, "cm:"+ns+"/"+c)
	}
	for _, s := range secrets {
		all = append(all, "secret:"+ns+"/"+s)
	}
	r.objects[pod] = all
}

func (r *recorder) ForgetPod(pod types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgot = append(r.forgot, pod)
}

type tokenRecorder struct{ r *recorder }

func (t tokenRecorder) ForgetPod(pod types.UID) {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	t.r.tokens = append(t.r.tokens, pod)
}

func (r *recorder) Refreshed(_ string, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.took = append(r.took, took)
}

// takeMarked returns and clears the marked volumes, sorted.
func (r *recorder) takeMarked() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.marked
	r.marked = nil
	sort.Strings(out)
	return out
}

func newRefresher() (*Refresher, *recorder, *clocktesting.FakeClock) {
	rec := &recorder{objects: map[types.UID][]string{}, absent: map[volume.UniqueName]bool{}}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	r := New(Options{Desired: rec, Watches: rec, Tokens: tokenRecorder{rec}, Observer: rec, Clock: clk})
	return r, rec, clk
}

func cmVolume(name, cm string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: cm}}}}
}

func secretVolume(name, secret string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: secret}}}
}

func labelsVolume(name string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
		{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
	}}}}
}

func newPod(uid string, labels map[string]string, vols ...v1.Volume) (*v1.Pod, []*v1.Volume) {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-" + uid, Namespace: "ns", UID: types.UID(uid), Labels: labels}}
	p.Spec.Volumes = vols
	used := make([]*v1.Volume, len(vols))
	for i := range vols {
		used[i] = &p.Spec.Volumes[i]
	}
	return p, used
}

func TestObjectChangeMarksExactlyItsVolumes(t *testing.T) {
	r, rec, _ := newRefresher()
	empty := v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}
	r.PodUpdated(newPod("a", nil, cmVolume("config", "shared"), secretVolume("creds", "a-secret"), empty))
	r.PodUpdated(newPod("b", nil, cmVolume("config", "shared"), cmVolume("own", "b-only")))

	if got := rec.objects["a"]; !slices.Equal(got, []string{"cm:ns/shared", "secret:ns/a-secret"}) {
		t.Errorf("watches of pod a: %v", got)
	}
	if got := rec.objects["b"]; !slices.Equal(got, []string{"cm:ns/b-only", "cm:ns/shared"}) {
		t.Errorf("watches of pod b: %v", got)
	}

	r.ObjectChanged(KindConfigMap, "ns", "shared")
	want := []string{"kubernetes.io/configmap/a-config", "kubernetes.io/configmap/b-config"}
	if got := rec.takeMarked(); !slices.Equal(got, want) {
		t.Errorf("marked %v, want %v", got, want)
	}
	r.ObjectChanged(KindSecret, "ns", "a-secret")
	if got := rec.takeMarked(); !slices.Equal(got, []string{"kubernetes.io/secret/a-creds"}) {
		t.Errorf("marked %v", got)
	}
	r.ObjectChanged(KindConfigMap, "other", "shared")
	r.ObjectChanged(KindSecret, "ns", "shared")
	if got := rec.takeMarked(); len(got) != 0 {
		t.Errorf("objects no pod uses marked %v", got)
	}

	r.PodRemoved("a")
	r.ObjectChanged(KindConfigMap, "ns", "shared")
	if got := rec.takeMarked(); !slices.Equal(got, []string{"kubernetes.io/configmap/b-config"}) {
		t.Errorf("after pod a left: marked %v", got)
	}
	if !slices.Contains(rec.forgot, "a") || !slices.Contains(rec.tokens, "a") {
		t.Errorf("pod a's watches and tokens not released: %v %v", rec.forgot, rec.tokens)
	}
	if s := r.Stats(); s.Pods != 1 || s.Volumes != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestPodMetadataChanges(t *testing.T) {
	r, rec, _ := newRefresher()
	p, used := newPod("a", map[string]string{"app": "web"}, labelsVolume("info"), cmVolume("config", "cm"))
	r.PodUpdated(p, used)
	if m, ok := r.Pod("a"); !ok || m.Labels["app"] != "web" || m.Annotations != nil {
		t.Fatalf("metadata %+v: labels kept (read), annotations not (unread)", m)
	}

	p2 := p.DeepCopy()
	p2.Annotations = map[string]string{"x": "y"}
	r.PodUpdated(p2, used)
	if got := rec.takeMarked(); len(got) != 0 {
		t.Errorf("an annotation change marked %v, but no item reads annotations", got)
	}
	p3 := p2.DeepCopy()
	p3.Labels["app"] = "db"
	r.PodUpdated(p3, used)
	if got := rec.takeMarked(); !slices.Equal(got, []string{"kubernetes.io/downward-api/a-info"}) {
		t.Errorf("a label change marked %v", got)
	}
	if m, _ := r.Pod("a"); m.Labels["app"] != "db" {
		t.Errorf("metadata not updated: %v", m.Labels)
	}

	// Resources, read by resourceFieldRef.
	res := v1.Volume{Name: "res", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
		{Path: "cpu", ResourceFieldRef: &v1.ResourceFieldSelector{ContainerName: "c", Resource: "limits.cpu"}},
	}}}}
	q, used := newPod("b", nil, res)
	q.Spec.Containers = []v1.Container{{Name: "c"}}
	r.PodUpdated(q, used)
	q2 := q.DeepCopy()
	q2.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceCPU: resource.MustParse("2")}
	r.PodUpdated(q2, used)
	if got := rec.takeMarked(); !slices.Equal(got, []string{"kubernetes.io/downward-api/b-res"}) {
		t.Errorf("a resize marked %v", got)
	}
}

// TestRefreshLatency: a pod volume's refresh is complete once a set up
// wrote the last generation the DSW handed out for it; one that wrote an
// older one (the sources changed while it ran) leaves it stale, and the
// planner plans the next set up from the DSW. The latency counts from the
// first change.
func TestRefreshLatency(t *testing.T) {
	r, rec, clk := newRefresher()
	r.PodUpdated(newPod("a", nil, cmVolume("config", "cm")))
	name := volume.UniqueName("kubernetes.io/configmap/a-config")

	r.ObjectChanged(KindConfigMap, "ns", "cm")
	first := rec.gen
	clk.Step(100 * time.Millisecond)
	r.ObjectChanged(KindConfigMap, "ns", "cm") // while SetUp runs
	last := rec.gen
	if got := rec.takeMarked(); len(got) != 2 || last <= first {
		t.Fatalf("two changes gave generations %d, %d (marked %v): want two, increasing", first, last, got)
	}
	clk.Step(100 * time.Millisecond)
	r.MountDone(name, "a", first, time.Time{})
	if len(rec.took) != 0 || r.Stats().Stale != 1 {
		t.Fatalf("content of an older generation counted as caught up: latencies %v, stats %+v", rec.took, r.Stats())
	}
	clk.Step(50 * time.Millisecond)
	r.MountDone(name, "a", last, time.Time{})
	if len(rec.took) != 1 || rec.took[0] != 250*time.Millisecond {
		t.Errorf("refresh latency %v, want 250ms from the first change", rec.took)
	}
	if s := r.Stats(); s.Stale != 0 {
		t.Errorf("stats %+v: nothing stale", s)
	}

	// A pod volume the DSW does not have (yet) is set up from its sources
	// as they are then: nothing is stale.
	rec.absent[name] = true
	r.ObjectChanged(KindConfigMap, "ns", "cm")
	if got := rec.takeMarked(); len(got) != 0 || r.Stats().Stale != 0 {
		t.Errorf("marked %v, stats %+v: want nothing for a pod volume the DSW lacks", got, r.Stats())
	}
}

func TestScheduledRefresh(t *testing.T) {
	r, rec, clk := newRefresher()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	name := volume.UniqueName("kubernetes.io/projected/a-kube-api-access")
	r.MountDone(name, "a", 0, clk.Now().Add(48*time.Minute))
	waitFor(t, func() bool { return clk.HasWaiters() })
	clk.Step(47 * time.Minute)
	if got := rec.takeMarked(); len(got) != 0 {
		t.Fatalf("refreshed early: %v", got)
	}
	clk.Step(time.Minute)
	waitFor(t, func() bool { return len(rec.snapshot()) == 1 })
	if got := rec.takeMarked(); !slices.Equal(got, []string{string(name)}) {
		t.Errorf("marked %v", got)
	}
	// A refresh scheduled for a pod that then left never fires.
	r.MountDone(name, "b", 0, clk.Now().Add(time.Minute))
	r.PodRemoved("b")
	clk.Step(2 * time.Minute)
	if s := r.Stats(); s.Scheduled != 0 {
		t.Errorf("stats %+v", s)
	}
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.marked)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}

// The objects that containers' subPathExpr read are watched for the pod
// (with its API volumes' or alone), and changing them refreshes no volume.
func TestSubPathExprObjectsWatched(t *testing.T) {
	r, rec, _ := newRefresher()
	envOf := func(p *v1.Pod) *v1.Pod {
		p.Spec.Containers = []v1.Container{{Name: "app",
			Env:          []v1.EnvVar{{Name: "D", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "env-cm"}, Key: "k"}}}},
			EnvFrom:      []v1.EnvFromSource{{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "env-secret"}}}},
			VolumeMounts: []v1.VolumeMount{{Name: "v", MountPath: "/v", SubPathExpr: "$(D)"}}}}
		return p
	}
	withVolume, used := newPod("a", nil, cmVolume("config", "shared"))
	r.PodUpdated(envOf(withVolume), used)
	if got := rec.objects["a"]; !slices.Equal(got, []string{"cm:ns/env-cm", "cm:ns/shared", "secret:ns/env-secret"}) {
		t.Errorf("watches of pod a: %v", got)
	}
	alone, used := newPod("b", nil)
	r.PodUpdated(envOf(alone), used)
	if got := rec.objects["b"]; !slices.Equal(got, []string{"cm:ns/env-cm", "secret:ns/env-secret"}) {
		t.Errorf("watches of pod b (no API volume): %v", got)
	}
	r.ObjectChanged(KindConfigMap, "ns", "env-cm")
	if got := rec.takeMarked(); len(got) != 0 {
		t.Errorf("an environment's object refreshed volumes: %v", got)
	}
	// Without subPathExpr, nothing of the environment is read.
	plain, used := newPod("c", nil)
	plain = envOf(plain)
	plain.Spec.Containers[0].VolumeMounts[0].SubPathExpr = ""
	r.PodUpdated(plain, used)
	if got, ok := rec.objects["c"]; ok {
		t.Errorf("watches of a pod without subPathExpr: %v", got)
	}
}

// A PodCertificateRequest's change marks the volumes of its pod that hold
// podCertificate projections, nothing else; a pod that leaves has its keys
// dropped.
func TestPodCertificateRequestChangeMarksItsPod(t *testing.T) {
	r, rec, _ := newRefresher()
	var certs []types.UID
	r.opts.PodCerts = forgetFunc(func(uid types.UID) { certs = append(certs, uid) })
	certVolume := func(name string) v1.Volume {
		return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{PodCertificate: &v1.PodCertificateProjection{SignerName: "example.com/s", KeyType: "ED25519", CredentialBundlePath: "b"}}}}}}
	}
	r.PodUpdated(newPod("a", nil, certVolume("tls"), cmVolume("config", "shared")))
	r.PodUpdated(newPod("b", nil, certVolume("tls")))
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"a", []string{"kubernetes.io/projected/a-tls"}},
		{"b", []string{"kubernetes.io/projected/b-tls"}},
		{"c", nil},
	} {
		r.ObjectChanged(KindPodCertificateRequest, "", tc.name)
		if got := rec.takeMarked(); !slices.Equal(got, tc.want) {
			t.Errorf("request of pod %s changed: marked %v, want %v", tc.name, got, tc.want)
		}
	}
	r.PodRemoved("a")
	if !slices.Equal(certs, []types.UID{"a"}) {
		t.Errorf("pod certificates forgotten for %v, want [a]", certs)
	}
	r.ObjectChanged(KindPodCertificateRequest, "", "a")
	if got := rec.takeMarked(); len(got) != 0 {
		t.Errorf("marked %v after the pod left", got)
	}
}

type forgetFunc func(types.UID)

func (f forgetFunc) ForgetPod(uid types.UID) { f(uid) }
