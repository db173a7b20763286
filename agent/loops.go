package agent

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// loops supervises the agent's long-running loops: each runs until the
// agent stops, and the first one to fail — or to return while the agent is
// still running — stops all the others with its error.
type loops struct {
	g *errgroup.Group
	// ctx ends when the agent stops: its parent ended, or a loop failed
	// (context.Cause then says which and why).
	ctx context.Context
}

func newLoops(ctx context.Context) *loops {
	g, ctx := errgroup.WithContext(ctx)
	return &loops{g: g, ctx: ctx}
}

// errStoppedEarly is a loop returning without an error before the agent
// stops: the agent would go on without it, silently.
var errStoppedEarly = errors.New("stopped unexpectedly")

// run starts a loop that must run until l.ctx ends. What it returns once
// the agent is stopping is not an error: stopping may interrupt it.
func (l *loops) run(name string, loop func(ctx context.Context) error) {
	l.g.Go(func() error {
		err := loop(l.ctx)
		if l.ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errStoppedEarly
		}
		return fmt.Errorf("%s: %w", name, err)
	})
}

// goUntilStopped starts fn, which returns when told to (an HTTP server shut
// down after running operations finished): it may outlive l.ctx, and an
// error it returns stops the agent like a loop's.
func (l *loops) goUntilStopped(name string, fn func() error) {
	l.g.Go(func() error {
		if err := fn(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// wait waits for every loop to return and returns the first failure (nil if
// the agent stopped because its parent context ended).
func (l *loops) wait() error { return l.g.Wait() }

// untilDone adapts a loop that cannot fail.
func untilDone(loop func(ctx context.Context)) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		loop(ctx)
		return nil
	}
}
