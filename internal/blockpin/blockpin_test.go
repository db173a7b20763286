package blockpin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

// accessPoint bind-mounts dev onto a new file in dir, as the agent makes a
// pod's access point.
func accessPoint(t *testing.T, dir, name, dev string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev, path, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	return path
}

// pinsOf lists the loop devices backed by path.
func pinsOf(t *testing.T, l *Loops, path string) []string {
	t.Helper()
	ps, err := l.find(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range ps {
		out = append(out, p.loop)
	}
	return out
}

func TestLoopsPinHoldsTheDeviceAndIsIdempotent(t *testing.T) {
	mounttest.RequireRoot(t)
	dev := mounttest.LoopDevice(t, 8<<20)
	dir := mounttest.TempDir(t)
	l := &Loops{}
	a := accessPoint(t, dir, "a", dev)
	b := accessPoint(t, dir, "b", dev)
	t.Cleanup(func() { _, _ = l.Sweep(dir, func(string) bool { return false }) })

	for range 2 {
		if err := l.Pin(a); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Pin(b); err != nil {
		t.Fatal(err)
	}
	if got := pinsOf(t, l, a); len(got) != 1 {
		t.Fatalf("pins of %s: %v, want exactly one after pinning twice", a, got)
	}
	snap, err := l.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{a, b} {
		if ok, err := l.Pinned(p); err != nil || !ok {
			t.Errorf("Pinned(%s) = %v, %v", p, ok, err)
		}
		if ok, err := snap.Pinned(p); err != nil || !ok {
			t.Errorf("Snapshot.Pinned(%s) = %v, %v", p, ok, err)
		}
	}
	// The pin is read-only: writing through it fails.
	loop := "/dev/" + pinsOf(t, l, a)[0]
	if f, err := os.OpenFile(loop, os.O_WRONLY, 0); err == nil {
		if _, err := f.Write(make([]byte, 512)); err == nil {
			t.Errorf("wrote through %s; a pin must be read-only", loop)
		}
		f.Close()
	}
	// The pin keeps the device open: the access point's mount is busy.
	if err := unix.Unmount(a, 0); !errors.Is(err, unix.EBUSY) {
		t.Errorf("unmounting a pinned access point: %v, want EBUSY", err)
	}

	if err := l.Unpin(a); err != nil {
		t.Fatal(err)
	}
	if ok, _ := l.Pinned(a); ok {
		t.Errorf("%s still pinned after Unpin", a)
	}
	if ok, _ := l.Pinned(b); !ok {
		t.Errorf("Unpin(%s) released %s's pin too", a, b)
	}
	// Released at once: the access point unmounts right away.
	if err := unix.Unmount(a, 0); err != nil {
		t.Errorf("unmounting after Unpin: %v", err)
	}
	if err := l.Unpin(a); err != nil {
		t.Errorf("Unpin of an unpinned path: %v", err)
	}
}

func TestLoopsPinRefusesWhatIsNotABlockDevice(t *testing.T) {
	mounttest.RequireRoot(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	l := &Loops{}
	for _, p := range []string{file, link, filepath.Join(dir, "missing")} {
		if err := l.Pin(p); err == nil {
			t.Errorf("Pin(%s) succeeded", p)
		}
	}
}

func TestLoopsReplacesAStalePin(t *testing.T) {
	mounttest.RequireRoot(t)
	dev1 := mounttest.LoopDevice(t, 8<<20)
	dev2 := mounttest.LoopDevice(t, 8<<20)
	dir := mounttest.TempDir(t)
	l := &Loops{}
	t.Cleanup(func() { _, _ = l.Sweep(dir, func(string) bool { return false }) })
	// A driver may make the access point a device node of its own; if it
	// is replaced by a node of another device, the old pin (now backed by
	// a deleted file of the same path) holds the wrong device.
	a := filepath.Join(dir, "a")
	mknod := func(dev string) {
		var st unix.Stat_t
		if err := unix.Stat(dev, &st); err != nil {
			t.Fatal(err)
		}
		_ = os.Remove(a)
		if err := unix.Mknod(a, unix.S_IFBLK|0o600, int(st.Rdev)); err != nil {
			t.Skipf("skipping: cannot make a device node in %s: %v", dir, err)
		}
	}
	mknod(dev1)
	if err := l.Pin(a); err != nil {
		t.Fatal(err)
	}
	old := pinsOf(t, l, a)
	mknod(dev2)
	if ok, _ := l.Pinned(a); ok {
		t.Error("a pin of another device counts as pinned")
	}
	if err := l.Pin(a); err != nil {
		t.Fatal(err)
	}
	// The stale pin is gone (its number may be reused) and the new one
	// holds the new node's device.
	now := pinsOf(t, l, a)
	if len(old) != 1 || len(now) != 1 {
		t.Errorf("pins after re-pinning: %v (before %v), want exactly one", now, old)
	}
	if ok, err := l.Pinned(a); err != nil || !ok {
		t.Errorf("Pinned after re-pinning = %v, %v", ok, err)
	}
}

func TestLoopsSweep(t *testing.T) {
	mounttest.RequireRoot(t)
	dev := mounttest.LoopDevice(t, 8<<20)
	dir := mounttest.TempDir(t)
	l := &Loops{}
	t.Cleanup(func() { _, _ = l.Sweep(dir, func(string) bool { return false }) })
	keep := accessPoint(t, dir, "keep", dev)
	drop := accessPoint(t, dir, "drop", dev)
	for _, p := range []string{keep, drop} {
		if err := l.Pin(p); err != nil {
			t.Fatal(err)
		}
	}
	released, err := l.Sweep(dir, func(p string) bool { return p == keep })
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(released, ",") != drop {
		t.Errorf("swept %v, want [%s]", released, drop)
	}
	if ok, _ := l.Pinned(keep); !ok {
		t.Error("kept pin was released")
	}
}

func TestMemory(t *testing.T) {
	m := &Memory{Fail: map[string]error{"/bad": errors.New("boom")}}
	if err := m.Pin("/a"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := m.Pinned("/a"); !ok {
		t.Error("not pinned")
	}
	if err := m.Pin("/bad"); err == nil {
		t.Error("Pin(/bad) succeeded")
	}
	if err := m.Unpin("/a"); err != nil {
		t.Fatal(err)
	}
	if len(m.Paths()) != 0 {
		t.Errorf("left: %v", m.Paths())
	}
}
