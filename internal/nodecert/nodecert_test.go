package nodecert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func TestRotationDeadline(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &x509.Certificate{NotBefore: start, NotAfter: start.Add(100 * time.Hour)}
	for _, tc := range []struct {
		r    float64
		want time.Duration
	}{
		{0, 70 * time.Hour},
		{0.5, 80 * time.Hour},
		{0.999999, 90 * time.Hour},
	} {
		got := rotationDeadline(c, tc.r).Sub(start)
		if d := got - tc.want; d < -time.Second || d > time.Second {
			t.Errorf("r=%v: renewed %v after NotBefore, want %v", tc.r, got, tc.want)
		}
	}
}

// pair is a self-signed certificate and its key, PEM encoded.
func pair(t *testing.T, cn string, orgs []string, notAfter time.Time) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})...)
}

func newManager(t *testing.T, dir string) *Manager {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1", InsecureSkipTLSVerify: true}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "abcdef.0123456789abcdef"}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "bootstrap.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	m, err := New(Options{BootstrapKubeconfig: path, Dir: dir, NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A certificate in the directory is used at start only if it is valid and
// names this node; otherwise there is none until one is issued, and
// requests fail saying why instead of going out anonymous.
func TestStart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		file   []byte
		usable bool
	}{
		{"none", nil, false},
		{"valid", pair(t, "system:node:node-a", []string{"system:nodes"}, time.Now().Add(time.Hour)), true},
		{"expired", pair(t, "system:node:node-a", []string{"system:nodes"}, time.Now().Add(-time.Minute)), false},
		{"another node", pair(t, "system:node:node-b", []string{"system:nodes"}, time.Now().Add(time.Hour)), false},
		{"not in system:nodes", pair(t, "system:node:node-a", nil, time.Now().Add(time.Hour)), false},
		{"garbage", []byte("not PEM"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.file != nil {
				if err := os.WriteFile(filepath.Join(dir, FileName), tc.file, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			m := newManager(t, dir)
			if got := m.Current() != nil; got != tc.usable {
				t.Fatalf("certificate usable: %v, want %v", got, tc.usable)
			}
			if got := !m.deadline().IsZero(); got != tc.usable {
				t.Errorf("renewal scheduled: %v, want %v", got, tc.usable)
			}
			expiry := testutil.ToFloat64(m.Collectors()[0])
			if got := expiry != 0; got != tc.usable {
				t.Errorf("expiration metric %v, want it set: %v", expiry, tc.usable)
			}
			if tc.usable {
				return
			}
			req, _ := http.NewRequest(http.MethodGet, "https://127.0.0.1:1/api", nil)
			_, err := m.Config().Transport.RoundTrip(req)
			if err == nil || !strings.Contains(err.Error(), "system:node:node-a to be approved") {
				t.Errorf("request without a certificate: %v, want the reason", err)
			}
		})
	}
}

func TestWriteFileAtomic(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	for _, data := range []string{"one", "two"} {
		if err := writeFileAtomic(path, []byte(data)); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("mode %v, want 0600", fi.Mode().Perm())
		}
		if got, _ := os.ReadFile(path); string(got) != data {
			t.Errorf("content %q, want %q", got, data)
		}
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("%d files left in the directory, want 1", len(entries))
	}
}
