//go:build !race

package restart_test

const raceEnabled = false
