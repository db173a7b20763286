package cache

import (
	"encoding/json"
	"iter"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// PodSet is a volume's pods, each with its entry (*E): the pods of a
// DesiredVolume or an ActualVolume. It behaves as a map from pod UID to
// entry, which TestPodSetOracle compares it with.
//
// In a storm nearly every volume has one pod, and a map per volume was two
// allocations that every lookup and every copy-on-write clone reached
// through cold memory. A set of one pod holds it inline; from the second
// pod on, every pod is in a slice sorted by UID.
//
// A PodSet is a value that is never written once made: With and Without
// return a new set and leave the old one as it was, so a set reachable
// from a published entry stays valid for every snapshot that shares it.
// The zero PodSet is empty.
type PodSet[E any] struct {
	// uid and one are the only pod of a set of one; one is nil otherwise.
	uid types.UID
	one *E
	// many holds every pod, sorted by UID, of a set of two or more; nil
	// otherwise (the representation is canonical, so reflect.DeepEqual
	// compares sets by content).
	many []podSetEntry[E]
}

type podSetEntry[E any] struct {
	uid types.UID
	e   *E
}

// PodSetOf returns a set of the pods in m (for tests and tools that build
// entries by hand). Its entries must not be nil.
func PodSetOf[E any](m map[types.UID]*E) PodSet[E] {
	var s PodSet[E]
	for uid, e := range m {
		s = s.With(uid, e)
	}
	return s
}

// Len returns the number of pods.
func (s PodSet[E]) Len() int {
	if s.many != nil {
		return len(s.many)
	}
	if s.one != nil {
		return 1
	}
	return 0
}

// Get returns the pod's entry.
func (s PodSet[E]) Get(uid types.UID) (*E, bool) {
	if s.many == nil {
		if s.one != nil && s.uid == uid {
			return s.one, true
		}
		return nil, false
	}
	if i, ok := s.find(uid); ok {
		return s.many[i].e, true
	}
	return nil, false
}

// Has reports whether the set holds the pod.
func (s PodSet[E]) Has(uid types.UID) bool {
	_, ok := s.Get(uid)
	return ok
}

func (s PodSet[E]) find(uid types.UID) (int, bool) {
	return slices.BinarySearchFunc(s.many, uid, func(p podSetEntry[E], uid types.UID) int {
		return strings.Compare(string(p.uid), string(uid))
	})
}

// All yields every pod and its entry. Readers must not depend on the
// order (a map's was random).
func (s PodSet[E]) All() iter.Seq2[types.UID, *E] {
	return func(yield func(types.UID, *E) bool) {
		if s.many == nil {
			if s.one != nil {
				yield(s.uid, s.one)
			}
			return
		}
		for _, p := range s.many {
			if !yield(p.uid, p.e) {
				return
			}
		}
	}
}

// Any returns the entry of one of the pods, nil if there is none.
func (s PodSet[E]) Any() *E {
	if s.many != nil {
		return s.many[0].e
	}
	return s.one
}

// With returns the set with the pod's entry set to e (not nil), sharing
// nothing that either set may change with s.
func (s PodSet[E]) With(uid types.UID, e *E) PodSet[E] {
	if e == nil {
		panic("cache: PodSet.With a nil entry")
	}
	if s.many == nil {
		if s.one == nil || s.uid == uid {
			return PodSet[E]{uid: uid, one: e}
		}
		a, b := podSetEntry[E]{s.uid, s.one}, podSetEntry[E]{uid, e}
		if b.uid < a.uid {
			a, b = b, a
		}
		return PodSet[E]{many: []podSetEntry[E]{a, b}}
	}
	i, ok := s.find(uid)
	if ok {
		many := slices.Clone(s.many)
		many[i].e = e
		return PodSet[E]{many: many}
	}
	many := make([]podSetEntry[E], len(s.many)+1)
	copy(many, s.many[:i])
	many[i] = podSetEntry[E]{uid, e}
	copy(many[i+1:], s.many[i:])
	return PodSet[E]{many: many}
}

// Without returns the set without the pod, sharing nothing that either set
// may change with s.
func (s PodSet[E]) Without(uid types.UID) PodSet[E] {
	if s.many == nil {
		if s.one != nil && s.uid == uid {
			return PodSet[E]{}
		}
		return s
	}
	i, ok := s.find(uid)
	if !ok {
		return s
	}
	if len(s.many) == 2 {
		p := s.many[1-i]
		return PodSet[E]{uid: p.uid, one: p.e}
	}
	return PodSet[E]{many: slices.Delete(slices.Clone(s.many), i, i+1)}
}

// MarshalJSON encodes the set as the map it stands for: an object by pod
// UID.
func (s PodSet[E]) MarshalJSON() ([]byte, error) {
	m := make(map[types.UID]*E, s.Len())
	for uid, e := range s.All() {
		m[uid] = e
	}
	return json.Marshal(m)
}

// At returns the pod's entry, nil if the set does not hold the pod.
func (s PodSet[E]) At(uid types.UID) *E {
	e, _ := s.Get(uid)
	return e
}

// UIDs yields every pod's UID, in no order readers may depend on.
func (s PodSet[E]) UIDs() iter.Seq[types.UID] {
	return func(yield func(types.UID) bool) {
		for uid := range s.All() {
			if !yield(uid) {
				return
			}
		}
	}
}
