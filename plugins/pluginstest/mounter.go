// Package pluginstest holds fakes for unit tests of volume plugins. Mounter
// keeps a mount table in memory instead of calling mount(2), records every
// call and fails the calls a test asks it to, so plugins' decisions (what to
// mount, when a failure leaves the outcome uncertain, what a teardown
// refuses) can be tested without root. It is only imported by tests; the
// real mounts are tested with the real mounter.
package pluginstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Call is one call of a Mounter method.
type Call struct {
	// Op is the method's name ("BindMount", "IsMountPoint"...).
	Op string
	// Target is the path operated on (the mount point, or the device for
	// DiskFormat); Source is the bind source or the device.
	Target, Source string
	Tmpfs          mountutil.TmpfsOptions
	Bind           mountutil.BindOptions
	FSType         string
	Options        []string
}

// String spells the call the way tests compare it, e.g.
// "BindMount /src /dst ro rec" or "MountTmpfs /dst size=1024 mode=0777".
func (c Call) String() string {
	parts := []string{c.Op}
	if c.Source != "" {
		parts = append(parts, c.Source)
	}
	parts = append(parts, c.Target)
	switch c.Op {
	case "MountTmpfs":
		if c.Tmpfs.Resize {
			parts = append(parts, fmt.Sprintf("resize size=%d", c.Tmpfs.SizeBytes))
			break
		}
		parts = append(parts, fmt.Sprintf("size=%d mode=%#o", c.Tmpfs.SizeBytes, c.Tmpfs.Mode.Perm()))
		if c.Tmpfs.NoSwap {
			parts = append(parts, "noswap")
		}
	case "BindMount":
		if c.Bind.ReadOnly {
			parts = append(parts, "ro")
		}
		if c.Bind.Recursive {
			parts = append(parts, "rec")
		}
		if c.Bind.Flags != 0 {
			parts = append(parts, fmt.Sprintf("flags=%#x", c.Bind.Flags))
		}
	case "FormatAndMount":
		parts = append(parts, c.FSType)
		if len(c.Options) > 0 {
			parts = append(parts, strings.Join(c.Options, ","))
		}
	}
	return strings.Join(parts, " ")
}

// Fault makes calls fail.
type Fault struct {
	// Op is the method to fail; Target the path it must be called on ("":
	// any).
	Op, Target string
	Err        error
	// Applied: the call changes the mount table before failing, as a mount
	// that timed out or a mount(8) killed half way may have.
	Applied bool
	// Times is how many calls fail; 0 means every call.
	Times int
}

// mount is one entry of the fake mount table.
type mount struct {
	source string // bind source or device; "tmpfs" for a tmpfs
}

// Mounter is a plugins.Mounter that only pretends. Mount points must exist
// on disk (as for mount(2)); the mounts themselves live in memory. It is
// safe for concurrent use.
type Mounter struct {
	mu      sync.Mutex
	table   map[string][]mount // mount point → mounts stacked on it
	formats map[string]string  // device → filesystem
	faults  []*Fault
	calls   []Call
}

var _ plugins.Mounter = (*Mounter)(nil)

// NewMounter returns a Mounter with nothing mounted.
func NewMounter() *Mounter {
	return &Mounter{table: map[string][]mount{}, formats: map[string]string{}}
}

// Fail adds a fault.
func (m *Mounter) Fail(f Fault) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults = append(m.faults, &f)
}

// SetMounted pretends something is mounted at target (from source).
func (m *Mounter) SetMounted(source, target string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.table[filepath.Clean(target)] = append(m.table[filepath.Clean(target)], mount{source: source})
}

// SetDiskFormat pretends device has a filesystem of type fsType.
func (m *Mounter) SetDiskFormat(device, fsType string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.formats[device] = fsType
}

