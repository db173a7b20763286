package csidriver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	MajorMinor string // of the mounted filesystem, e.g. "7:3"
	Root       string // path inside that filesystem, "/loop3" for a bind-mounted device node
	MountPoint string
	FSType     string
	Source     string
}

// listMounts reads /proc/self/mountinfo.
func listMounts() ([]mountEntry, error) {
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, err
	}
	out := make([]mountEntry, 0, len(infos))
	for _, i := range infos {
		out = append(out, mountEntry{
			MajorMinor: fmt.Sprintf("%d:%d", i.Major, i.Minor),
			Root:       i.Root, MountPoint: i.Mountpoint, FSType: i.FSType, Source: i.Source,
		})
	}
	return out, nil
}

// mountsAt returns the mounts stacked on path (canonical), oldest first.
func mountsAt(path string) ([]mountEntry, error) {
	all, err := listMounts()
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for _, m := range all {
		if m.MountPoint == path {
			out = append(out, m)
		}
	}
	return out, nil
}

func isMounted(path string) (bool, error) {
	ms, err := mountsAt(path)
	return len(ms) > 0, err
}

// mountedFrom reports whether path has a mount of the filesystem on the
// block device dev, or a bind mount of the device node dev itself.
func mountedFrom(path, dev string) (bool, error) {
	if dev == "" {
		return false, nil
	}
	ms, err := mountsAt(path)
	if err != nil || len(ms) == 0 {
		return false, err
	}
	majmin, _ := deviceMajorMinor(dev)
	for _, m := range ms {
		if (majmin != "" && m.MajorMinor == majmin) || m.Root == "/"+filepath.Base(dev) {
			return true, nil
		}
	}
	return false, nil
}

// deviceMounted reports whether the filesystem on dev is mounted anywhere.
func deviceMounted(dev string) (bool, error) {
	majmin, err := deviceMajorMinor(dev)
	if err != nil {
		return false, err
	}
	all, err := listMounts()
	if err != nil {
		return false, err
	}
	for _, m := range all {
		if m.MajorMinor == majmin {
			return true, nil
		}
	}
	return false, nil
}

// canonicalPath makes path absolute and resolves symlinks in the part of it
// that exists, so it compares equal to mount points in mountinfo.
func canonicalPath(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if resolved, err := filepath.EvalSymlinks(abs); err == nil {
		return resolved, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	dir, base := filepath.Split(abs)
	dir = filepath.Clean(dir)
	if dir == abs { // "/" always exists; this only guards the recursion
		return abs, nil
	}
	parent, err := canonicalPath(dir)
	if err != nil {
		return "", err
	}
	return filepath.Join(parent, base), nil
}

// mountOption is a mount(8)-style option that maps to a mount(2) flag.
type mountOption struct {
	flag  uintptr
	clear bool // the option turns the flag off ("rw", "exec", ...)
}

var mountOptions = map[string]mountOption{
	"ro":          {flag: unix.MS_RDONLY},
	"rw":          {flag: unix.MS_RDONLY, clear: true},
	"nosuid":      {flag: unix.MS_NOSUID},
	"suid":        {flag: unix.MS_NOSUID, clear: true},
	"nodev":       {flag: unix.MS_NODEV},
	"dev":         {flag: unix.MS_NODEV, clear: true},
	"noexec":      {flag: unix.MS_NOEXEC},
	"exec":        {flag: unix.MS_NOEXEC, clear: true},
	"sync":        {flag: unix.MS_SYNCHRONOUS},
	"async":       {flag: unix.MS_SYNCHRONOUS, clear: true},
	"dirsync":     {flag: unix.MS_DIRSYNC},
	"noatime":     {flag: unix.MS_NOATIME},
	"atime":       {flag: unix.MS_NOATIME, clear: true},
	"nodiratime":  {flag: unix.MS_NODIRATIME},
	"diratime":    {flag: unix.MS_NODIRATIME, clear: true},
	"relatime":    {flag: unix.MS_RELATIME},
	"norelatime":  {flag: unix.MS_RELATIME, clear: true},
	"strictatime": {flag: unix.MS_STRICTATIME},
	"lazytime":    {flag: unix.MS_LAZYTIME},
	"nolazytime":  {flag: unix.MS_LAZYTIME, clear: true},
	"silent":      {flag: unix.MS_SILENT},
	"loud":        {flag: unix.MS_SILENT, clear: true},
	"defaults":    {},
}

// parseMountOptions turns CSI mount flags (each may hold several
// comma-separated options) into mount(2) flags and the filesystem-specific
// data string made of the options it does not know.
func parseMountOptions(opts []string) (uintptr, string) {
	var flags uintptr
	var data []string
	for _, o := range opts {
		for _, opt := range strings.Split(o, ",") {
			opt = strings.TrimSpace(opt)
			if opt == "" {
				continue
			}
			mo, ok := mountOptions[opt]
			switch {
			case !ok:
				data = append(data, opt)
			case mo.clear:
				flags &^= mo.flag
			default:
				flags |= mo.flag
			}
		}
	}
	return flags, strings.Join(data, ",")
}

// mountDevice mounts the filesystem on dev at target.
func mountDevice(dev, target, fsType string, options []string, readOnly bool) error {
	flags, data := parseMountOptions(options)
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount(dev, target, fsType, flags, data); err != nil {
		return fmt.Errorf("mount -t %s -o %q %s %s: %w", fsType, data, dev, target, err)
	}
	return nil
}

// bindMount bind-mounts src (a directory or a device node) at target. A bind
// mount ignores most flags on creation, so read-only and the other per-mount
// flags are applied with a second, remounting call.
func bindMount(src, target string, options []string, readOnly bool) error {
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s at %s: %w", src, target, err)
	}
	flags, _ := parseMountOptions(options)
	flags &= unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC |
		unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME | unix.MS_STRICTATIME
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if flags == 0 {
		return nil
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		_ = unix.Unmount(target, 0)
		return fmt.Errorf("remount bind mount %s with flags %#x: %w", target, flags, err)
	}
	return nil
}

// unmountAll removes every mount stacked on target. EBUSY is retried for a
// short while, because a process that has just closed a file there may still
// hold the mount for a moment.
func unmountAll(target string) error {
	deadline := time.Now().Add(5 * time.Second)
	for attempt := 0; ; attempt++ {
		mounted, err := isMounted(target)
		if err != nil || !mounted {
			return err
		}
		err = unix.Unmount(target, 0)
		switch {
		case err == nil:
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
		case errors.Is(err, unix.EINVAL) && attempt < 3:
			// Raced with someone else's unmount; look again.
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
}
