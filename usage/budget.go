package usage

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Budget is a token bucket of directory entries shared by every walk of
// the node (safefs.Budget): at most PerSecond entries a second on average,
// at most one second's worth at once.
type Budget struct {
	clock clock.Clock
	rate  float64

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

// NewBudget returns a full bucket of perSecond entries a second.
func NewBudget(perSecond int, clk clock.Clock) *Budget {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Budget{clock: clk, rate: float64(perSecond), tokens: float64(perSecond), last: clk.Now()}
}

// Take waits until n entries may be looked at, or ctx ends. A request
// larger than the bucket waits until the bucket is full and takes it all.
func (b *Budget) Take(ctx context.Context, n int) error {
	for {
		b.mu.Lock()
		now := b.clock.Now()
		b.tokens = min(b.rate, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
		need := min(float64(n), b.rate)
		if b.tokens >= need {
			b.tokens -= need
			b.mu.Unlock()
			return nil
		}
		wait := time.Duration((need - b.tokens) / b.rate * float64(time.Second))
		b.mu.Unlock()
		t := b.clock.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
	}
}
