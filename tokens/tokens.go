// Package tokens gets service-account tokens for the pods on the node, the
// way the kubelet's token manager does: one TokenRequest per (pod, service
// account, audience, expiration), bound to the pod (name and UID), cached in
// memory only, and refreshed once the token is past 80 % of its lifetime or
// 24 hours old. A refresh that fails keeps the valid token and is retried
// with backoff; only an expired token that cannot be refreshed is an error.
//
// Tokens are secrets: they are never logged, never written anywhere but the
// pod's volume (by the caller), and Status shows only when they were issued
// and expire.
package tokens

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Requester makes TokenRequests (create serviceaccounts/<name>/token).
type Requester interface {
	RequestToken(ctx context.Context, namespace, serviceAccount string, spec authenticationv1.TokenRequestSpec) (*authenticationv1.TokenRequest, error)
}

// Key identifies a token: one per pod, service account, audience and
// requested expiration.
type Key struct {
	Namespace         string    `json:"namespace"`
	ServiceAccount    string    `json:"serviceAccount"`
	Audience          string    `json:"audience,omitempty"`
	ExpirationSeconds int64     `json:"expirationSeconds"`
	PodName           string    `json:"podName"`
	PodUID            types.UID `json:"podUID"`
}

func (k Key) String() string {
	return fmt.Sprintf("service account %s/%s for pod %s (audience %q, %ds)", k.Namespace, k.ServiceAccount, k.PodName, k.Audience, k.ExpirationSeconds)
}

// Observer learns about token requests (metrics).
type Observer interface {
	TokenRequested(err error)
}

// Options configure a Manager.
type Options struct {
	Requester Requester
	Clock     clock.PassiveClock
	// Jitter returns the random amount a refresh is brought forward by;
	// default: whole seconds in [0, 10), as in the kubelet.
	Jitter   func() time.Duration
	Observer Observer
}

const (
	// maxTTL: a token older than this is refreshed whatever its lifetime.
	maxTTL = 24 * time.Hour
	// refreshPercent of the lifetime left triggers a refresh.
	refreshPercent = 20
	maxJitter      = 10 * time.Second
	minRetry       = 500 * time.Millisecond
	maxRetry       = 2 * time.Minute
)

// Manager caches and refreshes tokens. It is safe for concurrent use.
type Manager struct {
	opts Options

	mu     sync.Mutex
	tokens map[Key]*entry
}

// entry is one cached token. Its own lock makes concurrent Gets of one key
// share one request.
type entry struct {
	mu       sync.Mutex
	token    []byte
	issued   time.Time
	expires  time.Time
	due      time.Time // when a refresh is needed
	failures int
	retryAt  time.Time // after a failed refresh
	lastErr  string
}

// New returns a Manager.
func New(o Options) *Manager {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Jitter == nil {
		o.Jitter = func() time.Duration { return time.Duration(rand.IntN(int(maxJitter/time.Second))) * time.Second }
	}
	return &Manager{opts: o, tokens: map[Key]*entry{}}
}

// Token is an issued token and when it expires.
type Token struct {
	Value   []byte
	Expires time.Time
}

// Get returns the token for k and when it should be asked for again. A
// cached token is returned until it is due for refresh; then a new one is
// requested. If that fails while the cached token is still valid, the
// cached one is returned with a retry time (backoff from 0.5 s to 2 min,
// never past its expiry); an error is returned only when no valid token is
// left.
func (m *Manager) Get(ctx context.Context, k Key) (token []byte, refreshAt time.Time, err error) {
	t, refreshAt, err := m.Token(ctx, k)
	return t.Value, refreshAt, err
}

