package apivolume_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/apivolume"
	"github.com/volume-agent/volume-agent/plugins/pluginstest"
	"github.com/volume-agent/volume-agent/podcerts"
	"github.com/volume-agent/volume-agent/volume"
)

// The plugins' mount decisions with a recording mounter, without root.
func TestMountDecisions(t *testing.T) {
	m := pluginstest.NewMounter()
	paths := volume.Paths{Root: t.TempDir()}
	objects := &fakeObjects{secrets: map[string]*v1.Secret{"ns/s": {ObjectMeta: metav1.ObjectMeta{Name: "s"}, Data: map[string][]byte{"k": []byte("v")}}}}
	ps, _ := apivolume.New(plugins.Host{Paths: paths, Mounter: m, Log: zap.NewNop()}, apivolume.Sources{Objects: objects})
	reg := plugins.NewRegistry(ps...)
	s := spec("creds", secretVolume("s"))
	p := pod("p1")
	pl, err := reg.ForSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	dir := paths.PodVolumeDir(p.UID, pl.Name(), s.Name)
	setUp := func() error {
		return pl.SetUp(context.Background(), &plugins.SetUpRequest{VolumeName: volume.PodScopedName(pl.Name(), p.UID, s.Name), Spec: s, Pod: p, Dir: dir, Log: zap.NewNop()})
	}

	if err := setUp(); err != nil {
		t.Fatal(err)
	}
	want := []string{"MountTmpfs " + dir + " size=73728 mode=0755 noswap"}
	if got := m.CallStrings(); !slices.Equal(got, want) {
		t.Fatalf("first SetUp: %v, want %v (a tmpfs of two copies of one page plus 64 KiB, never swapped)", got, want)
	}
	// Again: already mounted, nothing mounted twice.
	if err := setUp(); err != nil {
		t.Fatal(err)
	}
	if got := m.CallStrings(); len(got) != 1 {
		t.Errorf("second SetUp mounted again: %v", got)
	}
	if err := pl.TearDown(context.Background(), &plugins.TearDownRequest{Spec: s, Pod: p.PodRef, Dir: dir, Log: zap.NewNop()}); err != nil {
		t.Fatal(err)
	}
	if got := m.Mounted(); len(got) != 0 {
		t.Errorf("still mounted after TearDown: %v", got)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("volume directory left: %v", err)
	}

	// A mount that fails leaves no directory behind.
	m.Fail(pluginstest.Fault{Op: "MountTmpfs", Err: errors.New("no memory"), Times: 1})
	if err := setUp(); err == nil {
		t.Fatal("SetUp succeeded with a failing mount")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed mount left %s: %v", filepath.Base(dir), err)
	}
}

// podCertificate projections a node cannot serve, or the API would have
// refused, are per-pod errors before anything is mounted.
func TestPodCertificateAttributes(t *testing.T) {
	proj := func(p v1.PodCertificateProjection) v1.VolumeSource {
		return v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{PodCertificate: &p}}}}
	}
	good := v1.PodCertificateProjection{SignerName: "example.com/s", KeyType: "ED25519", CredentialBundlePath: "creds.pem"}
	for _, tc := range []struct {
		name    string
		served  bool
		vs      v1.VolumeSource
		wantErr string
	}{
		{"served", true, proj(good), ""},
		{"not served", false, proj(good), `podCertificate projection (signer "example.com/s") cannot be served: no node identity`},
		{"unknown key type", true, proj(v1.PodCertificateProjection{SignerName: "a/b", KeyType: "RSA1024", KeyPath: "k"}), `keyType "RSA1024"`},
		{"no file", true, proj(v1.PodCertificateProjection{SignerName: "a/b", KeyType: "ED25519"}), "specify at least one of"},
		{"two sources, one path", true, v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{PodCertificate: &good}, {PodCertificate: &good}}}}, "conflicting duplicate paths"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := apivolume.Sources{NoPodCertsReason: "no node identity"}
			if tc.served {
				src.PodCerts = noCerts{}
			}
			ps, _ := apivolume.New(plugins.Host{Log: zap.NewNop()}, src)
			pl, err := plugins.NewRegistry(ps...).ForSpec(spec("tls", tc.vs))
			if err != nil {
				t.Fatal(err)
			}
			_, err = pl.Attributes(spec("tls", tc.vs))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Attributes: %v; want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

type noCerts struct{}

func (noCerts) Get(context.Context, podcerts.Request) (podcerts.Credentials, error) {
	return podcerts.Credentials{}, errors.New("unused")
}
