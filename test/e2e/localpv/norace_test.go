//go:build !race

package localpv_test

const raceEnabled = false
