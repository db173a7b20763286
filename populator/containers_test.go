package populator

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/volume"
)

func podWithEnv(env []v1.EnvVar, envFrom []v1.EnvFromSource, exprs ...string) *v1.Pod {
	c := v1.Container{Name: "app", Env: env, EnvFrom: envFrom}
	for i, e := range exprs {
		c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: "data", MountPath: "/m" + string(rune('0'+i)), SubPathExpr: e})
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "shop", UID: "uid-1", Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"team": "blue"}},
		Spec:       v1.PodSpec{ServiceAccountName: "sa", Containers: []v1.Container{c}},
	}
}

func field(path string) *v1.EnvVarSource {
	return &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: path}}
}

// envObjects serves ConfigMap shop/cfg, Secret shop/sec, and ConfigMap
// shop/slow as not read yet; anything else is NotFound.
type envObjects struct{ cfg map[string]string }

func (o envObjects) ConfigMap(ns, name string) (*v1.ConfigMap, error) {
	switch {
	case ns == "shop" && name == "cfg":
		return &v1.ConfigMap{Data: o.cfg}, nil
	case name == "slow":
		return nil, volume.Waitingf("configmaps %s/%s: not read from the API server yet", ns, name)
	}
	return nil, apierrors.NewNotFound(v1.Resource("configmaps"), name)
}

func (o envObjects) Secret(ns, name string) (*v1.Secret, error) {
	if ns == "shop" && name == "sec" {
		return &v1.Secret{Data: map[string][]byte{"user": []byte("alice")}}, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("secrets"), name)
}

func testEnvInputs(node string) envInputs {
	o := envObjects{cfg: map[string]string{"dir": "from-cfg"}}
	return envInputs{NodeName: node,
		ConfigMap: func(name string) (*v1.ConfigMap, error) { return o.ConfigMap("shop", name) },
		Secret:    func(name string) (*v1.Secret, error) { return o.Secret("shop", name) },
	}
}

