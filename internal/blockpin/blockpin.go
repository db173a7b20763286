// Package blockpin keeps a raw block device from being released while a pod
// has it mapped.
//
// A container's device node only names a device number. If the device went
// away while nothing held it open (a loop device detached, a disk
// unplugged, an iSCSI session logged out) the number could be given to
// another device, and the pod would read and write someone else's data. The
// kubelet prevents this by attaching a loop device to each pod's bind mount of
// the device: the loop device holds the device open, in the kernel, for as
// long as it exists, across kubelet restarts and crashes.
//
// Loops does the same, with three differences: the loop device is read-only
// (the pin adds no second writable path to the tenant's data on the host);
// it is made with ioctls (LOOP_CTL_GET_FREE, LOOP_CONFIGURE), not by running
// losetup; and a pin is recognised by both its backing path and the device
// inode behind it, so a stale pin (an access point reused for another device)
// is replaced rather than trusted. Pins are found again after a restart by
// scanning /sys/block/loop*/loop/backing_file; Sweep releases pins below a
// directory that nothing accounts for.
//
// A pin holds the access point's mount busy, so it must be released before
// the access point is unmounted.
package blockpin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Pinner pins block devices through their access points.
type Pinner interface {
	// Pin makes sure the block device at path (an access point) is held
	// open until Unpin. It is idempotent.
	Pin(path string) error
	// Unpin releases every pin of path. Nothing pinned is done.
	Unpin(path string) error
	// Pinned reports whether the device at path is pinned.
	Pinned(path string) (bool, error)
}

// Loops pins with read-only loop devices. The zero value is ready to use.
type Loops struct {
	// SysBlock and Dev default to /sys/block and /dev.
	SysBlock, Dev string

	// mu serialises allocations: two pins racing for the same free loop
	// device would otherwise retry against each other.
	mu sync.Mutex
}

var _ Pinner = (*Loops)(nil)

func (l *Loops) sysBlock() string {
	if l.SysBlock != "" {
		return l.SysBlock
	}
	return "/sys/block"
}

func (l *Loops) dev() string {
	if l.Dev != "" {
		return l.Dev
	}
	return "/dev"
}

// Pin implements Pinner.
func (l *Loops) Pin(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("opening access point %s: %w", path, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return fmt.Errorf("access point %s is not a block device", path)
	}
	pins, err := l.find(path)
	if err != nil {
		return err
	}
	ok := false
	for _, p := range pins {
		if p.device == st.Dev && p.inode == st.Ino {
			ok = true
			continue
		}
		// The access point now holds another device: this pin holds the
		// wrong one.
		if err := l.detach(p.loop); err != nil {
			return err
		}
	}
	if ok {
		return nil
	}
	return l.attach(f, path)
}

// attach configures a free loop device, read-only, over the open device f.
func (l *Loops) attach(f *os.File, path string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctl, err := os.OpenFile(filepath.Join(l.dev(), "loop-control"), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("pinning %s: %w", path, err)
	}
	defer ctl.Close()
	cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_READ_ONLY
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], path)
	var lastErr error
	// Another program may take the free device between the two calls.
	for range 16 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("pinning %s: no free loop device: %w", path, err)
		}
		dev := filepath.Join(l.dev(), "loop"+strconv.Itoa(n))
		lf, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			lastErr = err
			continue
		}
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		lf.Close()
		if err == nil {
			return nil
		}
		lastErr = err
		if !errors.Is(err, unix.EBUSY) {
			break
		}
	}
	return fmt.Errorf("pinning %s with a loop device: %w", path, lastErr)
}

// Unpin implements Pinner.
func (l *Loops) Unpin(path string) error {
	pins, err := l.find(path)
	if err != nil {
		return err
	}
	for _, p := range pins {
		if err := l.detach(p.loop); err != nil {
			return err
		}
	}
	return nil
}

