package ui

import (
	"testing"
	"time"
)

func TestTook(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{250 * time.Microsecond, "250µs"},
		{999*time.Microsecond + 400*time.Nanosecond, "999µs"},
		{1500 * time.Microsecond, "2ms"},
		{1234 * time.Millisecond, "1.234s"},
	} {
		if got := took(c.d); got != c.want {
			t.Errorf("took(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}
