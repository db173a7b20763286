package csi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/plugins"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/tokens"
	"github.com/volume-agent/volume-agent/volume"
)

type modes = []v1.PersistentVolumeAccessMode

const (
	rwo  = v1.ReadWriteOnce
	rwop = v1.ReadWriteOncePod
	rox  = v1.ReadOnlyMany
	rwx  = v1.ReadWriteMany

	sw   = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	snsw = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	snmw = csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
	mnro = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	mnmw = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
)

// The access mode of every call, as the kubelet picks it for the node calls
// (the PV's first mode, mapped by the node's SINGLE_NODE_MULTI_WRITER) and
// as the external-attacher picks it for ControllerPublishVolume (all the
// modes, by the controller's SINGLE_NODE_MULTI_WRITER), which the agent
// makes in its place in standalone and self-attach modes.
func TestAccessModes(t *testing.T) {
	cases := []struct {
		name       string
		modes      modes // nil: an inline volume
		nodeSNMW   bool
		ctrlSNMW   bool
		node       csi.VolumeCapability_AccessMode_Mode
		controller csi.VolumeCapability_AccessMode_Mode
		ctrlErr    string // ControllerPublishVolume is refused before the call
	}{
		{name: "RWO", modes: modes{rwo}, node: sw, controller: sw},
		{name: "RWO, SINGLE_NODE_MULTI_WRITER", modes: modes{rwo}, nodeSNMW: true, ctrlSNMW: true, node: snmw, controller: snmw},
		{name: "RWOP without SINGLE_NODE_MULTI_WRITER is a single-node writer", modes: modes{rwop}, node: sw, controller: sw},
		{name: "RWOP, SINGLE_NODE_MULTI_WRITER", modes: modes{rwop}, nodeSNMW: true, ctrlSNMW: true, node: snsw, controller: snsw},
		{name: "node and controller capabilities apart", modes: modes{rwo}, nodeSNMW: true, node: snmw, controller: sw},
		{name: "ROX", modes: modes{rox}, nodeSNMW: true, node: mnro, controller: mnro},
		{name: "RWX", modes: modes{rwx}, node: mnmw, controller: mnmw},
		{name: "the first mode for the node, RWX first for the controller", modes: modes{rwo, rwx}, nodeSNMW: true, node: snmw, controller: mnmw},
		{name: "ROX first", modes: modes{rox, rwx}, node: mnro, controller: mnmw},
		{name: "ROX and RWO: the node takes the first, the attacher refuses", modes: modes{rwo, rox}, node: sw, ctrlErr: "both ReadOnlyMany and ReadWriteOnce"},
		{name: "RWOP with another mode: the attacher refuses", modes: modes{rwop, rwo}, nodeSNMW: true, node: snsw, ctrlErr: "combines ReadWriteOncePod"},
		{name: "inline: ReadWriteOnce", node: sw},
		{name: "inline: ReadWriteOnce, SINGLE_NODE_MULTI_WRITER", nodeSNMW: true, node: snmw},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			f.attachMode = csiplugin.AttachLocal
			m := f.startRegistered(testDriver, caps{stage: true, expand: true, controllerPublish: true,
				singleNodeMultiWriter: c.nodeSNMW, controllerSingleNodeMultiWriter: c.ctrlSNMW})
			p := f.plugin()
			var got sync.Map // method -> mode
			record := func(method string, capability *csi.VolumeCapability) {
				got.Store(method, capability.GetAccessMode().GetMode())
			}
			m.node.EXPECT().NodePublishVolume(gomock.Any(), gomock.Any()).DoAndReturn(
				func(_ context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
					record("NodePublishVolume", r.GetVolumeCapability())
					return &csi.NodePublishVolumeResponse{}, nil
				})
			want := map[string]csi.VolumeCapability_AccessMode_Mode{"NodePublishVolume": c.node}
			if c.modes == nil {
				f.setCSIDriver(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: testDriver},
					Spec: storagev1.CSIDriverSpec{VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}}})
				if err := p.SetUp(ctx(t), f.setUpRequest(inlineSpec("scratch", nil), pod("uid-1"), nil)); err != nil {
					t.Fatalf("SetUp: %v", err)
				}
			} else {
				spec := pvSpec("pv-1", "vol-1", func(pv *v1.PersistentVolume) { pv.Spec.AccessModes = c.modes })
				m.node.EXPECT().NodeStageVolume(gomock.Any(), gomock.Any()).DoAndReturn(
					func(_ context.Context, r *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
						record("NodeStageVolume", r.GetVolumeCapability())
						return &csi.NodeStageVolumeResponse{}, nil
					})
				m.node.EXPECT().NodeExpandVolume(gomock.Any(), gomock.Any()).DoAndReturn(
					func(_ context.Context, r *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
						record("NodeExpandVolume", r.GetVolumeCapability())
						return &csi.NodeExpandVolumeResponse{}, nil
					})
				want["NodeStageVolume"], want["NodeExpandVolume"] = c.node, c.node
				if c.ctrlErr == "" {
					m.controller.EXPECT().ControllerPublishVolume(gomock.Any(), gomock.Any()).DoAndReturn(
						func(_ context.Context, r *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
							record("ControllerPublishVolume", r.GetVolumeCapability())
							return &csi.ControllerPublishVolumeResponse{}, nil
						})
					want["ControllerPublishVolume"] = c.controller
				}
				_, err := p.Attach(ctx(t), attachRequest(spec))
				switch {
				case c.ctrlErr == "" && err != nil:
					t.Fatalf("Attach: %v", err)
				case c.ctrlErr != "" && (err == nil || !strings.Contains(err.Error(), c.ctrlErr) || !strings.Contains(err.Error(), "pv-1")):
					t.Fatalf("Attach: %v, want an error naming the PV and saying %q", err, c.ctrlErr)
				}
				if err := p.MountDevice(ctx(t), f.deviceRequest(spec, nil)); err != nil {
					t.Fatalf("MountDevice: %v", err)
				}
				req := f.setUpRequest(spec, pod("uid-1"), nil)
				if err := p.SetUp(ctx(t), req); err != nil {
					t.Fatalf("SetUp: %v", err)
				}
				if _, err := p.Expand(ctx(t), &plugins.ExpandRequest{VolumeName: req.VolumeName, Spec: spec, DeviceMountPath: req.DeviceMountPath,
					VolumePath: req.Dir, NewSize: resource.MustParse("2Gi"), Log: zaptest.NewLogger(t)}); err != nil {
					t.Fatalf("Expand: %v", err)
				}
			}
			for method, mode := range want {
				if g, ok := got.Load(method); !ok || g != mode {
					t.Errorf("%s access mode %v, want %v", method, g, mode)
				}
			}
		})
	}
}