// Pinned implements Pinner.
func (l *Loops) Pinned(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	pins, err := l.find(path)
	if err != nil {
		return false, err
	}
	for _, p := range pins {
		if p.device == st.Dev && p.inode == st.Ino {
			return true, nil
		}
	}
	return false, nil
}

// Snapshot is the pins found by one scan, for checking many access points
// at once (at start-up) without scanning every loop device for each.
type Snapshot struct{ byPath map[string][]pin }

// Snapshot scans the loop devices once.
func (l *Loops) Snapshot() (*Snapshot, error) {
	all, err := l.scan()
	if err != nil {
		return nil, err
	}
	s := &Snapshot{byPath: map[string][]pin{}}
	for _, p := range all {
		s.byPath[p.path] = append(s.byPath[p.path], p)
	}
	return s, nil
}

// Pinned reports whether the device at path was pinned when the snapshot
// was taken.
func (s *Snapshot) Pinned(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	for _, p := range s.byPath[path] {
		if p.device == st.Dev && p.inode == st.Ino {
			return true, nil
		}
	}
	return false, nil
}

// Sweep releases the pins of access points below dir for which keep is
// false, and returns their paths.
func (l *Loops) Sweep(dir string, keep func(path string) bool) ([]string, error) {
	all, err := l.scan()
	if err != nil {
		return nil, err
	}
	var released []string
	prefix := filepath.Clean(dir) + "/"
	for _, p := range all {
		if !strings.HasPrefix(p.path, prefix) || keep(p.path) {
			continue
		}
		if err := l.detach(p.loop); err != nil {
			return released, err
		}
		released = append(released, p.path)
	}
	return released, nil
}

// pin is a loop device and what backs it.
type pin struct {
	loop          string // e.g. "loop7"
	path          string // backing file, " (deleted)" trimmed
	device, inode uint64
}

func (l *Loops) find(path string) ([]pin, error) {
	all, err := l.scan()
	if err != nil {
		return nil, err
	}
	var out []pin
	for _, p := range all {
		if p.path == path {
			out = append(out, p)
		}
	}
	return out, nil
}

// scan lists the read-only loop devices (pins are read-only; anything else
// is not ours to touch) with their backing files.
func (l *Loops) scan() ([]pin, error) {
	entries, err := os.ReadDir(l.sysBlock())
	if err != nil {
		return nil, err
	}
	var out []pin
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "loop") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(l.sysBlock(), name, "loop", "backing_file"))
		if err != nil {
			continue // not attached (or detached while reading)
		}
		backing := strings.TrimSuffix(strings.TrimRight(string(raw), "\n"), " (deleted)")
		if ro, _ := os.ReadFile(filepath.Join(l.sysBlock(), name, "ro")); strings.TrimSpace(string(ro)) != "1" {
			continue
		}
		p := pin{loop: name, path: backing}
		if info, err := l.status(name); err == nil {
			p.device, p.inode = info.Device, info.Inode
		}
		out = append(out, p)
	}
	return out, nil
}

func (l *Loops) status(loop string) (*unix.LoopInfo64, error) {
	f, err := os.OpenFile(filepath.Join(l.dev(), loop), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return unix.IoctlLoopGetStatus64(int(f.Fd()))
}

// detachWait bounds how long detach waits for the kernel to let go of the
// backing file (a udev probe may hold the loop device open briefly).
const detachWait = 5 * time.Second

// detach clears a loop device and waits until its backing file is released,
// so that the access point can be unmounted right after.
func (l *Loops) detach(loop string) error {
	f, err := os.OpenFile(filepath.Join(l.dev(), loop), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("releasing pin %s: %w", loop, err)
	}
	err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
	f.Close()
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("releasing pin %s: %w", loop, err)
	}
	backing := filepath.Join(l.sysBlock(), loop, "loop", "backing_file")
	deadline := time.Now().Add(detachWait)
	for {
		if _, err := os.Stat(backing); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("releasing pin %s: still attached after %s (held open by another program?)", loop, detachWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
