package mountutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// SharedResult says what MakeShared did.
type SharedResult int

const (
	// AlreadyShared: dir lies in a mount with shared propagation (systemd
	// makes / shared; a container's Bidirectional mount is shared).
	AlreadyShared SharedResult = iota
	// MadeShared: dir was bind-mounted onto itself (unless it was a mount
	// point already) and made rshared.
	MadeShared
)

// ErrMountsBelow is returned by MakeShared when dir is not shared but holds
// mounts already: bind-mounting dir onto itself would hide them behind the
// new mount (a recursive bind would copy them, leaving the originals mounted
// where nothing can reach them). They are left alone; dir becomes shared at
// a start with nothing mounted below it.
var ErrMountsBelow = fmt.Errorf("mounts below it would be hidden")

// MakeShared makes dir a mount with shared propagation, as the kubelet
// makes its root directory: a CSI driver in a container that mounts dir with
// Bidirectional propagation has a shared copy of it, and the mounts the
// driver makes below it then reach this mount namespace (and so the pods)
// only if dir is shared here. If dir lies in a shared mount already nothing
// changes. Otherwise dir is bind-mounted onto itself, unless it is a mount
// point already, and made rshared.
func MakeShared(dir string) (SharedResult, error) {
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	dir = filepath.Clean(dir)
	mounts, err := ReadMountInfo()
	if err != nil {
		return 0, err
	}
	var containing *Mount
	below := 0
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if rest, ok := within(m.Mountpoint, dir); ok && rest != "/" {
			below++
		}
		if _, ok := within(dir, m.Mountpoint); ok && containing == nil {
			containing = m
		}
	}
	if containing == nil {
		return 0, &os.PathError{Op: "find mount", Path: dir, Err: os.ErrNotExist}
	}
	if hasShared(containing.Optional) {
		return AlreadyShared, nil
	}
	if containing.Mountpoint != dir {
		if below > 0 {
			return 0, fmt.Errorf("cannot make %s a shared mount: %d %w", dir, below, ErrMountsBelow)
		}
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return 0, &os.PathError{Op: "bind mount onto itself", Path: dir, Err: err}
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return 0, &os.PathError{Op: "make rshared", Path: dir, Err: err}
	}
	return MadeShared, nil
}

// hasShared reports whether a mount's optional fields ("shared:3
// master:1") include shared propagation.
func hasShared(optional string) bool {
	for _, f := range strings.Fields(optional) {
		if strings.HasPrefix(f, "shared:") {
			return true
		}
	}
	return false
}
