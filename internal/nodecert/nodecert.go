// Package nodecert gives a node without a kubelet an identity of its own on
// the API server, obtained the way the kubelet obtains its own: with a
// bootstrap kubeconfig (typically a bootstrap token, user
// system:bootstrap:<id> in group system:bootstrappers) it creates a
// CertificateSigningRequest for a client certificate of user
// system:node:<name> in group system:nodes with the signer
// kubernetes.io/kube-apiserver-client-kubelet, waits until the controller
// manager has approved and signed it, keeps the key and certificate in a
// file of its directory (mode 0600), and renews the certificate at 70–90 %
// of its lifetime (jittered, as the kubelet does), authenticated by the
// certificate itself. A valid certificate found in the directory at start
// is used as it is: a restart makes no new request.
//
// The package owns that life cycle and a rest.Config that authenticates with
// the current certificate (Config); nothing else. It talks to the API server
// with a REST client of its own for certificates.k8s.io/v1 rather than
// client-go's certificate manager, which needs the generated clientset: that
// registers every API group at start-up and costs every agent about 9 MiB of
// resident memory (docs/performance.md).
package nodecert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/connrotation"
)

// FileName is the file in the certificate directory that holds the current
// certificate and its key, PEM encoded.
const FileName = "node-client.pem"

// Options configure New.
type Options struct {
	// BootstrapKubeconfig authenticates the first request, and any request
	// made once the certificate has expired.
	BootstrapKubeconfig string
	// Dir holds the certificate and its key; made (0700) if missing.
	Dir      string
	NodeName string
	// UserAgent of the requests.
	UserAgent string
	Log       *zap.Logger
}

// Manager obtains, keeps and renews the node's client certificate.
type Manager struct {
	o         Options
	bootstrap *rest.Config
	// base has the API server's address and how to trust it, no
	// credentials.
	base   *rest.Config
	dialer *connrotation.Dialer
	config *rest.Config

	// renewalErrors counts failed requests (Collectors).
	renewalErrors prometheus.Counter

	mu   sync.RWMutex
	cert *tls.Certificate
	// renewAt is the current certificate's rotation deadline, drawn once
	// per certificate (see rotationDeadline).
	renewAt time.Time

	now func() time.Time
}

// New reads the bootstrap kubeconfig and the certificate in Dir, if any. It
// makes no request: see Run.
func New(o Options) (*Manager, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.NodeName == "" || o.Dir == "" {
		return nil, errors.New("nodecert: the node name and the certificate directory are required")
	}
	bootstrap, err := clientcmd.BuildConfigFromFlags("", o.BootstrapKubeconfig)
	if err != nil {
		return nil, fmt.Errorf("bootstrap kubeconfig: %w", err)
	}
	bootstrap.UserAgent = o.UserAgent
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("node certificate directory: %w", err)
	}
	m := &Manager{o: o, bootstrap: bootstrap, now: time.Now, renewalErrors: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "volume_agent_node_certificate_renewal_errors_total",
		Help: "Failed requests for the node's client certificate (--bootstrap-kubeconfig).",
	})}
	m.base = &rest.Config{
		Host: bootstrap.Host, UserAgent: o.UserAgent,
		TLSClientConfig: rest.TLSClientConfig{
			Insecure: bootstrap.Insecure, ServerName: bootstrap.ServerName,
			CAFile: bootstrap.CAFile, CAData: bootstrap.CAData,
		},
	}
	if m.config, err = m.newConfig(); err != nil {
		return nil, err
	}
	switch cert, err := m.load(); {
	case err == nil:
		m.install(cert)
		o.Log.Info("node certificate found", append(certFields(cert.Leaf), zap.Time("renewAt", m.deadline()))...)
	case errors.Is(err, os.ErrNotExist):
	default:
		// A damaged or foreign file is replaced by the next request.
		o.Log.Warn("node certificate not usable, requesting a new one", zap.String("path", m.path()), zap.Error(err))
	}
	return m, nil
}

func (m *Manager) path() string { return filepath.Join(m.o.Dir, FileName) }

// Current is the certificate in use, nil before the first one is issued
// and once it has expired.
func (m *Manager) Current() *tls.Certificate {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.cert == nil || !m.now().Before(m.cert.Leaf.NotAfter) {
		return nil
	}
	return m.cert
}

