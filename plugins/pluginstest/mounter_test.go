package pluginstest_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins/pluginstest"
)

// The fake must behave like the real mounter where plugins rely on it:
// mounts need an existing mount point, unmounting what is not mounted is
// done, UnmountAll peels stacked mounts, UnmountTree also what is below, a
// formatted device is never reformatted.
func TestMounterTable(t *testing.T) {
	root := t.TempDir()
	dir := func(name string) string {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
		return p
	}
	global, pod1, pod2, sub := dir("global"), dir("pod1"), dir("pod2"), dir("pod2/sub")
	m := pluginstest.NewMounter()

	if err := m.MountTmpfs(filepath.Join(root, "missing"), mountutil.TmpfsOptions{}); err == nil {
		t.Error("MountTmpfs on a missing mount point succeeded")
	}
	if err := m.FormatAndMount("/dev/x", global, "ext4", []string{"noatime"}); err != nil {
		t.Fatal(err)
	}
	if err := m.FormatAndMount("/dev/x", global, "xfs", nil); err == nil || !strings.Contains(err.Error(), "never reformatted") {
		t.Errorf("FormatAndMount of an ext4 device as xfs: %v, want a refusal", err)
	}
	if f, _ := m.DiskFormat("/dev/x"); f != "ext4" {
		t.Errorf("DiskFormat %q, want ext4", f)
	}
	for _, target := range []string{pod1, pod1} { // stacked twice
		if err := m.BindMount(global, target, mountutil.BindOptions{ReadOnly: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.BindMount(global, pod2, mountutil.BindOptions{Recursive: true}); err != nil {
		t.Fatal(err)
	}
	m.SetMounted("tmpfs", sub)

	if refs, _ := m.MountRefs(global); !slices.Equal(refs, []string{pod1, pod2}) {
		t.Errorf("MountRefs(global) = %v, want %v", refs, []string{pod1, pod2})
	}
	if refs, _ := m.MountRefs(pod1); !slices.Equal(refs, []string{pod2}) {
		t.Errorf("MountRefs(pod1) = %v, want [%s] (pod1's source is bound there too)", refs, pod2)
	}
	if err := m.UnmountAll(pod1); err != nil {
		t.Fatal(err)
	}
	if mounted, _ := m.IsMountPoint(pod1); mounted {
		t.Error("pod1 still mounted after UnmountAll")
	}
	if err := m.UnmountAll(pod1); err != nil {
		t.Errorf("UnmountAll of what is not mounted: %v", err)
	}
	if err := m.UnmountTree(pod2); err != nil {
		t.Fatal(err)
	}
	if got := m.Mounted(); !slices.Equal(got, []string{global}) {
		t.Errorf("mounted %v, want only %s", got, global)
	}
	want := []string{
		"FormatAndMount /dev/x " + global + " ext4 noatime",
		"FormatAndMount /dev/x " + global + " xfs",
		"BindMount " + global + " " + pod1 + " ro",
		"BindMount " + global + " " + pod1 + " ro",
		"BindMount " + global + " " + pod2 + " rec",
		"UnmountAll " + pod1,
		"UnmountAll " + pod1,
		"UnmountTree " + pod2,
	}
	// The failed MountTmpfs is recorded first.
	if got := m.CallStrings(); !slices.Equal(got[1:], want) || !strings.HasPrefix(got[0], "MountTmpfs ") {
		t.Errorf("calls:\n%s\nwant a MountTmpfs, then:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestMounterFaults(t *testing.T) {
	target := t.TempDir()
	boom := errors.New("boom")
	m := pluginstest.NewMounter()

	// Once, not applied: nothing mounted; the next call works.
	m.Fail(pluginstest.Fault{Op: "MountTmpfs", Target: target, Err: boom, Times: 1})
	if err := m.MountTmpfs(target, mountutil.TmpfsOptions{}); !errors.Is(err, boom) {
		t.Fatalf("first MountTmpfs: %v, want boom", err)
	}
	if len(m.Mounted()) != 0 {
		t.Errorf("mounted %v after a failed mount", m.Mounted())
	}
	if err := m.MountTmpfs(target, mountutil.TmpfsOptions{}); err != nil {
		t.Fatalf("second MountTmpfs: %v", err)
	}

	// Applied: unmounted, yet an error.
	m.Fail(pluginstest.Fault{Op: "UnmountAll", Err: boom, Applied: true})
	if err := m.UnmountAll(target); !errors.Is(err, boom) {
		t.Fatalf("UnmountAll: %v, want boom", err)
	}
	if len(m.Mounted()) != 0 {
		t.Errorf("mounted %v after an applied unmount", m.Mounted())
	}

	// Every call, on another target only.
	m.Fail(pluginstest.Fault{Op: "IsMountPoint", Target: "/elsewhere", Err: boom})
	for range 2 {
		if _, err := m.IsMountPoint("/elsewhere"); !errors.Is(err, boom) {
			t.Errorf("IsMountPoint(/elsewhere): %v, want boom", err)
		}
	}
	if _, err := m.IsMountPoint(target); err != nil {
		t.Errorf("IsMountPoint(%s): %v, want no fault", target, err)
	}
}
