package apiobjects

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/source/objectwatch"
)

func certPEM(t *testing.T, cn string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestNormalizePEM(t *testing.T) {
	a, b := certPEM(t, "a"), certPEM(t, "b")
	one, err := NormalizePEM(a + "\n\n" + b)
	if err != nil {
		t.Fatal(err)
	}
	two, err := NormalizePEM(b, a, a, "# comment\n"+b)
	if err != nil {
		t.Fatal(err)
	}
	if string(one) != string(two) {
		t.Errorf("the same certificates in another order, with duplicates, give other bytes:\n%s\n%s", one, two)
	}
	if n := strings.Count(string(one), "BEGIN CERTIFICATE"); n != 2 {
		t.Errorf("%d certificates, want 2", n)
	}
	if _, err := NormalizePEM(a + "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"); err == nil {
		t.Error("a private key in a trust bundle must be refused")
	}
}

func TestBundleKey(t *testing.T) {
	tests := []struct {
		p    v1.ClusterTrustBundleProjection
		want objectwatch.Key
		ok   bool
	}{
		{v1.ClusterTrustBundleProjection{Name: ptr.To("b1")}, objectwatch.Key{Name: "b1"}, true},
		{v1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/s")}, objectwatch.Key{}, false},
		{v1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/s"), LabelSelector: &metav1.LabelSelector{}},
			objectwatch.Key{Fields: "spec.signerName=example.com/s"}, true},
		{v1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/s"), LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}},
			objectwatch.Key{Fields: "spec.signerName=example.com/s", Labels: "env=prod"}, true},
	}
	for _, tt := range tests {
		got, ok := bundleKey(&tt.p)
		if ok != tt.ok || got != tt.want {
			t.Errorf("bundleKey(%+v) = %+v, %v; want %+v, %v", tt.p, got, ok, tt.want, tt.ok)
		}
	}
}
