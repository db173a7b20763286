//go:build race

package expansion_test

// raceEnabled: the tests run with -race, so the agent is built with it too.
const raceEnabled = true
