// Package notify provides a coalescing wake-up signal: any number of
// notifications before the receiver gets to run collapse into one, and the
// sender never blocks. It is how sources, caches and the executor wake the
// reconciler without polling.
package notify

// Signal is a coalescing notification channel. The zero value is not usable;
// call New.
type Signal struct{ ch chan struct{} }

// New returns a Signal with nothing pending.
func New() *Signal { return &Signal{ch: make(chan struct{}, 1)} }

// Notify records that something happened. It never blocks.
func (s *Signal) Notify() {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// C is the channel to receive from.
func (s *Signal) C() <-chan struct{} { return s.ch }
