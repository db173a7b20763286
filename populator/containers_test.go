package populator

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/volume"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "a", "B": "b", "EMPTY": ""}
	mapping := func(n string) string {
		if v, ok := vars[n]; ok {
			return v
		}
		return "<" + n + ">"
	}
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{"$(A)", "a"},
		{"x/$(A)/$(B)y", "x/a/by"},
		{"$$(A)", "$(A)"},
		{"$$$(A)", "$a"},
		{"$A", "$A"},
		{"a$", "a$"},
		{"$(A", "$(A"},
		{"$(A$(B)", "<A$(B>"},
		{"$(", "$("},
		{"$()", "<>"},
		{"$(EMPTY)x", "x"},
		{"$(UNDEFINED)", "<UNDEFINED>"},
		{"$x$(A)", "$xa"},
		{"日本$(A)語", "日本a語"},
	} {
		if got := expand(tc.in, mapping); got != tc.want {
			t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

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

// subPathExpr is expanded from the container's environment with the
// kubelet's rules; what the agent cannot know gets an error saying why.
func TestSubPathExprExpansion(t *testing.T) {
	env := []v1.EnvVar{
		{Name: "POD", ValueFrom: field("metadata.name")},
		{Name: "NS", ValueFrom: field("metadata.namespace")},
		{Name: "UID", ValueFrom: field("metadata.uid")},
		{Name: "NODE", ValueFrom: field("spec.nodeName")},
		{Name: "SA", ValueFrom: field("spec.serviceAccountName")},
		{Name: "APP", ValueFrom: field("metadata.labels['app']")},
		{Name: "TEAM", ValueFrom: field(`metadata.annotations["team"]`)},
		{Name: "NOLABEL", ValueFrom: field("metadata.labels['none']")},
		{Name: "DIR", Value: "logs/$(POD)"},
		{Name: "LATER", Value: "$(DEFINED_LATER)"},
		{Name: "DEFINED_LATER", Value: "x"},
		{Name: "EMPTY", Value: ""},
		{Name: "DOTS", Value: ".."},
		{Name: "ABS", Value: "/etc"},
		{Name: "IP", ValueFrom: field("status.podIP")},
		{Name: "CM", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}, Key: "k"}}},
		{Name: "SEC", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "s"}, Key: "k"}}},
		{Name: "MEM", ValueFrom: &v1.EnvVarSource{ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.memory"}}},
		{Name: "FROMCM", Value: "x-$(CM)"},
		{Name: "OVERRIDDEN", ValueFrom: field("status.hostIP")},
		{Name: "OVERRIDDEN", Value: "known"},
	}
	for _, tc := range []struct {
		expr, want, err string
	}{
		{expr: "$(NS)/$(POD)", want: "shop/web-0"},
		{expr: "$(UID)-$(NODE)-$(SA)", want: "uid-1-node-a-sa"},
		{expr: "$(APP)/$(TEAM)", want: "web/blue"},
		{expr: "$(DIR)", want: "logs/web-0"},
		// A reference to a variable defined later stays as written.
		{expr: "$(LATER)", want: "$(DEFINED_LATER)"},
		{expr: "$$(POD)", want: "$(POD)"},
		{expr: "static", want: "static"},
		{expr: "$(OVERRIDDEN)", want: "known"},
		{expr: "a/$(UNDEFINED)/$(EMPTY)/$(NOLABEL)", err: "missing value for EMPTY, NOLABEL, UNDEFINED"},
		{expr: "$(IP)", err: "$(IP) comes from fieldRef status.podIP, which is only known once the pod's sandbox runs"},
		{expr: "$(CM)", err: `$(CM) comes from key "k" of ConfigMap cfg, and volume-agent does not read ConfigMaps`},
		{expr: "$(SEC)", err: `$(SEC) comes from key "k" of Secret s`},
		{expr: "$(MEM)", err: "$(MEM) comes from resourceFieldRef"},
		{expr: "$(FROMCM)", err: "$(FROMCM) refers to $(CM), which comes from key"},
		{expr: "$(EMPTY)$(CM)", err: "missing value for EMPTY; $(CM) comes from"},
		{expr: "$(POD)/$(DOTS)", err: `expands to an unusable path: subPath "web-0/.." must not contain '..'`},
		{expr: "$(ABS)", err: `expands to an unusable path: subPath "/etc" must not be an absolute path`},
		{expr: "$(POD)/..", err: `subPathExpr: subPath "$(POD)/.." must not contain '..'`},
		{expr: "/$(POD)", err: "must not be an absolute path"},
		{expr: "../$(POD)", err: "must not contain '..'"},
	} {
		got := containerMounts(podWithEnv(env, nil, tc.expr), "node-a")
		mount := got.containers[0].Mounts[0]
		if tc.err != "" {
			if len(got.errs) != 1 || !strings.Contains(got.errs[0].Error(), tc.err) {
				t.Errorf("%q: errors %v, want one saying %q", tc.expr, got.errs, tc.err)
				continue
			}
			e := got.errs[0]
			if e.Volume != "data" || e.Reason != ReasonInvalidSubPath || !strings.Contains(e.Error(), `pod shop/web-0 volume "data": container "app" volumeMount at /m0`) {
				t.Errorf("%q: error %q (volume %q, reason %q) does not name the pod, volume and container", tc.expr, e, e.Volume, e.Reason)
			}
			if mount.SubPath != "" || mount.SubPathError == "" || len(got.subPaths["data"]) != 0 {
				t.Errorf("%q: an unusable sub-path is still to be prepared: %+v %v", tc.expr, mount, got.subPaths)
			}
			continue
		}
		if len(got.errs) != 0 {
			t.Errorf("%q: %v", tc.expr, got.errs)
			continue
		}
		if mount.SubPath != tc.want {
			t.Errorf("%q expands to %q, want %q", tc.expr, mount.SubPath, tc.want)
		}
		if want := []volume.SubPath{{Container: "app", Index: 0, MountPath: "/m0", Path: tc.want}}; !cmp.Equal(got.subPaths["data"], want) {
			t.Errorf("%q: sub-paths %+v, want %+v", tc.expr, got.subPaths["data"], want)
		}
	}
}

