// Package volume holds the small vocabulary shared by the populator, the
// caches, the reconciler and the plugins: how a volume is named (UniqueName),
// described (Spec, Attributes), which pod it belongs to (PodRef, PodInfo), how
// operation errors are classified (uncertain or final), and where everything
// lives under the agent's root directory (Paths).
//
// It is a leaf package: it imports nothing of the agent, so every layer can
// speak it without import cycles.
package volume
