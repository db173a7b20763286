package mountutil

import (
	"path/filepath"
	"strings"
	"testing"
)

// The climb of RemoveEmptyDirs visits what the simple loop over
// filepath.Dir, bounded by HasPrefix(d, stop+"/"), visits.
func TestRemoveEmptyDirsClimb(t *testing.T) {
	simple := func(dir, stop string) []string {
		stop = filepath.Clean(stop)
		var out []string
		for d := filepath.Clean(dir); d != stop && strings.HasPrefix(d, stop+"/"); d = filepath.Dir(d) {
			out = append(out, d)
		}
		return out
	}
	fast := func(dir, stop string) []string {
		stop = filepath.Clean(stop)
		var out []string
		for d := filepath.Clean(dir); below(d, stop); d = d[:strings.LastIndexByte(d, '/')] {
			out = append(out, d)
		}
		return out
	}
	for _, c := range []struct{ dir, stop string }{
		{"/r/pods/u/volumes/p/v", "/r/pods"},
		{"/r/pods/u/volumes/p/v/", "/r/pods/"},
		{"/r/pods//u/./volumes/../volumes/p", "/r//pods"},
		{"/r/pods", "/r/pods"},
		{"/r/podsx/u", "/r/pods"},
		{"/r/pod", "/r/pods"},
		{"/a/b", "/"},
		{"/a", "/a/b"},
		{"a/b/c", "a"},
		{"/x/y", ""},
		{"", ""},
		{"/r/pods/u", "/r/pods/u/v"},
	} {
		got, want := fast(c.dir, c.stop), simple(c.dir, c.stop)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("climb %q to %q: %q, want %q", c.dir, c.stop, got, want)
		}
	}
}

func FuzzRemoveEmptyDirsClimb(f *testing.F) {
	f.Add("/r/pods/u/volumes/p/v", "/r/pods")
	f.Add("a/../b/c", "b")
	f.Fuzz(func(t *testing.T, dir, stop string) {
		stop = filepath.Clean(stop)
		d := filepath.Clean(dir)
		for i := 0; i < 64; i++ {
			want := d != stop && strings.HasPrefix(d, stop+"/")
			if got := below(d, stop); got != want {
				t.Fatalf("below(%q, %q) = %v, want %v", d, stop, got, want)
			}
			if !want {
				return
			}
			if next := d[:strings.LastIndexByte(d, '/')]; next != filepath.Dir(d) {
				t.Fatalf("parent of %q: %q, want %q", d, next, filepath.Dir(d))
			}
			d = filepath.Dir(d)
		}
	})
}
