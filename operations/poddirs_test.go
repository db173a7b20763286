package operations

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestPodDirsEnsure(t *testing.T) {
	tests := []struct {
		name string
		// prepare runs on root before ensure; dir is relative to root.
		prepare   func(t *testing.T, root string)
		dir       string
		wantDir   bool // dir exists afterwards
		wantKnown bool
		// beside: dir is relative to root's parent instead.
		beside bool
	}{
		{name: "whole chain made", dir: "u1/volumes/kubernetes.io~empty-dir", wantDir: true, wantKnown: true},
		{name: "part exists", prepare: func(t *testing.T, root string) {
			mkdirAll(t, filepath.Join(root, "u1/volumes"))
		}, dir: "u1/volumes/kubernetes.io~empty-dir", wantDir: true, wantKnown: true},
		{name: "all exist", prepare: func(t *testing.T, root string) {
			mkdirAll(t, filepath.Join(root, "u1/volumes/kubernetes.io~empty-dir"))
		}, dir: "u1/volumes/kubernetes.io~empty-dir", wantDir: true, wantKnown: true},
		{name: "file in the way: nothing remembered", prepare: func(t *testing.T, root string) {
			mkdirAll(t, filepath.Join(root, "u1"))
			if err := os.WriteFile(filepath.Join(root, "u1/volumes"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, dir: "u1/volumes/kubernetes.io~empty-dir", wantDir: false, wantKnown: false},
		{name: "not below root: nothing done", dir: "../elsewhere/x", wantDir: false, wantKnown: false},
		{name: "beside root: nothing done", dir: "elsewhere/x", beside: true},
		{name: "beside root, named like it: nothing done", dir: "podsx/u1", beside: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			root := filepath.Join(base, "pods")
			mkdirAll(t, root)
			if tt.prepare != nil {
				tt.prepare(t, root)
			}
			dir := root + "/" + tt.dir // as given, not cleaned
			if tt.beside {
				dir = base + "/" + tt.dir
				mkdirAll(t, base+"/elsewhere")
			}
			var d podDirs
			d.ensure(root, dir)
			fi, err := os.Stat(dir)
			if got := err == nil && fi.IsDir(); got != tt.wantDir {
				t.Errorf("dir exists = %v, want %v (%v)", got, tt.wantDir, err)
			}
			if got := d.known(dir); got != tt.wantKnown {
				t.Errorf("known = %v, want %v", got, tt.wantKnown)
			}
			if tt.wantDir {
				for p := dir; p != root; p = filepath.Dir(p) {
					fi, err := os.Stat(p)
					if err != nil {
						t.Fatal(err)
					}
					if tt.prepare == nil && fi.Mode().Perm() != 0o750 {
						t.Errorf("%s: mode %v, want 0750", p, fi.Mode().Perm())
					}
				}
			}
		})
	}
}

// A hint is not trusted: a directory removed behind podDirs' back is not
// made again until forgotten, so the caller's own mkdir must cope (and
// does: mountutil.EnsureDir makes missing parents).
func TestPodDirsForget(t *testing.T) {
	root := filepath.Join(t.TempDir(), "pods")
	mkdirAll(t, root)
	dir := filepath.Join(root, "u1/volumes/p")
	var d podDirs
	d.ensure(root, dir)
	if err := os.RemoveAll(filepath.Join(root, "u1")); err != nil {
		t.Fatal(err)
	}
	d.ensure(root, dir)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("remembered directory made again without forget: %v", err)
	}
	d.forget(dir)
	d.ensure(root, dir)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("forgotten directory not made again: %v", err)
	}
}

func TestPodDirsConcurrent(t *testing.T) {
	root := filepath.Join(t.TempDir(), "pods")
	mkdirAll(t, root)
	var d podDirs
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			d.ensure(root, filepath.Join(root, "u"+string(rune('a'+i%4)), "volumes", "p"))
		})
	}
	wg.Wait()
	for i := range 4 {
		dir := filepath.Join(root, "u"+string(rune('a'+i)), "volumes", "p")
		if _, err := os.Stat(dir); err != nil || !d.known(dir) {
			t.Errorf("%s: %v, known %v", dir, err, d.known(dir))
		}
	}
}

func mkdirAll(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
}

// undo removes what ensure made and nothing that was there before it, nor
// anything that is no longer empty.
func TestPodDirsUndo(t *testing.T) {
	tests := []struct {
		name     string
		existing string // made before ensure, relative to root
		other    string // made after ensure, relative to root
		want     []string
		gone     []string
	}{
		{name: "all made: all removed", gone: []string{"u1"}},
		{name: "pod directory existed", existing: "u1", want: []string{"u1"}, gone: []string{"u1/volumes"}},
		{name: "another plugin's directory appeared", other: "u1/volumes/q", want: []string{"u1/volumes/q"}, gone: []string{"u1/volumes/p"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "pods")
			mkdirAll(t, root)
			if tt.existing != "" {
				mkdirAll(t, filepath.Join(root, tt.existing))
			}
			dir := filepath.Join(root, "u1/volumes/p")
			var d podDirs
			top := d.ensure(root, dir)
			if tt.other != "" {
				mkdirAll(t, filepath.Join(root, tt.other))
			}
			d.undo(dir, top)
			for _, w := range tt.want {
				if _, err := os.Stat(filepath.Join(root, w)); err != nil {
					t.Errorf("%s: %v, want it kept", w, err)
				}
			}
			for _, g := range tt.gone {
				if _, err := os.Stat(filepath.Join(root, g)); !os.IsNotExist(err) {
					t.Errorf("%s: %v, want it removed", g, err)
				}
			}
			if d.known(dir) {
				t.Error("still known after undo")
			}
			if _, err := os.Stat(root); err != nil {
				t.Errorf("root: %v", err)
			}
		})
	}
}

// known reports whether d remembers making dir.
func (d *podDirs) known(dir string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.dirs[dir]
	return ok
}
