//go:build race

package restart_test

// raceEnabled: the tests run with -race, so the agent is built with it too.
const raceEnabled = true