// subPathExpr is expanded from the container's environment with the
// kubelet's rules (package containerenv has them one by one); here, how
// the outcome reaches the pod: the sub-path, or an error naming the pod,
// volume, container and object, classified as a wait or a change needed.
func TestSubPathExprExpansion(t *testing.T) {
	cm := func(name, key string) *v1.EnvVarSource {
		return &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key}}
	}
	env := []v1.EnvVar{
		{Name: "POD", ValueFrom: field("metadata.name")},
		{Name: "NODE", ValueFrom: field("spec.nodeName")},
		{Name: "IP", ValueFrom: field("status.podIP")},
		{Name: "USER", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Key: "user"}}},
		{Name: "DOTS", Value: ".."},
		{Name: "ABS", Value: "/etc"},
	}
	for _, tc := range []struct {
		name     string
		env      []v1.EnvVar
		from     []v1.EnvFromSource
		expr     string
		want     string
		err      string
		reason   string
		waiting  bool
		unpinned bool
	}{
		{name: "fields", expr: "$(NODE)/$(POD)", want: "node-a/web-0"},
		{name: "configMapKeyRef", env: []v1.EnvVar{{Name: "D", ValueFrom: cm("cfg", "dir")}}, expr: "$(D)/$(POD)", want: "from-cfg/web-0"},
		{name: "envFrom with prefix", from: []v1.EnvFromSource{{Prefix: "C_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}},
			expr: "$(C_dir)", want: "from-cfg"},
		{name: "secretKeyRef", expr: "home/$(USER)", want: "home/alice"},
		{name: "pod IP not set yet", expr: "$(IP)", err: "$(IP) comes from fieldRef status.podIP, and the pod's status has no IP yet",
			reason: ReasonSubPathExprWaiting, waiting: true, unpinned: true},
		{name: "ConfigMap not read yet", env: []v1.EnvVar{{Name: "D", ValueFrom: cm("slow", "dir")}}, expr: "$(D)",
			err: "ConfigMap shop/slow is not read yet", reason: ReasonSubPathExprWaiting, waiting: true, unpinned: true},
		{name: "required ConfigMap missing", env: []v1.EnvVar{{Name: "D", ValueFrom: cm("gone", "dir")}}, expr: "$(POD)",
			err: `subPathExpr "$(POD)": environment: ConfigMap shop/gone not found`, reason: ReasonInvalidSubPath, unpinned: true},
		{name: "required key missing", env: []v1.EnvVar{{Name: "D", ValueFrom: cm("cfg", "k")}}, expr: "$(D)",
			err: "couldn't find key k in ConfigMap shop/cfg", reason: ReasonInvalidSubPath, unpinned: true},
		{name: "missing value", expr: "$(NOPE)", err: "missing value for NOPE", reason: ReasonInvalidSubPath, unpinned: true},
		{name: "expands to ..", expr: "$(POD)/$(DOTS)", err: `expands to an unusable path: subPath "web-0/.." must not contain '..'`, reason: ReasonInvalidSubPath, unpinned: true},
		{name: "expands to an absolute path", expr: "$(ABS)", err: `subPath "/etc" must not be an absolute path`, reason: ReasonInvalidSubPath, unpinned: true},
		{name: "bad before expansion", expr: "$(POD)/..", err: `subPathExpr: subPath "$(POD)/.." must not contain '..'`, reason: ReasonInvalidSubPath, unpinned: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := containerMounts(podWithEnv(append(slices.Clone(env), tc.env...), tc.from, tc.expr), testEnvInputs("node-a"), nil)
			mount := got.containers[0].Mounts[0]
			if got.unpinned != tc.unpinned {
				t.Errorf("unpinned = %v, want %v", got.unpinned, tc.unpinned)
			}
			if tc.err != "" {
				if len(got.errs) != 1 || !strings.Contains(got.errs[0].Error(), tc.err) {
					t.Fatalf("errors %v, want one saying %q", got.errs, tc.err)
				}
				e := got.errs[0]
				if e.Volume != "data" || e.Reason != tc.reason || !strings.Contains(e.Error(), `pod shop/web-0 volume "data": container "app" volumeMount at /m0`) {
					t.Errorf("error %q (volume %q, reason %q, want %q) does not name the pod, volume and container", e, e.Volume, e.Reason, tc.reason)
				}
				if explained := explain.ErrorStatus(e) == explain.Waiting; explained != tc.waiting {
					t.Errorf("error %q: a wait = %v, want %v", e, explained, tc.waiting)
				}
				if mount.SubPath != "" || mount.SubPathError == "" || len(got.subPaths["data"]) != 0 || len(got.expanded) != 0 {
					t.Errorf("an unusable sub-path is still to be prepared: %+v %v", mount, got.subPaths)
				}
				return
			}
			if len(got.errs) != 0 {
				t.Fatal(got.errs)
			}
			if mount.SubPath != tc.want {
				t.Errorf("expands to %q, want %q", mount.SubPath, tc.want)
			}
			if want := []volume.SubPath{{Container: "app", Index: 0, MountPath: "/m0", Path: tc.want}}; !cmp.Equal(got.subPaths["data"], want) {
				t.Errorf("sub-paths %+v, want %+v", got.subPaths["data"], want)
			}
			if got.expanded[mountKey{"app", 0}] != tc.want {
				t.Errorf("pins %v", got.expanded)
			}
		})
	}
}

// A pinned expansion is used as it is: what the environment says now does
// not matter any more.
func TestSubPathExprPinned(t *testing.T) {
	pod := podWithEnv([]v1.EnvVar{{Name: "D", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "gone"}, Key: "dir"}}}}, nil, "$(D)", "plain-$(D)")
	got := containerMounts(pod, testEnvInputs("n"), map[mountKey]string{{"app", 0}: "old/dir"})
	if sub := got.containers[0].Mounts[0].SubPath; sub != "old/dir" || got.expanded[mountKey{"app", 0}] != "old/dir" {
		t.Errorf("pinned mount: sub-path %q, pins %v", sub, got.expanded)
	}
	if len(got.errs) != 1 || got.errs[0].Err == nil || !strings.Contains(got.errs[0].Error(), "/m1") || !got.unpinned {
		t.Errorf("the unpinned mount must still fail (ConfigMap gone): %v", got.errs)
	}
}

