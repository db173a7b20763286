package podcerts

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func TestDecide(t *testing.T) {
	cur := &credential{refreshAt: t0.Add(time.Hour), notAfter: t0.Add(2 * time.Hour)}
	pend := &pending{pcr: "req-1", created: t0}
	for _, tc := range []struct {
		name string
		s    state
		now  time.Time
		want action
	}{
		{"nothing yet: request", state{}, t0, actCreate},
		{"requested: wait", state{pend: pend}, t0, actWait},
		{"issued: serve", state{cur: cur}, t0, actServe},
		{"at beginRefreshAt: request again", state{cur: cur}, t0.Add(time.Hour), actCreate},
		{"refreshing: keep serving", state{cur: cur, pend: pend}, t0.Add(90 * time.Minute), actServe},
		{"refresh not issued by expiry: wait", state{cur: cur, pend: pend}, t0.Add(2 * time.Hour), actWait},
		{"denied: fail whatever else", state{cur: cur, fail: errors.New("denied")}, t0, actFail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decide(tc.s, tc.now); got != tc.want {
				t.Errorf("decide = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestNextCall(t *testing.T) {
	cur := &credential{refreshAt: t0.Add(time.Hour), notAfter: t0.Add(2 * time.Hour)}
	for _, tc := range []struct {
		name string
		s    state
		want time.Time
	}{
		{"issued: at the refresh", state{cur: cur}, t0.Add(time.Hour)},
		{"refreshing: when the request counts as deleted", state{cur: cur, pend: &pending{created: t0.Add(time.Hour)}}, t0.Add(time.Hour + assumeDeleted)},
		{"refreshing late: at expiry", state{cur: cur, pend: &pending{created: t0.Add(115 * time.Minute)}}, t0.Add(2 * time.Hour)},
		{"nothing", state{}, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextCall(tc.s); !got.Equal(tc.want) {
				t.Errorf("nextCall = %v, want %v", got, tc.want)
			}
		})
	}
}

// ca issues test certificates.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newCA(t *testing.T) *ca {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, NotBefore: t0.Add(-time.Hour), NotAfter: t0.Add(48 * time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &ca{cert: c, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// issue answers pcr with a certificate for pub (the requested key unless
// given), valid from now for two hours, refresh after one.
func (c *ca) issue(t *testing.T, pcr *certificatesv1beta1.PodCertificateRequest, now time.Time, pub any) {
	t.Helper()
	if pub == nil {
		csr, err := x509.ParseCertificateRequest(pcr.Spec.StubPKCS10Request)
		if err != nil {
			t.Fatal(err)
		}
		if err := csr.CheckSignature(); err != nil {
			t.Fatalf("proof of possession: %v", err)
		}
		pub = csr.PublicKey
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), NotBefore: now, NotAfter: now.Add(2 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, pub, c.key)
	if err != nil {
		t.Fatal(err)
	}
	// Headers and text between blocks are dropped from what is written.
	pcr.Status.CertificateChain = "junk\n" + string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Headers: map[string]string{"X": "y"}, Bytes: der})) + c.pem
	pcr.Status.NotBefore, pcr.Status.NotAfter = &metav1.Time{Time: now}, &metav1.Time{Time: now.Add(2 * time.Hour)}
	pcr.Status.BeginRefreshAt = &metav1.Time{Time: now.Add(time.Hour)}
	pcr.Status.Conditions = []metav1.Condition{{Type: certificatesv1beta1.PodCertificateRequestConditionTypeIssued, Status: metav1.ConditionTrue, Reason: "Issued"}}
}

// fakeAPI creates requests into a map that also serves Lookup.
type fakeAPI struct {
	mu        sync.Mutex
	pcrs      map[string]*certificatesv1beta1.PodCertificateRequest
	n         int
	createErr error
	ensureErr error
}

func (f *fakeAPI) CreatePodCertificateRequest(_ context.Context, pcr *certificatesv1beta1.PodCertificateRequest) (*certificatesv1beta1.PodCertificateRequest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.createErr != nil {
		return nil, f.createErr
	}
	f.n++
	p := pcr.DeepCopy()
	p.Name = fmt.Sprintf("req-%d", f.n)
	f.pcrs[p.Name] = p
	return p, nil
}

func (f *fakeAPI) ServiceAccountUID(_ context.Context, ns, name string) (types.UID, error) {
	return types.UID("sa-" + name), nil
}

func (f *fakeAPI) Ensure(context.Context) error { return f.ensureErr }

func (f *fakeAPI) Get(_, name string) (*certificatesv1beta1.PodCertificateRequest, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pcrs[name]
	return p, ok
}

func (f *fakeAPI) ByPod(uid types.UID) []*certificatesv1beta1.PodCertificateRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*certificatesv1beta1.PodCertificateRequest
	for _, p := range f.pcrs {
		if p.Spec.PodUID == uid {
			out = append(out, p)
		}
	}
	return out
}

