// Package operations runs volume operations: the Executor admits at most one
// operation per key through a nested pending-operations map, holds failed
// keys in exponential backoff, bounds concurrency and gives every operation a
// timeout; the Operator holds the bodies of the operations (mount device, set
// up, tear down, unmount device...), which call the volume plugins and are the
// only code that writes the actual state of world. Each body starts by
// checking that it is still Needed, from the predicates in package cache that
// the planner plans from. The table of kinds (Kind, kinds.go) is the one
// place that says what each kind of operation means, for all of them.
//
// Keys nest: an operation on (volume, "") excludes every operation on that
// volume; one on (volume, pod) excludes (volume, pod) and (volume, ""), but
// not (volume, otherPod). So device-level work on a shared volume is serial,
// while pods publishing an already-staged volume proceed in parallel.
package operations