func TestContainerMounts(t *testing.T) {
	bidi := v1.MountPropagationBidirectional
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"},
		Spec: v1.PodSpec{
			InitContainers: []v1.Container{{Name: "init", VolumeMounts: []v1.VolumeMount{{Name: "data", MountPath: "/data", SubPath: "init"}}}},
			Containers: []v1.Container{
				{Name: "app", VolumeMounts: []v1.VolumeMount{
					{Name: "data", MountPath: "/data"},
					{Name: "data", MountPath: "/logs", SubPath: "a//logs/", ReadOnly: true},
					{Name: "conf", MountPath: "/etc/app.conf", SubPath: "app.conf", MountPropagation: &bidi},
					{Name: "data", MountPath: "/bad", SubPath: "../etc"},
					{Name: "data", MountPath: "/both", SubPath: "x", SubPathExpr: "y"},
					{Name: "data", MountPath: "/dot", SubPath: "./"},
				}, VolumeDevices: []v1.VolumeDevice{{Name: "raw", DevicePath: "/dev/xvdb"}}},
				{Name: "nothing"},
			},
			EphemeralContainers: []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debug", VolumeMounts: []v1.VolumeMount{
				{Name: "data", MountPath: "/data"}, {Name: "data", MountPath: "/sub", SubPath: "x"},
			}}}},
		},
	}
	got := containerMounts(pod, testEnvInputs("n"), nil)
	wantContainers := []volume.Container{
		{Name: "init", Type: volume.InitContainer, Mounts: []volume.ContainerMount{{Volume: "data", MountPath: "/data", SubPath: "init"}}},
		{Name: "app", Type: volume.RegularContainer, Mounts: []volume.ContainerMount{
			{Volume: "data", Index: 0, MountPath: "/data"},
			{Volume: "data", Index: 1, MountPath: "/logs", SubPath: "a/logs", ReadOnly: true},
			{Volume: "conf", Index: 2, MountPath: "/etc/app.conf", SubPath: "app.conf", Propagation: bidi},
			{Volume: "data", Index: 3, MountPath: "/bad", SubPathError: `subPath "../etc" must not contain '..'`},
			{Volume: "data", Index: 4, MountPath: "/both", SubPathError: "subPath and subPathExpr are mutually exclusive"},
			{Volume: "data", Index: 5, MountPath: "/dot"},
		}, Devices: []volume.ContainerDevice{{Volume: "raw", DevicePath: "/dev/xvdb"}}},
		{Name: "debug", Type: volume.EphemeralContainer, Mounts: []volume.ContainerMount{
			{Volume: "data", Index: 0, MountPath: "/data"},
			{Volume: "data", Index: 1, MountPath: "/sub", SubPathError: "ephemeral containers may not use subPath or subPathExpr"},
		}},
	}
	if diff := cmp.Diff(wantContainers, got.containers); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	wantSubPaths := map[string][]volume.SubPath{
		"data": {{Container: "init", Index: 0, MountPath: "/data", Path: "init"}, {Container: "app", Index: 1, MountPath: "/logs", Path: "a/logs", ReadOnly: true}},
		"conf": {{Container: "app", Index: 2, MountPath: "/etc/app.conf", Path: "app.conf"}},
	}
	if diff := cmp.Diff(wantSubPaths, got.subPaths); diff != "" {
		t.Errorf("sub-paths (-want +got):\n%s", diff)
	}
	if len(got.errs) != 3 {
		t.Errorf("errors: %v, want 3", got.errs)
	}
}

// The DSW gets, for each pod volume, the sub-paths its containers mount
// (two names for one claim merged; read-only from the claim), and what each
// container mounts; a label a subPathExpr uses changes them, and a bad
// sub-path is an error of the pod that leaves its volumes desired.
func TestSyncRecordsSubPathsAndContainers(t *testing.T) {
	h := newHarness(t)
	pvc, pv := boundPair("claim", "pv-1", t.TempDir())
	pod := newPod("web", withVolume(emptyDirVol("scratch")), withVolume(claimVol("data", "claim")), withVolume(claimVol("alias", "claim")))
	pod.Labels = map[string]string{"track": "stable"}
	pod.Spec.Volumes[2].PersistentVolumeClaim.ReadOnly = true
	c := &pod.Spec.Containers[0]
	c.Env = []v1.EnvVar{{Name: "TRACK", ValueFrom: field("metadata.labels['track']")}}
	c.VolumeMounts = append(c.VolumeMounts,
		v1.VolumeMount{Name: "data", MountPath: "/logs", SubPathExpr: "logs/$(TRACK)"},
		v1.VolumeMount{Name: "alias", MountPath: "/conf", SubPath: "conf"},
		v1.VolumeMount{Name: "scratch", MountPath: "/bad", SubPath: "/abs"},
	)
	h.src.Add(pvc, pv, pod)
	h.pop.Sync(false)

	s := h.snapshot()
	dp := s.Volume(volume.SharedName(local.Name, "pv-1")).Pods.At(pod.UID)
	want := []volume.SubPath{{Container: "main", Index: 3, MountPath: "/logs", Path: "logs/stable"}, {Container: "main", Index: 4, MountPath: "/conf", Path: "conf", ReadOnly: true}}
	if diff := cmp.Diff(want, dp.SubPaths); diff != "" {
		t.Errorf("sub-paths of the claim (-want +got):\n%s", diff)
	}
	if sp := s.Volume(volume.PodScopedName(emptydir.Name, pod.UID, "scratch")).Pods.At(pod.UID).SubPaths; len(sp) != 0 {
		t.Errorf("an invalid sub-path is to be prepared: %+v", sp)
	}
	p := h.pod(t, pod)
	if len(p.Containers) != 1 || len(p.Containers[0].Mounts) != 6 {
		t.Fatalf("containers = %+v", p.Containers)
	}
	if got := reasons(p.Errors); !slices.Equal(got, []string{"scratch:" + ReasonInvalidSubPath}) {
		t.Errorf("errors = %v", got)
	}
	if len(p.Volumes) != 2 {
		t.Errorf("the pod's volumes = %v: a bad sub-path must not keep its volume from being mounted", p.Volumes)
	}
	if ev := h.events.list(); len(ev) != 1 || !strings.Contains(ev[0], "must not be an absolute path") {
		t.Errorf("events = %v, want one for the bad sub-path", ev)
	}

	// The kubelet expands once, when the container starts: a label
	// changed afterwards does not move the prepared sub-path.
	relabelled := pod.DeepCopy()
	relabelled.Labels["track"] = "canary"
	h.src.SetPods(relabelled)
	h.pop.Sync(false)
	s = h.snapshot()
	dp = s.Volume(volume.SharedName(local.Name, "pv-1")).Pods.At(pod.UID)
	if dp.SubPaths[0].Path != "logs/stable" {
		t.Errorf("after the label change the sub-path moved: %+v", dp.SubPaths)
	}
}