func (f *fakeAPI) last() *certificatesv1beta1.PodCertificateRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pcrs[fmt.Sprintf("req-%d", f.n)]
}

func newManager(api *fakeAPI, clk *clocktesting.FakeClock) *Manager {
	return New(Options{Creator: api, Lookup: api, Clock: clk, Jitter: func(time.Duration) time.Duration { return 0 },
		Node: func() (string, types.UID, bool) { return "node-1", "node-uid", true }})
}

func request(keyType string) Request {
	return Request{Key: Key{Namespace: "ns", PodName: "app", PodUID: "pod-uid", Volume: "tls"}, ServiceAccount: "",
		Projection: v1.PodCertificateProjection{SignerName: "example.com/s", KeyType: keyType, UserAnnotations: map[string]string{"example.com/a": "b"}}}
}

// The whole life of a projection: requested, pending, issued (every key
// type), refreshed with a new key while the old is served, then denied.
func TestManagerLifecycle(t *testing.T) {
	for _, kt := range []string{"RSA3072", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"} {
		t.Run(kt, func(t *testing.T) {
			api := &fakeAPI{pcrs: map[string]*certificatesv1beta1.PodCertificateRequest{}}
			clk := clocktesting.NewFakeClock(t0)
			m := newManager(api, clk)
			c := newCA(t)
			ctx := t.Context()

			_, err := m.Get(ctx, request(kt))
			if !errors.Is(err, ErrPending) || !strings.Contains(err.Error(), "req-1") {
				t.Fatalf("first Get: %v, want pending naming req-1", err)
			}
			p := api.last()
			s := p.Spec
			if s.PodName != "app" || s.PodUID != "pod-uid" || s.ServiceAccountName != "default" || s.ServiceAccountUID != "sa-default" ||
				s.NodeName != "node-1" || s.NodeUID != "node-uid" || s.SignerName != "example.com/s" || s.UnverifiedUserAnnotations["example.com/a"] != "b" ||
				len(p.OwnerReferences) != 1 || p.OwnerReferences[0].UID != "pod-uid" {
				t.Fatalf("request: %+v %+v", p.ObjectMeta, s)
			}
			if _, err := m.Get(ctx, request(kt)); !errors.Is(err, ErrPending) || api.n != 1 {
				t.Fatalf("second Get: %v, %d requests; want pending, one request", err, api.n)
			}

			c.issue(t, p, t0, nil)
			got, err := m.Get(ctx, request(kt))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(got.Chain), "junk") || strings.Contains(string(got.Chain), "X: y") {
				t.Errorf("chain not cleaned: %q", got.Chain)
			}
			if !got.RefreshAt.Equal(t0.Add(time.Hour)) {
				t.Errorf("refresh at %v, want beginRefreshAt", got.RefreshAt)
			}
			first := got

			clk.SetTime(t0.Add(time.Hour))
			got, err = m.Get(ctx, request(kt))
			if err != nil || string(got.Key) != string(first.Key) || api.n != 2 {
				t.Fatalf("at refresh: %v, %d requests; want the old key served and a second request", err, api.n)
			}
			c.issue(t, api.last(), clk.Now(), nil)
			got, err = m.Get(ctx, request(kt))
			if err != nil || string(got.Key) == string(first.Key) || string(got.Chain) == string(first.Chain) {
				t.Fatalf("after refresh: %v; want a new key and chain", err)
			}

			// A refresh that is denied: the signer's reason, for good.
			clk.SetTime(t0.Add(2 * time.Hour))
			_, _ = m.Get(ctx, request(kt))
			last := api.last()
			last.Status.Conditions = []metav1.Condition{{Type: certificatesv1beta1.PodCertificateRequestConditionTypeDenied, Reason: "Nope", Message: "not you"}}
			_, err = m.Get(ctx, request(kt))
			if err == nil || errors.Is(err, ErrPending) || !strings.Contains(err.Error(), `denied by signer "example.com/s": reason "Nope", message "not you"`) {
				t.Fatalf("denied: %v", err)
			}
			m.ForgetPod("pod-uid")
			if st := m.Status(); len(st) != 0 {
				t.Errorf("after ForgetPod: %v", st)
			}
		})
	}
}

