package main

import (
	"fmt"
	"slices"
)

// emptyDirRounds runs the emptydir scenario -runs times, alternating the
// agent with -baseline if one is given, and with more than one round
// summarises each binary's rounds. A storm's times swing by a tenth or
// more between runs on a shared machine, and the floor's with them: only
// rounds alternated in one sitting, each against the floor measured beside
// it, compare two builds.
func emptyDirRounds(o options, work, root string) error {
	agents := []string{o.agent}
	if o.baseline != "" {
		agents = append(agents, o.baseline)
	}
	runs := max(o.runs, 1)
	perf, why, err := newPerfSampler(o.perf, o.perfKeep)
	if err != nil {
		return err
	}
	defer perf.close()
	if why != "" {
		fmt.Println(why)
	}
	results := make([][]emptyDirResult, len(agents))
	for r := range runs {
		for i, agent := range agents {
			if runs > 1 || len(agents) > 1 {
				fmt.Printf("\nround %d of %d, %s\n", r+1, runs, agent)
			}
			var res emptyDirResult
			if err := emptyDirRound(o, agent, work, root, fmt.Sprintf("-%d-%d", r, i), perf, &res); err != nil {
				return err
			}
			results[i] = append(results[i], res)
		}
	}
	if runs == 1 && len(agents) == 1 {
		return nil
	}
	fmt.Printf("\n%d rounds of %d pods × %d, times by the agents' logs, medians [ranges]:\n", runs, o.pods, o.volumes)
	for i, agent := range agents {
		fmt.Println(agent)
		for _, line := range summarizeEmptyDir(results[i], o.floor) {
			fmt.Println("  " + line)
		}
	}
	return nil
}

// summarizeEmptyDir describes rounds of one agent: each quantity's median
// and range, and the agent's time over the floor measured just before and
// just after it in the same round.
func summarizeEmptyDir(rounds []emptyDirResult, floor bool) []string {
	var setup, teardown, setupCPU, teardownCPU, setupUser, teardownUser, idle, rss, peak, setupRatio, teardownRatio []float64
	var setupUserPerf, teardownUserPerf []float64
	for _, r := range rounds {
		setup = append(setup, r.setup.Seconds())
		teardown = append(teardown, r.teardown.Seconds())
		setupCPU = append(setupCPU, r.setupCPU)
		teardownCPU = append(teardownCPU, r.teardownCPU)
		setupUser = append(setupUser, r.setupUser)
		teardownUser = append(teardownUser, r.teardownUser)
		if r.setupUserPerf > 0 && r.teardownUserPerf > 0 {
			setupUserPerf = append(setupUserPerf, r.setupUserPerf)
			teardownUserPerf = append(teardownUserPerf, r.teardownUserPerf)
		}
		idle = append(idle, r.idleCPU)
		rss = append(rss, r.rssMiB)
		peak = append(peak, r.peakRSSMiB)
		for _, f := range r.floors {
			if f[0] > 0 && f[1] > 0 {
				setupRatio = append(setupRatio, r.setup.Seconds()/f[0].Seconds())
				teardownRatio = append(teardownRatio, r.teardown.Seconds()/f[1].Seconds())
			}
		}
	}
	user := fmt.Sprintf("user CPU per volume: setup %s µs, teardown %s µs", medianRange(setupUser, "%.1f"), medianRange(teardownUser, "%.1f"))
	if len(setupUserPerf) == len(rounds) {
		// The perf samples where every round has them: the kernel's tick
		// accounting (utime) is too coarse to see a tenth.
		user = fmt.Sprintf("user CPU per volume: setup %s µs, teardown %s µs (perf cpu-clock samples; utime ticks: setup %s µs, teardown %s µs)",
			medianRange(setupUserPerf, "%.1f"), medianRange(teardownUserPerf, "%.1f"), medianRange(setupUser, "%.1f"), medianRange(teardownUser, "%.1f"))
	}
	lines := []string{
		fmt.Sprintf("setup:    %s s, CPU %s s", medianRange(setup, "%.3f"), medianRange(setupCPU, "%.2f")),
		fmt.Sprintf("teardown: %s s, CPU %s s", medianRange(teardown, "%.3f"), medianRange(teardownCPU, "%.2f")),
		user,
		fmt.Sprintf("idle CPU: %s s, RSS %s MiB, peak %s MiB", medianRange(idle, "%.3f"), medianRange(rss, "%.1f"), medianRange(peak, "%.1f")),
	}
	if floor && len(setupRatio) > 0 {
		lines = append(lines, fmt.Sprintf("÷ floor:  setup %s×, teardown %s× (each round against the floor before and after it)",
			medianRange(setupRatio, "%.2f"), medianRange(teardownRatio, "%.2f")))
	}
	return lines
}

// medianRange formats the median of values and their range.
func medianRange(values []float64, format string) string {
	v := slices.Sorted(slices.Values(values))
	return fmt.Sprintf(format+" ["+format+"–"+format+"]", v[len(v)/2], v[0], v[len(v)-1])
}