// Token is Get with the token's expiry, for consumers that pass it on (CSI
// drivers get {token, expirationTimestamp}).
func (m *Manager) Token(ctx context.Context, k Key) (token Token, refreshAt time.Time, err error) {
	m.mu.Lock()
	e, ok := m.tokens[k]
	if !ok {
		e = &entry{}
		m.tokens[k] = e
	}
	m.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	now := m.opts.Clock.Now()
	cached := Token{Value: e.token, Expires: e.expires}
	if e.token != nil && now.Before(e.due) {
		return cached, e.due, nil
	}
	if e.token != nil && now.Before(e.retryAt) && now.Before(e.expires) {
		return cached, e.retryAt, nil
	}
	tr, err := m.request(ctx, k)
	if m.opts.Observer != nil {
		m.opts.Observer.TokenRequested(err)
	}
	if err != nil {
		e.failures++
		e.lastErr = err.Error()
		if e.token == nil {
			m.drop(k, e)
			return Token{}, time.Time{}, fmt.Errorf("requesting a token for %s: %w", k, err)
		}
		if !now.Before(e.expires) {
			return Token{}, time.Time{}, fmt.Errorf("the token for %s expired at %s and could not be refreshed: %w", k, e.expires.Format(time.RFC3339), err)
		}
		e.retryAt = now.Add(backoff(e.failures))
		if e.retryAt.After(e.expires) {
			e.retryAt = e.expires
		}
		return cached, e.retryAt, nil
	}
	e.token = []byte(tr.Status.Token)
	e.expires = tr.Status.ExpirationTimestamp.Time
	ttl := time.Duration(*tr.Spec.ExpirationSeconds) * time.Second
	e.issued = e.expires.Add(-ttl)
	e.due = dueAt(e.issued, e.expires, ttl, m.opts.Jitter())
	e.failures, e.retryAt, e.lastErr = 0, time.Time{}, ""
	return Token{Value: e.token, Expires: e.expires}, e.due, nil
}

// drop forgets an entry that never got a token (unless another Get has
// replaced it meanwhile).
func (m *Manager) drop(k Key, e *entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tokens[k] == e {
		delete(m.tokens, k)
	}
}

// dueAt is when a token must be refreshed: past 80 % of its lifetime or
// 24 hours after it was issued, whichever comes first, brought forward by
// jitter so that tokens issued together are not all refreshed together.
func dueAt(issued, expires time.Time, ttl, jitter time.Duration) time.Time {
	// Whole seconds, as the kubelet computes it.
	due := expires.Add(-time.Duration(int64(ttl/time.Second)*refreshPercent/100) * time.Second)
	if cap := issued.Add(maxTTL); cap.Before(due) {
		due = cap
	}
	return due.Add(-jitter)
}

func backoff(failures int) time.Duration {
	d := minRetry
	for i := 1; i < failures && d < maxRetry; i++ {
		d *= 2
	}
	return min(d, maxRetry)
}

func (m *Manager) request(ctx context.Context, k Key) (*authenticationv1.TokenRequest, error) {
	if m.opts.Requester == nil {
		return nil, errors.New("no API server to request tokens from")
	}
	spec := authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &k.ExpirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: k.PodName, UID: k.PodUID},
	}
	if k.Audience != "" {
		spec.Audiences = []string{k.Audience}
	}
	tr, err := m.opts.Requester.RequestToken(ctx, k.Namespace, k.ServiceAccount, spec)
	if err != nil {
		return nil, err
	}
	if tr.Status.Token == "" || tr.Spec.ExpirationSeconds == nil || tr.Status.ExpirationTimestamp.IsZero() {
		return nil, errors.New("the API server returned a token request without a token, lifetime or expiry")
	}
	return tr, nil
}

// ForgetPod drops the pod's tokens (the pod is gone from the node).
func (m *Manager) ForgetPod(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.tokens {
		if k.PodUID == uid {
			delete(m.tokens, k)
		}
	}
}

// Status describes a cached token, without the token.
type Status struct {
	Key
	Issued    time.Time `json:"issued"`
	Expires   time.Time `json:"expires"`
	RefreshAt time.Time `json:"refreshAt"`
	Failures  int       `json:"failures,omitempty"`
	LastError string    `json:"lastError,omitempty"`
}

// Status lists the cached tokens, by pod and key.
func (m *Manager) Status() []Status {
	m.mu.Lock()
	keys := make([]Key, 0, len(m.tokens))
	entries := make([]*entry, 0, len(m.tokens))
	for k, e := range m.tokens {
		keys = append(keys, k)
		entries = append(entries, e)
	}
	m.mu.Unlock()
	out := make([]Status, 0, len(keys))
	for i, e := range entries {
		e.mu.Lock()
		if e.token != nil {
			s := Status{Key: keys[i], Issued: e.issued, Expires: e.expires, RefreshAt: e.due, Failures: e.failures, LastError: e.lastErr}
			if !e.retryAt.IsZero() {
				s.RefreshAt = e.retryAt
			}
			out = append(out, s)
		}
		e.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Key, out[j].Key
		if a.PodUID != b.PodUID {
			return a.PodUID < b.PodUID
		}
		return a.String() < b.String()
	})
	return out
}

// Len is the number of cached tokens.
func (m *Manager) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.tokens)
}
