package metrics

import (
	"errors"
	"fmt"
	"testing"

	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// Waits are counted as such in the operation metrics, not as failures.
func TestResultOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, "success"},
		{volume.Waitingf("waiting"), "waiting"},
		{fmt.Errorf("wrapped: %w", volume.Waitingf("waiting")), "waiting"},
		{volume.Uncertainf("timed out"), "uncertain"},
		{errors.New("attach failed"), "failure"},
		{operations.ErrStale, "stale"},
	} {
		if got := resultOf(c.err); got != c.want {
			t.Errorf("resultOf(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}