// Collectors are the manager's metrics: when the current certificate
// expires (0 while there is none) and how many requests for one failed, so
// that a node about to lose its identity can be alerted on.
func (m *Manager) Collectors() []prometheus.Collector {
	expiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "volume_agent_node_certificate_expiration_timestamp_seconds",
		Help: "When the node's client certificate expires, in Unix seconds; 0 while there is none.",
	}, func() float64 {
		if c := m.Current(); c != nil {
			return float64(c.Leaf.NotAfter.Unix())
		}
		return 0
	})
	return []prometheus.Collector{expiry, m.renewalErrors}
}

// Config is a client configuration that authenticates with the current
// certificate. Until one is issued, its requests fail saying so.
func (m *Manager) Config() *rest.Config { return rest.CopyConfig(m.config) }

func (m *Manager) newConfig() (*rest.Config, error) {
	tlsConfig, err := rest.TLSConfigFor(m.base)
	if err != nil {
		return nil, fmt.Errorf("bootstrap kubeconfig: %w", err)
	}
	if tlsConfig == nil {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tlsConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if c := m.Current(); c != nil {
			return c, nil
		}
		return &tls.Certificate{}, nil
	}
	// A connection keeps the identity it was opened with, and the API
	// server checks the certificate's validity on every request: each
	// renewal closes the connections (see install) so that none outlives
	// its certificate.
	m.dialer = connrotation.NewDialer((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
	t := utilnet.SetTransportDefaults(&http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSHandshakeTimeout: 10 * time.Second,
		TLSClientConfig:     tlsConfig,
		MaxIdleConnsPerHost: 25,
		DialContext:         m.dialer.DialContext,
	})
	cfg := &rest.Config{Host: m.base.Host, UserAgent: m.o.UserAgent, Transport: &requireCert{m: m, next: t}}
	return cfg, nil
}

// requireCert fails requests while there is no certificate: sent without
// one, they would reach the API server as system:anonymous and be refused
// for a reason that hides the real one.
type requireCert struct {
	m    *Manager
	next http.RoundTripper
}

func (r *requireCert) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.m.Current() == nil {
		return nil, fmt.Errorf("no valid node certificate yet: waiting for the CertificateSigningRequest for system:node:%s to be approved and signed", r.m.o.NodeName)
	}
	return r.next.RoundTrip(req)
}

// Run renews the certificate until ctx ends: at once when there is none or
// it does not fit this node, else at its rotation deadline; failures are
// retried with a backoff from 2 s to 5 min.
func (m *Manager) Run(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		wait := m.deadline().Sub(m.now())
		if backoff > 0 {
			wait = backoff
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err := m.renew(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			m.renewalErrors.Inc()
			backoff = min(max(2*backoff, 2*time.Second), 5*time.Minute)
			m.o.Log.Error("node certificate request failed", zap.Duration("retryIn", backoff), zap.Error(err))
			continue
		}
		backoff = 0
	}
}

// deadline is when the certificate is to be renewed; the zero time when
// there is none.
func (m *Manager) deadline() time.Time {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.renewAt
}

// install makes cert the current certificate, renewed at a random point
// between 70 and 90 % of its lifetime so that nodes started together
// spread their renewals.
func (m *Manager) install(cert *tls.Certificate) {
	m.mu.Lock()
	m.cert = cert
	m.renewAt = rotationDeadline(cert.Leaf, mathrand.Float64())
	m.mu.Unlock()
}

// rotationDeadline is NotBefore plus (0.7 + 0.2 r) of the lifetime, r in
// [0, 1).
func rotationDeadline(c *x509.Certificate, r float64) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(time.Duration(float64(life) * (0.7 + 0.2*r)))
}

