package budget_test

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/plugins/apivolume/budget"
	"github.com/volume-agent/volume-agent/volume"
)

type counter map[budget.Scope]int

func (c counter) OverBudget(s budget.Scope) { c[s]++ }

func ref(uid string) volume.PodRef {
	return volume.PodRef{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid}
}

// step is one Reserve (or Release when release is set) and what must
// follow.
type step struct {
	pod, vol  string
	bytes     int64
	release   bool
	wantScope budget.Scope // "" : fits
	wantTotal int64
	wantPod   int64 // of pod
}

func TestReserve(t *testing.T) {
	lim := budget.Limits{Pod: 100, Node: 250}
	cases := []struct {
		name  string
		steps []step
	}{
		{"fits and adds up", []step{
			{pod: "a", vol: "v1", bytes: 60, wantTotal: 60, wantPod: 60},
			{pod: "a", vol: "v2", bytes: 40, wantTotal: 100, wantPod: 100},
		}},
		{"over the pod's budget, nothing held", []step{
			{pod: "a", vol: "v1", bytes: 60, wantTotal: 60, wantPod: 60},
			{pod: "a", vol: "v2", bytes: 41, wantScope: budget.PodScope, wantTotal: 60, wantPod: 60},
		}},
		{"a rewrite replaces the volume's size", []step{
			{pod: "a", vol: "v1", bytes: 60, wantTotal: 60, wantPod: 60},
			{pod: "a", vol: "v1", bytes: 100, wantTotal: 100, wantPod: 100},
			{pod: "a", vol: "v1", bytes: 10, wantTotal: 10, wantPod: 10},
		}},
		{"a refused growth keeps the old size", []step{
			{pod: "a", vol: "v1", bytes: 60, wantTotal: 60, wantPod: 60},
			{pod: "a", vol: "v1", bytes: 101, wantScope: budget.PodScope, wantTotal: 60, wantPod: 60},
		}},
		{"over the node's budget, other pods keep theirs", []step{
			{pod: "a", vol: "v", bytes: 100, wantTotal: 100, wantPod: 100},
			{pod: "b", vol: "v", bytes: 100, wantTotal: 200, wantPod: 100},
			{pod: "c", vol: "v", bytes: 51, wantScope: budget.NodeScope, wantTotal: 200, wantPod: 0},
			{pod: "c", vol: "w", bytes: 50, wantTotal: 250, wantPod: 50},
		}},
		{"teardown gives back", []step{
			{pod: "a", vol: "v", bytes: 100, wantTotal: 100, wantPod: 100},
			{pod: "b", vol: "v", bytes: 100, wantTotal: 200, wantPod: 100},
			{pod: "a", vol: "v", release: true, wantTotal: 100, wantPod: 0},
			{pod: "c", vol: "v", bytes: 100, wantTotal: 200, wantPod: 100},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obs := counter{}
			b := budget.New(lim, obs)
			refused := counter{}
			for i, s := range tc.steps {
				name := volume.UniqueName("pl/" + s.pod + "-" + s.vol)
				var err error
				if s.release {
					b.Release(name)
				} else {
					err = b.Reserve(ref(s.pod), s.vol, name, s.bytes)
				}
				var over *budget.OverError
				switch {
				case s.wantScope == "" && err != nil:
					t.Fatalf("step %d: %v, want no error", i, err)
				case s.wantScope != "" && !errors.As(err, &over):
					t.Fatalf("step %d: %v, want an OverError", i, err)
				case s.wantScope != "":
					refused[s.wantScope]++
					if over.Scope != s.wantScope {
						t.Errorf("step %d: scope %s, want %s", i, over.Scope, s.wantScope)
					}
					// The message names pod, volume, size and budget.
					for _, want := range []string{"ns/pod-" + s.pod, `"` + s.vol + `"`, " bytes", "budget"} {
						if !strings.Contains(err.Error(), want) {
							t.Errorf("step %d: %q does not say %q", i, err, want)
						}
					}
				}
				if got := b.Total(); got != s.wantTotal {
					t.Errorf("step %d: total %d, want %d", i, got, s.wantTotal)
				}
				if got := b.Pod(types.UID(s.pod)); got != s.wantPod {
					t.Errorf("step %d: pod %s holds %d, want %d", i, s.pod, got, s.wantPod)
				}
				if got := b.Total(); got > lim.Node {
					t.Errorf("step %d: total %d over the node budget %d", i, got, lim.Node)
				}
			}
			for s, n := range refused {
				if obs[s] != n {
					t.Errorf("observer heard %d refusals of scope %s, want %d", obs[s], s, n)
				}
			}
		})
	}
}

// Content found on disk after a restart counts whatever the budget, and
// the volume's next set up replaces it.
func TestFoundCountsWhateverTheBudget(t *testing.T) {
	b := budget.New(budget.Limits{Pod: 100, Node: 150}, nil)
	b.Found("a", "pl/a-v", 300)
	if err := b.Reserve(ref("b"), "v", "pl/b-v", 10); err == nil {
		t.Fatalf("a new volume fits while content found on disk already fills the node's budget")
	}
	// Its rewrite, smaller, fits: content held is never refused a rewrite
	// that does not grow it.
	if err := b.Reserve(ref("a"), "v", "pl/a-v", 100); err != nil {
		t.Fatalf("rewrite of a found volume at a smaller size: %v", err)
	}
	if err := b.Reserve(ref("b"), "v", "pl/b-v", 50); err != nil {
		t.Fatalf("after the found volume shrank: %v", err)
	}
	if got := b.Total(); got != 150 {
		t.Errorf("total %d, want 150", got)
	}
}

// No limit: 0.
func TestZeroIsNoLimit(t *testing.T) {
	b := budget.New(budget.Limits{}, nil)
	if err := b.Reserve(ref("a"), "v", "pl/a-v", 1<<40); err != nil {
		t.Fatal(err)
	}
}
