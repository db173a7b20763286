//go:build !race

package agent

// raceSlowdown is how much slower the race detector makes the agent:
// timeouts that stand for a client's patience are stretched by it.
const raceSlowdown = 1
