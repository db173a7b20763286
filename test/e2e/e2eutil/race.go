//go:build race

package e2eutil

// RaceEnabled reports whether the tests run with the race detector. The
// suites then build the agent with it too: a data race makes the agent log
// it and exit 66, which Agent reports.
const RaceEnabled = true
