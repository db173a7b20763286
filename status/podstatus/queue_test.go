package podstatus

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestQueueOrder(t *testing.T) {
	type step struct {
		add  types.UID
		prio priority
		// get, when set, takes a pod (and marks it done unless hold).
		get  bool
		hold bool
		done types.UID
	}
	cases := []struct {
		name  string
		steps []step
		// want is the order the pods are handed out in after the steps,
		// each marked done at once.
		want []types.UID
	}{
		{
			name:  "FIFO within a priority",
			steps: []step{{add: "a", prio: low}, {add: "b", prio: low}, {add: "c", prio: low}},
			want:  []types.UID{"a", "b", "c"},
		},
		{
			name:  "high before low",
			steps: []step{{add: "a", prio: low}, {add: "b", prio: high}, {add: "c", prio: low}, {add: "d", prio: high}},
			want:  []types.UID{"b", "d", "a", "c"},
		},
		{
			name:  "a pod queued twice is handed out once",
			steps: []step{{add: "a", prio: low}, {add: "b", prio: low}, {add: "a", prio: low}},
			want:  []types.UID{"a", "b"},
		},
		{
			name:  "raised to high, not kept in its low place",
			steps: []step{{add: "a", prio: low}, {add: "b", prio: low}, {add: "c", prio: high}, {add: "b", prio: high}},
			want:  []types.UID{"c", "b", "a"},
		},
		{
			name:  "never lowered",
			steps: []step{{add: "a", prio: high}, {add: "b", prio: high}, {add: "a", prio: low}},
			want:  []types.UID{"a", "b"},
		},
		{
			name: "added while a worker has it: queued again when done, not handed to a second worker",
			steps: []step{
				{add: "a", prio: high}, {get: true, hold: true},
				{add: "a", prio: low}, {add: "b", prio: low},
			},
			// a is held: only b can be handed out until a is done.
			want: []types.UID{"b"},
		},
		{
			name: "queued again at the higher priority asked for while held",
			steps: []step{
				{add: "a", prio: low}, {get: true, hold: true},
				{add: "a", prio: low}, {add: "a", prio: high}, {add: "b", prio: low},
				{done: "a"},
			},
			want: []types.UID{"a", "b"},
		},
		{
			name: "done without a new add: gone",
			steps: []step{
				{add: "a", prio: low}, {get: true, hold: true}, {done: "a"},
			},
			want: nil,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := newQueue()
			for _, s := range tc.steps {
				switch {
				case s.add != "":
					q.add(s.add, s.prio)
				case s.get:
					uid, _, ok := q.get()
					if !ok {
						t.Fatal("get: queue shut down")
					}
					if !s.hold {
						q.done(uid)
					}
				case s.done != "":
					q.done(s.done)
				}
			}
			var got []types.UID
			for q.len() > 0 {
				uid, _, ok := q.get()
				if !ok {
					t.Fatal("get: queue shut down")
				}
				got = append(got, uid)
				q.done(uid)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("handed out %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("handed out %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestQueueShutDownWakesGet(t *testing.T) {
	q := newQueue()
	ended := make(chan bool)
	go func() {
		_, _, ok := q.get()
		ended <- ok
	}()
	q.shutDown()
	if ok := <-ended; ok {
		t.Fatal("get handed out a pod from an empty queue that was shut down")
	}
	q.add("a", high)
	if q.len() != 0 {
		t.Fatal("a pod was queued after shutdown")
	}
}
