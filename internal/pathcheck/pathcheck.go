// Package pathcheck answers "what is at this host path?" for code that must
// never wait on a filesystem: the populator, which decides from the answer
// how a volume is handled (a local PV on a block device needs a device
// mount, one on a directory does not). A hung disk (a dead NFS server, a
// stuck FUSE daemon, a failing drive) blocks stat(2) for as long as it
// likes; such a call here runs in the background, one per path at most,
// and its answer is cached. The caller gets the last answer at once, waits
// a moment (FirstWait) for the first one and is told "pending" if it is
// not there by then, is told the filesystem does not answer
// once a check has run longer than the timeout, and is called back
// (Changed) whenever an answer changes what it would be told.
package pathcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// ErrPending is returned while the first check of a path runs.
var ErrPending = errors.New("being checked")

// ErrNoAnswer is returned (wrapped) when the first check of a path has run
// longer than the timeout: its filesystem does not answer.
var ErrNoAnswer = errors.New("its filesystem does not answer")

// StatFunc looks at a path: its type bits (fs.ModeDir, fs.ModeDevice...).
type StatFunc func(path string) (fs.FileMode, error)

// Options configures a Checker. Zero values get defaults.
type Options struct {
	// Timeout after which a first check still running is reported as
	// ErrNoAnswer (default 10s: a local disk answers in microseconds).
	Timeout time.Duration
	// FirstWait is how long the first ask for a path waits for its first
	// answer before being told ErrPending (default 20ms; negative: not at
	// all). A healthy disk answers well within it, so a new local volume
	// is resolved at once instead of a round through Changed; a hung one
	// costs each new path this once.
	FirstWait time.Duration
	// MaxAge after which an answer is checked again, in the background
	// (default 1m: paths can change unseen, e.g. a disk mounted later).
	MaxAge time.Duration
	// Changed is called (from the checking goroutine) when an answer
	// arrives that differs from what was told, and when a first check
	// outlives the timeout.
	Changed func()
	Clock   clock.WithDelayedExecution
}

// Checker caches the answers for paths. It is safe for concurrent use.
type Checker struct {
	stat StatFunc
	opts Options

	mu        sync.Mutex
	entries   map[string]*entry
	lastSweep time.Time
}

type entry struct {
	mode      fs.FileMode
	err       error
	known     bool
	checkedAt time.Time
	running   bool
	started   time.Time
	// done is closed when the running check ends; waitUntil (real time)
	// is how long first askers wait for it.
	done      chan struct{}
	waitUntil time.Time
	// toldUnknown: someone was told ErrPending or ErrNoAnswer, so the
	// first answer changes what they were told.
	toldUnknown bool
	lastUsed    time.Time
}

// New returns a Checker that looks at paths with stat.
func New(stat StatFunc, opts Options) *Checker {
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.MaxAge <= 0 {
		opts.MaxAge = time.Minute
	}
	if opts.FirstWait == 0 {
		opts.FirstWait = 20 * time.Millisecond
	}
	if opts.Changed == nil {
		opts.Changed = func() {}
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Checker{stat: stat, opts: opts, entries: map[string]*entry{}}
}

// Type returns what path is as last checked, without touching any
// filesystem: ErrPending while its first check runs, an ErrNoAnswer error
// once that check has run longer than the timeout, else the last answer
// (refreshed in the background once older than MaxAge).
func (c *Checker) Type(path string) (fs.FileMode, error) {
	now := c.opts.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweep(now)
	e, ok := c.entries[path]
	if !ok {
		e = &entry{}
		c.entries[path] = e
	}
	e.lastUsed = now
	if !e.running && (!e.known || now.Sub(e.checkedAt) >= c.opts.MaxAge) {
		c.start(path, e, now)
	}
	if !e.known && e.running {
		if wait := time.Until(e.waitUntil); wait > 0 {
			done := e.done
			c.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-done:
			case <-t.C:
			}
			t.Stop()
			c.mu.Lock()
		}
	}
	switch {
	case e.known:
		return e.mode, e.err
	case now.Sub(e.started) >= c.opts.Timeout:
		e.toldUnknown = true
		return 0, fmt.Errorf("%w: no answer to a stat of %s for %v (a hung disk or network filesystem?)", ErrNoAnswer, path, now.Sub(e.started).Round(time.Second))
	}
	e.toldUnknown = true
	return 0, ErrPending
}

// start checks path in the background. c.mu is held.
func (c *Checker) start(path string, e *entry, now time.Time) {
	e.running, e.started = true, now
	done := make(chan struct{})
	e.done = done
	first := !e.known
	if first && c.opts.FirstWait > 0 {
		e.waitUntil = time.Now().Add(c.opts.FirstWait)
	}
	if first {
		// Tell the caller when the first answer is overdue, so it
		// reports that instead of "pending" for ever.
		c.opts.Clock.AfterFunc(c.opts.Timeout, func() {
			c.mu.Lock()
			overdue := e.running && !e.known
			c.mu.Unlock()
			if overdue {
				c.opts.Changed()
			}
		})
	}
	go func() {
		mode, err := c.stat(path)
		mode = mode.Type()
		c.mu.Lock()
		// Changed only when a caller was told something else: a first
		// answer that the first asker waited for changes nothing, and a
		// resolve of every pod for each new path would make a storm of
		// new local volumes quadratic.
		changed := (!e.known && e.toldUnknown) || (e.known && (e.mode != mode || !sameError(e.err, err)))
		e.mode, e.err, e.known, e.running = mode, err, true, false
		e.checkedAt = c.opts.Clock.Now()
		c.mu.Unlock()
		if changed {
			c.opts.Changed()
		}
		close(done)
	}()
}

func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Error() == b.Error()
}

// forgetAfter: a path nobody asked about for this long (its pods and PV
// left) is forgotten, in a sweep at most once per sweepEvery.
const (
	forgetAfter = 10 * time.Minute
	sweepEvery  = time.Minute
)

// sweep forgets paths nobody asked about for a while. A running check is
// kept: it is the one goroutine allowed for its path. c.mu is held.
func (c *Checker) sweep(now time.Time) {
	if now.Sub(c.lastSweep) < sweepEvery {
		return
	}
	c.lastSweep = now
	for p, e := range c.entries {
		if !e.running && now.Sub(e.lastUsed) >= forgetAfter {
			delete(c.entries, p)
		}
	}
}
