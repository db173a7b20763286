package usage

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Source answers a volume's usage cheaply, from what enforces its limit
// (a project quota's usage, the statfs of a per-volume filesystem image).
// volumeDir is the pod's volume directory
// (<root>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>); ok is false
// when the source does not back that volume, and the volume is then walked.
// It must answer quickly (no walk): a round asks it for every volume.
type Source interface {
	Usage(volumeDir string) (bytes, inodes int64, ok bool, err error)
}

// NoSource backs no volume: every disk emptyDir is walked.
type NoSource struct{}

// Usage implements Source.
func (NoSource) Usage(string) (int64, int64, bool, error) { return 0, 0, false, nil }

// Sources asks each source in turn; the first that backs the volume answers.
type Sources []Source

// Usage implements Source.
func (s Sources) Usage(dir string) (int64, int64, bool, error) {
	for _, src := range s {
		if src == nil {
			continue
		}
		if b, i, ok, err := src.Usage(dir); ok || err != nil {
			return b, i, ok, err
		}
	}
	return 0, 0, false, nil
}

// errNotTmpfs: a Memory emptyDir whose directory is not a tmpfs (not set
// up as the agent sets it up): statfs would measure the filesystem under it.
var errNotTmpfs = errors.New("not a tmpfs")

// tmpfsUsage is what a Memory emptyDir's tmpfs holds, from its statfs:
// the tmpfs is the volume's own, so its used blocks and inodes are the
// volume's.
func tmpfsUsage(dir string) (bytes, inodes int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	if st.Type != unix.TMPFS_MAGIC {
		return 0, 0, fmt.Errorf("%s: %w (filesystem type %#x)", dir, errNotTmpfs, st.Type)
	}
	bsize := int64(st.Bsize)
	return (int64(st.Blocks) - int64(st.Bfree)) * bsize, int64(st.Files) - int64(st.Ffree), nil
}
