package cluster_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// trustBundleTest is TestClusterTrustBundles' env name: its node gets
// credentials of its own (the Node authorizer lets nodes read every
// ClusterTrustBundle; the default ClusterRole grants nothing on them).
const trustBundleTest = "trustbundles"

func testCert(t *testing.T, cn string) (string, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), der
}

// certsIn decodes the certificates of a PEM file.
func certsIn(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			return out
		}
		out[string(b.Bytes)] = true
	}
}

// clusterTrustBundle projections by name and by signer and label selector,
// following changes.
func TestClusterTrustBundles(t *testing.T) {
	e := newEnv(t, trustBundleTest)
	ctbs := suite.Admin.CertificatesV1beta1().ClusterTrustBundles()
	create := func(name, signer string, labels map[string]string, pems ...string) {
		t.Helper()
		b := &certificatesv1beta1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: certificatesv1beta1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: strings.Join(pems, "")}}
		if _, err := ctbs.Create(t.Context(), b, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ClusterTrustBundle %s: %v", name, err)
		}
		t.Cleanup(func() { _ = ctbs.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	plainPEM, plainDER := testCert(t, "plain")
	aPEM, aDER := testCert(t, "a")
	bPEM, bDER := testCert(t, "b")
	signer := "example.com/" + e.ns
	prefix := "example.com:" + e.ns + ":"
	create(e.ns+"-plain", "", nil, plainPEM)
	// The same certificate in two bundles: written once.
	create(prefix+"one", signer, map[string]string{"env": "prod"}, aPEM)
	create(prefix+"dup", signer, map[string]string{"env": "prod"}, aPEM)
	create(prefix+"other", signer, map[string]string{"env": "dev"}, bPEM)

	e.start("--node-kubeconfig=" + suite.Cluster.NodeKubeconfig(e.node))
	pod := e.createPod(e.pod("app", corev1.Volume{Name: "trust", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Name: ptr.To(e.ns + "-plain"), Path: "plain.pem"}},
		{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{SignerName: ptr.To(signer), LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}, Path: "prod.pem"}},
		{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{SignerName: ptr.To(signer), LabelSelector: &metav1.LabelSelector{}, Path: "all.pem"}},
		{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Name: ptr.To(e.ns + "-absent"), Path: "absent.pem", Optional: ptr.To(true)}},
	}}}}))
	e.waitCondition("app", corev1.ConditionTrue, "VolumesMounted")
	dir := e.volumePath(pod.UID, e2eutil.ProjectedPlugin, "trust")
	check := func(file string, want ...[]byte) {
		t.Helper()
		e2eutil.PollErr(t, 60*time.Second, file, func() error {
			got := certsIn(t, filepath.Join(dir, file))
			if len(got) != len(want) {
				return fmt.Errorf("%s holds %d certificates, want %d", file, len(got), len(want))
			}
			for _, w := range want {
				if !got[string(w)] {
					return fmt.Errorf("%s lacks a certificate", file)
				}
			}
			return nil
		})
	}
	check("plain.pem", plainDER)
	check("prod.pem", aDER)
	check("all.pem", aDER, bDER)
	if data, err := os.ReadFile(filepath.Join(dir, "absent.pem")); err != nil || len(data) != 0 {
		t.Errorf("optional missing bundle: %q, %v; want an empty file", data, err)
	}

	// A new bundle of the signer reaches the files that select it.
	cPEM, cDER := testCert(t, "c")
	create(prefix+"third", signer, map[string]string{"env": "prod"}, cPEM)
	check("prod.pem", aDER, cDER)
	check("all.pem", aDER, bDER, cDER)

	// A bundle that is not there and not optional: the pod is told.
	missing := e.createPod(e.pod("missing", corev1.Volume{Name: "trust", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Name: ptr.To(e.ns + "-absent"), Path: "ca.pem"}},
	}}}}))
	e.waitEvent("missing", "FailedMount", nil, e.ns+"-absent")
	e.deletePod("app", 0)
	e.deletePod("missing", 0)
	e.waitTornDown(pod.UID)
	e.waitTornDown(missing.UID)
}
