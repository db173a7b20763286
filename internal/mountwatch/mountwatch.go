// Package mountwatch reports changes of this process's mount table: every
// mount, unmount and remount in its mount namespace (including mounts that
// propagate into it), with no polling and no CPU use while nothing changes.
//
// The kernel flags /proc/self/mountinfo with POLLPRI when the namespace's
// mount table changes. The flag is kept per open file and is cleared by the
// first poll of that file that sees it, whoever polls: see Start for why
// the file must therefore be a descriptor that nothing but this package
// polls.
package mountwatch

import (
	"context"
	"encoding/binary"
	"fmt"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// mountTable is the file whose POLLPRI flags the changes.
const mountTable = "/proc/self/mountinfo"

// Watcher is a running watch; Start makes one.
type Watcher struct {
	table int // mountTable, a raw descriptor only run polls
	quit  int // an eventfd that ends run's poll(2) when ctx ends
	done  chan struct{}
	err   error
}

// Start opens the mount table and, from its own goroutine, calls changed
// after every change made from now on until ctx ends. Changes that come
// while changed runs, or in a burst, may be reported by one call: changed
// should only record that something changed (notify.Signal.Notify) and
// never block. The watcher stops on its own, logging why, only if the
// kernel reports an error on the file.
//
// Why a raw descriptor: os.Open would hand the file to Go's runtime poller,
// which adds every file that supports poll to its own epoll set, and
// /proc/self/mountinfo does. The kernel's poll method for the file
// (mounts_poll in fs/proc_namespace.c) compares the namespace's event
// counter with the copy kept in the open file and updates the copy on the
// spot, so the POLLPRI goes to whichever poll looks first. A change wakes
// both the runtime's epoll and our poll(2); when the runtime's epoll_wait
// looks first it takes the event (and ignores it: it only waits for
// reads and writes), and our poll(2) finds nothing and sleeps on. In a
// test, 8 to 46 of 100 changes were lost that way, each one then
// noticed only by the caller's periodic rescan. unix.Open gives a
// descriptor the runtime never sees, so every change reaches this poll.
func Start(ctx context.Context, log *zap.Logger, changed func()) (*Watcher, error) {
	table, err := unix.Open(mountTable, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", mountTable, err)
	}
	quit, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(table)
		return nil, fmt.Errorf("watching %s: eventfd: %w", mountTable, err)
	}
	// The kernel records the namespace's event counter when the file is
	// opened, so a change made after this point is reported by the first
	// poll even if run has not started polling yet.
	w := &Watcher{table: table, quit: quit, done: make(chan struct{})}
	go w.run(ctx, log, changed)
	return w, nil
}

// Done is closed when the watcher has stopped and closed its descriptors.
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Err is why the watcher stopped: nil when ctx ended. Valid after Done.
func (w *Watcher) Err() error { return w.err }

func (w *Watcher) run(ctx context.Context, log *zap.Logger, changed func()) {
	defer close(w.done)
	stopped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(stopped)
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = unix.Write(w.quit, one[:])
	})
	defer func() {
		// The descriptors are closed only once nothing can write to
		// quit: a closed number may already name another file.
		if !stop() {
			<-stopped
		}
		_ = unix.Close(w.quit)
		_ = unix.Close(w.table)
	}()
	fds := []unix.PollFd{{Fd: int32(w.table), Events: unix.POLLPRI}, {Fd: int32(w.quit), Events: unix.POLLIN}}
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		// Blocks with no timeout: the thread sleeps in the kernel until a
		// change or ctx's end, and costs no CPU meanwhile.
		_, err := unix.Poll(fds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			w.err = fmt.Errorf("polling %s: %w", mountTable, err)
			break
		}
		if fds[1].Revents != 0 || ctx.Err() != nil {
			return
		}
		if re := fds[0].Revents; re&unix.POLLNVAL != 0 {
			w.err = fmt.Errorf("polling %s: invalid descriptor", mountTable)
			break
		} else if re&(unix.POLLPRI|unix.POLLERR) != 0 {
			// mounts_poll sets both on a change.
			changed()
		}
	}
	log.Warn("watching the mount table stopped; mounts are noticed by periodic rescans only", zap.Error(w.err))
}
