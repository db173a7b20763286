// Package podcerts serves podCertificate projections the way the kubelet's
// pod certificate manager does: for each projection of a pod (pod, volume,
// source index) it generates a private key of the requested type, creates a
// PodCertificateRequest (certificates.k8s.io/v1beta1) with the node's
// identity naming the pod, its service account and the node (names and
// UIDs), and once the signer has issued it hands out the key and the
// certificate chain. At the issued beginRefreshAt (plus a little jitter) it
// asks again with a new key while the current certificate is still
// served; a denied or failed request is a permanent error for that
// projection, as in the kubelet.
//
// It owns those decisions and the keys; writing the files is the caller's
// (the projected volume, written atomically). Keys exist in memory and in
// the pod's volume only. After a restart, a volume's current key and chain
// are adopted, never taken on trust: only when the chain's leaf is that of
// an issued request of the same pod in the API and was issued to the key
// found (see Request.Existing); otherwise a new request is made.
//
// The requests are read through a Lookup fed by one watch of the node's own
// requests (field selector spec.nodeName), so the traffic follows the node.
package podcerts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Key identifies a projection: one source of one volume of one pod.
type Key struct {
	Namespace string    `json:"namespace"`
	PodName   string    `json:"podName"`
	PodUID    types.UID `json:"podUID"`
	Volume    string    `json:"volume"`
	Source    int       `json:"source"`
}

func (k Key) String() string {
	return fmt.Sprintf("pod %s/%s volume %q source %d", k.Namespace, k.PodName, k.Volume, k.Source)
}

// Request is what Get needs to serve a projection.
type Request struct {
	Key
	ServiceAccount string
	Projection     v1.PodCertificateProjection
	// Existing returns the key and chain the volume holds now (nil, nil if
	// none); asked only for a projection this process has not served yet,
	// i.e. after a restart.
	Existing func() (key, chain []byte)
}

// Credentials are what a projection's files hold.
type Credentials struct {
	Key, Chain []byte
	// RefreshAt is when Get should be called again (zero: when a
	// request changes).
	RefreshAt time.Time
}

// Creator creates PodCertificateRequests and reads what they must name.
type Creator interface {
	CreatePodCertificateRequest(ctx context.Context, pcr *certificatesv1beta1.PodCertificateRequest) (*certificatesv1beta1.PodCertificateRequest, error)
	ServiceAccountUID(ctx context.Context, namespace, name string) (types.UID, error)
}

// Lookup reads the node's PodCertificateRequests as last seen (a watch).
type Lookup interface {
	// Ensure makes the requests readable (starts the watch, waits for
	// its first list); an error says why they cannot be.
	Ensure(ctx context.Context) error
	Get(namespace, name string) (*certificatesv1beta1.PodCertificateRequest, bool)
	ByPod(uid types.UID) []*certificatesv1beta1.PodCertificateRequest
}

// Options configure a Manager.
type Options struct {
	Creator Creator
	Lookup  Lookup
	// Node returns the node's name and UID.
	Node  func() (string, types.UID, bool)
	Clock clock.PassiveClock
	// Jitter returns how much later than beginRefreshAt a refresh starts,
	// given the time until beginRefreshAt; default: random, up to a tenth
	// of it and at most 5 minutes (the kubelet adds up to 5 minutes).
	Jitter func(untilRefresh time.Duration) time.Duration
}

// assumeDeleted is how long a request this process created may be missing
// from the watch before it is taken as deleted and made again (the
// kubelet's figure).
const assumeDeleted = 10 * time.Minute

const maxJitter = 5 * time.Minute

// retryCreate is how soon a failed refresh request is made again while
// the certificate served is still valid.
const retryCreate = 30 * time.Second

// Manager is safe for concurrent use.
type Manager struct {
	opts Options

	mu   sync.Mutex
	recs map[Key]*record
}

