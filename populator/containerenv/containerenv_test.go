package containerenv

import (
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
		if got := Expand(tc.in, mapping); got != tc.want {
			t.Errorf("Expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func field(path string) *v1.EnvVarSource {
	return &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: path}}
}

func cmKey(name, key string, optional bool) *v1.EnvVarSource {
	return &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: ptr(optional)}}
}

func secretKey(name, key string, optional bool) *v1.EnvVarSource {
	return &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: ptr(optional)}}
}

func resField(container, res, divisor string) *v1.EnvVarSource {
	s := &v1.ResourceFieldSelector{ContainerName: container, Resource: res}
	if divisor != "" {
		s.Divisor = resource.MustParse(divisor)
	}
	return &v1.EnvVarSource{ResourceFieldRef: s}
}

func cmFrom(name, prefix string, optional bool) v1.EnvFromSource {
	return v1.EnvFromSource{Prefix: prefix, ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: name}, Optional: ptr(optional)}}
}

func secretFrom(name, prefix string) v1.EnvFromSource {
	return v1.EnvFromSource{Prefix: prefix, SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: name}}}
}

// testInputs serves ConfigMaps "cfg" and "other", Secret "sec", ConfigMap
// "slow" not read yet and "broken" failing; anything else is NotFound.
func testInputs(pod *v1.Pod) Inputs {
	return Inputs{
		Pod: pod, NodeName: "node-a",
		ConfigMap: func(name string) (*v1.ConfigMap, error) {
			switch name {
			case "cfg":
				return &v1.ConfigMap{Data: map[string]string{"dir": "from-cfg", "SHARED": "cfg", "bad.key-1": "ok", "dots": ".."}}, nil
			case "other":
				return &v1.ConfigMap{Data: map[string]string{"SHARED": "other"}}, nil
			case "slow":
				return nil, volume.Waitingf("not read from the API server yet")
			case "broken":
				return nil, errors.New("connection refused")
			}
			return nil, apierrors.NewNotFound(v1.Resource("configmaps"), name)
		},
		Secret: func(name string) (*v1.Secret, error) {
			if name == "sec" {
				return &v1.Secret{Data: map[string][]byte{"user": []byte("alice"), "SHARED": []byte("secret")}}, nil
			}
			return nil, apierrors.NewNotFound(v1.Resource("secrets"), name)
		},
		HostIPs: []string{"192.0.2.1", "2001:db8::1"},
		Allocatable: func() v1.ResourceList {
			return v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("8Gi"), v1.ResourceEphemeralStorage: resource.MustParse("100Gi")}
		},
	}
}

func testPod() *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "shop", UID: "uid-1", Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"team": "blue"}},
		Spec: v1.PodSpec{ServiceAccountName: "sa", Containers: []v1.Container{
			{Name: "app", Resources: v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m"), v1.ResourceMemory: resource.MustParse("64Mi"), "hugepages-2Mi": resource.MustParse("4Mi")},
				Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("128Mi")},
			}},
			{Name: "side", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1500m")}}},
		}},
		Status: v1.PodStatus{PodIPs: []v1.PodIP{{IP: "10.0.0.7"}, {IP: "fd00::7"}}, PodIP: "10.0.0.7"},
	}
}

