package cluster_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// podCertTest is TestPodCertificates' env name: its node has credentials of
// its own (the agent makes PodCertificateRequests only with the node's
// identity).
const podCertTest = "podcerts"

// testSigner is the signer controller of the test: it issues the requests
// of its signer with a test CA (beginRefreshAt as early as the API allows,
// so that the test sees a refresh) and denies those of pods named
// "denied".
type testSigner struct {
	name   string
	ca     *x509.Certificate
	caKey  crypto.Signer
	caPEM  []byte
	issued chan string
}

func newTestSigner(t *testing.T, name string) *testSigner {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test signer CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testSigner{name: name, ca: ca, caKey: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), issued: make(chan string, 100)}
}

// run answers the namespace's requests of the signer until ctx ends.
func (s *testSigner) run(ctx context.Context, t *testing.T, ns string) {
	pcrs := suite.Admin.CertificatesV1beta1().PodCertificateRequests(ns)
	for ctx.Err() == nil {
		w, err := pcrs.Watch(ctx, metav1.ListOptions{})
		if err != nil {
			time.Sleep(100 * time.Millisecond) // reconnect pause, not synchronisation
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			pcr, ok := ev.Object.(*certificatesv1beta1.PodCertificateRequest)
			if !ok || pcr.Spec.SignerName != s.name || len(pcr.Status.Conditions) > 0 {
				continue
			}
			if err := s.answer(ctx, pcr); err != nil && ctx.Err() == nil {
				t.Errorf("signer: %s/%s: %v", ns, pcr.Name, err)
			}
		}
		w.Stop()
	}
}

func (s *testSigner) answer(ctx context.Context, pcr *certificatesv1beta1.PodCertificateRequest) error {
	now := metav1.Now()
	if pcr.Spec.PodName == "denied" {
		pcr.Status.Conditions = []metav1.Condition{{Type: certificatesv1beta1.PodCertificateRequestConditionTypeDenied, Status: metav1.ConditionTrue,
			Reason: "TestDenied", Message: "pods named denied get no certificate", LastTransitionTime: now}}
	} else {
		csr, err := x509.ParseCertificateRequest(pcr.Spec.StubPKCS10Request)
		if err != nil {
			return err
		}
		if err := csr.CheckSignature(); err != nil {
			return fmt.Errorf("proof of possession: %w", err)
		}
		// The API wants notBefore within 5 minutes of now and
		// beginRefreshAt at least 10 minutes after notBefore: the earliest
		// refresh is a little over 5 minutes away.
		notBefore := time.Now().Add(-4*time.Minute - 50*time.Second).Truncate(time.Second)
		notAfter := notBefore.Add(time.Hour)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: pcr.Spec.PodName},
			NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca, csr.PublicKey, s.caKey)
		if err != nil {
			return err
		}
		pcr.Status.CertificateChain = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})) + string(s.caPEM)
		pcr.Status.NotBefore = &metav1.Time{Time: notBefore}
		pcr.Status.NotAfter = &metav1.Time{Time: notAfter}
		pcr.Status.BeginRefreshAt = &metav1.Time{Time: notBefore.Add(10*time.Minute + time.Second)}
		pcr.Status.Conditions = []metav1.Condition{{Type: certificatesv1beta1.PodCertificateRequestConditionTypeIssued, Status: metav1.ConditionTrue,
			Reason: "Issued", Message: "issued by the test signer", LastTransitionTime: now}}
	}
	_, err := suite.Admin.CertificatesV1beta1().PodCertificateRequests(pcr.Namespace).UpdateStatus(ctx, pcr, metav1.UpdateOptions{})
	if err == nil {
		s.issued <- pcr.Spec.PodName
	}
	return err
}

