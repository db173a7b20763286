// Package reconciler makes the actual state of world match the desired one.
// Plan is a pure function from the two snapshots to a list of actions in the
// kubelet's fixed order: (1) unmount what pods no longer want, (2) attach,
// mount devices and set up volumes for pods (and expand them), (3) unmount
// devices and detach volumes no pod uses. The Reconciler runs Plan when
// something changed (a source, an operation finishing, a backoff expiring)
// and on a slow periodic resync, and hands each action to the executor.
package reconciler
