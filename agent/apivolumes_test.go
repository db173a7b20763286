package agent

import "testing"

// Standalone mode has no token manager: the CSI plugin must get a nil
// issuer (not a nil *tokens.Manager in an interface), so that volumes that
// need tokens fail with the reason instead of a nil dereference.
func TestTokenIssuerNilInStandalone(t *testing.T) {
	if got := (&apiVolumes{}).tokenIssuer(); got != nil {
		t.Errorf("tokenIssuer() = %#v, want nil", got)
	}
}
