package manifest

import (
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/api/equality"
)

// fileState is what is known about one manifest file.
type fileState struct {
	id     fileID
	hash   uint64 // of the content last parsed, valid when hashed
	hashed bool
	// objects and warnings come from the last version that parsed well.
	objects  []object
	warnings []string
	// fatal says why the current content cannot be used; empty when it can.
	fatal string
	// good is true once some version of the file parsed well.
	good bool
}

// job is the reading of one file, done concurrently with others.
type job struct {
	name     string
	path     string // in the directory, joined once for stat, read and logs
	id       fileID
	prevHash uint64
	hasPrev  bool

	gone      bool // missing, or not a regular file any more
	unchanged bool // same content as last parsed
	err       error
	hash      uint64
	parsed    parsed
}

// scan compares the directory with the file states, reads the files that
// changed and those in force (all of them with forceAll), leaves those in
// hold alone, and publishes the result.
func (s *Source) scan(force, hold map[string]bool, forceAll bool) {
	s.wholeScans.Add(1)
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		// Keep every object: an unmounted or replaced directory is not a
		// request to delete all pods.
		msg := fmt.Sprintf("cannot read directory: %v; keeping the objects last read from it", err)
		if msg != s.dirErr {
			s.log.Warn("Cannot read manifest directory", zap.String("dir", s.dir), zap.Error(err))
			s.dirErr = msg
			s.publish()
		}
		return
	}
	changed := false
	if s.dirErr != "" {
		s.dirErr = ""
		changed = true
	}
	names := make([]string, len(entries))
	s.symlinks = map[string]bool{}
	for i, e := range entries {
		names[i] = e.Name()
		if e.Type()&fs.ModeSymlink != 0 && !candidate(e.Name()) {
			s.symlinks[e.Name()] = true
		}
	}
	s.update(names, nil, force, hold, forceAll, changed)
}

// scanFiles reads the named files again, and only them: those that had
// events. Looking at the whole directory for every batch of events made a
// burst of N files cost N stats per batch, and the batches of a burst
// delivered a few events at a time: with 2,000 files, seconds of stats
// after the last one was read. Files without events are left to the
// periodic full scan (a symlink's target can change without one).
func (s *Source) scanFiles(names map[string]bool) {
	list := slices.Sorted(maps.Keys(names))
	s.update(list, names, names, nil, false, false)
}

// update reads the candidates among names as scan describes. With only
// nil, names is the whole directory and a known file not in it is gone;
// otherwise only the files in only are looked at.
func (s *Source) update(names []string, only, force, hold map[string]bool, forceAll, changed bool) {
	seen := make(map[string]bool, len(names))
	var jobs []job
	for _, name := range names {
		if !candidate(name) {
			continue
		}
		st := s.files[name]
		if hold[name] {
			if st != nil {
				seen[name] = true
			}
			continue
		}
		// Not os.Stat: no FileInfo to allocate per file. Follows symlinks.
		var sb syscall.Stat_t
		path := filepath.Join(s.dir, name)
		err := ignoringEINTR(func() error { return syscall.Stat(path, &sb) })
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed, or a dangling symlink
			}
			seen[name] = true
			jobs = append(jobs, job{name: name, path: path}) // reading reports the error
			continue
		}
		if sb.Mode&syscall.S_IFMT != syscall.S_IFREG {
			continue
		}
		seen[name] = true
		id := idOfStat(&sb)
		if st != nil && st.id == id && !force[name] && !forceAll {
			continue
		}
		j := job{name: name, path: path, id: id}
		if st != nil {
			j.prevHash, j.hasPrev = st.hash, st.hashed
		}
		jobs = append(jobs, j)
	}

	// Publish as files are parsed, not once all are: in a burst of pods
	// the first ones are mounted while the rest are still being read.
	// Publishing after a geometrically growing number of files keeps the
	// rebuilds (each over every file) linear in the burst. Not when files
	// went: a pod moved from a removed file to a new one would be seen
	// twice in between.
	var gone []string
	if only == nil {
		for name := range s.files {
			if !seen[name] {
				gone = append(gone, name)
			}
		}
	} else {
		for name := range only {
			if s.files[name] != nil && !seen[name] {
				gone = append(gone, name)
			}
		}
	}
	stream := len(gone) == 0
	applied, published := 0, 0
	if s.reads != nil && len(jobs) > 0 {
		s.reads.Reading(len(jobs))
	}
	s.runJobs(jobs, func(j *job) {
		if s.apply(j) {
			changed = true
		}
		applied++
		if stream && changed && applied < len(jobs) && applied-published >= max(publishFirst, published/2) {
			s.publish()
			changed, published = false, applied
		}
	})
	for _, name := range gone {
		c := countKinds(s.files[name].objects)
		s.removeFile(name)
		s.fileLine("Removed manifest file", func() []zap.Field {
			return append([]zap.Field{zap.String("file", filepath.Join(s.dir, name))}, c.fields()...)
		})
		changed = true
	}
	if changed {
		s.publish()
	}
}

