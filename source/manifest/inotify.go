package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dirWatcher reports the inotify events of one directory. It exists
// because fsnotify does not tell a file renamed into place (IN_MOVED_TO)
// or closed after writing (IN_CLOSE_WRITE), which are complete and can be
// read at once, from one being written (IN_CREATE, IN_MODIFY), which must
// be left alone until its writer is done.
type dirWatcher struct {
	f *os.File
	// events carries the events of one read together: a burst of files
	// gives thousands, and handing them over one by one woke the reader
	// for each.
	events chan []dirEvent
	errs   chan error
	done   chan struct{}
	once   sync.Once

	mu sync.Mutex
	wd int // current watch descriptor; -1 when none
}

// dirEvent is one inotify event. dir is set for events about the watched
// directory itself; name is the entry's name otherwise.
type dirEvent struct {
	name     string
	mask     uint32
	dir      bool
	overflow bool
}

// lost reports whether the event ends the watch: the directory was
// removed or renamed.
func (e dirEvent) lost() bool {
	return e.dir && e.mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED) != 0
}

// complete reports whether the entry's content is final for now: renamed
// into place or closed by a writer.
func (e dirEvent) complete() bool { return e.mask&(unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE) != 0 }

// appeared reports whether an entry came into the directory under the
// name (created, or renamed into it): the only events after which the name
// may be a symlink it was not before.
func (e dirEvent) appeared() bool { return e.mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 }

// gone reports whether the entry left the directory (removed or renamed
// away): there is nothing left to look at under its name.
func (e dirEvent) gone() bool { return e.mask&(unix.IN_MOVED_FROM|unix.IN_DELETE) != 0 }

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_ATTRIB |
	unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR

func newDirWatcher() (*dirWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	// Non-blocking, so reads go through the runtime's poller and Close
	// ends a blocked read.
	w := &dirWatcher{f: os.NewFile(uintptr(fd), "inotify"), events: make(chan []dirEvent, 64), errs: make(chan error, 1), done: make(chan struct{}), wd: -1}
	go w.read()
	return w, nil
}

// watch watches dir, replacing the previous watch (of another directory
// the path may have named before).
func (w *dirWatcher) watch(dir string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	var wd int
	var werr error
	if err := rc.Control(func(fd uintptr) {
		if w.wd >= 0 {
			_, _ = unix.InotifyRmWatch(int(fd), uint32(w.wd)) // gone already if the directory was removed
			w.wd = -1
		}
		wd, werr = unix.InotifyAddWatch(int(fd), dir, watchMask)
	}); err != nil {
		return err
	}
	if werr != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: dir, Err: werr}
	}
	w.wd = wd
	return nil
}

func (w *dirWatcher) current(wd int32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int(wd) == w.wd
}

// Close stops the watcher; the event channel is closed once the reader
// has returned.
func (w *dirWatcher) Close() error {
	w.once.Do(func() { close(w.done) })
	return w.f.Close()
}

func (w *dirWatcher) read() {
	defer close(w.events)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				select {
				case w.errs <- err:
				default:
				}
			}
			return
		}
		var evs []dirEvent
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			end := off + unix.SizeofInotifyEvent + int(raw.Len)
			if end > n {
				break
			}
			ev := dirEvent{mask: raw.Mask}
			name := buf[off+unix.SizeofInotifyEvent : end]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			off = end
			switch {
			case raw.Mask&unix.IN_Q_OVERFLOW != 0:
				ev.overflow = true
			case !w.current(raw.Wd):
				continue // an event of a watch given up
			case len(name) == 0:
				ev.dir = true
			default:
				ev.name = string(name)
			}
			evs = append(evs, ev)
		}
		if len(evs) == 0 {
			continue
		}
		select {
		case w.events <- evs:
		case <-w.done:
			return
		}
	}
}
