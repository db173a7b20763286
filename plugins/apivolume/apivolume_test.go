package apivolume_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/apivolume"
	"github.com/volume-agent/volume-agent/plugins/apivolume/payload"
	"github.com/volume-agent/volume-agent/tokens"
	"github.com/volume-agent/volume-agent/volume"
)

// fakeObjects serves ConfigMaps and Secrets from maps.
type fakeObjects struct {
	mu         sync.Mutex
	configMaps map[string]*v1.ConfigMap
	secrets    map[string]*v1.Secret
	err        error
}

func (f *fakeObjects) ConfigMap(_ context.Context, ns, name string) (*v1.ConfigMap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if cm, ok := f.configMaps[ns+"/"+name]; ok {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("configmaps"), name)
}

func (f *fakeObjects) Secret(_ context.Context, ns, name string) (*v1.Secret, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if s, ok := f.secrets[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("secrets"), name)
}

func (f *fakeObjects) setSecret(ns, name string, data map[string][]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.secrets[ns+"/"+name] = &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "2"}, Data: data}
}

type fakeTokens struct {
	keys      []tokens.Key
	refreshAt time.Time
}

func (f *fakeTokens) Get(_ context.Context, k tokens.Key) ([]byte, time.Time, error) {
	f.keys = append(f.keys, k)
	return []byte("TOKEN-" + string(k.PodUID)), f.refreshAt, nil
}

type fakePods map[types.UID]*payload.Pod

func (f fakePods) Pod(uid types.UID) (*payload.Pod, bool) { p, ok := f[uid]; return p, ok }

type fixture struct {
	plugins *plugins.Registry
	status  *apivolume.Status
	paths   volume.Paths
	objects *fakeObjects
	tokens  *fakeTokens
	pods    fakePods
}

func newFixture(t *testing.T, withTokens bool) *fixture {
	t.Helper()
	mounttest.RequireRoot(t)
	f := &fixture{
		paths: volume.Paths{Root: mounttest.TempDir(t)},
		objects: &fakeObjects{
			configMaps: map[string]*v1.ConfigMap{"ns/cm": {ObjectMeta: metav1.ObjectMeta{Name: "cm", ResourceVersion: "1"}, Data: map[string]string{"app.conf": "x=1", "ca.crt": "CERT"}}},
			secrets:    map[string]*v1.Secret{"ns/s": {ObjectMeta: metav1.ObjectMeta{Name: "s", ResourceVersion: "1"}, Data: map[string][]byte{"password": []byte("hunter2")}}},
		},
		tokens: &fakeTokens{refreshAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)},
		pods:   fakePods{},
	}
	src := apivolume.Sources{Objects: f.objects, Pods: f.pods, NoTokensReason: "standalone mode has no API server", NoTrustBundlesReason: "no API server",
		NodeAllocatable: func() v1.ResourceList { return nil }}
	if withTokens {
		src.Tokens = f.tokens
	}
	host := plugins.Host{Paths: f.paths, Mounter: mountutil.New(), NodeName: "node", Log: zap.NewNop()}
	ps, st := apivolume.New(host, src)
	f.plugins, f.status = plugins.NewRegistry(ps...), st
	return f
}

func pod(uid string) volume.PodInfo {
	return volume.PodInfo{PodRef: volume.PodRef{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid}, ServiceAccount: "default"}
}

func spec(name string, vs v1.VolumeSource) *volume.Spec {
	return &volume.Spec{Name: name, Volume: &v1.Volume{Name: name, VolumeSource: vs}, Mode: v1.PersistentVolumeFilesystem}
}

func (f *fixture) request(t *testing.T, s *volume.Spec, p volume.PodInfo) (plugins.Plugin, *plugins.SetUpRequest) {
	t.Helper()
	pl, err := f.plugins.ForSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	attrs, err := pl.Attributes(s)
	if err != nil {
		t.Fatalf("Attributes: %v", err)
	}
	if !attrs.ReadOnlyForContainers || !attrs.RequiresRemount {
		t.Fatalf("Attributes %+v: API data volumes are rewritten on changes and read-only for containers", attrs)
	}
	return pl, &plugins.SetUpRequest{
		VolumeName: volume.PodScopedName(pl.Name(), p.UID, s.Name), Spec: s, Pod: p,
		Dir: f.paths.PodVolumeDir(p.UID, pl.Name(), s.Name), Log: zap.NewNop(),
	}
}

func (f *fixture) setUp(t *testing.T, s *volume.Spec, p volume.PodInfo) *plugins.SetUpRequest {
	t.Helper()
	pl, req := f.request(t, s, p)
	if err := pl.SetUp(context.Background(), req); err != nil {
		t.Fatalf("SetUp: %v", err)
	}
	return req
}

