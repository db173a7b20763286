package atomicfile_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/volume-agent/volume-agent/internal/atomicfile"
)

type state struct {
	Volume string `json:"volume"`
	N      int    `json:"n"`
}

// entries lists the names in dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func TestWriteAndRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b") // made by WriteJSON
	path := filepath.Join(dir, "state.json")
	for n := range 3 {
		want := state{Volume: "pv-1", N: n}
		if err := atomicfile.WriteJSON(path, want); err != nil {
			t.Fatalf("WriteJSON #%d: %v", n, err)
		}
		var got state
		if err := atomicfile.ReadJSON(path, &got); err != nil || got != want {
			t.Fatalf("ReadJSON #%d = %+v, %v; want %+v", n, got, err, want)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(data), "}\n") || !strings.Contains(string(data), "\n  \"volume\": \"pv-1\"") {
		t.Errorf("file content %q: want indented JSON ending in a newline", data)
	}
	// Nothing but the file: no temporary left behind.
	if got := entries(t, dir); !slices.Equal(got, []string{"state.json"}) {
		t.Errorf("directory holds %v, want only state.json", got)
	}
	// State files are the agent's: nobody else may read them.
	if info, err := os.Stat(path); err != nil || info.Mode().Perm()&0o077 != 0 {
		t.Errorf("state file mode %v, %v: want no access for group and others", info.Mode(), err)
	}
}

// A write that fails leaves the old content, and no debris.
func TestFailedWriteKeepsOldContent(t *testing.T) {
	cases := []struct {
		name  string
		write func(path string) error
	}{
		{"value that is not JSON", func(path string) error { return atomicfile.WriteJSON(path, map[string]any{"c": make(chan int)}) }},
		{"rename refused", func(path string) error {
			// A non-empty directory in the way of the rename.
			if err := os.MkdirAll(filepath.Join(path+".d", "x"), 0o750); err != nil {
				return err
			}
			return atomicfile.Write(path+".d", []byte("new"))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state.json")
			if err := atomicfile.WriteJSON(path, state{Volume: "old"}); err != nil {
				t.Fatal(err)
			}
			before := entries(t, dir)
			if err := c.write(path); err == nil {
				t.Fatal("write succeeded")
			}
			var got state
			if err := atomicfile.ReadJSON(path, &got); err != nil || got.Volume != "old" {
				t.Errorf("after a failed write: %+v, %v; want the old content", got, err)
			}
			for _, name := range entries(t, dir) {
				if atomicfile.IsTemp(name) {
					t.Errorf("debris %s left (directory before: %v)", name, before)
				}
			}
		})
	}
}

// Concurrent writers never tear the file: it always holds one complete
// write.
func TestConcurrentWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				if err := atomicfile.WriteJSON(path, state{Volume: strings.Repeat("v", 100*w), N: i}); err != nil {
					errs <- err
					return
				}
				var got state
				if err := atomicfile.ReadJSON(path, &got); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := entries(t, filepath.Dir(path)); !slices.Equal(got, []string{"state.json"}) {
		t.Errorf("directory holds %v, want only state.json", got)
	}
}

func TestReadErrors(t *testing.T) {
	dir := t.TempDir()
	var v state
	err := atomicfile.ReadJSON(filepath.Join(dir, "missing.json"), &v)
	if !errors.Is(err, atomicfile.ErrNotExist) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
	corrupt := filepath.Join(dir, "corrupt.json")
	if err := os.WriteFile(corrupt, []byte(`{"volume": "pv-`), 0o600); err != nil {
		t.Fatal(err)
	}
	err = atomicfile.ReadJSON(corrupt, &v)
	var syntax *json.SyntaxError
	if !errors.As(err, &syntax) || errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), corrupt+" is corrupt") {
		t.Errorf("corrupt file: %v, want a JSON syntax error naming the file as corrupt", err)
	}
	// A file too large for a state file is refused, not read whole: valid
	// JSON (a string of spaces) just over the limit.
	huge := filepath.Join(dir, "huge.json")
	if err := os.WriteFile(huge, []byte(`{"volume": "`+strings.Repeat(" ", atomicfile.MaxJSONSize)+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.ReadJSON(huge, &v); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a file over %d bytes: %v", atomicfile.MaxJSONSize, err)
	}
}

func TestTemps(t *testing.T) {
	for name, want := range map[string]bool{
		".state.json.tmp-123456":              true,
		".state.json" + atomicfile.TempMarker: true,
		"state.json":                          false,
		"state.json.tmp-1":                    false, // not hidden: not one of ours
		".hidden":                             false,
		".tmp":                                false,
	} {
		if got := atomicfile.IsTemp(name); got != want {
			t.Errorf("IsTemp(%q) = %v, want %v", name, got, want)
		}
	}

	// An interrupted write leaves a temporary next to the intact file;
	// RemoveTemps removes such files and nothing else.
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := atomicfile.WriteJSON(path, state{Volume: "kept"}); err != nil {
		t.Fatal(err)
	}
	write := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(`{"volume": "to`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(".state.json.tmp-42")
	write(".hidden")
	if err := os.Mkdir(filepath.Join(dir, ".dir.tmp-1"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, ".link.tmp-2")); err != nil {
		t.Fatal(err)
	}
	atomicfile.RemoveTemps(dir)
	if got, want := entries(t, dir), []string{".dir.tmp-1", ".hidden", ".link.tmp-2", "state.json"}; !slices.Equal(got, want) {
		t.Errorf("after RemoveTemps: %v, want %v", got, want)
	}
	var got state
	if err := atomicfile.ReadJSON(path, &got); err != nil || got.Volume != "kept" {
		t.Errorf("state after an interrupted write: %+v, %v", got, err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Errorf("a symlink's target was touched: %v", err)
	}
	atomicfile.RemoveTemps(filepath.Join(dir, "missing")) // no panic, nothing to do
}

func TestRemove(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := atomicfile.WriteJSON(path, state{}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // the second time it is gone already
		if err := atomicfile.Remove(path); err != nil {
			t.Errorf("Remove #%d: %v", i+1, err)
		}
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("file still there: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "full", "x"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Remove(filepath.Join(dir, "full")); err == nil {
		t.Error("Remove of a non-empty directory succeeded")
	}
}
