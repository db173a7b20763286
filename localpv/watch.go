package localpv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/notify"
)

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// configWatcher reports changes to the configuration file. It watches the
// file's directory, not the file: a ConfigMap volume replaces its content
// by swapping the ..data symbolic link (the file itself is a link through
// it), editors replace files by renaming, and a file created after start
// must be seen too. Every event in the directory is reported; the reader
// compares contents.
type configWatcher struct {
	file    string
	w       *fsnotify.Watcher
	signal  *notify.Signal
	log     *zap.Logger
	mu      sync.Mutex
	watched map[string]bool
	done    chan struct{}
}

func newConfigWatcher(file string, log *zap.Logger) (*configWatcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	cw := &configWatcher{file: file, w: w, signal: notify.New(), log: log, watched: map[string]bool{}, done: make(chan struct{})}
	cw.refresh()
	go cw.loop()
	return cw, nil
}

// refresh watches the file's directory and, when the file is a link to
// somewhere else (not through ..data), the directory it resolves to.
func (cw *configWatcher) refresh() {
	dirs := []string{filepath.Dir(cw.file)}
	if real, err := filepath.EvalSymlinks(cw.file); err == nil {
		if d := filepath.Dir(real); filepath.Dir(d) != filepath.Dir(cw.file) {
			dirs = append(dirs, d)
		}
	}
	cw.mu.Lock()
	defer cw.mu.Unlock()
	want := map[string]bool{}
	for _, d := range dirs {
		want[d] = true
		if cw.watched[d] {
			continue
		}
		if err := cw.w.Add(d); err != nil {
			cw.log.Debug("cannot watch the configuration's directory (yet); it is re-read periodically", zap.String("dir", d), zap.Error(err))
			continue
		}
		cw.watched[d] = true
	}
	for d := range cw.watched {
		if !want[d] {
			_ = cw.w.Remove(d)
			delete(cw.watched, d)
		}
	}
}

func (cw *configWatcher) loop() {
	defer close(cw.done)
	for {
		select {
		case ev, ok := <-cw.w.Events:
			if !ok {
				return
			}
			if ev.Op&(fsnotify.Remove|fsnotify.Rename) != 0 && filepath.Clean(ev.Name) == filepath.Dir(cw.file) {
				cw.mu.Lock()
				delete(cw.watched, ev.Name)
				cw.mu.Unlock()
			}
			cw.refresh()
			cw.signal.Notify()
		case err, ok := <-cw.w.Errors:
			if !ok {
				return
			}
			cw.log.Warn("watching the local volumes configuration", zap.Error(err))
			cw.signal.Notify()
		}
	}
}

func (cw *configWatcher) changed() <-chan struct{} { return cw.signal.C() }

func (cw *configWatcher) close() {
	_ = cw.w.Close()
	<-cw.done
}

// dirWatcher watches the discovery directories: an entry created, removed
// or renamed starts a pass at once.
type dirWatcher struct {
	w       *fsnotify.Watcher
	log     *zap.Logger
	mu      sync.Mutex
	watched map[string]bool
}

func newDirWatcher(log *zap.Logger) (*dirWatcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	return &dirWatcher{w: w, log: log, watched: map[string]bool{}}, nil
}

// set watches exactly dirs (as the agent sees them). A directory that
// does not exist yet is tried again at the next pass.
func (dw *dirWatcher) set(dirs []string) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	want := map[string]bool{}
	for _, d := range dirs {
		want[d] = true
		if dw.watched[d] {
			continue
		}
		if err := dw.w.Add(d); err == nil {
			dw.watched[d] = true
		}
	}
	for d := range dw.watched {
		if !want[d] {
			_ = dw.w.Remove(d)
			delete(dw.watched, d)
		}
	}
}

func (dw *dirWatcher) run(ctx context.Context, wake func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-dw.w.Events:
			if !ok {
				return
			}
			if ev.Op&(fsnotify.Remove|fsnotify.Rename) != 0 {
				// The directory itself may be gone: watch it again once
				// it is back.
				dw.mu.Lock()
				if dw.watched[ev.Name] {
					delete(dw.watched, ev.Name)
				}
				dw.mu.Unlock()
			}
			wake()
		case err, ok := <-dw.w.Errors:
			if !ok {
				return
			}
			dw.log.Warn("watching discovery directories", zap.Error(err))
			wake()
		}
	}
}

func (dw *dirWatcher) close() { _ = dw.w.Close() }

// watchMounts calls wake whenever this mount namespace's mount table
// changes. Mounting a disk on an existing directory makes no inotify event
// in the discovery directory, but the kernel flags the mount table file
// (POLLPRI) on every mount and unmount. If that cannot be used, only the
// periodic rescan notices mounts.
func watchMounts(ctx context.Context, log *zap.Logger, wake func()) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		log.Warn("cannot watch the mount table; mounts are noticed by the periodic rescan", zap.Error(err))
		return
	}
	defer f.Close()
	// A pipe to interrupt poll(2) when ctx ends.
	r, w, err := os.Pipe()
	if err != nil {
		log.Warn("cannot watch the mount table; mounts are noticed by the periodic rescan", zap.Error(err))
		return
	}
	defer r.Close()
	stop := context.AfterFunc(ctx, func() { w.Close() })
	defer func() {
		if stop() {
			w.Close()
		}
	}()
	fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI}, {Fd: int32(r.Fd()), Events: unix.POLLIN}}
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		_, err := unix.Poll(fds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			log.Warn("watching the mount table failed; mounts are noticed by the periodic rescan", zap.Error(err))
			return
		}
		if fds[1].Revents != 0 || ctx.Err() != nil {
			return
		}
		if fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0 {
			wake()
		}
	}
}
