// Package planner owns what the node should do: pure functions from the
// desired and actual snapshots to actions, without I/O, clock or locks.
//
// Plan is the definition, and the one to read first: it plans every volume
// in the kubelet's fixed order: (1) unmount what pods no longer want, (2)
// attach, mount devices and set up volumes for pods (and expand them), (3)
// unmount devices and detach volumes no pod uses. Incremental is its fast
// path, which the reconciler runs: it plans again only the volumes that
// changed, and a differential test holds it to Plan. Adoptions decides what
// state found on disk after a restart pods may take over as it is, and
// Relevant which failed operations are worth remembering.
//
// The package imports nothing that touches the machine (no os, unix or
// mount packages): a test in imports_test.go, which `make lint` runs,
// fails otherwise.
package planner
