package procs

import (
	"runtime"
	"testing"
)

func TestAddSpare(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	for _, tc := range []struct {
		name, env string
		want      int
	}{
		{"default", "", CPUs() + Spare},
		{"operator's choice", "3", before},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GOMAXPROCS(before)
			t.Setenv("GOMAXPROCS", tc.env)
			if got := AddSpare(); got != tc.want {
				t.Errorf("AddSpare() = %d, want %d", got, tc.want)
			}
			if got := runtime.GOMAXPROCS(0); got != tc.want {
				t.Errorf("GOMAXPROCS is %d, want %d", got, tc.want)
			}
			if CPUs() != cpus {
				t.Errorf("CPUs() = %d changed with GOMAXPROCS", CPUs())
			}
		})
	}
}