// A subPathExpr that waits for a ConfigMap is a wait (no event), resolved
// again when the objects change; once expanded, a change of the value does
// not move it.
func TestSyncSubPathExprFromConfigMap(t *testing.T) {
	objs := &switchableObjects{}
	changed := make(chan struct{}, 1)
	h := newHarness(t, func(o *Options) { o.EnvObjects = objs; o.EnvChanged = changed })
	pod := newPod("web", withVolume(emptyDirVol("scratch")))
	c := &pod.Spec.Containers[0]
	c.Env = []v1.EnvVar{{Name: "D", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}, Key: "dir"}}}}
	c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: "scratch", MountPath: "/d", SubPathExpr: "by/$(D)"})
	h.src.Add(pod)
	name := volume.PodScopedName(emptydir.Name, pod.UID, "scratch")

	h.pop.Sync(false)
	if got := reasons(h.pod(t, pod).Errors); !slices.Equal(got, []string{"scratch:" + ReasonSubPathExprWaiting}) {
		t.Fatalf("errors = %v, want a wait", got)
	}
	if ev := h.events.list(); len(ev) != 0 {
		t.Errorf("a wait made events: %v", ev)
	}

	objs.set(&v1.ConfigMap{Data: map[string]string{"dir": "one"}})
	h.pop.Sync(false) // what EnvChanged triggers: no pod changed
	if sp := h.snapshot().Volume(name).Pods.At(pod.UID).SubPaths; len(sp) != 1 || sp[0].Path != "by/one" {
		t.Fatalf("sub-paths %+v, want by/one once the ConfigMap is read", sp)
	}
	if errs := h.pod(t, pod).Errors; len(errs) != 0 {
		t.Errorf("errors = %v", errs)
	}

	objs.set(&v1.ConfigMap{Data: map[string]string{"dir": "two"}})
	h.pop.Sync(true)
	if sp := h.snapshot().Volume(name).Pods.At(pod.UID).SubPaths; len(sp) != 1 || sp[0].Path != "by/one" {
		t.Errorf("sub-paths %+v: a changed value moved a prepared sub-path", sp)
	}
}

// switchableObjects serves one ConfigMap, "not read yet" until set.
type switchableObjects struct {
	mu sync.Mutex
	cm *v1.ConfigMap
}

func (o *switchableObjects) set(cm *v1.ConfigMap) { o.mu.Lock(); o.cm = cm; o.mu.Unlock() }

func (o *switchableObjects) ConfigMap(_, name string) (*v1.ConfigMap, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cm == nil {
		return nil, volume.Waitingf("configmaps %s: not read from the API server yet", name)
	}
	return o.cm, nil
}

func (o *switchableObjects) Secret(_, name string) (*v1.Secret, error) {
	return nil, apierrors.NewNotFound(v1.Resource("secrets"), name)
}
