// Package reconciler owns when the node acts: it runs a pass when something
// changed (a source, an operation finishing, a backoff expiring) and on a
// slow periodic resync, plans it with the planner (reconciler/planner) and
// hands each action that can start to the executor, through the Handler
// (*operations.Operator) that owns how. After a restart it adopts, at the
// first pass with ready sources, the state found on disk that pods want.
package reconciler
