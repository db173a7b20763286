package volume

import "k8s.io/apimachinery/pkg/api/resource"

// SizeString formats a size without writing into it. Quantity.String
// caches what it returns inside the value, so two goroutines formatting one
// shared quantity (a snapshot's, an informer's) race; this formats a copy.
func SizeString(q *resource.Quantity) string {
	if q == nil {
		return ""
	}
	c := q.DeepCopy()
	return c.String()
}

// SizeCmp compares two sizes without writing into either: Quantity.Cmp
// converts the receiver to its decimal form, in place, when the other is
// decimal.
func SizeCmp(a, b *resource.Quantity) int {
	x, y := a.DeepCopy(), b.DeepCopy()
	return x.Cmp(y)
}