func (f *fixture) tearDown(t *testing.T, req *plugins.SetUpRequest) {
	t.Helper()
	pl, _ := f.plugins.ByName(apivolume.PluginName(&req.Spec.Volume.VolumeSource))
	if err := pl.TearDown(context.Background(), &plugins.TearDownRequest{VolumeName: req.VolumeName, Spec: req.Spec, Pod: req.Pod.PodRef, Dir: req.Dir, Log: zap.NewNop()}); err != nil {
		t.Fatalf("TearDown: %v", err)
	}
	if mounttest.Exists(t, req.Dir) {
		t.Errorf("%s still exists after TearDown", req.Dir)
	}
}

func (f *fixture) writes(name volume.UniqueName) int {
	for _, v := range f.status.List() {
		if v.Volume == name {
			return v.Writes
		}
	}
	return 0
}

func secretVolume(name string) v1.VolumeSource {
	return v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: name, DefaultMode: ptr.To[int32](0o400)}}
}

func TestSecretOnItsOwnTmpfs(t *testing.T) {
	f := newFixture(t, false)
	s := spec("creds", secretVolume("s"))
	req := f.setUp(t, s, pod("p1"))
	m := mounttest.MountAt(t, req.Dir)
	if m.FSType != "tmpfs" {
		t.Fatalf("secret volume on %s, want its own tmpfs", m.FSType)
	}
	if size := mounttest.FSSize(t, req.Dir); size > 1<<20 {
		t.Errorf("tmpfs of %d bytes for 7 bytes of secret: not sized from the content", size)
	}
	if got := mounttest.ReadFile(t, filepath.Join(req.Dir, "password")); got != "hunter2" {
		t.Errorf("password = %q", got)
	}
	st, err := os.Stat(filepath.Join(req.Dir, "password"))
	if err != nil || st.Mode().Perm() != 0o400 {
		t.Errorf("mode %v, %v; want 0400", st.Mode(), err)
	}

	// The same content again: checked, not written.
	f.setUp(t, s, pod("p1"))
	if w := f.writes(req.VolumeName); w != 1 {
		t.Errorf("%d writes after an unchanged SetUp, want 1", w)
	}

	// A bigger secret: the tmpfs grows, the content is swapped.
	big := strings.Repeat("x", 2<<20)
	f.objects.setSecret("ns", "s", map[string][]byte{"password": []byte("new"), "blob": []byte(big)})
	f.setUp(t, s, pod("p1"))
	if got := mounttest.ReadFile(t, filepath.Join(req.Dir, "password")); got != "new" {
		t.Errorf("after the update: %q", got)
	}
	if got := mounttest.ReadFile(t, filepath.Join(req.Dir, "blob")); len(got) != len(big) {
		t.Errorf("blob of %d bytes, want %d", len(got), len(big))
	}
	if n := len(mounttest.MountsAt(t, req.Dir)); n != 1 {
		t.Errorf("%d mounts at the volume after a resize, want 1", n)
	}
	if w := f.writes(req.VolumeName); w != 2 {
		t.Errorf("%d writes, want 2", w)
	}
	f.tearDown(t, req)
}

func TestConfigMapOnDisk(t *testing.T) {
	f := newFixture(t, false)
	s := spec("config", v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}})
	req := f.setUp(t, s, pod("p1"))
	if len(mounttest.MountsAt(t, req.Dir)) != 0 {
		t.Error("a configMap volume is a directory on the node's disk, as in the kubelet: no mount")
	}
	if got := mounttest.ReadFile(t, filepath.Join(req.Dir, "app.conf")); got != "x=1" {
		t.Errorf("app.conf = %q", got)
	}
	f.tearDown(t, req)
}

func TestFailuresLeaveNothingOrTheOldContent(t *testing.T) {
	f := newFixture(t, false)
	missing := spec("creds", secretVolume("nope"))
	pl, req := f.request(t, missing, pod("p1"))
	err := pl.SetUp(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), `secret "nope" not found`) {
		t.Fatalf("err = %v", err)
	}
	if mounttest.Exists(t, req.Dir) {
		t.Error("a failed first SetUp left the volume directory")
	}

	s := spec("creds", secretVolume("s"))
	ok := f.setUp(t, s, pod("p1"))
	f.objects.err = errors.New("connection refused")
	pl, req = f.request(t, s, pod("p1"))
	if err := pl.SetUp(context.Background(), req); err == nil {
		t.Fatal("SetUp succeeded without its source")
	}
	if got := mounttest.ReadFile(t, filepath.Join(ok.Dir, "password")); got != "hunter2" {
		t.Errorf("a failed refresh changed the content: %q", got)
	}
	f.objects.err = nil
	f.tearDown(t, ok)
}

