package volume

import (
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Sizes in the caches' snapshots are read by the planner, the debug
// endpoint and the page at once: formatting one must not write into it (run
// with -race; Quantity.String on the shared value fails it).
func TestSizeStringWritesNothing(t *testing.T) {
	// As the agent's sizes are made (from a driver's byte count), without
	// the formatted string a parsed quantity carries.
	shared := resource.NewQuantity(1536<<20, resource.BinarySI)
	var wg sync.WaitGroup
	got := make([]string, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = SizeString(shared)
		}()
	}
	wg.Wait()
	for _, s := range got {
		if s != "1536Mi" {
			t.Errorf("SizeString = %q, want 1536Mi", s)
		}
	}
	if SizeString(nil) != "" {
		t.Error("SizeString(nil) is not empty")
	}
}

// Cmp of an integer quantity with a decimal one turns the receiver decimal,
// in place; SizeCmp leaves both as they were (and String writes its cache).
func TestSizeCmpWritesNothing(t *testing.T) {
	whole := *resource.NewQuantity(1<<30, resource.BinarySI)
	dec := resource.MustParse("100000000000000000000000") // too big for an int64: decimal
	before := whole
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(2)
		go func() { defer wg.Done(); _ = SizeCmp(&whole, &dec) }()
		go func() { defer wg.Done(); _ = SizeString(&whole) }()
	}
	wg.Wait()
	if got := SizeCmp(&whole, &dec); got != -1 {
		t.Errorf("SizeCmp(1Gi, 1e23) = %d", got)
	}
	if whole != before {
		t.Errorf("SizeCmp wrote into its argument: %#v, was %#v", whole, before)
	}
}
