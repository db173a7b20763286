package notify

import "testing"

func pending(s *Signal) int {
	n := 0
	for {
		select {
		case <-s.C():
			n++
		default:
			return n
		}
	}
}

// TestSignal: what a receiver sees after a sequence of notifications and
// receives. The case that matters to every watcher: a notification that
// comes while the receiver handles the previous one (after it received)
// is kept for it, never lost.
func TestSignal(t *testing.T) {
	for _, tc := range []struct {
		name     string
		before   int // notifications before the receive
		during   int // notifications after the receive, while handling
		received bool
		left     int // wake-ups pending afterwards
	}{
		{name: "nothing", left: 0},
		{name: "one, not received", before: 1, left: 1},
		{name: "a burst coalesces", before: 100, left: 1},
		{name: "received, nothing since", before: 3, received: true, left: 0},
		{name: "one during handling is kept", before: 1, received: true, during: 1, left: 1},
		{name: "a burst during handling is kept once", before: 1, received: true, during: 50, left: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New()
			for range tc.before {
				s.Notify() // never blocks, however many
			}
			if tc.received {
				<-s.C()
			}
			for range tc.during {
				s.Notify()
			}
			if got := pending(s); got != tc.left {
				t.Errorf("%d wake-ups pending, want %d", got, tc.left)
			}
		})
	}
}
