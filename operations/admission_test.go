package operations

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// admissionState puts an executor into a state: operations running, failed
// ones in backoff.
type admissionState struct {
	name  string
	setup func(s *stateBuilder)
	// startable lists the candidates (see admissionCandidates) that may
	// start in that state.
	startable []string
}

type stateBuilder struct {
	t       *testing.T
	e       *Executor
	clk     *clocktesting.FakeClock
	obs     *finished
	release chan struct{}
}

func (b *stateBuilder) running(key Key, name Op) {
	b.t.Helper()
	if err := b.e.Run(key, op(name, blocking(b.release))); err != nil {
		b.t.Fatalf("setting up: running %s on %v: %v", name, key, err)
	}
}

func (b *stateBuilder) failed(key Key, name Op) {
	b.t.Helper()
	if err := b.e.Run(key, op(name, failing)); err != nil {
		b.t.Fatalf("setting up: failing %s on %v: %v", name, key, err)
	}
	if r := b.obs.wait(b.t); !errors.Is(r.err, errBoom) {
		b.t.Fatalf("setting up: %s on %v finished with %v", name, key, r.err)
	}
}

// admissionCandidates are every key on two volumes (whole volume, three
// pods; another volume) with two operation names, labelled "v/p1 a".
func admissionCandidates() (labels []string, cands []Candidate) {
	keys := []Key{{"v", ""}, {"v", "p1"}, {"v", "p2"}, {"v", "p3"}, {"w", ""}}
	for _, k := range keys {
		for _, name := range []Op{"a", "b"} {
			labels = append(labels, fmt.Sprintf("%s/%s %s", k.Volume, k.Pod, name))
			cands = append(cands, Candidate{Key: k, Name: name})
		}
	}
	return labels, cands
}

var admissionStates = []admissionState{
	{
		name:      "idle",
		setup:     func(*stateBuilder) {},
		startable: []string{"v/ a", "v/ b", "v/p1 a", "v/p1 b", "v/p2 a", "v/p2 b", "v/p3 a", "v/p3 b", "w/ a", "w/ b"},
	},
	{
		name:      "volume-wide operation running",
		setup:     func(b *stateBuilder) { b.running(Key{"v", ""}, "a") },
		startable: []string{"w/ a", "w/ b"},
	},
	{
		name:      "pod operation running",
		setup:     func(b *stateBuilder) { b.running(Key{"v", "p1"}, "a") },
		startable: []string{"v/p2 a", "v/p2 b", "v/p3 a", "v/p3 b", "w/ a", "w/ b"},
	},
	{
		name:      "volume-wide operation in backoff holds back the same operation on every key of the volume",
		setup:     func(b *stateBuilder) { b.failed(Key{"v", ""}, "a") },
		startable: []string{"v/ b", "v/p1 b", "v/p2 b", "v/p3 b", "w/ a", "w/ b"},
	},
	{
		name: "backoff over",
		setup: func(b *stateBuilder) {
			b.failed(Key{"v", ""}, "a")
			b.clk.Step(time.Second)
		},
		startable: []string{"v/ a", "v/ b", "v/p1 a", "v/p1 b", "v/p2 a", "v/p2 b", "v/p3 a", "v/p3 b", "w/ a", "w/ b"},
	},
	{
		name: "pod operations in backoff",
		setup: func(b *stateBuilder) {
			b.failed(Key{"v", "p1"}, "a")
			b.failed(Key{"v", "p2"}, "b")
		},
		// The volume-wide key has no entry of its own and carries on the
		// first failed one (p1's).
		startable: []string{"v/ b", "v/p1 b", "v/p2 a", "v/p3 a", "v/p3 b", "w/ a", "w/ b"},
	},
	{
		name: "the exact key's entry is preferred to the first match",
		setup: func(b *stateBuilder) {
			b.failed(Key{"v", "p1"}, "a")
			b.failed(Key{"v", "p2"}, "a")
			// Carries on p1's entry, which becomes the volume's and
			// comes first.
			b.failed(Key{"v", ""}, "b")
		},
		startable: []string{"v/ a", "v/p1 a", "v/p2 b", "v/p3 a", "w/ a", "w/ b"},
	},
	{
		name: "a running operation wins over a failed entry listed before it",
		setup: func(b *stateBuilder) {
			b.failed(Key{"v", "p1"}, "a")
			b.running(Key{"v", "p3"}, "a")
		},
		startable: []string{"v/p1 b", "v/p2 a", "v/p2 b", "w/ a", "w/ b"},
	},
}

// TestAdmission: Startable and Run make the same decision for every
// candidate in every state, and it is the expected one.
func TestAdmission(t *testing.T) {
	labels, cands := admissionCandidates()
	for _, st := range admissionStates {
		t.Run(st.name, func(t *testing.T) {
			newState := func() (*Executor, *stateBuilder) {
				e, clk, obs := newTestExecutor(t, ExecutorOptions{})
				b := &stateBuilder{t: t, e: e, clk: clk, obs: obs, release: make(chan struct{})}
				t.Cleanup(func() { close(b.release) })
				st.setup(b)
				return e, b
			}
			e, _ := newState()
			startable := e.Startable(cands, e.Mark())
			var got []string
			for i, label := range labels {
				if startable[i] {
					got = append(got, label)
				}
			}
			if !slices.Equal(got, st.startable) {
				t.Errorf("Startable: %s\nwant       %s", strings.Join(got, ", "), strings.Join(st.startable, ", "))
			}
			for i, c := range cands {
				// Run changes the state: each candidate gets a fresh one.
				e, b := newState()
				err := e.Run(c.Key, op(c.Name, blocking(b.release)))
				if ran := err == nil; ran != startable[i] {
					t.Errorf("%s: Run = %v, but Startable = %v", labels[i], err, startable[i])
				}
				if err != nil && !IsExpected(err) {
					t.Errorf("%s: Run refused with an unexpected error %v", labels[i], err)
				}
			}
		})
	}
}

// A plan made from snapshots taken before an operation finished must not
// start its key again: the snapshot does not show the outcome. Startable
// holds such keys (and those conflicting with them) back until a later mark.
func TestStartableHoldsKeysFinishedAfterMark(t *testing.T) {
	e, _, _ := newTestExecutor(t, ExecutorOptions{})
	before := e.Mark()
	for _, k := range []Key{{"v", "p1"}, {"w", ""}} {
		if err := e.Run(k, op("a", noop)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	cands := []Candidate{
		{Key: Key{"v", "p1"}, Name: "a"}, // finished after before
		{Key: Key{"v", "p2"}, Name: "a"}, // another pod of v: no conflict
		{Key: Key{"v", ""}, Name: "b"},   // volume-wide: conflicts with v/p1
		{Key: Key{"w", "p1"}, Name: "a"}, // a pod of w: conflicts with w's volume-wide key
		{Key: Key{"x", ""}, Name: "a"},   // untouched
	}
	tests := []struct {
		name string
		mark uint64
		want []bool
	}{
		{"plan from before the finishes", before, []bool{false, true, false, false, true}},
		{"plan from after them", e.Mark(), []bool{true, true, true, true, true}},
		{"an old mark once a newer one was passed", before, []bool{true, true, true, true, true}},
	}
	for _, tc := range tests {
		if got := e.Startable(cands, tc.mark); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Startable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
