package cache

import (
	"encoding/json"
	"maps"
	"math/rand/v2"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestPodSetOracle drives random With/Without sequences on a PodSet and
// on the map it stands for, and checks after every step that they agree,
// that the set before the step is unchanged (copy-on-write), and that
// equal contents have one representation.
func TestPodSetOracle(t *testing.T) {
	uids := []types.UID{"a", "b", "c", "d", "e", "f", "g"}
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		var s PodSet[int]
		m := map[types.UID]*int{}
		for step := range 60 {
			before, beforeMap := s, maps.Clone(m)
			uid := uids[r.IntN(len(uids))]
			if r.IntN(3) > 0 {
				v := new(int)
				*v = step
				s, m[uid] = s.With(uid, v), v
			} else {
				s = s.Without(uid)
				delete(m, uid)
			}
			check(t, seed, step, before, beforeMap, uids)
			check(t, seed, step, s, m, uids)
			if rebuilt := PodSetOf(m); !reflect.DeepEqual(rebuilt, s) {
				t.Fatalf("seed %d step %d: %+v and %+v hold the same pods", seed, step, rebuilt, s)
			}
		}
	}
}

func check(t *testing.T, seed uint64, step int, s PodSet[int], m map[types.UID]*int, uids []types.UID) {
	t.Helper()
	if s.Len() != len(m) {
		t.Fatalf("seed %d step %d: Len %d, map has %d", seed, step, s.Len(), len(m))
	}
	for _, uid := range uids {
		got, ok := s.Get(uid)
		want, wok := m[uid]
		if got != want || ok != wok || s.At(uid) != want || s.Has(uid) != wok {
			t.Fatalf("seed %d step %d: Get(%s) = %v, %v; map has %v, %v", seed, step, uid, got, ok, want, wok)
		}
	}
	all := map[types.UID]*int{}
	for uid, v := range s.All() {
		if _, dup := all[uid]; dup {
			t.Fatalf("seed %d step %d: All yields %s twice", seed, step, uid)
		}
		all[uid] = v
	}
	if !maps.Equal(all, m) {
		t.Fatalf("seed %d step %d: All yields %v, map has %v", seed, step, all, m)
	}
	n := 0
	for range s.UIDs() {
		n++
	}
	if n != len(m) || (len(m) > 0) != (s.Any() != nil) {
		t.Fatalf("seed %d step %d: UIDs yields %d, Any %v; map has %d", seed, step, n, s.Any(), len(m))
	}
	got, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(m)
	if string(got) != string(want) {
		t.Fatalf("seed %d step %d: JSON %s, map's %s", seed, step, got, want)
	}
}