// The PV's nodeExpandSecretRef is read when the node expands the volume
// and passed in NodeExpandVolume's secrets; a secret that cannot be read
// fails the expansion naming it, without calling the driver.
func TestNodeExpandSecret(t *testing.T) {
	f := newFixture(t)
	m := f.startRegistered(testDriver, caps{stage: true, expand: true})
	f.setSecret("secrets", "expand", map[string]string{"key": "k3y"})
	expand := func(secretName string) (*resource.Quantity, error) {
		spec := pvSpec("pv-1", "vol-1", func(pv *v1.PersistentVolume) {
			pv.Spec.CSI.NodeExpandSecretRef = &v1.SecretReference{Namespace: "secrets", Name: secretName}
		})
		return f.plugin().Expand(ctx(t), &plugins.ExpandRequest{VolumeName: uniqueName(spec), Spec: spec,
			DeviceMountPath: f.paths.DeviceMountPath(csiplugin.Name, identityOf(spec)), NewSize: resource.MustParse("2Gi"), Log: zaptest.NewLogger(t)})
	}
	m.node.EXPECT().NodeExpandVolume(gomock.Any(), eqProto(&csi.NodeExpandVolumeRequest{
		VolumeId: "vol-1", VolumePath: f.paths.DeviceMountPath(csiplugin.Name, testDriver+"^vol-1"),
		StagingTargetPath: f.paths.DeviceMountPath(csiplugin.Name, testDriver+"^vol-1"),
		CapacityRange:     &csi.CapacityRange{RequiredBytes: 2 << 30}, VolumeCapability: mountCap("ext4", nil, sw, ""),
		Secrets: map[string]string{"key": "k3y"},
	})).Return(&csi.NodeExpandVolumeResponse{}, nil)
	if size, err := expand("expand"); err != nil || size.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Fatalf("Expand = %v, %v", size, err)
	}
	if _, err := expand("missing"); err == nil || !strings.Contains(err.Error(), "secrets/missing") {
		t.Errorf("Expand with a missing secret: %v, want an error naming it", err)
	}
}

