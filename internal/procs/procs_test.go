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
			for round := range 2 {
				Burst()
				Burst() // once is enough
				if got := runtime.GOMAXPROCS(0); got != tc.burst {
					t.Errorf("round %d: GOMAXPROCS %d during a burst, want %d", round, got, tc.burst)
				}
				if got := CPUs(); got != base {
					t.Errorf("round %d: CPUs() = %d during a burst, want %d", round, got, base)
				}
				Steady()
				Steady()
				if got := runtime.GOMAXPROCS(0); got != base {
					t.Errorf("round %d: GOMAXPROCS %d once steady, want %d", round, got, base)
				}
				if got := CPUs(); got != base {
					t.Errorf("round %d: CPUs() = %d once steady, want %d", round, got, base)
				}
			}
		})
	}
}
