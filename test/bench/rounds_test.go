package main

import (
	"slices"
	"testing"
	"time"
)

func TestSummarizeEmptyDir(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	rounds := []emptyDirResult{
		{setup: ms(300), teardown: ms(200), setupCPU: 0.5, teardownCPU: 0.4, setupUser: 50, teardownUser: 20, rssMiB: 40, peakRSSMiB: 60,
			floors: [2][2]time.Duration{{ms(150), ms(200)}, {ms(100), ms(100)}}},
		{setup: ms(200), teardown: ms(300), setupCPU: 0.3, teardownCPU: 0.6, setupUser: 30, teardownUser: 40, rssMiB: 42, peakRSSMiB: 70,
			floors: [2][2]time.Duration{{ms(200), ms(150)}, {ms(100), ms(300)}}},
		{setup: ms(250), teardown: ms(250), setupCPU: 0.4, teardownCPU: 0.5, setupUser: 40, teardownUser: 30, rssMiB: 41, peakRSSMiB: 50,
			floors: [2][2]time.Duration{{ms(125), ms(250)}, {ms(250), ms(250)}}},
	}
	tests := []struct {
		name  string
		floor bool
		want  []string
	}{
		{"without the floor", false, []string{
			"setup:    0.250 [0.200–0.300] s, CPU 0.40 [0.30–0.50] s",
			"teardown: 0.250 [0.200–0.300] s, CPU 0.50 [0.40–0.60] s",
			"user CPU per volume: setup 40.0 [30.0–50.0] µs, teardown 30.0 [20.0–40.0] µs",
			"idle CPU: 0.000 [0.000–0.000] s, RSS 41.0 [40.0–42.0] MiB, peak 60.0 [50.0–70.0] MiB",
		}},
		// Each round's time over the floor before it and after it: setup
		// 2, 3, 1, 2, 2, 1; teardown 1, 2, 2, 1, 1, 1.
		{"with the floor", true, []string{
			"setup:    0.250 [0.200–0.300] s, CPU 0.40 [0.30–0.50] s",
			"teardown: 0.250 [0.200–0.300] s, CPU 0.50 [0.40–0.60] s",
			"user CPU per volume: setup 40.0 [30.0–50.0] µs, teardown 30.0 [20.0–40.0] µs",
			"idle CPU: 0.000 [0.000–0.000] s, RSS 41.0 [40.0–42.0] MiB, peak 60.0 [50.0–70.0] MiB",
			"÷ floor:  setup 2.00 [1.00–3.00]×, teardown 1.00 [1.00–2.00]× (each round against the floor before and after it)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := summarizeEmptyDir(rounds, tt.floor); !slices.Equal(got, tt.want) {
				t.Errorf("got\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}