// Each rule of the kubelet's environment, as subPathExpr sees it.
func TestExpansionRules(t *testing.T) {
	noIPs := func(p *v1.Pod) { p.Status = v1.PodStatus{} }
	for _, tc := range []struct {
		name    string
		env     []v1.EnvVar
		envFrom []v1.EnvFromSource
		modPod  func(*v1.Pod)
		modIn   func(*Inputs)
		expr    string
		want    string
		// err is part of the error; waiting says it is a wait.
		err     string
		waiting bool
		lookup  bool
	}{
		{name: "metadata", env: []v1.EnvVar{{Name: "POD", ValueFrom: field("metadata.name")}, {Name: "NS", ValueFrom: field("metadata.namespace")}, {Name: "UID", ValueFrom: field("metadata.uid")}},
			expr: "$(NS)/$(POD)/$(UID)", want: "shop/web-0/uid-1"},
		{name: "labels and annotations", env: []v1.EnvVar{{Name: "APP", ValueFrom: field("metadata.labels['app']")}, {Name: "TEAM", ValueFrom: field("metadata.annotations['team']")}},
			expr: "$(APP)-$(TEAM)", want: "web-blue"},
		{name: "spec fields; the node's name for a pod without one", env: []v1.EnvVar{{Name: "NODE", ValueFrom: field("spec.nodeName")}, {Name: "SA", ValueFrom: field("spec.serviceAccountName")}},
			expr: "$(NODE)/$(SA)", want: "node-a/sa"},
		{name: "spec.nodeName of the pod", env: []v1.EnvVar{{Name: "NODE", ValueFrom: field("spec.nodeName")}}, modPod: func(p *v1.Pod) { p.Spec.NodeName = "n2" },
			expr: "$(NODE)", want: "n2"},
		{name: "pod IPs", env: []v1.EnvVar{{Name: "IP", ValueFrom: field("status.podIP")}, {Name: "IPS", ValueFrom: field("status.podIPs")}},
			expr: "$(IP)/$(IPS)", want: "10.0.0.7/10.0.0.7,fd00::7"},
		{name: "pod IP from podIP alone", env: []v1.EnvVar{{Name: "IP", ValueFrom: field("status.podIP")}}, modPod: func(p *v1.Pod) { p.Status.PodIPs = nil },
			expr: "$(IP)", want: "10.0.0.7"},
		{name: "no pod IP yet waits", env: []v1.EnvVar{{Name: "IP", ValueFrom: field("status.podIP")}}, modPod: noIPs,
			expr: "ip-$(IP)", err: "$(IP) comes from fieldRef status.podIP, and the pod's status has no IP yet", waiting: true},
		{name: "an unread pod IP not referred to does not matter", env: []v1.EnvVar{{Name: "IP", ValueFrom: field("status.podIP")}, {Name: "POD", ValueFrom: field("metadata.name")}}, modPod: noIPs,
			expr: "$(POD)", want: "web-0"},
		{name: "a variable built from a waiting one waits", env: []v1.EnvVar{{Name: "IP", ValueFrom: field("status.podIP")}, {Name: "DIR", Value: "d-$(IP)"}}, modPod: noIPs,
			expr: "$(DIR)", err: "$(DIR) refers to $(IP), which comes from fieldRef status.podIP", waiting: true},
		{name: "a waiting variable redefined is known", env: []v1.EnvVar{{Name: "IP", ValueFrom: field("status.podIP")}, {Name: "IP", Value: "fixed"}}, modPod: noIPs,
			expr: "$(IP)", want: "fixed"},
		{name: "missing wins over waiting", env: []v1.EnvVar{{Name: "IP", ValueFrom: field("status.podIP")}}, modPod: noIPs,
			expr: "$(IP)/$(NOPE)", err: "missing value for NOPE"},
		{name: "host IPs from the node", env: []v1.EnvVar{{Name: "H", ValueFrom: field("status.hostIP")}, {Name: "HS", ValueFrom: field("status.hostIPs")}},
			modPod: func(p *v1.Pod) { p.Status.HostIP = "198.51.100.9" },
			expr:   "$(H)/$(HS)", want: "192.0.2.1/192.0.2.1,2001:db8::1"},
		{name: "host IP from the pod's status when the node's are unknown", env: []v1.EnvVar{{Name: "H", ValueFrom: field("status.hostIP")}},
			modPod: func(p *v1.Pod) { p.Status.HostIPs = []v1.HostIP{{IP: "198.51.100.9"}} }, modIn: func(in *Inputs) { in.HostIPs = nil },
			expr: "$(H)", want: "198.51.100.9"},
		{name: "no host IP yet waits", env: []v1.EnvVar{{Name: "H", ValueFrom: field("status.hostIPs")}}, modIn: func(in *Inputs) { in.HostIPs = nil },
			expr: "$(H)", err: "host's IP yet", waiting: true},
		{name: "configMapKeyRef", env: []v1.EnvVar{{Name: "D", ValueFrom: cmKey("cfg", "dir", false)}},
			expr: "x/$(D)", want: "x/from-cfg"},
		{name: "secretKeyRef", env: []v1.EnvVar{{Name: "U", ValueFrom: secretKey("sec", "user", false)}},
			expr: "$(U)", want: "alice"},
		{name: "required ConfigMap missing", env: []v1.EnvVar{{Name: "D", ValueFrom: cmKey("gone", "dir", false)}},
			expr: "static", err: "ConfigMap shop/gone not found"},
		{name: "required key missing", env: []v1.EnvVar{{Name: "D", ValueFrom: cmKey("cfg", "nokey", false)}},
			expr: "$(D)", err: "couldn't find key nokey in ConfigMap shop/cfg"},
		{name: "required Secret key missing", env: []v1.EnvVar{{Name: "U", ValueFrom: secretKey("sec", "pass", false)}},
			expr: "$(U)", err: "couldn't find key pass in Secret shop/sec"},
		{name: "required Secret missing", env: []v1.EnvVar{{Name: "U", ValueFrom: secretKey("nosec", "user", false)}},
			expr: "$(U)", err: "Secret shop/nosec not found"},
		{name: "optional ConfigMap missing: variable unset", env: []v1.EnvVar{{Name: "D", ValueFrom: cmKey("gone", "dir", true)}},
			expr: "$(D)", err: "missing value for D"},
		{name: "optional key missing keeps an envFrom value", envFrom: []v1.EnvFromSource{cmFrom("cfg", "", false)},
			env:  []v1.EnvVar{{Name: "SHARED", ValueFrom: cmKey("cfg", "nokey", true)}},
			expr: "$(SHARED)", want: "cfg"},
		{name: "ConfigMap not read yet waits", env: []v1.EnvVar{{Name: "D", ValueFrom: cmKey("slow", "dir", false)}},
			expr: "$(D)", err: "ConfigMap shop/slow is not read yet", waiting: true},
		{name: "optional ConfigMap not read yet waits too", env: []v1.EnvVar{{Name: "D", ValueFrom: cmKey("slow", "dir", true)}},
			expr: "$(D)", err: "is not read yet", waiting: true},
		{name: "a failed read is a lookup failure", envFrom: []v1.EnvFromSource{cmFrom("broken", "", true)},
			expr: "x", err: "connection refused", lookup: true},
		{name: "envFrom with prefix, keys as they are", envFrom: []v1.EnvFromSource{cmFrom("cfg", "CFG_", false), secretFrom("sec", "S_")},
			expr: "$(CFG_dir)/$(S_user)/$(CFG_bad.key-1)", want: "from-cfg/alice/ok"},
		{name: "later envFrom overrides earlier", envFrom: []v1.EnvFromSource{cmFrom("cfg", "", false), cmFrom("other", "", false)},
			expr: "$(SHARED)", want: "other"},
		{name: "env overrides envFrom", envFrom: []v1.EnvFromSource{cmFrom("cfg", "", false), secretFrom("sec", "")},
			env:  []v1.EnvVar{{Name: "SHARED", Value: "env"}},
			expr: "$(SHARED)", want: "env"},
		{name: "optional envFrom missing", envFrom: []v1.EnvFromSource{cmFrom("gone", "", true)},
			expr: "$(dir)", err: "missing value for dir"},
		{name: "required envFrom missing", envFrom: []v1.EnvFromSource{cmFrom("gone", "", false)},
			expr: "static", err: "ConfigMap shop/gone not found"},
		{name: "a value refers to earlier variables and envFrom", envFrom: []v1.EnvFromSource{cmFrom("cfg", "", false)},
			env:  []v1.EnvVar{{Name: "POD", ValueFrom: field("metadata.name")}, {Name: "DIR", Value: "$(dir)/$(POD)"}},
			expr: "$(DIR)", want: "from-cfg/web-0"},
		{name: "a reference to a later variable stays as written", env: []v1.EnvVar{{Name: "A", Value: "$(B)"}, {Name: "B", Value: "b"}},
			expr: "$(A)", want: "$(B)"},
		{name: "a reference to an undefined variable stays as written", env: []v1.EnvVar{{Name: "A", Value: "x$(NOPE)"}},
			expr: "$(A)", want: "x$(NOPE)"},
		{name: "escaped reference", env: []v1.EnvVar{{Name: "A", Value: "$$(B)"}, {Name: "B", Value: "b"}},
			expr: "$(A)", want: "$(B)"},
		{name: "empty and undefined are missing", env: []v1.EnvVar{{Name: "E", Value: ""}},
			expr: "$(E)$(U)$(E)", err: "missing value for E, U"},
		{name: "last definition wins", env: []v1.EnvVar{{Name: "A", Value: "1"}, {Name: "A", Value: "2"}},
			expr: "$(A)", want: "2"},
		{name: "requests.cpu in millicores", env: []v1.EnvVar{{Name: "C", ValueFrom: resField("", "requests.cpu", "1m")}},
			expr: "$(C)", want: "250"},
		{name: "requests.cpu rounds up to cores", env: []v1.EnvVar{{Name: "C", ValueFrom: resField("", "requests.cpu", "")}},
			expr: "$(C)", want: "1"},
		{name: "limits.memory with divisor", env: []v1.EnvVar{{Name: "M", ValueFrom: resField("", "limits.memory", "1Mi")}},
			expr: "$(M)", want: "128"},
		{name: "unset limit is the node's allocatable", env: []v1.EnvVar{{Name: "C", ValueFrom: resField("", "limits.cpu", "")}},
			expr: "$(C)", want: "4"},
		{name: "unset limit is the pod-level limit", env: []v1.EnvVar{{Name: "C", ValueFrom: resField("", "limits.cpu", "")}},
			modPod: func(p *v1.Pod) {
				p.Spec.Resources = &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2")}}
			},
			expr: "$(C)", want: "2"},
		{name: "another container's limit", env: []v1.EnvVar{{Name: "C", ValueFrom: resField("side", "limits.cpu", "1m")}},
			expr: "$(C)", want: "1500"},
		{name: "hugepages request", env: []v1.EnvVar{{Name: "H", ValueFrom: resField("", "requests.hugepages-2Mi", "2Mi")}},
			expr: "$(H)", want: "2"},
		{name: "request not set is 0", env: []v1.EnvVar{{Name: "E", ValueFrom: resField("", "requests.ephemeral-storage", "")}},
			expr: "$(E)", want: "0"},
		{name: "unknown container", env: []v1.EnvVar{{Name: "C", ValueFrom: resField("nope", "limits.cpu", "")}},
			expr: "static", err: `container "nope" not found`},
		{name: "unsupported fieldRef", env: []v1.EnvVar{{Name: "X", ValueFrom: field("spec.restartPolicy")}},
			expr: "static", err: "not supported"},
		{name: "fileKeyRef", env: []v1.EnvVar{{Name: "F", ValueFrom: &v1.EnvVarSource{FileKeyRef: &v1.FileKeySelector{VolumeName: "v", Path: "p", Key: "k"}}}},
			expr: "static", err: "not supported by volume-agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod()
			if tc.modPod != nil {
				tc.modPod(pod)
			}
			c := &pod.Spec.Containers[0]
			c.Env, c.EnvFrom = tc.env, tc.envFrom
			in := testInputs(pod)
			if tc.modIn != nil {
				tc.modIn(&in)
			}
			env, err := Build(c, in)
			var got string
			if err == nil {
				got, err = env.ExpandSubPathExpr(tc.expr)
			}
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("got %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("got %q, %v; want an error saying %q", got, err, tc.err)
			}
			if volume.IsWaiting(err) != tc.waiting {
				t.Errorf("error %q: waiting = %v, want %v", err, volume.IsWaiting(err), tc.waiting)
			}
			var lookup *LookupError
			if errors.As(err, &lookup) != tc.lookup {
				t.Errorf("error %q: lookup failure = %v, want %v", err, !tc.lookup, tc.lookup)
			}
		})
	}
}

