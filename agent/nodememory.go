package agent

import (
	v1 "k8s.io/api/core/v1"
)

// allocatableMemory is the memory a Node object says pods may use, 0 if
// it says nothing.
func allocatableMemory(n *v1.Node) int64 {
	if n == nil {
		return 0
	}
	if q, ok := n.Status.Allocatable[v1.ResourceMemory]; ok {
		return q.Value()
	}
	return 0
}