// New returns a Manager.
func New(o Options) *Manager {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Jitter == nil {
		o.Jitter = func(d time.Duration) time.Duration {
			if d = min(d/10, maxJitter); d <= 0 {
				return 0
			}
			return rand.N(d)
		}
	}
	return &Manager{opts: o, recs: map[Key]*record{}}
}

// credential is an issued certificate and its key.
type credential struct {
	key, chain []byte
	pcr        string
	notAfter   time.Time
	refreshAt  time.Time
}

// pending is a request made and not yet answered.
type pending struct {
	key     []byte
	pcr     string
	created time.Time
}

// state is a projection's state: the credential served (if any), the
// request waited for (if any), or a permanent error.
type state struct {
	cur     *credential
	pend    *pending
	fail    error
	adopted bool // Existing was asked
}

type record struct {
	mu sync.Mutex
	state
}

// action is what Get does next.
type action int

const (
	actServe  action = iota // hand out cur
	actCreate               // make a request (then serve cur if any)
	actWait                 // nothing to hand out until the request is answered
	actFail                 // permanent error
)

// decide is what to do in state s at now.
func decide(s state, now time.Time) action {
	switch {
	case s.fail != nil:
		return actFail
	case s.pend == nil && (s.cur == nil || !now.Before(s.cur.refreshAt)):
		return actCreate
	case s.cur != nil && now.Before(s.cur.notAfter):
		return actServe
	}
	return actWait
}

// outcome is what the API says of a request.
type outcome int

const (
	outPending outcome = iota
	outIssued
	outDenied
	outFailed
)

func outcomeOf(pcr *certificatesv1beta1.PodCertificateRequest) (outcome, metav1.Condition) {
	for _, c := range pcr.Status.Conditions {
		switch c.Type {
		case certificatesv1beta1.PodCertificateRequestConditionTypeIssued:
			return outIssued, c
		case certificatesv1beta1.PodCertificateRequestConditionTypeDenied:
			return outDenied, c
		case certificatesv1beta1.PodCertificateRequestConditionTypeFailed:
			return outFailed, c
		}
	}
	return outPending, metav1.Condition{}
}

// advance applies what the API says of the pending request (pcr nil: not
// seen) to s.
func advance(s state, signer string, pcr *certificatesv1beta1.PodCertificateRequest, now time.Time, jitter func(time.Duration) time.Duration) state {
	p := s.pend
	if p == nil {
		return s
	}
	if pcr == nil {
		if now.Sub(p.created) >= assumeDeleted {
			s.pend = nil // deleted: the next decision makes it again
		}
		return s
	}
	name := pcr.Namespace + "/" + pcr.Name
	out, cond := outcomeOf(pcr)
	switch out {
	case outDenied:
		s.pend, s.fail = nil, fmt.Errorf("PodCertificateRequest %s was denied by signer %q: reason %q, message %q", name, signer, cond.Reason, cond.Message)
	case outFailed:
		s.pend, s.fail = nil, fmt.Errorf("PodCertificateRequest %s failed at signer %q: reason %q, message %q", name, signer, cond.Reason, cond.Message)
	case outIssued:
		c, err := issued(p, pcr, now, jitter)
		if err != nil {
			s.pend, s.fail = nil, fmt.Errorf("PodCertificateRequest %s: %w", name, err)
			return s
		}
		s.pend, s.cur = nil, c
	}
	return s
}

// issued checks an issued request against the key it was made for.
func issued(p *pending, pcr *certificatesv1beta1.PodCertificateRequest, now time.Time, jitter func(time.Duration) time.Duration) (*credential, error) {
	st := pcr.Status
	if st.NotAfter == nil || st.BeginRefreshAt == nil {
		return nil, errors.New("issued without notAfter or beginRefreshAt")
	}
	chain, leaf, err := cleanChain([]byte(st.CertificateChain))
	if err != nil {
		return nil, err
	}
	pub, err := publicKeyOf(p.key)
	if err != nil {
		return nil, err
	}
	if !matches(leaf, pub) {
		return nil, errors.New("the issued certificate is not for the requested key")
	}
	begin := st.BeginRefreshAt.Time
	return &credential{key: p.key, chain: chain, pcr: pcr.Name, notAfter: st.NotAfter.Time,
		refreshAt: begin.Add(jitter(begin.Sub(now)))}, nil
}