// renew requests a certificate for a new key, authenticated by the current
// certificate when there is one (its renewal is approved as the node's
// own, selfnodeclient) and by the bootstrap credentials otherwise
// (nodeclient), and installs it.
func (m *Manager) renew(ctx context.Context) error {
	auth, how := m.bootstrap, "bootstrap credentials"
	if m.Current() != nil {
		auth, how = m.config, "current node certificate"
	}
	client, err := csrClient(auth)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: m.subject()}, key)
	if err != nil {
		return err
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "node-csr-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			// What the API server's approver accepts for a node client
			// certificate with an ECDSA key, as the kubelet asks.
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}
	created := &certificatesv1.CertificateSigningRequest{}
	if err := client.Post().Resource("certificatesigningrequests").Body(csr).Do(ctx).Into(created); err != nil {
		return fmt.Errorf("creating a CertificateSigningRequest with the %s: %w", how, err)
	}
	m.o.Log.Info("node certificate requested", zap.String("csr", created.Name), zap.String("authenticatedBy", how))
	certPEM, err := m.waitIssued(ctx, client, created)
	if err != nil {
		return fmt.Errorf("CertificateSigningRequest %s: %w", created.Name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	pair := append(slices.Clip(certPEM), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})...)
	cert, err := m.parse(pair)
	if err != nil {
		return fmt.Errorf("CertificateSigningRequest %s: the issued certificate: %w", created.Name, err)
	}
	if err := writeFileAtomic(m.path(), pair); err != nil {
		return fmt.Errorf("storing the node certificate: %w", err)
	}
	m.install(cert)
	m.dialer.CloseAll()
	m.o.Log.Info("node certificate issued", append(certFields(cert.Leaf), zap.String("csr", created.Name), zap.Time("renewAt", m.deadline()))...)
	return nil
}

// waitIssued polls the request (a node may get but not watch one by name
// on every API server version) until it is signed, denied or failed.
func (m *Manager) waitIssued(ctx context.Context, client *rest.RESTClient, csr *certificatesv1.CertificateSigningRequest) ([]byte, error) {
	delay := 250 * time.Millisecond
	for {
		for _, c := range csr.Status.Conditions {
			switch c.Type {
			case certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
				return nil, fmt.Errorf("%s: %s: %s", c.Type, c.Reason, c.Message)
			}
		}
		if len(csr.Status.Certificate) > 0 {
			return csr.Status.Certificate, nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 10*time.Second)
		next := &certificatesv1.CertificateSigningRequest{}
		if err := client.Get().Resource("certificatesigningrequests").Name(csr.Name).Do(ctx).Into(next); err != nil {
			m.o.Log.Warn("reading the CertificateSigningRequest", zap.String("csr", csr.Name), zap.Error(err))
			continue
		}
		csr = next
	}
}

func (m *Manager) subject() pkix.Name {
	return pkix.Name{CommonName: "system:node:" + m.o.NodeName, Organization: []string{"system:nodes"}}
}

// load reads the certificate file; an expired certificate or one for
// another subject is not usable.
func (m *Manager) load() (*tls.Certificate, error) {
	data, err := os.ReadFile(m.path())
	if err != nil {
		return nil, err
	}
	cert, err := m.parse(data)
	if err != nil {
		return nil, err
	}
	if !m.now().Before(cert.Leaf.NotAfter) {
		return nil, fmt.Errorf("expired at %s", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return cert, nil
}

// parse checks that a PEM certificate and key pair belong together and
// name this node.
func (m *Manager) parse(pair []byte) (*tls.Certificate, error) {
	cert, err := tls.X509KeyPair(pair, pair)
	if err != nil {
		return nil, err
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, err
		}
		cert.Leaf = leaf
	}
	want := m.subject()
	if leaf.Subject.CommonName != want.CommonName || !slices.Contains(leaf.Subject.Organization, "system:nodes") {
		return nil, fmt.Errorf("the certificate is for %q in %q, not %q in system:nodes", leaf.Subject.CommonName, leaf.Subject.Organization, want.CommonName)
	}
	return &cert, nil
}

// writeFileAtomic replaces path with data (mode 0600) so that a crash
// leaves either the old pair or the new one, never half of either.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, nothing to remove
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func certFields(c *x509.Certificate) []zap.Field {
	return []zap.Field{
		zap.String("subject", c.Subject.CommonName), zap.String("serial", c.SerialNumber.String()),
		zap.Time("notAfter", c.NotAfter),
	}
}

var codecs = sync.OnceValue(func() serializer.CodecFactory {
	s := runtime.NewScheme()
	if err := certificatesv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(s)
})

// csrClient is a REST client for certificates.k8s.io/v1 with auth's
// credentials.
func csrClient(auth *rest.Config) (*rest.RESTClient, error) {
	cfg := rest.CopyConfig(auth)
	cfg.GroupVersion = &certificatesv1.SchemeGroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = codecs().WithoutConversion()
	cfg.ContentType = "application/json"
	return rest.RESTClientFor(cfg)
}
