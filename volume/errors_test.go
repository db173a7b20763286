package volume

import (
	"errors"
	"fmt"
	"testing"
)

// Waiting and Uncertain are told apart through any wrapping, and neither
// is the other.
func TestErrorClasses(t *testing.T) {
	for _, c := range []struct {
		name               string
		err                error
		waiting, uncertain bool
	}{
		{"plain", errors.New("x"), false, false},
		{"nil", Waiting(nil), false, false},
		{"waiting", Waitingf("waiting for %s", "x"), true, false},
		{"wrapped waiting", fmt.Errorf("verify: %w", Waitingf("waiting")), true, false},
		{"uncertain", Uncertainf("timed out"), false, true},
		{"pod volume error around a wait", &PodVolumeError{Err: Waitingf("waiting")}, true, false},
	} {
		if got := IsWaiting(c.err); got != c.waiting {
			t.Errorf("%s: IsWaiting = %v", c.name, got)
		}
		if got := IsUncertain(c.err); got != c.uncertain {
			t.Errorf("%s: IsUncertain = %v", c.name, got)
		}
	}
	if got := Waitingf("waiting for %s", "x").Error(); got != "waiting for x" {
		t.Errorf("message %q", got)
	}
}
