// Package manifest is the Source of standalone mode: it reads Pods, ConfigMaps, Secrets,
// PersistentVolumeClaims, PersistentVolumes, StorageClasses and CSIDrivers
// from YAML or JSON files in one directory and follows changes to them.
//
// Since no API server validates, defaults or binds these objects, the package
// does the part of that work the agent depends on: it rejects objects whose
// names could not serve as path elements, derives stable UIDs, fills in the
// defaults the agent reads and marks claims bound the way the PV controller
// would. A file that cannot be parsed keeps the objects of its last good
// version, because a file caught half-written must not look like deleted pods.
package manifest

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/logging"
	"github.com/volume-agent/volume-agent/internal/procs"
	"github.com/volume-agent/volume-agent/source"
)

// Options configure a Source.
type Options struct {
	// Dir holds the manifest files; subdirectories are not read.
	Dir string
	// NodeName is the node this agent runs on: pods whose spec.nodeName is
	// set to another node are ignored.
	NodeName string
	// Logger defaults to a no-op logger.
	Logger *zap.Logger
	// ResyncPeriod is how often the directory is compared with what was
	// read, to catch changes inotify missed. Defaults to 30s.
	ResyncPeriod time.Duration
	// Procs says how many CPUs to parse files on (the runtime's
	// GOMAXPROCS if nil).
	Procs *procs.Tuning
	// Reads, if set, is told how many files each read is about to parse
	// (agent/burst.GC: a storm's garbage starts with its manifests).
	Reads Reads
}

// Reads is told of the files a read parses before it parses them.
type Reads interface{ Reading(files int) }

const (
	defaultResyncPeriod = 30 * time.Second
	// debounceQuiet is how long a file must be left alone before it is read:
	// writers issue several writes per file and the events of a burst
	// should cost one update.
	debounceQuiet = 10 * time.Millisecond
	// debounceMax bounds the delay when events keep coming, so a stream of
	// writes to many files still updates the store.
	debounceMax = 20 * time.Millisecond
	// holdMax bounds how long a file that keeps being written is left alone.
	holdMax = 50 * time.Millisecond
	// readyQuiet and readyMax replace debounceQuiet and debounceMax while
	// every pending file is complete (renamed into place or closed by its
	// writer): there is nothing to wait for but the rest of a burst, read
	// in batches so that the first pods' volumes are being mounted while
	// the last manifests arrive.
	readyQuiet = time.Millisecond
	readyMax   = 5 * time.Millisecond
	// publishFirst is how many files of a scan are parsed before the store
	// is first published; later publications wait for half as many again
	// as were published before.
	publishFirst = 16
	// rewatchInterval is how often a lost directory watch is retried.
	rewatchInterval = time.Second
	// maxFileSize keeps a stray large file from costing the agent's memory.
	maxFileSize = 4 << 20
)

// Source implements source.Source and source.ErrorReporter.
type Source struct {
	dir string
	log *zap.Logger
	// fileLines writes the per-file lines (one per manifest loaded or
	// removed, thousands in a storm) without zap's caller capture, which
	// was half their cost; nil when log's core is not one logging.New
	// made. The caller says nothing the message does not.
	fileLines *logging.Direct
	procs     *procs.Tuning
	reads     Reads
	resync    time.Duration
	parser    parser
	seed      maphash.Seed
	snap      atomic.Pointer[snapshot]
	synced    atomic.Bool
	running   atomic.Bool
	changed   chan struct{}
	files     map[string]*fileState // owned by Run
	// names are the keys of files, sorted (the order in which a rebuild
	// visits them), kept in step by addFile and removeFile: sorting them
	// again for every rebuild was a tenth of its cost.
	names []string
	// touched holds, for each file changed since the last rebuild, what it
	// contributed then; claims and uidClaims count the objects of every
	// file by kind and key, and the pods by UID, as of the last rebuild
	// (see patched); builtDirErr is the directory's error that rebuild
	// saw. All owned by Run.
	touched     map[string]contribution
	claims      map[kindKey]int
	uidClaims   map[types.UID]int
	builtDirErr string
	// patches counts the rebuilds that patched the previous snapshot
	// (tests).
	patches  int
	dirErr   string // owned by Run
	dups     map[source.InputError]struct{}
	watchDir fileID // identity of the directory the watch is on
	// objectChanged is told about ConfigMap and Secret changes (set
	// before Run, called from it).
	objectChanged ObjectChanged
	// symlinks are the entries that are not manifests but symlinks, as
	// of the last whole scan and the events since (owned by Run).
	symlinks map[string]bool
	// wholeScans counts reads of the whole directory (for tests).
	wholeScans atomic.Int64
	// podChanges records the pods each published snapshot changed.
	podChanges source.PodChangeLog
}