func TestSubPathExprWithEnvFrom(t *testing.T) {
	from := []v1.EnvFromSource{{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "settings"}}}}
	env := []v1.EnvVar{{Name: "POD", ValueFrom: field("metadata.name")}, {Name: "MIXED", Value: "$(FROM_CM)-$(POD)"}}
	got := containerMounts(podWithEnv(env, from, "$(POD)", "$(FROM_CM)", "$(MIXED)"), "n")
	if sub := got.containers[0].Mounts[0].SubPath; sub != "web-0" {
		t.Errorf("a variable env defines does not depend on envFrom: got %q", sub)
	}
	if len(got.errs) != 2 {
		t.Fatalf("errors %v, want two", got.errs)
	}
	for _, e := range got.errs {
		if !strings.Contains(e.Error(), "may come from envFrom (ConfigMap settings)") {
			t.Errorf("error %q does not say the variable may come from envFrom", e)
		}
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
	got := containerMounts(pod, "n")
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
	dp := s.Volumes[volume.SharedName(local.Name, "pv-1")].Pods[pod.UID]
	want := []volume.SubPath{{Container: "main", Index: 3, MountPath: "/logs", Path: "logs/stable"}, {Container: "main", Index: 4, MountPath: "/conf", Path: "conf", ReadOnly: true}}
	if diff := cmp.Diff(want, dp.SubPaths); diff != "" {
		t.Errorf("sub-paths of the claim (-want +got):\n%s", diff)
	}
	if sp := s.Volumes[volume.PodScopedName(emptydir.Name, pod.UID, "scratch")].Pods[pod.UID].SubPaths; len(sp) != 0 {
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

	gen := s.Generation
	relabelled := pod.DeepCopy()
	relabelled.Labels["track"] = "canary"
	h.src.SetPods(relabelled)
	h.pop.Sync(false)
	s = h.snapshot()
	if s.Generation == gen {
		t.Fatal("a label change that changes a sub-path did not change the DSW")
	}
	dp = s.Volumes[volume.SharedName(local.Name, "pv-1")].Pods[pod.UID]
	if dp.SubPaths[0].Path != "logs/canary" {
		t.Errorf("after the label change: %+v", dp.SubPaths)
	}
}
