// Package cache owns the two views the reconciler compares: the desired state
// of world (DSW: which volumes the pods on this node want, filled by the
// populator) and the actual state of world (ASW: what is attached and mounted,
// written only by operations).
//
// Both are copy-on-write: an entry is never modified once published, a change
// replaces it. A Snapshot is therefore a cheap, consistent, immutable view that
// the planner can read without locks, and that the debug endpoint can encode.
// Its readers must not write into it either, not even through a method that
// caches (resource.Quantity.String and Cmp do: use volume.SizeString and
// SizeCmp); agent's TestReadersLeaveSnapshotsUnchanged runs every reader
// with the planner under -race and checks the snapshots are as built.
//
// needs.go holds what is left to do for a volume as pure predicates over these
// types, shared by the planner and the operations' checks when they run.
package cache
