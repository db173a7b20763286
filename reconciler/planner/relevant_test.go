package planner

import (
	"testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

func TestRelevant(t *testing.T) {
	const v, other = volume.UniqueName("p/v"), volume.UniqueName("p/other")
	dsw := desiredSnapshot([]*cache.DesiredVolume{dvol(v, volume.Attributes{}, "wants")}, nil)
	asw := actualSnapshot([]*cache.ActualVolume{avol(other, volume.Attributes{}, mounted("has"))})
	for _, tc := range []struct {
		key  operations.Key
		want bool
	}{
		{operations.Key{Volume: v, Pod: "wants"}, true},
		{operations.Key{Volume: other, Pod: "has"}, true},
		{operations.Key{Volume: v, Pod: "gone"}, false},
		{operations.Key{Volume: other, Pod: "wants"}, false},
		{operations.Key{Volume: v}, true},
		{operations.Key{Volume: other}, true},
		{operations.Key{Volume: "p/nothing"}, false},
	} {
		if got := Relevant(dsw, asw, tc.key); got != tc.want {
			t.Errorf("Relevant(%+v) = %v, want %v", tc.key, got, tc.want)
		}
	}
}