var _ source.Source = (*Source)(nil)

// New checks that opts.Dir is a directory and returns a Source that reads it
// once Run is called.
func New(opts Options) (*Source, error) {
	if opts.Dir == "" {
		return nil, errors.New("manifest: no directory given")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("manifest: directory %q: %w", opts.Dir, err)
	}
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	s := &Source{
		dir:      dir,
		log:      opts.Logger,
		procs:    opts.Procs,
		reads:    opts.Reads,
		resync:   opts.ResyncPeriod,
		parser:   parser{nodeName: opts.NodeName},
		seed:     maphash.MakeSeed(),
		changed:  make(chan struct{}, 1),
		files:    map[string]*fileState{},
		symlinks: map[string]bool{},
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.fileLines = logging.DirectOf(s.log)
	if s.resync <= 0 {
		s.resync = defaultResyncPeriod
	}
	s.snap.Store(emptySnapshot())
	return s, nil
}

func checkDir(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("manifest: directory %s does not exist", dir)
	case err != nil:
		return fmt.Errorf("manifest: directory %s: %w", dir, err)
	case !st.IsDir():
		return fmt.Errorf("manifest: %s is not a directory", dir)
	}
	return nil
}

// Dir returns the absolute path of the directory read.
func (s *Source) Dir() string { return s.dir }

// HasSynced reports whether the directory has been read completely once.
func (s *Source) HasSynced() bool { return s.synced.Load() }

// Changed receives a value after every update that changed the Store or the
// input errors.
func (s *Source) Changed() <-chan struct{} { return s.changed }

func (s *Source) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// pendingFile is a file with events not yet handled; complete says its last
// event left it complete.
type pendingFile struct {
	first, last time.Time
	complete    bool
}

