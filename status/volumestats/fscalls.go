package volumestats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// FS is how the collector looks at local volumes. Its calls may block for
// as long as a hung disk likes; the collector runs them off the scrape
// path, one per path at most, and gives up waiting after a timeout.
type FS interface {
	// Statfs returns the statfs(2) of the filesystem path is on.
	Statfs(path string) (unix.Statfs_t, error)
	// DeviceSize returns the size of the block device at path.
	DeviceSize(path string) (int64, error)
}

// HostFS is the FS of the host.
type HostFS struct{}

// Statfs opens path without following a symbolic link in its last
// element and stats its filesystem through the descriptor: the path is the
// agent's own mount point, and what is at it, not what a link there points
// to, is the volume.
func (HostFS) Statfs(path string) (unix.Statfs_t, error) {
	var st unix.Statfs_t
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, fmt.Errorf("opening %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Fstatfs(fd, &st); err != nil {
		return st, fmt.Errorf("statfs of %s: %w", path, err)
	}
	return st, nil
}

// DeviceSize opens the block device at path (a pod's access point, with
// the device bind-mounted onto it) read-only and seeks to its end, as the
// kubelet measures block volumes. Anything but a block device there is an
// error: an access point whose device is gone would read as size 0.
func (HostFS) DeviceSize(path string) (int64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("stat of %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, fmt.Errorf("%s is not a block device (mode %#o)", path, st.Mode&unix.S_IFMT)
	}
	size, err := unix.Seek(fd, 0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", path, err)
	}
	return size, nil
}

// Errors of fsCalls.
var (
	// errFSTimeout: the call ran longer than the timeout; it goes on in
	// the background and keeps its path busy until it returns.
	errFSTimeout = errors.New("no answer from the filesystem")
	// errFSBusy: the previous call on the path has not returned.
	errFSBusy = errors.New("an earlier call on the path has not returned")
	// errFSTooManyHung: too many calls hang to start another one.
	errFSTooManyHung = errors.New("too many filesystem calls hang")
)

// fsCalls runs blocking filesystem calls with a timeout, so that a hung
// disk costs a round one timeout and never more than a bounded number of
// goroutines (each pinning an OS thread in the kernel): at most one call per
// path is outstanding, and no call starts while maxHung calls have run past
// their timeout without returning. With the round's concurrency c, at most
// maxHung + c calls are ever outstanding.
type fsCalls struct {
	maxHung int

	mu          sync.Mutex
	outstanding map[string]*fsCall // by path
	hung        int                // outstanding calls past their timeout
}

type fsCall struct {
	started time.Time
	hung    bool // counted in hung
	done    bool
}

func newFSCalls(maxHung int) *fsCalls {
	return &fsCalls{maxHung: maxHung, outstanding: map[string]*fsCall{}}
}

// do runs fn for path and waits for it for at most timeout (or until ctx
// ends). It fails at once, starting nothing, when a call on path is still
// outstanding or too many calls hang.
func (g *fsCalls) do(ctx context.Context, path string, timeout time.Duration, fn func() (Usage, error)) (Usage, error) {
	g.mu.Lock()
	if c, ok := g.outstanding[path]; ok {
		g.mu.Unlock()
		return Usage{}, fmt.Errorf("%w (started %v ago)", errFSBusy, time.Since(c.started).Round(time.Second))
	}
	if g.hung >= g.maxHung {
		n := g.hung
		g.mu.Unlock()
		return Usage{}, fmt.Errorf("%w (%d), not starting another", errFSTooManyHung, n)
	}
	c := &fsCall{started: time.Now()}
	g.outstanding[path] = c
	g.mu.Unlock()

	type result struct {
		u   Usage
		err error
	}
	done := make(chan result, 1)
	go func() {
		u, err := fn()
		g.mu.Lock()
		c.done = true
		if c.hung {
			g.hung--
		}
		delete(g.outstanding, path)
		g.mu.Unlock()
		done <- result{u, err}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-done:
		return r.u, r.err
	case <-t.C:
	case <-ctx.Done():
	}
	g.mu.Lock()
	if !c.done {
		c.hung = true
		g.hung++
	}
	g.mu.Unlock()
	select {
	case r := <-done: // it returned just now
		return r.u, r.err
	default:
	}
	if ctx.Err() != nil {
		return Usage{}, ctx.Err()
	}
	return Usage{}, fmt.Errorf("%w in %v", errFSTimeout, timeout)
}

// hungCalls is the number of calls past their timeout that have not
// returned.
func (g *fsCalls) hungCalls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.hung
}

// outstandingCalls is the number of calls that have not returned.
func (g *fsCalls) outstandingCalls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.outstanding)
}
