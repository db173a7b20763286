package localpv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"
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
// or renamed starts a pass at once. Mounts on existing entries make no
// inotify event; mountwatch reports those.
type dirWatcher struct {
	w   *fsnotify.Watcher
	log *zap.Logger
	mu  sync.Mutex
	// watched maps each watched path to the directory inotify watches
	// there: inotify watches an inode, and the path may come to name
	// another one (a filesystem mounted on the discovery directory, the
	// directory removed and made again).
	watched map[string]dirID
}

// dirID identifies a directory by its inode.
type dirID struct{ dev, ino uint64 }

func statDir(path string) (dirID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return dirID{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return dirID{}, unix.ENOTDIR
	}
	return dirID{dev: uint64(st.Dev), ino: uint64(st.Ino)}, nil
}

func newDirWatcher(log *zap.Logger) (*dirWatcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	return &dirWatcher{w: w, log: log, watched: map[string]dirID{}}, nil
}

// set watches exactly dirs (as the agent sees them), each as it is now. A
// directory that does not exist is stood in for by its nearest existing
// ancestor, so that making it (or any directory on the way) starts a pass,
// which then watches it.
func (dw *dirWatcher) set(dirs []string) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	want := map[string]bool{}
	for _, d := range dirs {
		// A directory on the way made after nearestDir looked but before
		// the watch was added made no event the watch saw: look again
		// (a few times; a stand-in left over is dropped at the next set).
		for range len(strings.Split(d, "/")) {
			at, id, err := nearestDir(d)
			if err != nil || !dw.watch(at, id) {
				break
			}
			want[at] = true
			if again, _, err := nearestDir(d); err != nil || again == at {
				break
			}
		}
	}
	for d := range dw.watched {
		if !want[d] {
			_ = dw.w.Remove(d)
			delete(dw.watched, d)
		}
	}
}

// nearestDir returns d, or its nearest ancestor that exists, and its inode.
func nearestDir(d string) (string, dirID, error) {
	d = filepath.Clean(d)
	for {
		id, err := statDir(d)
		if err == nil || filepath.Dir(d) == d {
			return d, id, err
		}
		d = filepath.Dir(d)
	}
}

// watch makes sure the directory with inode id at path is the one
// watched there; mu is held.
func (dw *dirWatcher) watch(path string, id dirID) bool {
	old, ok := dw.watched[path]
	if ok && old == id {
		return true
	}
	if ok {
		_ = dw.w.Remove(path)
		delete(dw.watched, path)
	}
	if err := dw.w.Add(path); err != nil {
		dw.log.Debug("cannot watch a discovery directory (yet); it is tried again at the next pass", zap.String("dir", path), zap.Error(err))
		return false
	}
	dw.watched[path] = id
	return true
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
				// The directory itself may be gone or moved: watch
				// whatever has its path at the next pass.
				dw.mu.Lock()
				if _, ok := dw.watched[ev.Name]; ok {
					_ = dw.w.Remove(ev.Name)
					delete(dw.watched, ev.Name)
				}
				dw.mu.Unlock()
			}
			wake()
		case err, ok := <-dw.w.Errors:
			if !ok {
				return
			}
			// An overflow loses events: the pass looks at everything.
			dw.log.Warn("watching discovery directories", zap.Error(err))
			wake()
		}
	}
}

func (dw *dirWatcher) close() { _ = dw.w.Close() }
