package nodestatus_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/status/nodestatus"
	"github.com/volume-agent/volume-agent/volume"
)

type recordingPatcher struct {
	mu      sync.Mutex
	patches [][]v1.UniqueVolumeName
}

func (p *recordingPatcher) PatchNodeStatus(_ context.Context, _ string, patch []byte) error {
	var body struct {
		Status struct {
			VolumesInUse []v1.UniqueVolumeName `json:"volumesInUse"`
		} `json:"status"`
	}
	if err := json.Unmarshal(patch, &body); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.patches = append(p.patches, body.Status.VolumesInUse)
	return nil
}

func (p *recordingPatcher) all() [][]v1.UniqueVolumeName {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]v1.UniqueVolumeName(nil), p.patches...)
}

// A restarted agent that has not read its pods yet sees nothing in use; the
// node's volumesInUse of the previous run must stay until the whole truth
// replaces it, or the attach/detach controller could detach a mounted
// volume of a pod deleted meanwhile.
func TestReporterWaitsForSources(t *testing.T) {
	const vol = "kubernetes.io/csi/drv^h1"
	node := &v1.Node{Status: v1.NodeStatus{VolumesInUse: []v1.UniqueVolumeName{vol}}}
	var ready atomic.Bool
	p := &recordingPatcher{}
	r := nodestatus.New("n1", p, func() (*v1.Node, bool) { return node, true }, ready.Load, zap.NewNop())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	clock := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	dsw := cache.NewDesiredStateOfWorld(clock)
	asw := cache.NewActualStateOfWorld(clock)
	// Passes before the sources are read: the DSW is empty.
	r.Reconciled(dsw.Snapshot(), asw.Snapshot(), nil, 0)
	r.Reconciled(dsw.Snapshot(), asw.Snapshot(), nil, 0)

	ready.Store(true)
	dsw.SetPod(volume.PodInfo{PodRef: volume.PodRef{UID: "uid-1", Namespace: "ns", Name: "p"}}, []cache.PodVolume{{
		Name: vol, Plugin: csiPlugin, OuterName: "data", Attributes: attachable, Spec: &volume.Spec{Name: "data"},
	}, {
		Name: "kubernetes.io/csi/drv^h2", Plugin: csiPlugin, OuterName: "more", Attributes: attachable, Spec: &volume.Spec{Name: "more"},
	}}, nil, nil)
	r.Reconciled(dsw.Snapshot(), asw.Snapshot(), nil, 0)

	deadline := time.Now().Add(10 * time.Second)
	for len(p.all()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("volumesInUse never patched once the sources were read")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := p.all(); len(got[0]) != 2 {
		t.Errorf("first patch = %q, want both volumes (patches %q)", got[0], got)
	}
}
