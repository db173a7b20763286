package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// memTotal is the node's memory from /proc/meminfo (the host's in a
// container too, /proc/meminfo is not namespaced), 0 if unreadable. Read
// once at start.
func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		v, ok := strings.CutPrefix(s.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kib, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil {
			return 0
		}
		return kib << 10
	}
	return 0
}

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