// credentials decodes a key PEM and a chain PEM and checks that the leaf
// was issued by the CA to the key; it returns the leaf.
func (s *testSigner) credentials(keyPEM, chainPEM []byte) (*x509.Certificate, error) {
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("no PRIVATE KEY block")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	cb, rest := pem.Decode(chainPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("the chain does not start with a CERTIFICATE")
	}
	leaf, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(bytes.TrimSpace(rest), bytes.TrimSpace(s.caPEM)) {
		return nil, fmt.Errorf("the chain does not end with the CA")
	}
	if err := leaf.CheckSignatureFrom(s.ca); err != nil {
		return nil, fmt.Errorf("leaf not signed by the CA: %w", err)
	}
	pub := k.(crypto.Signer).Public().(interface{ Equal(crypto.PublicKey) bool })
	if !pub.Equal(leaf.PublicKey) {
		return nil, fmt.Errorf("the certificate is not for the key")
	}
	return leaf, nil
}

// podCertStatus reads the agent's pod certificate states (debug endpoint).
func podCertStatus(debugURL string) ([]struct {
	PodName string `json:"podName"`
	State   string `json:"state"`
}, error) {
	resp, err := http.Get(debugURL + "/debug/api-volumes")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var doc struct {
		PodCertificates []struct {
			PodName string `json:"podName"`
			State   string `json:"state"`
		} `json:"podCertificates"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, err
	}
	return doc.PodCertificates, nil
}

// podCertificate projections: issued by a signer (files written, key and
// certificate matching), kept across a restart of the agent, refreshed at beginRefreshAt with a new key, a
// pending request keeps the pod not ready with a reason naming the
// request, and a denied one gives the signer's reason.
func TestPodCertificates(t *testing.T) {
	t.Parallel() // most of it is waiting for the earliest refresh the API allows (notBefore + 10 min, notBefore at most 5 min ago)
	e := newEnv(t, podCertTest)
	signer := newTestSigner(t, "example.com/"+e.ns)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); signer.run(ctx, t, e.ns) }()
	t.Cleanup(func() { cancel(); <-done })

	e.start("--node-kubeconfig=" + suite.Cluster.NodeKubeconfig(e.node))
	certVolume := func(signerName string) corev1.Volume {
		return corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{PodCertificate: &corev1.PodCertificateProjection{SignerName: signerName, KeyType: "ECDSAP256", CredentialBundlePath: "creds.pem"}},
			{PodCertificate: &corev1.PodCertificateProjection{SignerName: signerName, KeyType: "ED25519", KeyPath: "tls.key", CertificateChainPath: "tls.crt"}},
		}}}}
	}
	pod := e.createPod(e.pod("app", certVolume(signer.name)))
	e.waitCondition("app", corev1.ConditionTrue, "VolumesMounted")
	dir := e.volumePath(pod.UID, e2eutil.ProjectedPlugin, "tls")
	read := func() (bundleLeaf, pairLeaf *x509.Certificate, err error) {
		b, err := os.ReadFile(filepath.Join(dir, "creds.pem"))
		if err != nil {
			return nil, nil, err
		}
		kb, rest := pem.Decode(b)
		if kb == nil {
			return nil, nil, fmt.Errorf("creds.pem: no key")
		}
		if bundleLeaf, err = signer.credentials(pem.EncodeToMemory(kb), rest); err != nil {
			return nil, nil, fmt.Errorf("creds.pem: %w", err)
		}
		key, err := os.ReadFile(filepath.Join(dir, "tls.key"))
		if err != nil {
			return nil, nil, err
		}
		chain, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
		if err != nil {
			return nil, nil, err
		}
		if pairLeaf, err = signer.credentials(key, chain); err != nil {
			return nil, nil, fmt.Errorf("tls.key, tls.crt: %w", err)
		}
		if _, ok := pairLeaf.PublicKey.(ed25519.PublicKey); !ok {
			return nil, nil, fmt.Errorf("tls.crt: a %T key, want ED25519", pairLeaf.PublicKey)
		}
		return bundleLeaf, pairLeaf, nil
	}
	firstBundle, firstPair, err := read()
	if err != nil {
		t.Fatalf("after issuance: %v", err)
	}
	if firstBundle.Subject.CommonName != "app" {
		t.Errorf("certificate for %q, want the pod app", firstBundle.Subject.CommonName)
	}
	// The requests name the pod, its service account and the node, with
	// UIDs (NodeRestriction checked them too).
	pcrs, err := suite.Admin.CertificatesV1beta1().PodCertificateRequests(e.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pcrs.Items {
		if p.Spec.PodUID != pod.UID || string(p.Spec.NodeName) != e.node || p.Spec.NodeUID == "" || p.Spec.ServiceAccountName != "default" || p.Spec.ServiceAccountUID == "" {
			t.Errorf("request %s: spec %+v", p.Name, p.Spec)
		}
	}

	// A restart: the volume's credentials are adopted (its requests are
	// in the API), so no new request is made and nothing is rewritten.
	before := map[string][]byte{}
	for _, f := range []string{"creds.pem", "tls.key", "tls.crt"} {
		if before[f], err = os.ReadFile(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	e.agent.Start()
	e2eutil.PollErr(t, 60*time.Second, "credentials adopted after the restart", func() error {
		st, err := podCertStatus(e.agent.DebugURL())
		if err != nil {
			return err
		}
		issued := 0
		for _, s := range st {
			if s.PodName == "app" && s.State == "issued" {
				issued++
			}
		}
		if issued != 2 {
			return fmt.Errorf("projections of app: %+v", st)
		}
		return nil
	})
	for f, want := range before {
		if got, err := os.ReadFile(filepath.Join(dir, f)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s changed across the restart (%v)", f, err)
		}
	}
	if after, err := suite.Admin.CertificatesV1beta1().PodCertificateRequests(e.ns).List(t.Context(), metav1.ListOptions{}); err != nil || len(after.Items) != len(pcrs.Items) {
		t.Errorf("requests after the restart: %d (%v), want %d", len(after.Items), err, len(pcrs.Items))
	}

	// A signer that never answers: the pod is not ready (a wait, not a
	// failure), and the page and `volume-agent status` say why.
	silent := e.createPod(e.pod("waiting", certVolume("example.com/"+e.ns+"-silent")))
	cond := e.waitCondition("waiting", corev1.ConditionFalse, "WaitingForVolumes")
	if !strings.Contains(cond.Message, "tls") {
		t.Errorf("pending: condition message %q does not name the volume", cond.Message)
	}
	e2eutil.PollErr(t, 30*time.Second, "the pending request on the page", func() error {
		resp, err := http.Get(e.agent.DebugURL() + "/debug/status/pods/" + e.ns + "/waiting")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		for _, want := range []string{`"tls"`, "PodCertificateRequest " + e.ns + "/req-", "example.com/" + e.ns + "-silent", "not issued yet"} {
			if !strings.Contains(string(body), want) {
				return fmt.Errorf("%s lacks %q", body, want)
			}
		}
		return nil
	})
	// Denied: the signer's reason reaches the pod.
	denied := e.createPod(e.pod("denied", certVolume(signer.name)))
	e.waitEvent("denied", "FailedMount", nil, "denied", "TestDenied", "pods named denied get no certificate")
	cond = e.waitCondition("denied", corev1.ConditionFalse, "MountFailed")
	if !strings.Contains(cond.Message, "TestDenied") {
		t.Errorf("denied: condition message %q", cond.Message)
	}

	// Refresh: at beginRefreshAt (a little over 5 minutes after issuance,
	// the earliest the API allows) both projections get a new key and
	// certificate.
	e2eutil.PollErr(t, 8*time.Minute, "refreshed credentials", func() error {
		b, p, err := read()
		if err != nil {
			return err
		}
		if b.Equal(firstBundle) || p.Equal(firstPair) {
			return fmt.Errorf("not refreshed yet")
		}
		return nil
	})
	e.deletePod("app", 0)
	e.deletePod("waiting", 0)
	e.deletePod("denied", 0)
	e.waitTornDown(pod.UID)
	e.waitTornDown(silent.UID)
	e.waitTornDown(denied.UID)
}