// Mounted lists the mount points, sorted, once per mount stacked on them.
func (m *Mounter) Mounted() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for p, ms := range m.table {
		for range ms {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// Calls returns the calls made so far.
func (m *Mounter) Calls() []Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// CallStrings returns the calls made so far as strings, leaving out the
// read-only ones (IsMountPoint, DiskFormat, MountRefs): what changed the
// mount table, in order.
func (m *Mounter) CallStrings() []string {
	var out []string
	for _, c := range m.Calls() {
		switch c.Op {
		case "IsMountPoint", "DiskFormat", "MountRefs":
			continue
		}
		out = append(out, c.String())
	}
	return out
}

// begin records c and returns the fault that applies to it, if any. The
// caller holds m.mu.
func (m *Mounter) begin(c Call) *Fault {
	m.calls = append(m.calls, c)
	for i, f := range m.faults {
		if f.Op != c.Op || (f.Target != "" && filepath.Clean(f.Target) != filepath.Clean(c.Target)) {
			continue
		}
		if f.Times > 0 {
			if f.Times--; f.Times == 0 {
				m.faults = slices.Delete(m.faults, i, i+1)
			}
		}
		return f
	}
	return nil
}

// IsMountPoint implements plugins.Mounter.
func (m *Mounter) IsMountPoint(path string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.begin(Call{Op: "IsMountPoint", Target: path}); f != nil {
		return false, f.Err
	}
	return len(m.table[filepath.Clean(path)]) > 0, nil
}

// mountOn stacks a mount on target, which must exist. The caller holds
// m.mu.
func (m *Mounter) mountOn(c Call, source string) error {
	f := m.begin(c)
	if f != nil && !f.Applied {
		return f.Err
	}
	if _, err := os.Lstat(c.Target); err != nil {
		return &os.PathError{Op: "mount", Path: c.Target, Err: unix.ENOENT}
	}
	t := filepath.Clean(c.Target)
	m.table[t] = append(m.table[t], mount{source: source})
	if f != nil {
		return f.Err
	}
	return nil
}

// MountTmpfs implements plugins.Mounter.
// A resize changes the tmpfs at target, which must be mounted, and mounts
// nothing new.
func (m *Mounter) MountTmpfs(target string, o mountutil.TmpfsOptions) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := Call{Op: "MountTmpfs", Target: target, Tmpfs: o}
	if !o.Resize {
		return m.mountOn(c, "tmpfs")
	}
	if f := m.begin(c); f != nil {
		return f.Err
	}
	if len(m.table[filepath.Clean(target)]) == 0 {
		return &os.PathError{Op: "resize tmpfs", Path: target, Err: unix.EINVAL}
	}
	return nil
}

// BindMount implements plugins.Mounter.
// A source naming an open descriptor (/proc/self/fd/N, what plugins mount
// from after resolving a node path safely) is recorded as the path it
// holds, as mount(2) would resolve it.
func (m *Mounter) BindMount(source, target string, o mountutil.BindOptions) error {
	if strings.HasPrefix(source, "/proc/self/fd/") {
		if p, err := os.Readlink(source); err == nil {
			source = p
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mountOn(Call{Op: "BindMount", Source: source, Target: target, Bind: o}, filepath.Clean(source))
}

// FormatAndMount implements plugins.Mounter. Like the real one it formats
// only a device without a filesystem and refuses one with another.
func (m *Mounter) FormatAndMount(device, target, fsType string, options []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := Call{Op: "FormatAndMount", Source: device, Target: target, FSType: fsType, Options: slices.Clone(options)}
	if existing := m.formats[device]; existing != "" && existing != fsType {
		m.calls = append(m.calls, c)
		return fmt.Errorf("device %s is formatted as %s, not %s, and is never reformatted", device, existing, fsType)
	}
	if err := m.mountOn(c, device); err != nil {
		return err
	}
	m.formats[device] = fsType
	return nil
}

// unmount pops every mount stacked on target. The caller holds m.mu.
func (m *Mounter) unmount(c Call) error {
	f := m.begin(c)
	if f != nil && !f.Applied {
		return f.Err
	}
	delete(m.table, filepath.Clean(c.Target))
	if f != nil {
		return f.Err
	}
	return nil
}

// Unmount implements plugins.Mounter: it pops the top mount on target.
func (m *Mounter) Unmount(target string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.begin(Call{Op: "Unmount", Target: target})
	if f != nil && !f.Applied {
		return f.Err
	}
	t := filepath.Clean(target)
	if n := len(m.table[t]); n > 1 {
		m.table[t] = m.table[t][:n-1]
	} else {
		delete(m.table, t)
	}
	if f != nil {
		return f.Err
	}
	return nil
}

// UnmountAll implements plugins.Mounter.
func (m *Mounter) UnmountAll(target string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.unmount(Call{Op: "UnmountAll", Target: target})
}

// UnmountTree implements plugins.Mounter.
func (m *Mounter) UnmountTree(target string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unmount(Call{Op: "UnmountTree", Target: target}); err != nil {
		return err
	}
	prefix := filepath.Clean(target) + "/"
	for p := range m.table {
		if strings.HasPrefix(p, prefix) {
			delete(m.table, p)
		}
	}
	return nil
}

// DiskFormat implements plugins.Mounter.
func (m *Mounter) DiskFormat(device string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.begin(Call{Op: "DiskFormat", Target: device}); f != nil {
		return "", f.Err
	}
	return m.formats[device], nil
}

// MountRefs implements plugins.Mounter: the other mount points whose
// source is path, or path's own source.
func (m *Mounter) MountRefs(path string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.begin(Call{Op: "MountRefs", Target: path}); f != nil {
		return nil, f.Err
	}
	path = filepath.Clean(path)
	sources := map[string]bool{path: true}
	for _, mt := range m.table[path] {
		sources[mt.source] = true
	}
	var refs []string
	for p, ms := range m.table {
		if p == path {
			continue
		}
		for _, mt := range ms {
			if sources[mt.source] {
				refs = append(refs, p)
				break
			}
		}
	}
	slices.Sort(refs)
	return refs, nil
}

// Attributes asks p about spec until it answers: while a plugin looks at
// the host in the background (plugins.ErrNotReady), polling, with a
// deadline.
func Attributes(t testing.TB, p plugins.Plugin, spec *volume.Spec) (volume.Attributes, error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, err := p.Attributes(spec)
		if !errors.Is(err, plugins.ErrNotReady) {
			return a, err
		}
		if time.Now().After(deadline) {
			t.Fatalf("Attributes(%s) not ready after 10s", spec.Name)
		}
		time.Sleep(time.Millisecond)
	}
}
