package operations

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// TestKindsComplete: every kind in the table says everything the planner,
// the executor and the reporter ask of it, so a kind added without, say, a
// failure event reason fails here and not in front of a user.
func TestKindsComplete(t *testing.T) {
	if len(kinds) == 0 || !slices.Equal(Ops, opsOf(kinds[:])) {
		t.Fatalf("Ops = %v, want the table's kinds in order", Ops)
	}
	counterparts := map[Op]Op{} // block kind -> the kind it stands for
	for i := range kinds {
		k := &kinds[i]
		t.Run(string(k.Op), func(t *testing.T) {
			for _, missing := range []struct {
				what string
				is   bool
			}{
				{"name", k.Op == ""},
				{"phase", k.Phase < PhaseUnmount || k.Phase > PhaseTeardown},
				{"precondition (Needed)", k.Needed == nil},
				{"body", k.Body == nil},
				{"failure event reason", k.FailureReason == ""},
			} {
				if missing.is {
					t.Errorf("no %s", missing.what)
				}
			}
			if KindOf(k.Op) != k {
				t.Errorf("KindOf(%s) is not its table entry: the name is not unique", k.Op)
			}
			// The reasons are the kubelet's style of name: FailedMount,
			// VolumeResizeFailed...
			if k.FailureReason != "" && !strings.Contains(k.FailureReason, "Failed") {
				t.Errorf("failure reason %q does not say it failed", k.FailureReason)
			}
			if k.Block == "" {
				return
			}
			b := KindOf(k.Block)
			switch {
			case b == nil:
				t.Errorf("block counterpart %s is not in the table", k.Block)
			case !b.BlockOnly || k.BlockOnly:
				t.Errorf("block counterpart %s: BlockOnly %v, own BlockOnly %v; want a filesystem kind's counterpart to be block only", k.Block, b.BlockOnly, k.BlockOnly)
			case b.Phase != k.Phase || b.PerPod != k.PerPod || b.Unmounts != k.Unmounts:
				t.Errorf("block counterpart %s differs in phase, scope or unmounting: %+v vs %+v", k.Block, *b, *k)
			}
			if prev, ok := counterparts[k.Block]; ok {
				t.Errorf("%s is also the block counterpart of %s", k.Block, prev)
			}
			counterparts[k.Block] = k.Op
		})
	}
	for i := range kinds {
		if k := &kinds[i]; k.BlockOnly && counterparts[k.Op] == "" {
			t.Errorf("%s is block only but no kind's block counterpart: the planner would never pick it", k.Op)
		}
	}
}

func opsOf(ks []Kind) []Op {
	out := make([]Op, len(ks))
	for i := range ks {
		out[i] = ks[i].Op
	}
	return out
}

// TestForMode: a filesystem kind maps to its block counterpart for a raw
// block volume and to itself otherwise; the other kinds always to
// themselves.
func TestForMode(t *testing.T) {
	for _, tc := range []struct {
		op          Op
		fs, block   Op
		isBlockKind bool
	}{
		{OpMountDevice, OpMountDevice, OpMapDevice, false},
		{OpMountVolume, OpMountVolume, OpMapVolume, false},
		{OpUnmountVolume, OpUnmountVolume, OpUnmapVolume, false},
		{OpUnmountDevice, OpUnmountDevice, OpUnmapDevice, false},
		{OpVerifyAttached, OpVerifyAttached, OpVerifyAttached, false},
		{OpDetachVolume, OpDetachVolume, OpDetachVolume, false},
		{OpExpandVolume, OpExpandVolume, OpExpandVolume, false},
		{OpPrepareSubPaths, OpPrepareSubPaths, OpPrepareSubPaths, false},
		{OpMapVolume, OpMapVolume, OpMapVolume, true},
		{"no_such_kind", "no_such_kind", "no_such_kind", false},
	} {
		if got := ForMode(tc.op, false); got != tc.fs {
			t.Errorf("ForMode(%s, filesystem) = %s, want %s", tc.op, got, tc.fs)
		}
		if got := ForMode(tc.op, true); got != tc.block {
			t.Errorf("ForMode(%s, block) = %s, want %s", tc.op, got, tc.block)
		}
		if tc.op.Block() != tc.isBlockKind {
			t.Errorf("%s.Block() = %v", tc.op, !tc.isBlockKind)
		}
	}
}

// nothingDesired is a DSW in which no pod wants anything.
type nothingDesired struct{}

func (nothingDesired) HasPodVolume(volume.UniqueName, types.UID) bool { return false }
func (nothingDesired) HasVolume(volume.UniqueName) bool               { return false }

// TestBodiesRecheckTheirPrecondition: the body of every kind, run through
// Operator.Operation where its precondition does not hold, does nothing and
// says so (ErrStale). The registry has no plugin: a body that went on would
// fail to find one instead.
func TestBodiesRecheckTheirPrecondition(t *testing.T) {
	o := &Operator{Plugins: plugins.NewRegistry(), ASW: cache.NewActualStateOfWorld(clocktesting.NewFakePassiveClock(time.Time{})),
		DSW: nothingDesired{}, Paths: volume.Paths{Root: t.TempDir()}, Log: zap.NewNop()}
	pod := volume.PodInfo{PodRef: volume.PodRef{UID: "p1", Namespace: "ns", Name: "p"}}
	size := resource.MustParse("1Gi")
	targets := []Target{
		{Volume: "v", Plugin: "test/none", Spec: &volume.Spec{Name: "v"}, Pod: pod, MountPath: "/nonexistent"},
		{Volume: "v", Plugin: "test/none", Spec: &volume.Spec{Name: "v"}, Pod: pod, MountPath: "/nonexistent",
			Attributes: volume.Attributes{Block: true}, DesiredSize: &size},
	}
	for _, op := range Ops {
		t.Run(string(op), func(t *testing.T) {
			stale := 0
			for _, tgt := range targets {
				if Needed(op, &tgt, nil, o.DSW) {
					continue
				}
				stale++
				run := o.Operation(op, tgt)
				if run == nil || run.Name != op || run.Key() != tgt.Key() {
					t.Fatalf("Operation(%s) = %+v", op, run)
				}
				if err := run.run(t.Context()); !errors.Is(err, ErrStale) {
					t.Errorf("block %v: body returned %v where its precondition does not hold, want ErrStale", tgt.Attributes.Block, err)
				}
			}
			if stale == 0 {
				t.Errorf("no target leaves %s without work: the test does not cover it", op)
			}
		})
	}
	if o.Operation("no_such_kind", targets[0]) != nil {
		t.Error("Operation built an operation for a name that is no kind")
	}
}
