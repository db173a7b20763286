package procs

import (
	"runtime"
	"strconv"
	"testing"
)

func TestBurstAndSteady(t *testing.T) {
	t.Cleanup(runtime.SetDefaultGOMAXPROCS)
	runtime.SetDefaultGOMAXPROCS()
	base := runtime.GOMAXPROCS(0)
	for _, tc := range []struct {
		name  string
		env   string // GOMAXPROCS in the environment
		burst int    // GOMAXPROCS during a burst
	}{
		{"default", "", base + Spare},
		{"operator's choice", strconv.Itoa(base), base},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", tc.env)
			p := New()
			for round := range 2 {
				p.Burst()
				p.Burst() // once is enough
				if got := runtime.GOMAXPROCS(0); got != tc.burst {
					t.Errorf("round %d: GOMAXPROCS %d during a burst, want %d", round, got, tc.burst)
				}
				if got := p.CPUs(); got != base {
					t.Errorf("round %d: CPUs() = %d during a burst, want %d", round, got, base)
				}
				p.Steady()
				p.Steady()
				if got := runtime.GOMAXPROCS(0); got != base {
					t.Errorf("round %d: GOMAXPROCS %d once steady, want %d", round, got, base)
				}
				if got := p.CPUs(); got != base {
					t.Errorf("round %d: CPUs() = %d once steady, want %d", round, got, base)
				}
			}
		})
	}
	// Without a Tuning the runtime's default stands.
	var none *Tuning
	none.Burst()
	if got := runtime.GOMAXPROCS(0); got != base {
		t.Errorf("GOMAXPROCS %d after a burst without a Tuning, want %d", got, base)
	}
	if got := none.CPUs(); got != base {
		t.Errorf("CPUs() = %d without a Tuning, want %d", got, base)
	}
	none.Steady()
}
