package safefs

// SetGroupWorkers makes SetGroup use n workers until the returned func
// is called.
func SetGroupWorkers(n int) (restore func()) {
	old := groupWorkersOverride
	groupWorkersOverride = n
	return func() { groupWorkersOverride = old }
}

// GroupFDBound is the most descriptors one SetGroup walk holds besides
// its root's.
func GroupFDBound() int {
	w := groupWorkers()
	return w*(maxOpenDirs+1+maxLocalDirs) + 2*w
}
