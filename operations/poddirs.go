package operations

import (
	"errors"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/pathcall"
)

// podDirs makes the directories above pods' volume directories
// (<pods>/<uid>/volumes/<plugin>) top down, once per pod and plugin, and
// remembers which it made. Each volume used to find them missing by
// failing mkdirs walking up from its own directory, and a pod's volumes,
// set up concurrently, raced each other doing it: 14 mkdirs per pod of
// four volumes, half of them failing, where 7 do.
//
// What it remembers is a hint, never trusted for correctness: a directory
// removed behind its back makes the plugin's own mkdir fail with ENOENT,
// and the plugin then creates the parents itself.
type podDirs struct {
	mu sync.Mutex
	// dirs holds a chain made, or being made: a pod's other volumes wait
	// for the first instead of racing it, and nothing else waits (a lock
	// shared between pods, held over the mkdirs, made unrelated pods
	// queue behind each other's syscalls). One entry per chain, added
	// once: the chain's first volume used to add and delete one map entry
	// and add another, under the lock twice.
	dirs map[string]*dirChain
}

// dirChain is a chain of directories ensure makes: done is closed once it
// is made (or ensure gave up, and then the entry is gone).
type dirChain struct {
	done chan struct{}
}

// maxKnownDirs bounds the hints: pods whose directories went without a
// teardown through this process (orphan clean-up) leave theirs behind.
const maxKnownDirs = 8192

// ensure makes dir, a directory below root, and those between them, with
// mode 0750, and returns the topmost directory it made ("" if none). It
// does nothing it cannot do: the caller's own mkdir reports the problem.
func (d *podDirs) ensure(root, dir string) (top string) {
	rel, below := strings.CutPrefix(dir, root)
	rel, sep := strings.CutPrefix(rel, "/")
	if !below || !sep || rel == "" {
		return ""
	}
	d.mu.Lock()
	if c, ok := d.dirs[dir]; ok {
		d.mu.Unlock()
		<-c.done // closed, unless the chain is still being made
		return ""
	}
	if d.dirs == nil || len(d.dirs) >= maxKnownDirs {
		d.dirs = map[string]*dirChain{}
	}
	c := &dirChain{done: make(chan struct{})}
	d.dirs[dir] = c
	d.mu.Unlock()
	defer close(c.done)
	top, made := makeChain(root, dir, rel)
	if !made {
		// Not remembered: the next volume tries again.
		d.mu.Lock()
		if d.dirs[dir] == c {
			delete(d.dirs, dir)
		}
		d.mu.Unlock()
	}
	return top
}

// makeChain makes the directories from root (excluded) down to dir, rel
// being dir below root, and returns the topmost it made and whether dir is
// there now.
func makeChain(root, dir, rel string) (top string, made bool) {
	end := len(root)
	for c := range strings.SplitSeq(rel, "/") {
		if c == "" || c == "." || c == ".." {
			return top, false // not a plain path below root
		}
		end += 1 + len(c)
		p := dir[:end] // root and the elements up to c
		err := pathcall.Mkdir(p, 0o750)
		switch {
		case err == nil:
			if top == "" {
				top = p
			}
		case !errors.Is(err, unix.EEXIST):
			return top, false
		}
	}
	return top, true
}

// undo removes what ensure made for dir, as far as it is still empty: a
// set up that failed leaves no directories behind (a pod whose volume
// never mounts has nothing to tear down that would remove them).
func (d *podDirs) undo(dir, top string) {
	if top == "" {
		return
	}
	d.forget(dir)
	mountutil.RemoveEmptyDirs(dir, filepath.Dir(top))
}

// forget drops the hint for dir, about to be removed.
func (d *podDirs) forget(dir string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.dirs, dir)
}
