// Package trash owns the agent's trash directory (<root>/trash): volume
// directories being deleted. A directory is renamed into the trash (one
// atomic step) before its contents are removed, so an agent that stops in
// the middle never leaves a half-deleted volume at the volume's path, where
// a restart would take it for one that is set up; the next start finishes
// the removal from the trash instead. Removal itself is safefs's: bounded
// memory, no symbolic link followed, no mount crossed.
package trash

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/pathcall"
	"github.com/volume-agent/volume-agent/internal/safefs"
)

// RemoveAll removes dir and everything below it through trashDir, which
// must be on the same filesystem (else dir is removed where it is). label
// names the entry in the trash for people (e.g. the pod and volume). When
// something below dir cannot be removed (another mount inside), dir is put
// back where it was with what is left, and the error returned: the caller
// retries, and the mount stays where it was found. When ctx ends first,
// the rest stays in the trash for Empty.
func RemoveAll(ctx context.Context, trashDir, dir, label string) error {
	if done, err := RemoveEmpty(dir); done {
		return err
	}
	if err := os.Mkdir(trashDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	in := filepath.Join(trashDir, entryName(label))
	if err := os.Rename(dir, in); err != nil {
		if errors.Is(err, unix.EXDEV) {
			return safefs.RemoveAll(ctx, dir)
		}
		return err
	}
	err := safefs.RemoveAll(ctx, in)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		// Out of time, not stuck: what is left stays in the trash, where
		// emptying the trash finishes it.
		return err
	}
	if rerr := os.Rename(in, dir); rerr != nil {
		return fmt.Errorf("%w (and putting what is left back failed, it stays in %s: %v)", err, in, rerr)
	}
	return err
}

// RemoveEmpty is the first step of RemoveAll: most volume directories are
// empty by the time they are removed, and one rmdir removes them, with no
// trash needed (nor its path or a label built). done reports that it
// removed dir (or found it gone), or failed for another reason than
// content (err); when it is false, dir has content for RemoveAll.
func RemoveEmpty(dir string) (done bool, err error) {
	err = pathcall.Rmdir(dir)
	switch {
	case err == nil || errors.Is(err, unix.ENOENT):
		return true, nil
	case errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST):
		return false, nil
	}
	return true, &os.PathError{Op: "rmdir", Path: dir, Err: err}
}

// entryName is label (made one safe path element) and a random suffix:
// unique among the entries of earlier runs too.
func entryName(label string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	safe := make([]byte, 0, len(label))
	for i := 0; i < len(label) && len(safe) < 128; i++ {
		c := label[i]
		if c == '/' || c < 0x21 || c > 0x7e {
			c = '_'
		}
		safe = append(safe, c)
	}
	if len(safe) == 0 || safe[0] == '.' {
		safe = append([]byte("v"), safe...)
	}
	return string(safe) + "." + hex.EncodeToString(b[:])
}

// Leftover is an entry of the trash that could not be removed.
type Leftover struct {
	Path string
	Err  error
}

// Empty removes everything in trashDir (what an agent that stopped in the
// middle of a removal left there) and returns what it could not remove.
func Empty(ctx context.Context, trashDir string) []Leftover {
	f, err := os.Open(trashDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return []Leftover{{Path: trashDir, Err: err}}
	}
	defer f.Close()
	var left []Leftover
	for {
		// In batches: the trash holds few entries, but nothing bounds it.
		names, err := f.Readdirnames(256)
		for _, name := range names {
			p := filepath.Join(trashDir, name)
			if err := safefs.RemoveAll(ctx, p); err != nil {
				// A file, not a directory, is removed too.
				if uerr := unix.Unlink(p); uerr != nil {
					left = append(left, Leftover{Path: p, Err: err})
				}
			}
		}
		if err != nil || len(names) == 0 {
			return left
		}
		if ctx.Err() != nil {
			return append(left, Leftover{Path: trashDir, Err: ctx.Err()})
		}
	}
}
