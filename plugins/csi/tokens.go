package csi

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/tokens"
	"github.com/volume-agent/volume-agent/volume"
)

// TokenIssuer issues service-account tokens bound to pods, cached and
// refreshed (tokens.Manager).
type TokenIssuer interface {
	Token(ctx context.Context, k tokens.Key) (tokens.Token, time.Time, error)
}

// defaultTokenExpirationSeconds is the lifetime of a tokenRequest that sets
// none: the kubelet leaves it unset and the API server then issues tokens
// for an hour. The agent asks for the hour itself, since its token cache
// is keyed by the requested lifetime.
const defaultTokenExpirationSeconds = 3600

// serviceAccountTokens gets the tokens the CSIDriver's tokenRequests ask
// for, one per audience for the pod's service account, bound to the pod,
// as the kubelet passes them to NodePublishVolume: the JSON object
// {"<audience>": {"token": ..., "expirationTimestamp": <RFC 3339>}}. It
// also returns when the first of them is due for refresh. A driver without
// tokenRequests gets nothing.
//
// The tokens come from the cache shared with projected volumes: a republish
// before a token is 80 % through its life passes the same token again.
func (p *Plugin) serviceAccountTokens(ctx context.Context, drv *storagev1.CSIDriver, pod volume.PodInfo) (string, time.Time, error) {
	if drv == nil || len(drv.Spec.TokenRequests) == 0 {
		return "", time.Time{}, nil
	}
	if p.cfg.Tokens == nil {
		return "", time.Time{}, fmt.Errorf("CSIDriver %s asks for service-account tokens (tokenRequests) for the pod, but %s", drv.Name, p.cfg.NoTokensReason)
	}
	sa := pod.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	out := make(map[string]authenticationv1.TokenRequestStatus, len(drv.Spec.TokenRequests))
	var refreshAt time.Time
	for _, tr := range drv.Spec.TokenRequests {
		exp := int64(defaultTokenExpirationSeconds)
		if tr.ExpirationSeconds != nil {
			exp = *tr.ExpirationSeconds
		}
		k := tokens.Key{Namespace: pod.Namespace, ServiceAccount: sa, Audience: tr.Audience, ExpirationSeconds: exp, PodName: pod.Name, PodUID: pod.UID}
		tok, at, err := p.cfg.Tokens.Token(ctx, k)
		if err != nil {
			return "", time.Time{}, fmt.Errorf("the service-account token CSIDriver %s asks for (audience %q): %w", drv.Name, tr.Audience, err)
		}
		out[tr.Audience] = authenticationv1.TokenRequestStatus{Token: string(tok.Value), ExpirationTimestamp: metav1.NewTime(tok.Expires)}
		if refreshAt.IsZero() || at.Before(refreshAt) {
			refreshAt = at
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return "", time.Time{}, err
	}
	return string(b), refreshAt, nil
}

// tokensInSecrets: the CSIDriver wants the tokens in the secrets of
// NodePublishVolume rather than in its volume context (a GA field since
// Kubernetes 1.36), where drivers and sidecars are less likely to log
// them.
func tokensInSecrets(drv *storagev1.CSIDriver) bool {
	return drv != nil && drv.Spec.ServiceAccountTokenInSecrets != nil && *drv.Spec.ServiceAccountTokenInSecrets
}
