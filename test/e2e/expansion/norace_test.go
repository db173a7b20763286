//go:build !race

package expansion_test

const raceEnabled = false
