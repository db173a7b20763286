package disklimit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"go.uber.org/zap"
)

// Quotactl is what the project quota backend asks of the kernel: a
// directory's project (FS_IOC_FSGETXATTR/FSSETXATTR) and a project's limit
// and usage (quotactl on the filesystem of the root directory). Kernel is
// the real one; tests give a fake.
type Quotactl interface {
	// Enforced returns nil when the filesystem holding dir enforces
	// project quotas, else why not.
	Enforced(dir string) error
	// Project returns the project ID of the directory dir.
	Project(dir string) (uint32, error)
	// SetProject sets dir's project ID and the inherit flag, so that what
	// is created below it is charged to the same project.
	SetProject(dir string, id uint32) error
	// SetLimit sets project id's hard block limit, in bytes (0: none), on
	// the filesystem holding fsDir.
	SetLimit(fsDir string, id uint32, bytes int64) error
	// Quota returns project id's usage and hard limit on the filesystem
	// holding fsDir.
	Quota(fsDir string, id uint32) (Quota, error)
}

// Quota is one project's quota.
type Quota struct {
	Bytes, Inodes int64
	// LimitBytes and LimitInodes are the hard limits; 0: none.
	LimitBytes, LimitInodes int64
}

func (q Quota) unused() bool { return q == Quota{} }

// Project IDs the agent gives out: above the range people use by hand and
// tools number from 1 (the kubelet's own quotas start at 1048577 too).
const (
	FirstProject uint32 = 1<<20 + 1
	LastProject  uint32 = 1<<31 - 1
)

// Projects is the project quota backend's bookkeeping: which project ID
// each limited volume directory has.
//
// The on-disk record is one file per ID in Dir, created exclusively
// (O_EXCL) before the ID is set on any directory, holding the volume's
// directory and the temporary directory it is prepared in. The exclusive
// create is what stops an ID being given twice; recording first is what
// makes a crash safe: an ID recorded but never set, or set on a directory
// that is gone, is found at start (no directory named by the record has it)
// and freed, so none leaks past a restart. An ID is freed only after its
// directory is removed, and handed out again only when the kernel says
// nothing is charged to it (so files still being deleted, or someone
// else's project, are never shared).
type Projects struct {
	q    Quotactl
	fs   string // a directory on the filesystem the quotas are on
	dir  string
	log  *zap.Logger
	mu   sync.Mutex
	byID map[uint32]string // ID → volume directory
	// next is where the search for a free ID starts.
	next uint32
	// First and Last bound the IDs (tests narrow them).
	first, last uint32
}

// NewProjects loads the records in dir, frees those no directory holds,
// and returns the bookkeeping for the filesystem holding fsDir.
func NewProjects(q Quotactl, fsDir, dir string, log *zap.Logger) (*Projects, error) {
	return newProjects(q, fsDir, dir, log, FirstProject, LastProject)
}