func (s *Source) publish() {
	if s.rebuild() {
		s.notify()
	}
}

// runJobs reads and parses files on all CPUs (parsing YAML dominates the
// cost of a large directory) and hands each finished job to done, in the
// calling goroutine, as soon as it is finished.
func (s *Source) runJobs(jobs []job, done func(*job)) {
	workers := min(s.procs.CPUs(), len(jobs))
	if workers <= 1 {
		for i := range jobs {
			s.read(&jobs[i])
			done(&jobs[i])
		}
		return
	}
	finished := make(chan int, len(jobs))
	var next atomic.Int64
	for range workers {
		go func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(jobs) {
					return
				}
				s.read(&jobs[i])
				finished <- i
			}
		}()
	}
	for range jobs {
		done(&jobs[<-finished])
	}
}

func (s *Source) read(j *job) {
	// O_NONBLOCK: a FIFO with a manifest's name must not hang the agent.
	// System calls, not an os.File: a file is open for microseconds, and
	// an os.File's poller registration and cleanup cost more than that.
	path := j.path
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			j.gone = true
		} else {
			j.err = &fs.PathError{Op: "open", Path: path, Err: err}
		}
		return
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := ignoringEINTR(func() error { return syscall.Fstat(fd, &st) }); err != nil {
		j.err = &fs.PathError{Op: "stat", Path: path, Err: err}
		return
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		j.gone = true
		return
	}
	// The identity of what is actually read, which may be newer than what
	// the directory scan saw.
	j.id = idOfStat(&st)
	if st.Size > maxFileSize {
		j.err = fmt.Errorf("file is larger than %d MiB", maxFileSize>>20)
		return
	}
	data := make([]byte, 0, st.Size+1)
	data, err = readAll(fdReader{fd: fd, path: path}, data)
	if err != nil {
		j.err = err
		return
	}
	if len(data) > maxFileSize {
		j.err = fmt.Errorf("file is larger than %d MiB", maxFileSize>>20)
		return
	}
	j.hash = maphash.Bytes(s.seed, data)
	if j.hasPrev && j.hash == j.prevHash {
		j.unchanged = true
		return
	}
	j.parsed = s.parser.parse(data)
}

// fdReader reads a file descriptor with errors as an os.File gives them.
type fdReader struct {
	fd   int
	path string
}

func (r fdReader) Read(b []byte) (int, error) {
	var n int
	err := ignoringEINTR(func() (err error) {
		n, err = syscall.Read(r.fd, b)
		return err
	})
	switch {
	case err != nil:
		return 0, &fs.PathError{Op: "read", Path: r.path, Err: err}
	case n == 0 && len(b) > 0:
		return 0, io.EOF
	}
	return n, nil
}

func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// readAll reads up to one byte past maxFileSize, so growth after the stat is
// noticed without reading an unbounded file.
// An fdReader, not an io.Reader: one allocation per file less.
func readAll(r fdReader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		if len(buf) > maxFileSize {
			return buf, nil
		}
	}
}

