// Package procs owns how many Ps (processors that run Go code) the runtime
// gives the agent: spare ones during a burst (the agent asks for them while
// it tears many volumes down), the runtime's default (one per CPU the agent
// may use) otherwise.
//
// The agent's operations block in the kernel: umount(2) waits for an RCU
// grace period, mkdir(2) and rmdir(2) for the filesystem's journal, for
// tens of microseconds to milliseconds each. While a goroutine is in such a
// syscall its P is idle; with only as many Ps as CPUs, the runtime soon
// takes that P away to run other goroutines on another thread, and the
// caller, once back, must wait for a P while its thread sleeps. In a storm
// that is a few thread switches per syscall: on 2 CPUs, 4,000 tmpfs volumes
// took half as long again to unmount, with a third more CPU, than with four
// spare Ps. Once the node is steady the runtime's default comes back, and
// with it the runtime following changes to the cgroup's CPU limit. What
// stays is the threads a burst made (the runtime keeps them): about 1.5 MiB
// of RSS after unmounting 500 pods' volumes.
//
// GOMAXPROCS belongs to the process: the program makes one Tuning at start
// and hands it to what bursts and to what asks how many CPUs it has. A nil
// *Tuning leaves the runtime's default alone.
package procs

import (
	"os"
	"runtime"
	"sync"
)

// Spare is how many Ps beyond the CPUs a burst runs with.
const Spare = 4

// Tuning changes the runtime's Ps for bursts; make one per process (New).
type Tuning struct {
	// fixed: the operator set GOMAXPROCS in the environment, and it
	// stands.
	fixed bool

	mu sync.Mutex
	// bursting is true while the spare Ps are there.
	bursting bool
}

// New returns the process's Tuning, reading the GOMAXPROCS environment
// variable now.
func New() *Tuning { return &Tuning{fixed: os.Getenv("GOMAXPROCS") != ""} }

// CPUs returns how many CPUs the agent may use (the runtime's default
// GOMAXPROCS, within the cgroup's CPU limit, or the GOMAXPROCS environment
// variable): how many goroutines are worth running at once for work that
// only computes, such as parsing manifests.
func (t *Tuning) CPUs() int {
	if t == nil {
		return runtime.GOMAXPROCS(0)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bursting {
		return runtime.GOMAXPROCS(0) - Spare
	}
	return runtime.GOMAXPROCS(0)
}

// Burst adds Spare Ps for a burst of operations. An operator's GOMAXPROCS
// (set in the environment) stands.
func (t *Tuning) Burst() {
	if t == nil || t.fixed {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bursting {
		return
	}
	t.bursting = true
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + Spare)
}

// Steady takes the spare Ps back once a burst is over, and lets the
// runtime follow the CPUs (and the cgroup's CPU limit) again.
func (t *Tuning) Steady() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.bursting {
		return
	}
	t.bursting = false
	runtime.SetDefaultGOMAXPROCS()
}
