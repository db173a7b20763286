//go:build !race

package csi_test

const raceEnabled = false