// apply records the outcome of a job and reports whether the file's
// contribution to the store changed.
func (s *Source) apply(j *job) bool {
	path := j.path
	st := s.files[j.name]
	if j.gone {
		if st == nil {
			return false
		}
		s.removeFile(j.name)
		c := countKinds(st.objects)
		s.fileLine("Removed manifest file", func() []zap.Field {
			return append([]zap.Field{zap.String("file", path)}, c.fields()...)
		})
		return true
	}
	if st == nil {
		st = &fileState{}
		s.addFile(j.name, st)
	}
	st.id = j.id
	if j.unchanged {
		return false
	}
	s.touch(j.name) // before its contribution changes
	switch {
	case j.err != nil:
		// Read again on the next event or identity change.
		st.hashed = false
		msg := fmt.Sprintf("cannot read file: %v", j.err)
		if msg == st.fatal {
			return false
		}
		st.fatal = msg
		s.log.Warn("Cannot read manifest file; keeping the objects of its last good version",
			zap.String("file", path), zap.Error(j.err), zap.Int("kept", len(st.objects)))
		return true

	case j.parsed.fatal != "":
		st.hash, st.hashed = j.hash, true
		st.fatal = j.parsed.fatal
		s.log.Warn("Malformed manifest file; keeping the objects of its last good version",
			zap.String("file", path), zap.String("error", st.fatal), zap.Int("kept", len(st.objects)))
		return true
	}

	st.hash, st.hashed = j.hash, true
	objs := j.parsed.objects
	reuseUnchanged(objs, st.objects)
	st.objects, st.warnings, st.fatal, st.good = objs, j.parsed.warnings, "", true
	s.fileLine("Loaded manifest file", func() []zap.Field {
		return countKinds(objs).appendFields(zap.String("file", path), zap.Int("ignoredPods", len(j.parsed.ignored)))
	})
	for _, w := range j.parsed.warnings {
		s.log.Warn("Problem in manifest file", zap.String("file", path), zap.String("error", w))
	}
	for _, pod := range j.parsed.ignored {
		s.log.Debug("Ignoring pod of another node", zap.String("file", path), zap.String("pod", pod))
	}
	return true
}

// reuseUnchanged replaces objects equal to their previous version by that
// version, so that rewriting a file with one pod changed leaves the other
// pods' pointers, and the store, unchanged.
func reuseUnchanged(objs, prev []object) {
	if len(prev) == 0 {
		return
	}
	old := make(map[kindKey]any, len(prev))
	for i := range prev {
		old[kindKey{prev[i].kind, prev[i].key()}] = prev[i].obj
	}
	for i := range objs {
		if o, ok := old[kindKey{objs[i].kind, objs[i].key()}]; ok && equality.Semantic.DeepEqual(o, objs[i].obj) {
			objs[i].obj = o
		}
	}
}

type kindCounts [numKinds]int

func countKinds(objs []object) kindCounts {
	var c kindCounts
	for i := range objs {
		c[objs[i].kind]++
	}
	return c
}

func (c kindCounts) fields() []zap.Field { return c.appendFields() }

// appendFields returns first followed by the counts' fields, in one
// allocation.
func (c kindCounts) appendFields(first ...zap.Field) []zap.Field {
	return append(append(make([]zap.Field, 0, len(first)+int(numKinds)), first...),
		zap.Int("pods", c[kindPod]),
		zap.Int("pvcs", c[kindPVC]),
		zap.Int("pvs", c[kindPV]),
		zap.Int("storageClasses", c[kindStorageClass]),
		zap.Int("csiDrivers", c[kindCSIDriver]),
		zap.Int("configMaps", c[kindConfigMap]),
		zap.Int("secrets", c[kindSecret]),
	)
}

// addFile records a new file's state.
func (s *Source) addFile(name string, st *fileState) {
	s.files[name] = st
	if i, found := slices.BinarySearch(s.names, name); !found {
		s.names = slices.Insert(s.names, i, name)
	}
}

// removeFile forgets a file.
func (s *Source) removeFile(name string) {
	s.touch(name)
	delete(s.files, name)
	if i, found := slices.BinarySearch(s.names, name); found {
		s.names = slices.Delete(s.names, i, i+1)
	}
}
