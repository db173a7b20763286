package agent

import (
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/reconciler"
)

func TestMemoryTrimmer(t *testing.T) {
	freed := make(chan struct{}, 10)
	m := &memoryTrimmer{free: func() { freed <- struct{}{} }}
	busy := []reconciler.Action{{Op: operations.OpMountVolume}}

	for i := 0; i < burst-1; i++ {
		m.operationFinished()
	}
	m.Reconciled(nil, nil, nil, 0)
	m.operationFinished()
	m.Reconciled(nil, nil, busy, 0)
	select {
	case <-freed:
		t.Fatal("trimmed after a small burst or while work was planned")
	default:
	}
	m.Reconciled(nil, nil, nil, 0)
	select {
	case <-freed:
	case <-time.After(10 * time.Second):
		t.Fatal("not trimmed once steady after a burst")
	}
	// The count starts again: a steady pass right after trims nothing.
	deadline := time.Now().Add(10 * time.Second)
	for m.trimming.Load() {
		if time.Now().After(deadline) {
			t.Fatal("trim did not finish")
		}
		time.Sleep(time.Millisecond)
	}
	m.Reconciled(nil, nil, nil, 0)
	select {
	case <-freed:
		t.Fatal("trimmed twice for one burst")
	default:
	}
}
