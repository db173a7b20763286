//go:build !race

package e2eutil

// RaceEnabled reports whether the tests run with the race detector.
const RaceEnabled = false