// adopt finds, among the pod's requests, the issued one whose leaf is
// the chain's and was issued to key: the credential a volume holds after
// a restart, with the times the API gave it.
func adopt(key, chain []byte, signer string, pcrs []*certificatesv1beta1.PodCertificateRequest, now time.Time, jitter func(time.Duration) time.Duration) *credential {
	if len(key) == 0 || len(chain) == 0 {
		return nil
	}
	_, leaf, err := cleanChain(chain)
	if err != nil {
		return nil
	}
	for _, pcr := range pcrs {
		if pcr.Spec.SignerName != signer {
			continue
		}
		if out, _ := outcomeOf(pcr); out != outIssued {
			continue
		}
		_, l, err := cleanChain([]byte(pcr.Status.CertificateChain))
		if err != nil || !bytes.Equal(l.Raw, leaf.Raw) {
			continue
		}
		c, err := issued(&pending{key: key}, pcr, now, jitter)
		if err != nil || !now.Before(c.notAfter) {
			return nil
		}
		return c
	}
	return nil
}

// nextCall is when Get should be called again in state s: the refresh, the
// expiry, or when a missing request is taken as deleted.
func nextCall(s state) time.Time {
	var at []time.Time
	if s.cur != nil {
		if s.pend == nil {
			at = append(at, s.cur.refreshAt)
		}
		at = append(at, s.cur.notAfter)
	}
	if s.pend != nil {
		at = append(at, s.pend.created.Add(assumeDeleted))
	}
	if len(at) == 0 {
		return time.Time{}
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	return at[0]
}

// ErrPending is wrapped by Get's error while a projection has nothing
// issued to hand out.
var ErrPending = errors.New("not issued yet")

// Get returns the key and chain to write for a projection, making (and
// remaking, at refresh) its PodCertificateRequest as needed. While nothing
// is issued it fails with an error wrapping ErrPending; a denied or failed
// request is a permanent error.
func (m *Manager) Get(ctx context.Context, req Request) (Credentials, error) {
	if err := m.opts.Lookup.Ensure(ctx); err != nil {
		return Credentials{}, err
	}
	m.mu.Lock()
	rec, ok := m.recs[req.Key]
	if !ok {
		rec = &record{}
		m.recs[req.Key] = rec
	}
	m.mu.Unlock()

	rec.mu.Lock()
	defer rec.mu.Unlock()
	now := m.opts.Clock.Now()
	signer := req.Projection.SignerName
	s := rec.state
	if !s.adopted {
		s.adopted = true
		if req.Existing != nil && s.cur == nil && s.pend == nil {
			k, c := req.Existing()
			s.cur = adopt(k, c, signer, m.opts.Lookup.ByPod(req.PodUID), now, m.opts.Jitter)
		}
	}
	if s.pend != nil {
		pcr, _ := m.opts.Lookup.Get(req.Namespace, s.pend.pcr)
		s = advance(s, signer, pcr, now, m.opts.Jitter)
	}
	var err error
	switch decide(s, now) {
	case actFail:
		err = s.fail
	case actCreate:
		var p *pending
		if p, err = m.create(ctx, req, now); err == nil {
			s.pend = p
			if decide(s, now) != actServe {
				err = fmt.Errorf("PodCertificateRequest %s/%s created, waiting for signer %q to issue it: %w", req.Namespace, p.pcr, signer, ErrPending)
			}
		} else if s.cur != nil && now.Before(s.cur.notAfter) {
			// The certificate served is still valid: keep serving it,
			// and try again soon.
			rec.state = s
			return Credentials{Key: s.cur.key, Chain: s.cur.chain, RefreshAt: now.Add(retryCreate)}, nil
		}
	case actWait:
		if s.cur != nil {
			err = fmt.Errorf("the certificate expired at %s and its refresh, PodCertificateRequest %s/%s, is not issued yet by signer %q: %w", s.cur.notAfter.UTC().Format(time.RFC3339), req.Namespace, s.pend.pcr, signer, ErrPending)
		} else {
			err = fmt.Errorf("PodCertificateRequest %s/%s is not issued yet by signer %q: %w", req.Namespace, s.pend.pcr, signer, ErrPending)
		}
	}
	rec.state = s
	if err != nil {
		return Credentials{}, err
	}
	return Credentials{Key: s.cur.key, Chain: s.cur.chain, RefreshAt: nextCall(s)}, nil
}

// create generates a key and makes a request for it.
func (m *Manager) create(ctx context.Context, req Request, now time.Time) (*pending, error) {
	node, nodeUID, ok := m.opts.Node()
	if !ok {
		return nil, errors.New("the node's UID is not known yet")
	}
	sa := req.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	saUID, err := m.opts.Creator.ServiceAccountUID(ctx, req.Namespace, sa)
	if err != nil {
		return nil, fmt.Errorf("reading service account %s/%s: %w", req.Namespace, sa, err)
	}
	key, csr, err := generateKey(req.Projection.KeyType)
	if err != nil {
		return nil, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	pcr := &certificatesv1beta1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    req.Namespace,
			GenerateName: "req-",
			// As the kubelet: the request goes with the pod.
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: req.PodName, UID: req.PodUID}},
		},
		Spec: certificatesv1beta1.PodCertificateRequestSpec{
			SignerName:                req.Projection.SignerName,
			PodName:                   req.PodName,
			PodUID:                    req.PodUID,
			ServiceAccountName:        sa,
			ServiceAccountUID:         saUID,
			NodeName:                  types.NodeName(node),
			NodeUID:                   nodeUID,
			MaxExpirationSeconds:      req.Projection.MaxExpirationSeconds,
			StubPKCS10Request:         csr,
			UnverifiedUserAnnotations: req.Projection.UserAnnotations,
		},
	}
	made, err := m.opts.Creator.CreatePodCertificateRequest(ctx, pcr)
	if err != nil {
		return nil, fmt.Errorf("creating a PodCertificateRequest for signer %q: %w", req.Projection.SignerName, err)
	}
	created := now
	if t := made.CreationTimestamp.Time; !t.IsZero() {
		created = t
	}
	return &pending{key: keyPEM, pcr: made.Name, created: created}, nil
}

