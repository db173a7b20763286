package safefs

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// The parallel group walk: a few workers, each running the sequential walk
// (walkGroup) on a directory it holds open. A worker that opens a
// subdirectory offers it to a small queue; when the queue is full it keeps
// it for later (up to maxLocalDirs), and when that is full too it walks the
// subdirectory itself, as the sequential walk does, with the same bound on
// what it holds. So memory and descriptors stay bounded whatever the tree's
// shape (at most workers × (maxOpenDirs+1+maxLocalDirs) + queue descriptors
// and workers dirent buffers), and every directory is still entered only
// through a descriptor its parent's walk opened with O_NOFOLLOW and found on
// the volume's mount: handing one to another worker changes who walks it,
// not how it was reached.

// groupWorkersPerCPU and maxGroupWorkers size a walk. With a warm cache
// the walk is CPU-bound in the kernel (statx, fchownat, fchmodat2): as
// many workers as CPUs reach the floor (test/bench/ownershipfloor) and more
// only contend; with a cold cache they wait for the disk, so a second one
// per CPU keeps a read in flight while the other changes entries (4 and 8
// on 2 CPUs measured alike, cold and warm: docs/performance.md).
const (
	groupWorkersPerCPU = 2
	maxGroupWorkers    = 16
	// maxLocalDirs bounds the subdirectories a worker keeps for later.
	maxLocalDirs = 32
)

// groupWorkersOverride, when positive, is the number of workers (tests).
var groupWorkersOverride int

func groupWorkers() int {
	if groupWorkersOverride > 0 {
		return groupWorkersOverride
	}
	return min(max(4, groupWorkersPerCPU*runtime.GOMAXPROCS(0)), maxGroupWorkers)
}

// dirTask is a directory to walk: its descriptor (owned by the task), its
// stat, and its path when known (the root: messages name it).
type dirTask struct {
	fd   int
	st   fileStat
	path string
}

// groupPool is one parallel walk.
type groupPool struct {
	ctx     context.Context
	cancel  context.CancelFunc
	g       Group
	root    string // for messages
	queue   chan dirTask
	pending sync.WaitGroup // tasks queued or being walked

	errOnce sync.Once
	err     error
}

// setGroupParallel walks below root (already changed) with workers
// goroutines. It closes root.
func setGroupParallel(ctx context.Context, root *walker, g Group, workers int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := &groupPool{ctx: ctx, cancel: cancel, g: g, root: root.rootPath, queue: make(chan dirTask, 2*workers)}
	// The root's walker already holds its descriptor: hand it over as the
	// first task (its buffer goes back to the pool).
	first := dirTask{fd: root.root.fd, st: root.rootStat, path: root.rootPath}
	root.root.fd = -1
	root.close()
	p.pending.Add(1)
	p.queue <- first

	var workersDone sync.WaitGroup
	for range workers {
		workersDone.Add(1)
		go func() {
			defer workersDone.Done()
			p.work()
		}()
	}
	p.pending.Wait()
	close(p.queue)
	workersDone.Wait()
	return p.err
}

func (p *groupPool) work() {
	// A subdirectory the queue has no room for is kept here rather than
	// walked at once: entering it in place would make the walk read the
	// rest of its parent again afterwards (one dirent buffer per walk),
	// the cost that made the parallel walk slower than the sequential one
	// on wide trees with nothing to change. Full, the walk enters in place.
	local := make([]dirTask, 0, maxLocalDirs)
	offer := func(fd int, st fileStat) bool {
		if p.offer(fd, st) {
			return true
		}
		if p.ctx.Err() != nil || len(local) == cap(local) {
			return false
		}
		local = append(local, dirTask{fd: fd, st: st})
		return true
	}
	for t := range p.queue {
		p.walk(t, offer)
		for len(local) > 0 {
			t := local[len(local)-1]
			local = local[:len(local)-1]
			if p.offer(t.fd, t.st) {
				continue // an idle worker takes it
			}
			p.walk(t, offer)
		}
		p.pending.Done()
	}
}

// walk walks the task's directory, offering its subdirectories to offer.
func (p *groupPool) walk(t dirTask, offer func(int, fileStat) bool) {
	if err := p.ctx.Err(); err != nil {
		// Failed or cancelled: drain. A cancellation with work
		// left is an error too (a no-op if one was kept).
		unix.Close(t.fd)
		p.fail(fmt.Errorf("applying group %d to %s: %w", p.g.GID, p.root, err))
		return
	}
	w := walkerAt(t.fd, t.st, t.path)
	w.handOff = offer
	if err := walkGroup(p.ctx, w, p.g); err != nil {
		p.fail(err)
	}
	w.close()
}

// offer queues the open directory fd for any worker, unless the queue is
// full (or the walk is failing): then the caller walks it itself.
func (p *groupPool) offer(fd int, st fileStat) bool {
	if p.ctx.Err() != nil {
		return false
	}
	// The offering task is pending, so the count cannot reach zero (and
	// the queue be closed) between this Add and the send.
	p.pending.Add(1)
	select {
	case p.queue <- dirTask{fd: fd, st: st}:
		return true
	default:
		p.pending.Done()
		return false
	}
}

// fail keeps the first error and stops the other workers.
func (p *groupPool) fail(err error) {
	p.errOnce.Do(func() {
		p.err = err
		p.cancel()
	})
}
