// Package housekeeping owns the agent's directory tree outside operations:
// Reconstruct reads it back after a restart into actual state, CleanPodDirs
// (run by a Loop of its own, beside the reconciler) removes what gone pods
// left in it, and Orphans reports, once each, what is found there that the
// agent cannot account for or clean.
package housekeeping