// fakeTokens issues "<audience>-<n>" tokens, a new one each time its
// generation is raised, and records what was asked.
type fakeTokens struct {
	mu   sync.Mutex
	keys []tokens.Key
	gen  int
	due  time.Time
	err  error
}

var tokenExpiry = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func (f *fakeTokens) Token(_ context.Context, k tokens.Key) (tokens.Token, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, k)
	if f.err != nil {
		return tokens.Token{}, time.Time{}, f.err
	}
	return tokens.Token{Value: fmt.Appendf(nil, "%s-%d", k.Audience, f.gen), Expires: tokenExpiry}, f.due, nil
}

func (f *fakeTokens) refresh() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
}

// A CSIDriver's tokenRequests: one token per audience for the pod's service
// account, bound to the pod, lifetime as asked (an hour when not), as the
// kubelet's JSON under csi.storage.k8s.io/serviceAccount.tokens, in the
// volume context or, with serviceAccountTokenInSecrets, in the secrets. A
// requiresRepublish driver is published again when a token is due (if that
// is sooner than the republish period) and gets the refreshed token. Tokens
// never reach a state file. Without an API server (standalone) the pod's
// volume fails with a clear error and the driver is not called.
func TestServiceAccountTokens(t *testing.T) {
	requests := []storagev1.TokenRequest{{Audience: "vault", ExpirationSeconds: ptr.To[int64](600)}, {Audience: ""}}
	wantKeys := func(p volume.PodInfo) []tokens.Key {
		return []tokens.Key{
			{Namespace: p.Namespace, ServiceAccount: p.ServiceAccount, Audience: "vault", ExpirationSeconds: 600, PodName: p.Name, PodUID: p.UID},
			{Namespace: p.Namespace, ServiceAccount: p.ServiceAccount, Audience: "", ExpirationSeconds: 3600, PodName: p.Name, PodUID: p.UID},
		}
	}
	wantJSON := func(gen int) string {
		return fmt.Sprintf(`{"":{"token":"-%d","expirationTimestamp":"2030-01-02T03:04:05Z"},"vault":{"token":"vault-%d","expirationTimestamp":"2030-01-02T03:04:05Z"}}`, gen, gen)
	}
	cases := []struct {
		name       string
		spec       storagev1.CSIDriverSpec
		noTokens   bool
		tokensErr  error
		inSecrets  bool
		republish  bool
		wantErr    []string
		wantNoKeys bool
	}{
		{name: "volume context", spec: storagev1.CSIDriverSpec{TokenRequests: requests}},
		{name: "secrets", spec: storagev1.CSIDriverSpec{TokenRequests: requests, ServiceAccountTokenInSecrets: ptr.To(true)}, inSecrets: true},
		{name: "requiresRepublish: the refreshed token reaches the driver",
			spec: storagev1.CSIDriverSpec{TokenRequests: requests, RequiresRepublish: ptr.To(true)}, republish: true},
		{name: "no tokenRequests: no tokens", spec: storagev1.CSIDriverSpec{}, wantNoKeys: true},
		{name: "standalone", spec: storagev1.CSIDriverSpec{TokenRequests: requests}, noTokens: true,
			wantErr: []string{"CSIDriver " + testDriver, "tokenRequests", "this test runs in standalone mode"}},
		{name: "token request refused", spec: storagev1.CSIDriverSpec{TokenRequests: requests}, tokensErr: fmt.Errorf("forbidden: no"),
			wantErr: []string{"CSIDriver " + testDriver, `audience "vault"`, "forbidden: no"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			fake := &fakeTokens{err: c.tokensErr, due: time.Now().Add(30 * time.Second)}
			if !c.noTokens {
				f.tokens = fake
			}
			m := f.startRegistered(testDriver, caps{})
			c.spec.AttachRequired = ptr.To(false)
			f.setCSIDriver(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: testDriver}, Spec: c.spec})
			f.setSecret("secrets", "publish", map[string]string{"user": "u", "csi.storage.k8s.io/serviceAccount.tokens": "from the secret"})
			spec := pvSpec("pv-1", "vol-1", func(pv *v1.PersistentVolume) {
				pv.Spec.CSI.VolumeAttributes = map[string]string{"pool": "fast"}
				pv.Spec.CSI.NodePublishSecretRef = &v1.SecretReference{Namespace: "secrets", Name: "publish"}
			})
			p := pod("uid-1")
			var published []*csi.NodePublishVolumeRequest
			var mu sync.Mutex
			if c.wantErr == nil {
				times := 1
				if c.republish {
					times = 2
				}
				m.node.EXPECT().NodePublishVolume(gomock.Any(), gomock.Any()).Times(times).DoAndReturn(
					func(_ context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
						mu.Lock()
						published = append(published, r)
						mu.Unlock()
						return &csi.NodePublishVolumeResponse{}, nil
					})
			}
			req := f.setUpRequest(spec, p, nil)
			err := f.plugin().SetUp(ctx(t), req)
			if c.wantErr != nil {
				for _, s := range c.wantErr {
					if err == nil || !strings.Contains(err.Error(), s) {
						t.Errorf("SetUp: %v, want an error saying %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("SetUp: %v", err)
			}
			if c.republish {
				// Due in 30 s, sooner than the republish period.
				if !req.RefreshAt.Equal(fake.due) {
					t.Errorf("RefreshAt %v, want when the tokens are due (%v)", req.RefreshAt, fake.due)
				}
				fake.refresh()
				if err := f.plugin().SetUp(ctx(t), req); err != nil {
					t.Fatalf("second SetUp: %v", err)
				}
			}
			if c.wantNoKeys {
				if len(fake.keys) != 0 || published[0].GetVolumeContext()["csi.storage.k8s.io/serviceAccount.tokens"] != "" {
					t.Errorf("tokens asked %v, volume context %v: want none", fake.keys, published[0].GetVolumeContext())
				}
				return
			}
			for i, r := range published {
				ctxKey := r.GetVolumeContext()["csi.storage.k8s.io/serviceAccount.tokens"]
				secretKey := r.GetSecrets()["csi.storage.k8s.io/serviceAccount.tokens"]
				got, other := ctxKey, secretKey
				if c.inSecrets {
					got, other = secretKey, ctxKey
				}
				if got != wantJSON(i) {
					t.Errorf("publish %d: tokens %s, want %s", i, got, wantJSON(i))
				}
				if !c.inSecrets && other != "from the secret" {
					t.Errorf("publish %d: the publish secret's own key was changed to %q", i, other)
				} else if c.inSecrets && other != "" {
					t.Errorf("publish %d: tokens in the volume context as well: %q", i, other)
				}
				if r.GetVolumeContext()["pool"] != "fast" || r.GetSecrets()["user"] != "u" {
					t.Errorf("publish %d lost the volume's own context or secrets: %v", i, r.GetVolumeContext())
				}
			}
			if keys := fake.keys[:2]; fmt.Sprint(keys) != fmt.Sprint(wantKeys(p)) {
				t.Errorf("tokens asked for %v, want %v", keys, wantKeys(p))
			}
			// Tokens are secrets: nothing under the root holds one.
			_ = filepath.Walk(f.paths.Root, func(path string, info os.FileInfo, err error) error {
				if err != nil || !info.Mode().IsRegular() {
					return nil
				}
				data, err := os.ReadFile(path)
				if err == nil && strings.Contains(string(data), "vault-") {
					t.Errorf("%s holds a token: %s", path, data)
				}
				return nil
			})
		})
	}
}

// What /debug/drivers says the plugin does with a driver's volumes: the
// CSIDriver object's settings, or the defaults without one (attach required
// unless there is no API server; Persistent only; fsGroup for RWO volumes
// with an fsType), and the token audiences, never a token.
func TestDriverPolicy(t *testing.T) {
	defaults := csiplugin.DriverPolicy{AttachRequired: true, FSGroupPolicy: storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy,
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}}
	standalone := defaults
	standalone.AttachRequired = false
	cases := []struct {
		name       string
		attachMode string
		spec       *storagev1.CSIDriverSpec
		want       csiplugin.DriverPolicy
	}{
		{name: "no object", attachMode: csiplugin.AttachController, want: defaults},
		{name: "no object, standalone", attachMode: csiplugin.AttachLocal, want: standalone},
		{name: "everything set", attachMode: csiplugin.AttachController, spec: &storagev1.CSIDriverSpec{
			AttachRequired: ptr.To(false), PodInfoOnMount: ptr.To(true), RequiresRepublish: ptr.To(true),
			FSGroupPolicy:        ptr.To(storagev1.FileFSGroupPolicy),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral},
			TokenRequests:        []storagev1.TokenRequest{{Audience: "vault"}, {Audience: ""}}, ServiceAccountTokenInSecrets: ptr.To(true),
		}, want: csiplugin.DriverPolicy{CSIDriver: true, PodInfoOnMount: true, RequiresRepublish: true, FSGroupPolicy: storagev1.FileFSGroupPolicy,
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral},
			TokenAudiences:       []string{"vault", ""}, TokensInSecrets: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			f.attachMode = c.attachMode
			if c.spec != nil {
				f.setCSIDriver(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: testDriver}, Spec: *c.spec})
			}
			if got := f.plugin().DriverPolicy(testDriver); fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", c.want) {
				t.Errorf("DriverPolicy = %+v, want %+v", got, c.want)
			}
		})
	}
}