func TestManagerErrors(t *testing.T) {
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, api *fakeAPI, c *ca, clk *clocktesting.FakeClock, m *Manager)
		want    string
		pending bool
	}{
		{name: "API not served", setup: func(_ *testing.T, api *fakeAPI, _ *ca, _ *clocktesting.FakeClock, _ *Manager) {
			api.ensureErr = ErrNotServed
		}, want: "does not serve PodCertificateRequests"},
		{name: "create refused", setup: func(_ *testing.T, api *fakeAPI, _ *ca, _ *clocktesting.FakeClock, _ *Manager) {
			api.createErr = errors.New("forbidden")
		}, want: `creating a PodCertificateRequest for signer "example.com/s": forbidden`},
		{name: "failed", setup: func(t *testing.T, api *fakeAPI, _ *ca, _ *clocktesting.FakeClock, m *Manager) {
			_, _ = m.Get(t.Context(), request("ED25519"))
			api.last().Status.Conditions = []metav1.Condition{{Type: certificatesv1beta1.PodCertificateRequestConditionTypeFailed, Reason: "Broken", Message: "signer down"}}
		}, want: `failed at signer "example.com/s": reason "Broken"`},
		{name: "issued to another key", setup: func(t *testing.T, api *fakeAPI, c *ca, _ *clocktesting.FakeClock, m *Manager) {
			_, _ = m.Get(t.Context(), request("ED25519"))
			c.issue(t, api.last(), t0, &other.PublicKey)
		}, want: "not for the requested key"},
		{name: "request deleted: made again", setup: func(t *testing.T, api *fakeAPI, _ *ca, clk *clocktesting.FakeClock, m *Manager) {
			_, _ = m.Get(t.Context(), request("ED25519"))
			delete(api.pcrs, "req-1")
			clk.SetTime(t0.Add(assumeDeleted))
		}, want: "req-2", pending: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := &fakeAPI{pcrs: map[string]*certificatesv1beta1.PodCertificateRequest{}}
			clk := clocktesting.NewFakeClock(t0)
			m := newManager(api, clk)
			tc.setup(t, api, newCA(t), clk, m)
			_, err := m.Get(t.Context(), request("ED25519"))
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrPending) != tc.pending {
				t.Fatalf("Get: %v; want an error containing %q (pending %v)", err, tc.want, tc.pending)
			}
		})
	}
}

// After a restart the volume's credentials are adopted only when they are
// an issued request's, for the key found, and still valid.
func TestAdoptAfterRestart(t *testing.T) {
	api := &fakeAPI{pcrs: map[string]*certificatesv1beta1.PodCertificateRequest{}}
	clk := clocktesting.NewFakeClock(t0)
	c := newCA(t)
	before := newManager(api, clk)
	_, _ = before.Get(t.Context(), request("ECDSAP256"))
	c.issue(t, api.last(), t0, nil)
	issued, err := before.Get(t.Context(), request("ECDSAP256"))
	if err != nil {
		t.Fatal(err)
	}
	otherKey, _, _ := generateKey("ECDSAP256")
	otherPEM, _ := encodeKey(otherKey)
	for _, tc := range []struct {
		name       string
		key, chain []byte
		at         time.Duration
		adopted    bool
	}{
		{"the volume's credentials", issued.Key, issued.Chain, 10 * time.Minute, true},
		{"past beginRefreshAt: adopted and refreshed", issued.Key, issued.Chain, 90 * time.Minute, true},
		{"expired", issued.Key, issued.Chain, 3 * time.Hour, false},
		{"another key", otherPEM, issued.Chain, 10 * time.Minute, false},
		{"a chain no request holds", issued.Key, []byte(c.pem), 10 * time.Minute, false},
		{"nothing", nil, nil, 10 * time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk.SetTime(t0.Add(tc.at))
			n := api.n
			m := newManager(api, clk)
			req := request("ECDSAP256")
			req.Existing = func() ([]byte, []byte) { return tc.key, tc.chain }
			got, err := m.Get(t.Context(), req)
			if tc.adopted {
				if err != nil || string(got.Key) != string(issued.Key) {
					t.Fatalf("Get: %v; want the volume's key served", err)
				}
				if wantNew := tc.at >= time.Hour; (api.n > n) != wantNew {
					t.Errorf("%d new requests; want a refresh request: %v", api.n-n, wantNew)
				}
				return
			}
			if !errors.Is(err, ErrPending) || api.n != n+1 {
				t.Fatalf("Get: %v, %d new requests; want pending on a new request", err, api.n-n)
			}
		})
	}
}

func TestSplitBundle(t *testing.T) {
	key, _, _ := generateKey("ED25519")
	kp, _ := encodeKey(key)
	chain := []byte("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n")
	for _, tc := range []struct {
		name         string
		in           []byte
		wantK, wantC string
	}{
		{"key then chain", append(append([]byte{}, kp...), chain...), string(kp), string(chain)},
		{"chain first", append(append([]byte{}, chain...), kp...), "", ""},
		{"garbage", []byte("x"), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, c := SplitBundle(tc.in)
			if string(k) != tc.wantK || string(c) != tc.wantC {
				t.Errorf("SplitBundle = %q, %q", k, c)
			}
		})
	}
}

func TestJitter(t *testing.T) {
	m := New(Options{})
	for _, tc := range []struct {
		until, max time.Duration
	}{
		{5 * time.Second, 500 * time.Millisecond},
		{20 * time.Hour, maxJitter},
		{-time.Minute, 0},
	} {
		for range 50 {
			if j := m.opts.Jitter(tc.until); j < 0 || j > tc.max {
				t.Fatalf("Jitter(%v) = %v, want within [0, %v]", tc.until, j, tc.max)
			}
		}
	}
}