func TestProjectedServiceAccountToken(t *testing.T) {
	f := newFixture(t, true)
	vs := v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](0o644), Sources: []v1.VolumeProjection{
		{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
		{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
		{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
	}}}
	p := pod("p1")
	p.FSGroup = ptr.To[int64](3000)
	f.pods[p.UID] = &payload.Pod{Name: p.Name, Namespace: p.Namespace, UID: p.UID, FSUser: ptr.To[int64](1000), FSGroup: p.FSGroup}
	req := f.setUp(t, spec("kube-api-access-abcde", vs), p)
	if mounttest.MountAt(t, req.Dir).FSType != "tmpfs" {
		t.Error("projected volumes live on a tmpfs")
	}
	want := map[string]string{"token": "TOKEN-p1", "ca.crt": "CERT", "namespace": "ns"}
	for name, content := range want {
		if got := mounttest.ReadFile(t, filepath.Join(req.Dir, name)); got != content {
			t.Errorf("%s = %q, want %q", name, got, content)
		}
	}
	st, _ := os.Stat(filepath.Join(req.Dir, "token"))
	if st.Mode().Perm() != 0o640 {
		t.Errorf("token mode %v, want 0640 (0600 plus fsGroup read)", st.Mode())
	}
	if !req.RefreshAt.Equal(f.tokens.refreshAt) {
		t.Errorf("RefreshAt = %v, want the token's refresh time %v", req.RefreshAt, f.tokens.refreshAt)
	}
	k := f.tokens.keys[0]
	if k.PodUID != "p1" || k.PodName != "pod-p1" || k.ServiceAccount != "default" || k.ExpirationSeconds != 3607 || k.Namespace != "ns" {
		t.Errorf("token key %+v", k)
	}
	for _, v := range f.status.List() {
		for _, in := range v.Inputs {
			if strings.Contains(in.Name, "TOKEN") {
				t.Errorf("status shows a token: %+v", in)
			}
		}
	}
	f.tearDown(t, req)
}

func TestTokenProjectionWithoutAPIServer(t *testing.T) {
	f := newFixture(t, false)
	s := spec("kube-api-access-x", v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
		{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token"}},
	}}})
	pl, err := f.plugins.ForSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pl.Attributes(s); err == nil || !strings.Contains(err.Error(), "standalone mode has no API server") {
		t.Fatalf("Attributes: %v", err)
	}
	ctb := spec("trust", v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
		{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{Name: ptr.To("b"), Path: "ca.pem"}},
	}}})
	if _, err := pl.Attributes(ctb); err == nil || !strings.Contains(err.Error(), "clusterTrustBundle projection \"ca.pem\" cannot be served") {
		t.Fatalf("Attributes of a trust bundle projection without an API server: %v", err)
	}
}

func TestDownwardAPIFromPodMetadata(t *testing.T) {
	f := newFixture(t, false)
	p := pod("p1")
	f.pods[p.UID] = &payload.Pod{Name: p.Name, Namespace: "ns", UID: p.UID, Labels: map[string]string{"b": "2", "a": "1"}}
	s := spec("info", v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
		{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
	}}})
	req := f.setUp(t, s, p)
	if got := mounttest.ReadFile(t, filepath.Join(req.Dir, "labels")); got != "a=\"1\"\nb=\"2\"" {
		t.Errorf("labels = %q", got)
	}
	f.pods[p.UID].Labels = map[string]string{"a": "changed"}
	f.setUp(t, s, p)
	if got := mounttest.ReadFile(t, filepath.Join(req.Dir, "labels")); got != "a=\"changed\"" {
		t.Errorf("labels after the change = %q", got)
	}
	f.tearDown(t, req)
}

func TestInvalidVolumes(t *testing.T) {
	f := newFixture(t, true)
	tests := []struct {
		name string
		vs   v1.VolumeSource
		want string
	}{
		{"escaping item", v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{Items: []v1.KeyToPath{{Key: "a", Path: "../x"}}}}, "'..'"},
		{"absolute item", v1.VolumeSource{Secret: &v1.SecretVolumeSource{Items: []v1.KeyToPath{{Key: "a", Path: "/etc/x"}}}}, "absolute"},
		{"duplicate paths", v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ConfigMap: &v1.ConfigMapProjection{Items: []v1.KeyToPath{{Key: "a", Path: "x"}}}},
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "x"}}}},
		}}}, "conflicting duplicate paths"},
		{"short token", v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "t", ExpirationSeconds: ptr.To[int64](599)}},
		}}}, "below the minimum"},
	}
	for _, tt := range tests {
		s := spec("v", tt.vs)
		pl, err := f.plugins.ForSpec(s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pl.Attributes(s); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Attributes err = %v, want %q", tt.name, err, tt.want)
		}
	}
}
