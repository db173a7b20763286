package apivolume

import (
	"errors"
	"fmt"
	"testing"

	"github.com/volume-agent/volume-agent/podcerts"
)

// A volume waits (not fails) only when all that is missing is pod
// certificates not issued yet.
func TestOnlyPending(t *testing.T) {
	pending := fmt.Errorf("podCertificate (signer %q): %w", "a/b", podcerts.ErrPending)
	other := errors.New(`configmap "x" not found`)
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"one pending", pending, true},
		{"two pending", errors.Join(pending, pending), true},
		{"pending and a missing object", errors.Join(pending, other), false},
		{"a missing object", other, false},
		{"denied", errors.New("PodCertificateRequest ns/req-1 was denied"), false},
		{"empty join", errors.Join(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := onlyPending(tc.err); got != tc.want {
				t.Errorf("onlyPending(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
