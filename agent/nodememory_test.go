package agent

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestNodeMemory(t *testing.T) {
	if got, err := memTotal(); got < 64<<20 {
		t.Errorf("memTotal() = %d, %v: /proc/meminfo not read", got, err)
	}
	node := &v1.Node{Status: v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceMemory: resource.MustParse("3Gi")}}}
	for _, tc := range []struct {
		node *v1.Node
		want int64
	}{{nil, 0}, {&v1.Node{}, 0}, {node, 3 << 30}} {
		if got := allocatableMemory(tc.node); got != tc.want {
			t.Errorf("allocatableMemory(%v) = %d, want %d", tc.node, got, tc.want)
		}
	}
}
