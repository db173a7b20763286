// Package disklimit owns the hard limits of disk emptyDirs with a
// sizeLimit: which enforcement the node has (decided once, at start), the
// per-volume resources each one needs, their reclaim when the volume goes
// and after a crash, and what each volume holds (Usage).
//
// Two enforcements exist. Project quotas (ext4 with the project feature,
// XFS with prjquota, the kernel built with quota support): each volume's
// directory gets a project ID of its own with a hard block limit, so a pod
// that writes past it gets EDQUOT; see Projects. Where quotas are not
// available, a filesystem image per volume: a sparse file of about
// sizeLimit bytes under the root directory, formatted once, mounted through
// a loop device at the volume's directory, so a pod that writes past it
// gets ENOSPC; see Images. Either way, nobody else on the node is hurt.
// The kubelet measures usage and evicts after the fact; a node without a
// kubelet has no one to evict, and a limit that is not enforced is not a
// limit.
package disklimit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Mode is what the operator asks for (--empty-dir-size-limit).
type Mode string

const (
	// ModeAuto uses project quotas where the root directory's filesystem
	// enforces them, filesystem images otherwise.
	ModeAuto Mode = "auto"
	// ModeQuota requires project quotas: the agent does not start without.
	ModeQuota Mode = "quota"
	// ModeImage always uses filesystem images.
	ModeImage Mode = "image"
	// ModeOff enforces nothing: a disk emptyDir is a plain directory
	// whatever its sizeLimit, as before.
	ModeOff Mode = "off"
)

// ParseMode checks a --empty-dir-size-limit value ("" is auto).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "":
		return ModeAuto, nil
	case ModeAuto, ModeQuota, ModeImage, ModeOff:
		return m, nil
	}
	return "", fmt.Errorf("--empty-dir-size-limit must be auto, quota, image or off, not %q", s)
}

// Kind is the enforcement in force.
type Kind string

const (
	KindQuota Kind = "project-quota"
	KindImage Kind = "image"
	KindNone  Kind = "none"
)

// Status says which enforcement is in force and why, for the log and the
// page.
type Status struct {
	Kind   Kind   `json:"kind"`
	Reason string `json:"reason"`
}

func (s Status) String() string { return string(s.Kind) + " (" + s.Reason + ")" }

// Choose is the decision of which enforcement runs, given the mode and
// whether the root directory's filesystem enforces project quotas (quotaErr
// says why not).
func Choose(mode Mode, quotaErr error) (Status, error) {
	switch mode {
	case ModeOff:
		return Status{KindNone, "turned off (--empty-dir-size-limit=off)"}, nil
	case ModeImage:
		return Status{KindImage, "asked for (--empty-dir-size-limit=image)"}, nil
	case ModeQuota:
		if quotaErr != nil {
			return Status{}, fmt.Errorf("--empty-dir-size-limit=quota: the root directory's filesystem does not enforce project quotas: %w", quotaErr)
		}
		return Status{KindQuota, "asked for (--empty-dir-size-limit=quota)"}, nil
	}
	if quotaErr == nil {
		return Status{KindQuota, "the root directory's filesystem enforces project quotas"}, nil
	}
	return Status{KindImage, "project quotas unavailable: " + quotaErr.Error()}, nil
}

// Options configure New.
type Options struct {
	Mode Mode
	// Root is the agent's root directory: quotas are detected on its
	// filesystem.
	Root string
	// StateDir holds what the backends keep on disk (images/, projects/).
	StateDir string
	// Quotactl is the kernel's quota interface (nil: the real one).
	Quotactl Quotactl
	Log      *zap.Logger
}

// Enforcer is the enforcement in force on this node. A nil *Enforcer, or
// one of KindNone, enforces nothing.
type Enforcer struct {
	status   Status
	images   *Images
	projects *Projects
}

// New detects what the node supports, chooses, and cleans up what a crash
// left behind (images nothing mounts, loop devices nothing uses, project
// IDs no directory has). It must run before any volume is set up.
func New(o Options) (*Enforcer, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	q := o.Quotactl
	if q == nil {
		q = Kernel{}
	}
	var quotaErr error
	if o.Mode == ModeAuto || o.Mode == ModeQuota || o.Mode == "" {
		quotaErr = q.Enforced(o.Root)
	}
	st, err := Choose(o.Mode, quotaErr)
	if err != nil {
		return nil, err
	}
	e := &Enforcer{status: st}
	// Images from an earlier run with images are cleaned up whatever runs
	// now: a mode changed between runs must not leak them.
	images := &Images{Dir: filepath.Join(o.StateDir, "images"), Log: o.Log}
	if err := images.Sweep(); err != nil {
		return nil, fmt.Errorf("cleaning up emptyDir images: %w", err)
	}
	switch st.Kind {
	case KindImage:
		e.images = images
	case KindQuota:
		if e.projects, err = NewProjects(q, o.Root, filepath.Join(o.StateDir, "projects"), o.Log); err != nil {
			return nil, err
		}
	}
	o.Log.Info("disk emptyDir sizeLimit enforcement", zap.String("enforcement", string(st.Kind)), zap.String("reason", st.Reason))
	return e, nil
}

// Status is the enforcement in force.
func (e *Enforcer) Status() Status {
	if e == nil {
		return Status{KindNone, "not configured"}
	}
	return e.status
}

// Images is the image backend, nil unless it is in force.
func (e *Enforcer) Images() *Images {
	if e == nil {
		return nil
	}
	return e.images
}

// Projects is the project quota backend, nil unless it is in force.
func (e *Enforcer) Projects() *Projects {
	if e == nil {
		return nil
	}
	return e.projects
}

// Usage reports what the volume at volumeDir holds, where a backend of
// this Enforcer backs it: an image it mounted from statfs, a project from
// its quota. ok is false for anything else: a plain directory (nothing
// knows its usage without walking it), a missing one, and a filesystem
// mounted by someone else (a Memory emptyDir's tmpfs: its own measurer
// reads it).
func (e *Enforcer) Usage(volumeDir string) (bytes, inodes int64, ok bool, err error) {
	mounted, dev, err := mountPoint(volumeDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, 0, false, nil
		}
		return 0, 0, false, err
	}
	if mounted {
		if im := e.Images(); im != nil && im.backs(dev) {
			return statfsUsage(volumeDir)
		}
		return 0, 0, false, nil
	}
	if p := e.Projects(); p != nil {
		return p.Usage(volumeDir)
	}
	return 0, 0, false, nil
}

func statfsUsage(dir string) (bytes, inodes int64, ok bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, false, &os.PathError{Op: "statfs", Path: dir, Err: err}
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, int64(st.Files - st.Ffree), true, nil
}

// mountPoint tells a mount point from a directory by the device of the
// directory and of its parent, and returns the directory's device; a bind
// mount of a directory of the same filesystem is not told apart, which is
// what Usage wants (its statfs would be the parent filesystem's).
func mountPoint(dir string) (bool, uint64, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, 0, &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false, 0, nil
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, 0, &os.PathError{Op: "lstat", Path: filepath.Dir(dir), Err: err}
	}
	return st.Dev != parent.Dev, st.Dev, nil
}
