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
	mu   sync.Mutex
	made map[string]struct{}
	// making holds, for each chain being made, a channel closed when it
	// is done: a pod's other volumes wait for the first instead of racing
	// it, and nothing else waits (a lock shared between pods, held over
	// the mkdirs, made unrelated pods queue behind each other's syscalls).
	making map[string]chan struct{}
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
	if _, ok := d.made[dir]; ok {
		d.mu.Unlock()
		return ""
	}
	if done, ok := d.making[dir]; ok {
		d.mu.Unlock()
		<-done
		return ""
	}
	if d.making == nil {
		d.making = map[string]chan struct{}{}
	}
	done := make(chan struct{})
	d.making[dir] = done
	d.mu.Unlock()
	made := false
	defer func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		delete(d.making, dir)
		close(done)
		if made {
			if d.made == nil || len(d.made) >= maxKnownDirs {
				d.made = map[string]struct{}{}
			}
			d.made[dir] = struct{}{}
		}
	}()
	end := len(root)
	for c := range strings.SplitSeq(rel, "/") {
		if c == "" || c == "." || c == ".." {
			return top // not a plain path below root
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
			return top
		}
	}
	made = true
	return top
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
	delete(d.made, dir)
}
