package payload

import (
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/atomicdir"
)

// fakeGetter serves objects from maps; a missing one is NotFound.
type fakeGetter struct {
	configMaps map[string]*v1.ConfigMap
	secrets    map[string]*v1.Secret
	token      []byte
	tokenErr   error
	bundle     []byte
	tokens     []*v1.ServiceAccountTokenProjection
	certErr    error
}

func (f *fakeGetter) ConfigMap(name string) (*v1.ConfigMap, error) {
	if cm, ok := f.configMaps[name]; ok {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("configmaps"), name)
}

func (f *fakeGetter) Secret(name string) (*v1.Secret, error) {
	if s, ok := f.secrets[name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("secrets"), name)
}

func (f *fakeGetter) Token(p *v1.ServiceAccountTokenProjection) ([]byte, error) {
	f.tokens = append(f.tokens, p)
	return f.token, f.tokenErr
}

func (f *fakeGetter) TrustBundle(p *v1.ClusterTrustBundleProjection) ([]byte, error) {
	if f.bundle == nil {
		return nil, apierrors.NewNotFound(v1.Resource("clustertrustbundles"), "x")
	}
	return f.bundle, nil
}

func (f *fakeGetter) PodCertificate(source int, p *v1.PodCertificateProjection) ([]byte, []byte, error) {
	if f.certErr != nil {
		return nil, nil, f.certErr
	}
	return []byte("KEY\n"), []byte("CHAIN\n"), nil
}

func getter() *fakeGetter {
	return &fakeGetter{
		configMaps: map[string]*v1.ConfigMap{
			"cm": {ObjectMeta: metav1.ObjectMeta{Name: "cm"}, Data: map[string]string{"a": "1", "b": "2"}, BinaryData: map[string][]byte{"bin": {0, 1, 2}}},
			"ca": {ObjectMeta: metav1.ObjectMeta{Name: "ca"}, Data: map[string]string{"ca.crt": "CERT"}},
		},
		secrets: map[string]*v1.Secret{
			"s": {ObjectMeta: metav1.ObjectMeta{Name: "s"}, Data: map[string][]byte{"user": []byte("u"), "pass": []byte("p")}},
		},
		token: []byte("TOKEN"),
	}
}

// simple renders a payload as path -> "data|mode" for comparisons.
func simple(p atomicdir.Payload) map[string]string {
	out := map[string]string{}
	for k, f := range p {
		s := string(f.Data) + "|" + f.Mode.String()
		if f.UID != nil {
			s += "|uid"
		}
		out[k] = s
	}
	return out
}

func m(mode os.FileMode) string { return mode.String() }

