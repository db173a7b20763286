package trash_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/safefs"
	"github.com/volume-agent/volume-agent/internal/trash"
)

func write(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func TestRemoveAll(t *testing.T) {
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "trash")
	for _, tc := range []struct {
		name  string
		setup func(dir string)
	}{
		{"missing", func(string) {}},
		{"empty", func(dir string) {
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{"full", func(dir string) {
			write(t, filepath.Join(dir, "a", "b", "c"))
			write(t, filepath.Join(dir, "d"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(tmp, tc.name)
			tc.setup(dir)
			if err := trash.RemoveAll(context.Background(), bin, dir, "pod/"+tc.name); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still there: %v", dir, err)
			}
			if left := entries(t, bin); len(left) != 0 {
				t.Errorf("left in the trash: %v", left)
			}
		})
	}
}

// Another mount inside the directory: the removal fails, and what is left
// (the path to the mount, and the mount with its data) is back where it
// was, for the caller to retry and report.
func TestRemoveAllPutsBackWhatItCannotRemove(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	bin := filepath.Join(tmp, "trash")
	dir := filepath.Join(tmp, "vol")
	write(t, filepath.Join(dir, "mine"))
	inner := filepath.Join(dir, "sub", "mnt")
	if err := os.MkdirAll(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	mounttest.MountTmpfs(t, inner)
	write(t, filepath.Join(inner, "theirs"))

	err := trash.RemoveAll(context.Background(), bin, dir, "vol")
	if !errors.Is(err, safefs.ErrMountPointInside) {
		t.Fatalf("RemoveAll = %v, want ErrMountPointInside", err)
	}
	if ms := mounttest.MountsAt(t, inner); len(ms) != 1 {
		t.Errorf("the mount inside is not where it was: %+v", ms)
	}
	if _, err := os.Stat(filepath.Join(inner, "theirs")); err != nil {
		t.Errorf("data on the mount inside: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "mine")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the rest was not removed: %v", err)
	}
	if left := entries(t, bin); len(left) != 0 {
		t.Errorf("left in the trash: %v", left)
	}
}

// The helper process removes $TRASH_TEST_DIR through $TRASH_TEST_BIN, slowly
// enough (one entry at a time is what a huge tree looks like) to be killed
// in the middle.
func TestRemoveHelperProcess(t *testing.T) {
	dir, bin := os.Getenv("TRASH_TEST_DIR"), os.Getenv("TRASH_TEST_BIN")
	if dir == "" {
		t.Skip("helper process for TestKilledInTheMiddle")
	}
	if err := trash.RemoveAll(context.Background(), bin, dir, "vol"); err != nil {
		t.Fatal(err)
	}
}

// An agent killed in the middle of removing a volume leaves nothing at the
// volume's path (a restart would take a half-removed directory there for a
// volume that is set up, and give it to a pod with the same UID); the next
// start finishes the removal from the trash.
func TestKilledInTheMiddle(t *testing.T) {
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "trash")
	dir := filepath.Join(tmp, "vol")
	const files = 20000
	for i := 0; i < files; i++ {
		write(t, filepath.Join(dir, fmt.Sprintf("d%d", i%100), fmt.Sprintf("file-%d", i)))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRemoveHelperProcess$")
	cmd.Env = append(os.Environ(), "TRASH_TEST_DIR="+dir, "TRASH_TEST_BIN="+bin)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill it once it is removing: the tree is in the trash and partly
	// gone. Polling, with a deadline.
	deadline := time.Now().Add(time.Minute)
	for {
		tree := dir
		if left := entries(t, bin); len(left) == 1 {
			tree = filepath.Join(bin, left[0])
		}
		if n := len(entries(t, tree)); n > 0 && n < 100 {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatal("the removal never got under way, or finished before it could be interrupted")
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a half-removed directory is at the volume's path: %v", err)
	}
	if left := trash.Empty(context.Background(), bin); len(left) != 0 {
		t.Fatalf("Empty left %+v", left)
	}
	if left := entries(t, bin); len(left) != 0 {
		t.Errorf("left in the trash: %v", left)
	}
}

func TestEmptyReportsWhatItCannotRemove(t *testing.T) {
	mounttest.RequireRoot(t)
	tmp := mounttest.TempDir(t)
	bin := filepath.Join(tmp, "trash")
	write(t, filepath.Join(bin, "a.1", "f"))
	write(t, filepath.Join(bin, "stray-file"))
	inner := filepath.Join(bin, "b.2", "mnt")
	if err := os.MkdirAll(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	mounttest.MountTmpfs(t, inner)
	write(t, filepath.Join(inner, "theirs"))
	left := trash.Empty(context.Background(), bin)
	if len(left) != 1 || left[0].Path != filepath.Join(bin, "b.2") || !errors.Is(left[0].Err, safefs.ErrMountPointInside) {
		t.Fatalf("Empty left %+v, want only b.2 (a mount inside)", left)
	}
	if got := strings.Join(entries(t, bin), ","); got != "b.2" {
		t.Errorf("trash holds %s, want b.2", got)
	}
}