// Only containers with a subPathExpr have their objects read.
func TestRefs(t *testing.T) {
	pod := testPod()
	pod.Spec.InitContainers = []v1.Container{{Name: "init", EnvFrom: []v1.EnvFromSource{cmFrom("init-cm", "", false)},
		VolumeMounts: []v1.VolumeMount{{Name: "v", MountPath: "/v", SubPathExpr: "$(X)"}}}}
	pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "A", ValueFrom: cmKey("app-cm", "k", false)}, {Name: "B", ValueFrom: secretKey("app-sec", "k", true)}, {Name: "C", Value: "v"}}
	pod.Spec.Containers[0].EnvFrom = []v1.EnvFromSource{secretFrom("app-sec2", "")}
	pod.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "v", MountPath: "/v", SubPathExpr: "$(A)"}}
	pod.Spec.Containers[1].Env = []v1.EnvVar{{Name: "A", ValueFrom: cmKey("side-cm", "k", false)}}
	pod.Spec.Containers[1].VolumeMounts = []v1.VolumeMount{{Name: "v", MountPath: "/v", SubPath: "x"}}
	cms, secrets := Refs(pod)
	if strings.Join(cms, ",") != "init-cm,app-cm" || strings.Join(secrets, ",") != "app-sec2,app-sec" {
		t.Errorf("Refs = %v, %v", cms, secrets)
	}
}