func TestBuild(t *testing.T) {
	pod := &Pod{Name: "p", Namespace: "ns", UID: "uid-1",
		Labels:      map[string]string{"app": "web", "tier": "a\"b\nc"},
		Annotations: map[string]string{"x/y": "z"},
	}
	tests := []struct {
		name    string
		vs      v1.VolumeSource
		pod     *Pod
		get     func(*fakeGetter)
		want    map[string]string
		wantErr string
	}{
		{
			name: "configMap: every key, data and binaryData, defaultMode",
			vs:   v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, DefaultMode: ptr.To[int32](0o440)}},
			want: map[string]string{"a": "1|" + m(0o440), "b": "2|" + m(0o440), "bin": "\x00\x01\x02|" + m(0o440)},
		},
		{
			name: "configMap: items with nested paths and per-item mode",
			vs: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Items: []v1.KeyToPath{
				{Key: "a", Path: "dir/sub/a.conf", Mode: ptr.To[int32](0o400)}, {Key: "b", Path: "b"},
			}}},
			want: map[string]string{"dir/sub/a.conf": "1|" + m(0o400), "b": "2|" + m(0o644)},
		},
		{
			name:    "configMap: missing, not optional",
			vs:      v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}}},
			wantErr: `configMap "nope" not found`,
		},
		{
			name: "configMap: missing, optional: empty",
			vs:   v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}, Optional: ptr.To(true)}},
			want: map[string]string{},
		},
		{
			name:    "configMap: missing key, not optional",
			vs:      v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Items: []v1.KeyToPath{{Key: "zz", Path: "zz"}}}},
			wantErr: `configMap "cm" has no key "zz"`,
		},
		{
			name: "configMap: missing key, optional: skipped",
			vs: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Optional: ptr.To(true),
				Items: []v1.KeyToPath{{Key: "zz", Path: "zz"}, {Key: "a", Path: "a"}}}},
			want: map[string]string{"a": "1|" + m(0o644)},
		},
		{
			name:    "configMap: escaping item path",
			vs:      v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Items: []v1.KeyToPath{{Key: "a", Path: "../../etc/x"}}}},
			wantErr: "'..'",
		},
		{
			name: "secret: every key",
			vs:   v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s", DefaultMode: ptr.To[int32](0o400)}},
			want: map[string]string{"user": "u|" + m(0o400), "pass": "p|" + m(0o400)},
		},
		{
			name:    "secret: missing, not optional",
			vs:      v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "nope"}},
			wantErr: `secret "nope" not found`,
		},
		{
			name: "secret: missing, optional",
			vs:   v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "nope", Optional: ptr.To(true)}},
			want: map[string]string{},
		},
		{
			name: "downwardAPI: fields in the kubelet's formats",
			vs: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
				{Path: "name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}},
				{Path: "ns", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}},
				{Path: "uid", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.uid"}},
				{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
				{Path: "app", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}},
				{Path: "none", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['none']"}},
				{Path: "ann", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.annotations"}, Mode: ptr.To[int32](0o600)},
			}}},
			want: map[string]string{
				"name": "p|" + m(0o644), "ns": "ns|" + m(0o644), "uid": "uid-1|" + m(0o644),
				"labels": "app=\"web\"\ntier=\"a\\\"b\\nc\"|" + m(0o644),
				"app":    "web|" + m(0o644), "none": "|" + m(0o644),
				"ann": "x/y=\"z\"|" + m(0o600),
			},
		},
		{
			name: "downwardAPI: unsupported field",
			vs: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
				{Path: "node", FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}},
			}}},
			wantErr: `fieldPath "spec.nodeName" is not supported in volumes`,
		},
		{
			name: "projected: sources merged in order, later wins",
			vs: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](0o444), Sources: []v1.VolumeProjection{
				{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Items: []v1.KeyToPath{{Key: "a", Path: "x"}}}},
				{Secret: &v1.SecretProjection{LocalObjectReference: v1.LocalObjectReference{Name: "s"}, Items: []v1.KeyToPath{{Key: "user", Path: "x"}}}},
				{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
			}}},
			want: map[string]string{"x": "u|" + m(0o444), "namespace": "ns|" + m(0o444)},
		},
		{
			name: "projected: kube-api-access (token, ca.crt, namespace)",
			vs:   kubeAPIAccess(),
			want: map[string]string{"token": "TOKEN|" + m(0o644), "ca.crt": "CERT|" + m(0o644), "namespace": "ns|" + m(0o644)},
		},
		{
			name: "projected: token file 0600 and owned by the pod's single user",
			vs:   kubeAPIAccess(),
			pod:  &Pod{Name: "p", Namespace: "ns", FSUser: ptr.To[int64](1000)},
			want: map[string]string{"token": "TOKEN|" + m(0o600) + "|uid", "ca.crt": "CERT|" + m(0o644), "namespace": "ns|" + m(0o644)},
		},
		{
			name: "projected: token file 0600 with an fsGroup",
			vs:   kubeAPIAccess(),
			pod:  &Pod{Name: "p", Namespace: "ns", FSGroup: ptr.To[int64](2000)},
			want: map[string]string{"token": "TOKEN|" + m(0o600), "ca.crt": "CERT|" + m(0o644), "namespace": "ns|" + m(0o644)},
		},
		{
			name:    "projected: errors of all sources together, nothing written",
			vs:      v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: append(kubeAPIAccess().Projected.Sources, v1.VolumeProjection{Secret: &v1.SecretProjection{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}}})}},
			get:     func(g *fakeGetter) { g.tokenErr = errors.New("API server unreachable") },
			wantErr: "API server unreachable\nsecret \"nope\" not found",
		},
		{
			name: "projected: token expiration below the minimum",
			vs: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "t", ExpirationSeconds: ptr.To[int64](60)}},
			}}},
			wantErr: "below the minimum of 600",
		},
		{
			name: "projected: optional trust bundle that matches nothing is an empty file",
			vs: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{Path: "ca.pem", Name: ptr.To("b"), Optional: ptr.To(true)}},
			}}},
			want: map[string]string{"ca.pem": "|" + m(0o644)},
		},
		{
			name: "projected: missing trust bundle",
			vs: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{Path: "ca.pem", Name: ptr.To("b")}},
			}}},
			wantErr: `clusterTrustBundle "ca.pem"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := getter()
			if tt.get != nil {
				tt.get(g)
			}
			p := tt.pod
			if p == nil {
				p = pod
			}
			got, err := Build(&tt.vs, Inputs{Pod: p, Get: g})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := simple(got); !equal(s, tt.want) {
				t.Errorf("payload\n got  %q\n want %q", s, tt.want)
			}
		})
	}
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// kubeAPIAccess is the volume the ServiceAccount admission plugin injects.
func kubeAPIAccess() v1.VolumeSource {
	return v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](0o644), Sources: []v1.VolumeProjection{
		{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
		{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "ca"}, Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
		{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
	}}}
}

func TestFormatMap(t *testing.T) {
	tests := []struct {
		in   map[string]string
		want string
	}{
		{nil, ""},
		{map[string]string{"b": "2", "a": "1"}, "a=\"1\"\nb=\"2\""},
		{map[string]string{"k": "tab\there \\ \"q\" \x01 é ☃"}, `k="tab\there \\ \"q\" \x01 é ☃"`},
		{map[string]string{"multi": "line1\nline2"}, `multi="line1\nline2"`},
	}
	for _, tt := range tests {
		if got := FormatMap(tt.in); got != tt.want {
			t.Errorf("FormatMap(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestResourceValue(t *testing.T) {
	q := resource.MustParse
	pod := &Pod{Containers: []Container{
		{Name: "app", Resources: v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceCPU: q("250m"), v1.ResourceMemory: q("64Mi")},
			Limits:   v1.ResourceList{v1.ResourceCPU: q("1500m"), v1.ResourceMemory: q("128Mi"), "hugepages-2Mi": q("4Mi")},
		}},
		{Name: "nolimits"},
		{Name: "init", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceEphemeralStorage: q("1Gi")}}},
	}}
	node := v1.ResourceList{v1.ResourceCPU: q("4"), v1.ResourceMemory: q("8Gi"), v1.ResourceEphemeralStorage: q("100Gi")}
	tests := []struct {
		container, resource, divisor string
		want, wantErr                string
	}{
		{"app", "requests.cpu", "", "1", ""},
		{"app", "requests.cpu", "1m", "250", ""},
		{"app", "limits.cpu", "", "2", ""},
		{"app", "limits.cpu", "1m", "1500", ""},
		{"app", "requests.memory", "", "67108864", ""},
		{"app", "requests.memory", "1Mi", "64", ""},
		{"app", "limits.memory", "1M", "135", ""},
		{"app", "limits.hugepages-2Mi", "1Mi", "4", ""},
		{"nolimits", "limits.cpu", "1m", "4000", ""},
		{"nolimits", "limits.memory", "1Gi", "8", ""},
		{"nolimits", "limits.ephemeral-storage", "1Gi", "100", ""},
		{"nolimits", "requests.memory", "", "0", ""},
		{"init", "requests.ephemeral-storage", "1Gi", "1", ""},
		{"ghost", "limits.cpu", "", "", `container "ghost" not found`},
		{"app", "limits.gpu", "", "", "not supported"},
		{"", "limits.cpu", "", "", "needs a containerName"},
	}
	for _, tt := range tests {
		ref := &v1.ResourceFieldSelector{ContainerName: tt.container, Resource: tt.resource}
		if tt.divisor != "" {
			ref.Divisor = q(tt.divisor)
		}
		got, err := ResourceValue(ref, pod, node)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s %s: err = %v, want %q", tt.container, tt.resource, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s %s / %s = %q, %v; want %q", tt.container, tt.resource, tt.divisor, got, err, tt.want)
		}
	}
}

func TestFromObject(t *testing.T) {
	user := func(u int64) *v1.SecurityContext { return &v1.SecurityContext{RunAsUser: &u} }
	tests := []struct {
		name string
		pod  v1.PodSpec
		want *int64
	}{
		{"no user anywhere", v1.PodSpec{Containers: []v1.Container{{Name: "a"}}}, nil},
		{"pod-level user", v1.PodSpec{SecurityContext: &v1.PodSecurityContext{RunAsUser: ptr.To[int64](7)}, Containers: []v1.Container{{Name: "a"}, {Name: "b"}}}, ptr.To[int64](7)},
		{"same user in every container", v1.PodSpec{InitContainers: []v1.Container{{Name: "i", SecurityContext: user(5)}}, Containers: []v1.Container{{Name: "a", SecurityContext: user(5)}}}, ptr.To[int64](5)},
		{"different users", v1.PodSpec{SecurityContext: &v1.PodSecurityContext{RunAsUser: ptr.To[int64](7)}, Containers: []v1.Container{{Name: "a"}, {Name: "b", SecurityContext: user(8)}}}, nil},
		{"one container without a user", v1.PodSpec{Containers: []v1.Container{{Name: "a", SecurityContext: user(5)}, {Name: "b"}}}, nil},
	}
	for _, tt := range tests {
		got := FromObject(&v1.Pod{Spec: tt.pod}, false, false).FSUser
		if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
			t.Errorf("%s: FSUser = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestRefsOf(t *testing.T) {
	vs := kubeAPIAccess()
	vs.Projected.Sources = append(vs.Projected.Sources,
		v1.VolumeProjection{Secret: &v1.SecretProjection{LocalObjectReference: v1.LocalObjectReference{Name: "s"}}},
		v1.VolumeProjection{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "l", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['a']"}}}}},
	)
	r := RefsOf(&vs)
	if len(r.ConfigMaps) != 1 || r.ConfigMaps[0] != "ca" || len(r.Secrets) != 1 || r.Secrets[0] != "s" || !r.Tokens || !r.Labels || r.Annotations || r.Resources {
		t.Errorf("RefsOf = %+v", r)
	}
	if kaa := kubeAPIAccess(); RefsOf(&kaa).ReadsPod() {
		t.Error("kube-api-access reads only the namespace, not labels, annotations or resources")
	}
}

func TestNestedMounts(t *testing.T) {
	pod := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "init", VolumeMounts: []v1.VolumeMount{
			{Name: "config", MountPath: "/etc/app"}, {Name: "init-only", MountPath: "/etc/app/init"},
		}}},
		Containers: []v1.Container{{Name: "c", VolumeMounts: []v1.VolumeMount{
			{Name: "config", MountPath: "/etc/app/"},
			{Name: "certs", MountPath: "/etc/app/tls"},
			{Name: "deeper", MountPath: "/etc/app/tls/private"},
			{Name: "sibling", MountPath: "/etc/application"},
			{Name: "data", MountPath: "/data/x/y"},
		}}},
	}}
	got := FromObject(pod, false, false).NestedMounts
	want := map[string][]string{"config": {"init", "tls"}, "certs": {"private"}}
	if len(got) != len(want) {
		t.Fatalf("nested mounts %v, want %v", got, want)
	}
	for k, v := range want {
		g := slices.Clone(got[k])
		slices.Sort(g)
		if !slices.Equal(g, v) {
			t.Errorf("%s: %v, want %v", k, got[k], v)
		}
	}
}

// Which files a podCertificate projection writes, with what, and its
// errors.
func TestPodCertificate(t *testing.T) {
	proj := func(bundle, key, chain string) v1.VolumeProjection {
		return v1.VolumeProjection{PodCertificate: &v1.PodCertificateProjection{SignerName: "example.com/s", KeyType: "ED25519",
			CredentialBundlePath: bundle, KeyPath: key, CertificateChainPath: chain}}
	}
	user := &Pod{FSUser: ptr.To[int64](1000)}
	for _, tc := range []struct {
		name    string
		src     v1.VolumeProjection
		pod     *Pod
		getErr  error
		want    map[string]string
		wantErr string
	}{
		{name: "bundle: key then chain", src: proj("creds.pem", "", ""), want: map[string]string{"creds.pem": "KEY\nCHAIN\n|-rw-r--r--"}},
		{name: "key and chain", src: proj("", "tls.key", "tls.crt"), want: map[string]string{"tls.key": "KEY\n|-rw-r--r--", "tls.crt": "CHAIN\n|-rw-r--r--"}},
		{name: "all three", src: proj("b", "k", "c"), want: map[string]string{"b": "KEY\nCHAIN\n|-rw-r--r--", "k": "KEY\n|-rw-r--r--", "c": "CHAIN\n|-rw-r--r--"}},
		{name: "one user: 0600 and owned", src: proj("b", "", ""), pod: user, want: map[string]string{"b": "KEY\nCHAIN\n|-rw-------|uid"}},
		{name: "no path", src: proj("", "", ""), wantErr: "specify at least one of"},
		{name: "bad path", src: proj("../x", "", ""), wantErr: "podCertificate:"},
		{name: "bad key type", src: v1.VolumeProjection{PodCertificate: &v1.PodCertificateProjection{SignerName: "a/b", KeyType: "DSA", KeyPath: "k"}}, wantErr: `keyType "DSA"`},
		{name: "short expiration", src: v1.VolumeProjection{PodCertificate: &v1.PodCertificateProjection{SignerName: "a/b", KeyType: "RSA3072", KeyPath: "k", MaxExpirationSeconds: ptr.To[int32](60)}}, wantErr: "maxExpirationSeconds 60"},
		{name: "pending names the signer", src: proj("b", "", ""), getErr: errors.New("PodCertificateRequest ns/req-1 is not issued yet"), wantErr: `podCertificate (signer "example.com/s"): PodCertificateRequest ns/req-1 is not issued yet`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := getter()
			g.certErr = tc.getErr
			vs := &v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{tc.src}}}
			got, err := Build(vs, Inputs{Pod: tc.pod, Get: g})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := simple(got); !maps.Equal(s, tc.want) {
				t.Errorf("files %v, want %v", s, tc.want)
			}
		})
	}
	if r := RefsOf(&v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{proj("b", "", "")}}}); !r.PodCertificates {
		t.Error("RefsOf: PodCertificates not set")
	}
}