func newProjects(q Quotactl, fsDir, dir string, log *zap.Logger, first, last uint32) (*Projects, error) {
	if log == nil {
		log = zap.NewNop()
	}
	p := &Projects{q: q, fs: fsDir, dir: dir, log: log, byID: map[uint32]string{}, next: first, first: first, last: last}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		id, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || uint32(id) < first || uint32(id) > last {
			if strings.HasSuffix(e.Name(), ".tmp") {
				os.Remove(filepath.Join(dir, e.Name()))
			}
			continue
		}
		volDir, tmpDir, err := p.readRecord(uint32(id))
		if err != nil {
			return nil, err
		}
		if p.holds(volDir, uint32(id)) || p.holds(tmpDir, uint32(id)) {
			p.byID[uint32(id)] = volDir
			continue
		}
		log.Info("freeing a project ID no volume has", zap.Uint32("project", uint32(id)), zap.String("dir", volDir))
		if err := p.free(uint32(id)); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// holds tells whether dir exists with project id. The path comes from the
// agent's own record; Project opens it without following a link.
func (p *Projects) holds(dir string, id uint32) bool {
	if dir == "" {
		return false
	}
	got, err := p.q.Project(dir)
	return err == nil && got == id
}

// Assign gives the directory tmp (the volume's directory being prepared,
// renamed to volDir once ready; tmp == volDir for one set up before) a
// project of its own with a hard limit of limit bytes, and returns its ID.
// Called again for the same volDir, it keeps the ID it gave.
func (p *Projects) Assign(tmp, volDir string, limit int64) (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.idOf(volDir)
	if !ok {
		var err error
		if id, err = p.allocate(tmp, volDir); err != nil {
			return 0, err
		}
	}
	if err := p.q.SetLimit(p.fs, id, limit); err != nil {
		return 0, fmt.Errorf("setting the quota of project %d for %s: %w", id, volDir, err)
	}
	if err := p.q.SetProject(tmp, id); err != nil {
		return 0, fmt.Errorf("setting project %d on %s: %w", id, tmp, err)
	}
	return id, nil
}

// Release frees volDir's project once the directory is removed (nothing
// left is charged to it). A directory without one is done.
func (p *Projects) Release(volDir string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.idOf(volDir)
	if !ok {
		return nil
	}
	return p.free(id)
}

// Usage is what the volume's project holds; ok is false for a directory
// without a project of the agent's.
func (p *Projects) Usage(volDir string) (bytes, inodes int64, ok bool, err error) {
	id, err := p.q.Project(volDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, 0, false, nil
		}
		return 0, 0, false, err
	}
	p.mu.Lock()
	ours := p.byID[id] == volDir
	p.mu.Unlock()
	if !ours {
		return 0, 0, false, nil
	}
	q, err := p.q.Quota(p.fs, id)
	if err != nil {
		return 0, 0, false, err
	}
	return q.Bytes, q.Inodes, true, nil
}

// IDs returns the recorded IDs and their directories (for tests and the
// debug endpoint).
func (p *Projects) IDs() map[uint32]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[uint32]string, len(p.byID))
	for id, d := range p.byID {
		out[id] = d
	}
	return out
}

func (p *Projects) idOf(volDir string) (uint32, bool) {
	for id, d := range p.byID {
		if d == volDir {
			return id, true
		}
	}
	return 0, false
}

// allocate records the lowest free ID from next on for volDir. A node has
// as many IDs in use as limited emptyDirs: the search is short.
func (p *Projects) allocate(tmp, volDir string) (uint32, error) {
	span := uint64(p.last-p.first) + 1
	for i := uint64(0); i < span; i++ {
		id := p.first + uint32((uint64(p.next-p.first)+i)%span)
		if _, taken := p.byID[id]; taken {
			continue
		}
		if q, err := p.q.Quota(p.fs, id); err != nil || !q.unused() {
			continue // someone else's, or files still charged to it
		}
		err := p.writeRecord(id, volDir, tmp)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		p.byID[id] = volDir
		p.next = id + 1
		if p.next > p.last || p.next < p.first {
			p.next = p.first
		}
		return id, nil
	}
	return 0, fmt.Errorf("no free project ID for %s", volDir)
}

// free removes the limit, then the record: a crash in between leaves a
// record that the next start frees again.
func (p *Projects) free(id uint32) error {
	if err := p.q.SetLimit(p.fs, id, 0); err != nil {
		return fmt.Errorf("clearing the quota of project %d: %w", id, err)
	}
	if err := os.Remove(p.recordPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	delete(p.byID, id)
	return nil
}

func (p *Projects) recordPath(id uint32) string {
	return filepath.Join(p.dir, strconv.FormatUint(uint64(id), 10))
}

// writeRecord creates id's record, failing with fs.ErrExist when taken.
// The content is written to a temporary file first and linked into place,
// so a record is never seen half-written.
func (p *Projects) writeRecord(id uint32, volDir, tmp string) error {
	t := p.recordPath(id) + ".tmp"
	if err := os.WriteFile(t, []byte(volDir+"\n"+tmp+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(t)
	if err := syncFile(t); err != nil {
		return err
	}
	if err := os.Link(t, p.recordPath(id)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fs.ErrExist
		}
		return err
	}
	return nil
}

func (p *Projects) readRecord(id uint32) (volDir, tmp string, err error) {
	b, err := os.ReadFile(p.recordPath(id))
	if err != nil {
		return "", "", err
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 2 || !filepath.IsAbs(lines[0]) {
		return "", "", nil // unreadable: freed
	}
	if filepath.IsAbs(lines[1]) {
		tmp = filepath.Clean(lines[1])
	}
	return filepath.Clean(lines[0]), tmp, nil
}
