package changelog

import (
	"maps"
	"slices"
	"testing"
)

func TestLog(t *testing.T) {
	type step struct {
		mark    []string // marked before the take
		markAll bool
		all     bool     // the take says All
		keys    []string // or lists these
	}
	tests := []struct {
		name  string
		limit int
		steps []step
	}{
		{"nothing is kept before the first take, which says All", 10, []step{
			{mark: []string{"a"}, all: true},
			{},
			{mark: []string{"b", "c", "b"}, keys: []string{"b", "c"}},
			{},
		}},
		{"MarkAll before the first take leaves nothing behind", 10, []step{
			{markAll: true, all: true},
			{mark: []string{"a"}, keys: []string{"a"}},
		}},
		{"MarkAll", 10, []step{
			{all: true},
			{mark: []string{"a"}, markAll: true, all: true},
			{mark: []string{"b"}, keys: []string{"b"}},
		}},
		{"past the limit", 2, []step{
			{all: true},
			{mark: []string{"a", "b"}, keys: []string{"a", "b"}},
			{mark: []string{"a", "b", "c"}, all: true},
			{mark: []string{"d"}, keys: []string{"d"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l Log[string]
			for i, s := range tt.steps {
				for _, k := range s.mark {
					l.Mark(k, tt.limit)
				}
				if s.markAll {
					l.MarkAll()
				}
				all, keys := l.Take()
				got := slices.Sorted(maps.Keys(keys))
				if all != s.all || !slices.Equal(got, s.keys) || (all && keys != nil) {
					t.Errorf("step %d: take = %v %v, want %v %v", i, all, got, s.all, s.keys)
				}
			}
		})
	}
}