// ForgetPod drops the keys and state of a pod that left.
func (m *Manager) ForgetPod(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.recs {
		if k.PodUID == uid {
			delete(m.recs, k)
		}
	}
}

// Status is a projection's state for the debug endpoint: names and
// times, never keys.
type Status struct {
	Key
	State     string    `json:"state"`
	Request   string    `json:"request,omitempty"`
	NotAfter  time.Time `json:"notAfter,omitzero"`
	RefreshAt time.Time `json:"refreshAt,omitzero"`
	Error     string    `json:"error,omitempty"`
}

// Status lists every projection's state.
func (m *Manager) Status() []Status {
	m.mu.Lock()
	keys := make([]Key, 0, len(m.recs))
	recs := make([]*record, 0, len(m.recs))
	for k, r := range m.recs {
		keys, recs = append(keys, k), append(recs, r)
	}
	m.mu.Unlock()
	out := make([]Status, 0, len(keys))
	for i, r := range recs {
		r.mu.Lock()
		st := Status{Key: keys[i], State: "none"}
		if r.cur != nil {
			st.State, st.Request, st.NotAfter, st.RefreshAt = "issued", r.cur.pcr, r.cur.notAfter, r.cur.refreshAt
		}
		if r.pend != nil {
			st.State, st.Request = "pending", r.pend.pcr
			if r.cur != nil {
				st.State = "refreshing"
			}
		}
		if r.fail != nil {
			st.State, st.Error = "failed", r.fail.Error()
		}
		r.mu.Unlock()
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out
}