// What NodeExpandVolume's errors mean, as the kubelet reads them:
// FailedPrecondition (not while in use), Unimplemented (nothing to do on
// the node), InvalidArgument / OutOfRange / NotFound (infeasible: the claim
// is marked so and the node stops retrying), the rest ordinary or uncertain
// failures.
func TestNodeExpandErrors(t *testing.T) {
	cases := []struct {
		code                            codes.Code
		inUse, notSupported, infeasible bool
		uncertain                       bool
	}{
		{code: codes.FailedPrecondition, inUse: true},
		{code: codes.Unimplemented, notSupported: true},
		{code: codes.InvalidArgument, infeasible: true},
		{code: codes.OutOfRange, infeasible: true},
		{code: codes.NotFound, infeasible: true},
		{code: codes.Internal},
		{code: codes.DeadlineExceeded, uncertain: true},
	}
	for _, c := range cases {
		t.Run(c.code.String(), func(t *testing.T) {
			f := newFixture(t)
			m := f.startRegistered(testDriver, caps{stage: true, expand: true})
			m.node.EXPECT().NodeExpandVolume(gomock.Any(), gomock.Any()).Return(nil, status.Error(c.code, "no"))
			spec := pvSpec("pv-1", "vol-1")
			_, err := f.plugin().Expand(ctx(t), &plugins.ExpandRequest{VolumeName: uniqueName(spec), Spec: spec,
				DeviceMountPath: f.paths.DeviceMountPath(csiplugin.Name, identityOf(spec)), NewSize: resource.MustParse("2Gi"), Log: zaptest.NewLogger(t)})
			if err == nil {
				t.Fatal("Expand succeeded")
			}
			for what, pair := range map[string][2]bool{
				"in use":        {errors.Is(err, plugins.ErrVolumeInUse), c.inUse},
				"not supported": {errors.Is(err, plugins.ErrExpansionNotSupported), c.notSupported},
				"infeasible":    {errors.Is(err, plugins.ErrExpansionInfeasible), c.infeasible},
				"uncertain":     {volume.IsUncertain(err), c.uncertain},
			} {
				if pair[0] != pair[1] {
					t.Errorf("%v: %s = %v, want %v", err, what, pair[0], pair[1])
				}
			}
			if !strings.Contains(err.Error(), "vol-1") || !strings.Contains(err.Error(), testDriver) {
				t.Errorf("%v does not name the volume and the driver", err)
			}
		})
	}
}
