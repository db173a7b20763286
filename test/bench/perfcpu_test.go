package main

import (
	"strings"
	"testing"
)

func TestCountPerfSamples(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    perfSplit
		wantErr string
	}{
		{"empty", "", perfSplit{}, ""},
		{"user and kernel", "" +
			"   42     250000  ffffffff816e92eb\n" +
			"   42     250000      55dd8a3c1f20\n" +
			"   42     250000      7f17b2e01a00\n" +
			"   42     250000  ffff800000000000\n",
			perfSplit{user: 0.0005, kernel: 0.0005, userSamples: 2, kernelSamples: 2}, ""},
		// Other processes' samples, perf's own and the idle task's.
		{"other processes", "" +
			"   42     250000      55dd8a3c1f20\n" +
			"  421     250000      55dd8a3c1f20\n" +
			"    4     250000  ffffffff816e92eb\n" +
			"    0     250000  ffffffff816e92eb\n",
			perfSplit{user: 0.00025, userSamples: 1}, ""},
		// The last user-space address and the first kernel one.
		{"boundary", "42 250000 ffff7fffffffffff\n42 250000 ffff800000000000\n",
			perfSplit{user: 0.00025, kernel: 0.00025, userSamples: 1, kernelSamples: 1}, ""},
		{"periods add up", "42 250000 401000\n42 500000 401000\n\n",
			perfSplit{user: 0.00075, userSamples: 2}, ""},
		{"no pid", "250000 ffffffff816e92eb\n", perfSplit{}, "line 1: want pid, period and ip"},
		{"symbol too", "42 250000 ffffffff816e92eb fdget_pos\n", perfSplit{}, "line 1: want pid, period and ip"},
		{"bad period", "42 x ffffffff816e92eb\n", perfSplit{}, "line 1: period"},
		{"bad pid", "x 250000 12\n", perfSplit{}, "line 1: pid"},
		{"bad ip", "42 250000 12\n42 250000 zz\n", perfSplit{}, "line 2: ip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := countPerfSamples(strings.NewReader(tt.in), 42)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