// Run reads the directory, then follows it until ctx ends. It fails only if
// the directory cannot be watched at start.
func (s *Source) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("manifest: Run called more than once")
	}
	if err := checkDir(s.dir); err != nil {
		return err
	}
	w, err := newDirWatcher()
	if err != nil {
		return fmt.Errorf("manifest: cannot watch %s: %w", s.dir, err)
	}
	defer w.Close()
	// Watch before reading, so that a change made while reading is seen.
	if err := w.watch(s.dir); err != nil {
		return fmt.Errorf("manifest: cannot watch directory %s: %w", s.dir, err)
	}
	s.watchDir, _ = statID(s.dir)

	start := time.Now()
	s.scan(nil, nil, false)
	s.synced.Store(true)
	s.notify()
	snap := s.snap.Load()
	s.log.Info("Read manifest directory", zap.String("dir", s.dir), zap.Int("files", len(s.files)),
		zap.Int("pods", len(snap.pods)), zap.Int("errors", len(snap.errors)), zap.Duration("took", time.Since(start)))

	var (
		pending  = map[string]pendingFile{}
		burst    time.Time // first event not yet handled
		waiting  bool      // some pending file is not complete
		overflow bool
		// whole: an event may have changed files it does not name (the
		// directory itself, or an entry other than a manifest, such as
		// the "..data" symlink a mounted ConfigMap swaps): the next scan
		// reads the whole directory.
		whole  bool
		lost   bool
		retry  <-chan time.Time
		timer  = time.NewTimer(time.Hour)
		ticker = time.NewTicker(s.resync)
	)
	timer.Stop()
	defer timer.Stop()
	defer ticker.Stop()
	arm := func(now time.Time) {
		if burst.IsZero() {
			burst = now
		}
		quiet, most := readyQuiet, readyMax
		if waiting || overflow {
			quiet, most = debounceQuiet, debounceMax
		}
		timer.Reset(max(0, min(quiet, burst.Add(most).Sub(now))))
	}
	loseWatch := func() {
		if !lost {
			lost = true
			retry = time.After(rewatchInterval)
		}
	}

	for {
		select {
		case <-ctx.Done():
			return nil

		case evs, ok := <-w.events:
			if !ok {
				return errors.New("manifest: watcher closed")
			}
			now := time.Now()
			rearm := false
			for _, ev := range evs {
				switch {
				case ev.overflow:
					// Events were lost: re-read every file, not only the ones
					// whose identity changed.
					overflow = true
					s.log.Warn("Manifest directory events overflowed; re-reading all files", zap.String("dir", s.dir))
				case ev.dir:
					whole = true
					if ev.lost() {
						loseWatch()
					}
				default:
					if !candidate(ev.name) {
						// A temporary file of a writer renaming into place
						// changes no manifest; a symlink manifests resolve
						// through might (a mounted ConfigMap's "..data"),
						// and so might its removal. An entry that left needs
						// no lstat (a writer renaming its temporary file into
						// place would pay a failing one per manifest): it
						// mattered if it was a known symlink. Nor does one that
						// was written to or changed attributes: only an entry
						// that appeared under the name can be a new symlink
						// (a temporary file written in place costs one lstat,
						// not one per event).
						gone, symlink := ev.gone(), false
						switch {
						case gone:
						case ev.appeared():
							fi, err := os.Lstat(filepath.Join(s.dir, ev.name))
							gone, symlink = err != nil, err == nil && fi.Mode()&fs.ModeSymlink != 0
						default:
							symlink = s.symlinks[ev.name]
						}
						if symlink || (gone && s.symlinks[ev.name]) {
							whole = true
							rearm = true
						}
						if symlink {
							s.symlinks[ev.name] = true
						}
						continue
					}
					p, ok := pending[ev.name]
					if !ok {
						p.first = now
					}
					p.last = now
					p.complete = ev.complete()
					waiting = waiting || !p.complete
					pending[ev.name] = p
				}
				rearm = true
			}
			if rearm {
				arm(now)
			}

		case err := <-w.errs:
			s.log.Warn("Watching manifest directory", zap.String("dir", s.dir), zap.Error(err))

		case <-timer.C:
			now := time.Now()
			force := make(map[string]bool, len(pending))
			hold := map[string]bool{}
			waiting = false
			for name, p := range pending {
				quiet, most := debounceQuiet, holdMax
				if p.complete {
					quiet, most = readyQuiet, readyMax
				}
				if now.Sub(p.last) < quiet && now.Sub(p.first) < most {
					hold[name] = true
					waiting = waiting || !p.complete
					continue
				}
				force[name] = true
				delete(pending, name)
			}
			if overflow || whole {
				s.scan(force, hold, overflow)
			} else if len(force) > 0 {
				s.scanFiles(force)
			}
			overflow, whole = false, false
			burst = time.Time{}
			if len(pending) > 0 {
				arm(now)
			}

		case <-ticker.C:
			if id, err := statID(s.dir); err != nil {
				loseWatch()
			} else if id.dev != s.watchDir.dev || id.ino != s.watchDir.ino {
				// The path now names another directory (a symlink swap or
				// a rename over it): the watch is on the old one.
				loseWatch()
			}
			if lost && s.rewatch(w) {
				lost, retry = false, nil
			}
			hold := make(map[string]bool, len(pending))
			for name := range pending {
				hold[name] = true
			}
			s.scan(nil, hold, false)

		case <-retry:
			if s.rewatch(w) {
				lost, retry = false, nil
				s.scan(nil, nil, false)
			} else {
				retry = time.After(rewatchInterval)
			}
		}
	}
}

// rewatch moves the watch to whatever directory the path names now.
func (s *Source) rewatch(w *dirWatcher) bool {
	id, err := statID(s.dir)
	if err != nil {
		return false
	}
	if err := w.watch(s.dir); err != nil {
		s.log.Debug("Cannot watch manifest directory yet", zap.String("dir", s.dir), zap.Error(err))
		return false
	}
	s.watchDir = id
	s.log.Info("Watching manifest directory again", zap.String("dir", s.dir))
	return true
}

// candidate reports whether a directory entry name may be a manifest.
func candidate(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// fileID is what tells a changed file from an unchanged one without reading
// it. ctime is included so that edits which restore the mtime are seen too.
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

func idOf(fi os.FileInfo) fileID {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return idOfStat(st)
	}
	return fileID{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
}

func idOfStat(st *syscall.Stat_t) fileID {
	// The conversions matter on 32-bit platforms.
	return fileID{size: st.Size, mtime: int64(st.Mtim.Sec)*1e9 + int64(st.Mtim.Nsec),
		dev: uint64(st.Dev), ino: uint64(st.Ino), ctime: int64(st.Ctim.Sec)*1e9 + int64(st.Ctim.Nsec)}
}

func statID(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	return idOf(fi), nil
}

// fileLine writes an info line about one manifest file; fields builds
// its fields only if the line is written.
func (s *Source) fileLine(msg string, fields func() []zap.Field) {
	if s.fileLines != nil {
		if s.fileLines.Enabled(zap.InfoLevel) {
			s.fileLines.Write(zap.InfoLevel, msg, fields())
		}
		return
	}
	if ce := s.log.Check(zap.InfoLevel, msg); ce != nil {
		ce.Write(fields()...)
	}
}
