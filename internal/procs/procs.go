// Package procs owns how many Ps (processors that run Go code) the runtime
// gives the agent, and remembers how many CPUs the agent may use.
//
// The agent's operations block in the kernel: umount(2) waits for an RCU
// grace period, mkdir(2) and rmdir(2) for the filesystem's journal, for
// tens of microseconds to milliseconds each. While a goroutine is in such a
// syscall its P is idle; with only as many Ps as CPUs, the runtime soon
// takes that P away to run other goroutines on another thread, and the
// caller, once back, must wait for a P and its thread sleeps. In a storm
// that is a few thread switches per syscall: on 2 CPUs, unmounting 4,000
// tmpfs volumes took about a third longer than with spare Ps, and more CPU.
// A spare P costs nothing while the agent idles and a little memory (less
// than 1 MiB for all of them, measured at 100 and 1000 pods).
package procs

import (
	"os"
	"runtime"
)

// cpus is the runtime's default GOMAXPROCS: the CPUs the process may run
// on, within its cgroup's CPU limit. Package initialisation records it
// before main can change it.
var cpus = runtime.GOMAXPROCS(0)

// Spare is how many Ps AddSpare adds beyond the CPUs.
const Spare = 4

// CPUs returns how many CPUs the agent may use: how many goroutines are
// worth running at once for work that only computes (parsing manifests).
func CPUs() int { return cpus }

// AddSpare makes the runtime run Spare more Ps than CPUs and returns the
// new GOMAXPROCS, unless the GOMAXPROCS environment variable chose it: an
// operator's choice stands. Setting it stops the runtime from following
// later changes to the cgroup's CPU limit, which a DaemonSet's pods do not
// see.
func AddSpare() int {
	if os.Getenv("GOMAXPROCS") != "" {
		return runtime.GOMAXPROCS(0)
	}
	runtime.GOMAXPROCS(cpus + Spare)
	return cpus + Spare
}
