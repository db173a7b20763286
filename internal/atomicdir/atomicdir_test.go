package atomicdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

func ptr[T any](v T) *T { return &v }

// files is a payload as plain strings with mode 0644, for brevity.
func files(kv ...string) Payload {
	p := Payload{}
	for i := 0; i < len(kv); i += 2 {
		p[kv[i]] = File{Data: []byte(kv[i+1]), Mode: 0o644}
	}
	return p
}

// visible reads what a pod sees at each of the given paths: the content,
// or "<absent>".
func visible(t *testing.T, dir string, paths []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range paths {
		data, err := os.ReadFile(filepath.Join(dir, p))
		switch {
		case err == nil:
			out[p] = string(data)
		case errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOTDIR):
			out[p] = "<absent>"
		default:
			t.Fatalf("read %s: %v", p, err)
		}
	}
	return out
}

func expected(p Payload, paths []string) map[string]string {
	out := map[string]string{}
	for _, k := range paths {
		if f, ok := p[k]; ok {
			out[k] = string(f.Data)
		} else {
			out[k] = "<absent>"
		}
	}
	return out
}

func keys(ps ...Payload) []string {
	var out []string
	for _, p := range ps {
		for k := range p {
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

// entries lists the volume directory: names, with "->target" for links.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		n := de.Name()
		if strings.HasPrefix(n, "..") && n != dataLink {
			n = "..<ts>"
		}
		if de.Type()&os.ModeSymlink != 0 {
			target, _ := os.Readlink(filepath.Join(dir, de.Name()))
			if n == dataLink {
				target = "..<ts>"
			}
			n += "->" + target
		}
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func mustWrite(t *testing.T, dir string, p Payload, o Options) bool {
	t.Helper()
	changed, err := Write(dir, p, o)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	return changed
}

func TestWriteAndUpdate(t *testing.T) {
	tests := []struct {
		name        string
		first, next Payload
		wantChanged bool
		wantEntries []string
	}{
		{
			name:        "unchanged payload writes nothing",
			first:       files("a", "1", "b/c", "2"),
			next:        files("a", "1", "b/c", "2"),
			wantEntries: []string{"..<ts>", "..data->..<ts>", "a->..data/a", "b->..data/b"},
		},
		{
			name:        "changed value",
			first:       files("a", "1"),
			next:        files("a", "2"),
			wantChanged: true,
			wantEntries: []string{"..<ts>", "..data->..<ts>", "a->..data/a"},
		},
		{
			name:        "key removed: its link goes",
			first:       files("a", "1", "b", "2"),
			next:        files("a", "1"),
			wantChanged: true,
			wantEntries: []string{"..<ts>", "..data->..<ts>", "a->..data/a"},
		},
		{
			name:        "nested key removed, sibling stays",
			first:       files("d/e/f", "1", "d/g", "2"),
			next:        files("d/g", "2"),
			wantChanged: true,
			wantEntries: []string{"..<ts>", "..data->..<ts>", "d->..data/d"},
		},
		{
			name:        "key added",
			first:       files("a", "1"),
			next:        files("a", "1", "x/y/z", "3"),
			wantChanged: true,
			wantEntries: []string{"..<ts>", "..data->..<ts>", "a->..data/a", "x->..data/x"},
		},
		{
			name:        "everything removed",
			first:       files("a", "1"),
			next:        Payload{},
			wantChanged: true,
			wantEntries: []string{"..<ts>", "..data->..<ts>"},
		},
		{
			name:        "mode change alone is a change",
			first:       Payload{"a": {Data: []byte("1"), Mode: 0o644}},
			next:        Payload{"a": {Data: []byte("1"), Mode: 0o400}},
			wantChanged: true,
			wantEntries: []string{"..<ts>", "..data->..<ts>", "a->..data/a"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if !mustWrite(t, dir, tt.first, Options{}) {
				t.Fatal("first write reported no change")
			}
			before, _ := os.Readlink(filepath.Join(dir, dataLink))
			if got := mustWrite(t, dir, tt.next, Options{}); got != tt.wantChanged {
				t.Errorf("changed = %v, want %v", got, tt.wantChanged)
			}
			after, _ := os.Readlink(filepath.Join(dir, dataLink))
			if (before != after) != tt.wantChanged {
				t.Errorf("..data moved from %s to %s, want moved=%v", before, after, tt.wantChanged)
			}
			all := keys(tt.first, tt.next)
			if got, want := visible(t, dir, all), expected(tt.next, all); !equalMaps(got, want) {
				t.Errorf("visible = %v, want %v", got, want)
			}
			if got := entries(t, dir); !slices.Equal(got, tt.wantEntries) {
				t.Errorf("entries = %v, want %v", got, tt.wantEntries)
			}
		})
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestModes(t *testing.T) {
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	dir := t.TempDir()
	p := Payload{
		"default":    {Data: []byte("x"), Mode: 0o644},
		"private":    {Data: []byte("x"), Mode: 0o400},
		"exec":       {Data: []byte("x"), Mode: 0o755},
		"deep/a/b/c": {Data: []byte("x"), Mode: 0o600},
	}
	mustWrite(t, dir, p, Options{})
	for name, f := range p {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != f.Mode {
			t.Errorf("%s: mode %#o, want %#o (umask must not apply)", name, st.Mode().Perm(), f.Mode)
		}
	}
	target, _ := os.Readlink(filepath.Join(dir, dataLink))
	for _, d := range []string{target, target + "/deep", target + "/deep/a/b"} {
		st, err := os.Stat(filepath.Join(dir, d))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o755 {
			t.Errorf("%s: mode %#o, want 0755", d, st.Mode().Perm())
		}
	}
}

func TestFSGroupAndOwner(t *testing.T) {
	mounttest.RequireRoot(t) // changing a file's group to an arbitrary fsGroup
	dir := t.TempDir()
	p := Payload{
		"a":     {Data: []byte("x"), Mode: 0o400},
		"b/c":   {Data: []byte("x"), Mode: 0o600},
		"token": {Data: []byte("x"), Mode: 0o600, UID: ptr[int64](1234)},
	}
	mustWrite(t, dir, p, Options{FSGroup: ptr[int64](4321)})
	want := map[string]struct {
		mode os.FileMode
		uid  uint32
	}{"a": {0o440, 0}, "b/c": {0o640, 0}, "token": {0o640, 1234}}
	for name, w := range want {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if st.Mode().Perm() != w.mode || sys.Gid != 4321 || sys.Uid != w.uid {
			t.Errorf("%s: mode %#o uid %d gid %d, want %#o uid %d gid 4321", name, st.Mode().Perm(), sys.Uid, sys.Gid, w.mode, w.uid)
		}
	}
	for _, d := range []string{".", "b"} {
		st, err := os.Stat(filepath.Join(dir, d))
		if err != nil {
			t.Fatal(err)
		}
		if st.Sys().(*syscall.Stat_t).Gid != 4321 || st.Mode()&os.ModeSetgid == 0 || st.Mode().Perm()&0o550 != 0o550 {
			t.Errorf("directory %s: mode %v gid %d, want setgid, group r-x, gid 4321", d, st.Mode(), st.Sys().(*syscall.Stat_t).Gid)
		}
	}
	// The same payload with the same group is unchanged: modes and owners
	// are compared as written.
	if mustWrite(t, dir, p, Options{FSGroup: ptr[int64](4321)}) {
		t.Error("rewriting the same payload with the same fsGroup changed something")
	}
	if !mustWrite(t, dir, p, Options{FSGroup: ptr[int64](999)}) {
		t.Error("a new fsGroup must rewrite")
	}
}

func TestInvalidPaths(t *testing.T) {
	long := strings.Repeat("x", 256)
	tests := []struct {
		name string
		p    Payload
		want string
	}{
		{"absolute", files("/etc/passwd", "x"), "absolute"},
		{"dot-dot", files("../x", "x"), "'..'"},
		{"dot-dot inside", files("a/../../x", "x"), "'..'"},
		{"writer's own name", files("..data", "x"), "starts with '..'"},
		{"hidden prefix", files("..2020/x", "x"), "starts with '..'"},
		{"writer's own name, spelt another way", files("./..data", "x"), "starts with '..'"},
		{"a data directory's name, spelt another way", files("a/.././..2030_01_01_00_00_00.0/x", "x"), "'..'"},
		{"a data directory's name after a dot", files(".//./..2030_01_01_00_00_00.0/x", "x"), "starts with '..'"},
		{"empty", files("", "x"), "empty"},
		{"only dot", files(".", "x"), "volume itself"},
		{"long element", files("a/"+long, "x"), "longer than 255"},
		{"long path", files(strings.Repeat("a/", 2049), "x"), "longer than 4096"},
		{"file and directory", files("a", "1", "a/b", "2"), "conflict"},
		{"two spellings", files("a/b", "1", "a//b", "2"), "conflict"},
		{"mode bits", Payload{"a": {Mode: 0o4755}}, "beyond 0777"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			mustWrite(t, dir, files("keep", "old"), Options{})
			_, err := Write(dir, tt.p, Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
			if got := visible(t, dir, []string{"keep"}); got["keep"] != "old" {
				t.Errorf("a refused payload changed the volume: %v", got)
			}
		})
	}
}

func TestNeverFollowsLinksOnDisk(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("outside"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("a link in the data directory is replaced, not read or written through", func(t *testing.T) {
		dir := t.TempDir()
		mustWrite(t, dir, files("a", "1"), Options{})
		target, _ := os.Readlink(filepath.Join(dir, dataLink))
		if err := os.Remove(filepath.Join(dir, target, "a")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(secret, filepath.Join(dir, target, "a")); err != nil {
			t.Fatal(err)
		}
		if !mustWrite(t, dir, files("a", "1"), Options{}) {
			t.Error("a link where a file belongs must count as a change")
		}
		if got := visible(t, dir, []string{"a"}); got["a"] != "1" {
			t.Errorf("visible %v", got)
		}
		if data, _ := os.ReadFile(secret); string(data) != "outside" {
			t.Errorf("the file outside was changed: %q", data)
		}
	})
	t.Run("..data pointing outside is replaced", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Symlink(outside, filepath.Join(dir, dataLink)); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, dir, files("secret", "mine"), Options{})
		if got := visible(t, dir, []string{"secret"}); got["secret"] != "mine" {
			t.Errorf("visible %v", got)
		}
		if data, _ := os.ReadFile(secret); string(data) != "outside" {
			t.Errorf("the file outside was changed: %q", data)
		}
	})
	t.Run("..data as a directory is replaced", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, dataLink, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, dir, files("a", "1"), Options{})
		if got := visible(t, dir, []string{"a"}); got["a"] != "1" {
			t.Errorf("visible %v", got)
		}
	})
	t.Run("a foreign top-level link is neither followed nor removed", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Symlink(outside, filepath.Join(dir, "x")); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, dir, files("x/secret", "mine", "y", "1"), Options{})
		mustWrite(t, dir, files("y", "2"), Options{})
		if data, _ := os.ReadFile(secret); string(data) != "outside" {
			t.Errorf("the file outside was changed: %q", data)
		}
		target, _ := os.Readlink(filepath.Join(dir, "x"))
		if target != outside {
			t.Errorf("foreign link now points at %q", target)
		}
	})
}

// TestCrashAtEveryStep stops an update after each step, as a crash would,
// and checks that the pod sees the complete old or the complete new set,
// then that the next Write finishes the update and leaves no debris.
func TestCrashAtEveryStep(t *testing.T) {
	transitions := []struct {
		name      string
		old, next Payload
	}{
		{"first write", nil, files("a", "1", "n/m", "2")},
		{"update, add and remove keys", files("a", "1", "gone", "x", "d/gone", "y", "d/stay", "s"), files("a", "2", "new/k", "3", "d/stay", "s2")},
	}
	for _, tr := range transitions {
		for _, step := range Steps() {
			t.Run(tr.name+"/after "+step.String(), func(t *testing.T) {
				dir := t.TempDir()
				if tr.old != nil {
					mustWrite(t, dir, tr.old, Options{})
				}
				all := keys(tr.old, tr.next)
				crashed := errors.New("crash")
				_, err := Write(dir, tr.next, Options{AfterStep: func(s Step) error {
					if s == step {
						return crashed
					}
					return nil
				}})
				if !errors.Is(err, crashed) {
					t.Fatalf("Write did not stop after %s: %v", step, err)
				}
				got := visible(t, dir, all)
				if !equalMaps(got, expected(tr.old, all)) && !equalMaps(got, expected(tr.next, all)) {
					t.Fatalf("after a crash at %s the pod sees a mix:\n got  %v\n old  %v\n new  %v", step, got, expected(tr.old, all), expected(tr.next, all))
				}
				mustWrite(t, dir, tr.next, Options{})
				if got, want := visible(t, dir, all), expected(tr.next, all); !equalMaps(got, want) {
					t.Errorf("after recovery: %v, want %v", got, want)
				}
				tsDirs := 0
				for _, e := range entries(t, dir) {
					if e == "..<ts>" {
						tsDirs++
					}
					if strings.HasPrefix(e, dataTmpLink) {
						t.Errorf("debris left: %s", e)
					}
				}
				if tsDirs != 1 {
					t.Errorf("%d data directories left, want 1: %v", tsDirs, entries(t, dir))
				}
				if mustWrite(t, dir, tr.next, Options{}) {
					t.Error("writing the same payload after recovery changed something")
				}
			})
		}
	}
}

func TestDataDirectoryName(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 22, 10, 0, 5, 0, time.UTC)
	mustWrite(t, dir, files("a", "1"), Options{Now: func() time.Time { return now }})
	target, err := os.Readlink(filepath.Join(dir, dataLink))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(target, "..2026_11_22_10_00_05.") {
		t.Errorf("data directory %q, want the kubelet's ..<UTC timestamp>.<n>", target)
	}
}

// A refresh whose sources did not change: compare and write nothing.
func BenchmarkWriteUnchanged(b *testing.B) {
	dir := b.TempDir()
	p := Payload{}
	for i := range 10 {
		p[fmt.Sprintf("key-%d", i)] = File{Data: []byte(strings.Repeat("x", 1024)), Mode: 0o644}
	}
	if _, err := Write(dir, p, Options{}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if changed, err := Write(dir, p, Options{}); err != nil || changed {
			b.Fatal(changed, err)
		}
	}
}

// An update of one key of ten: new data directory, swap, old one removed.
func BenchmarkWriteChanged(b *testing.B) {
	dir := b.TempDir()
	p := Payload{}
	for i := range 10 {
		p[fmt.Sprintf("key-%d", i)] = File{Data: []byte(strings.Repeat("x", 1024)), Mode: 0o644}
	}
	b.ResetTimer()
	for i := range b.N {
		p["key-0"] = File{Data: []byte(fmt.Sprint(i)), Mode: 0o644}
		if _, err := Write(dir, p, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

func TestMakeDirsForNestedMounts(t *testing.T) {
	dir := t.TempDir()
	if err := MakeDirs(dir, []string{"nested", "deep/er"}); err != nil {
		t.Fatal(err)
	}
	// A key of the same top-level name is shadowed by the mount point.
	mustWrite(t, dir, files("nested", "key", "deep/x", "y", "other", "z"), Options{})
	for _, d := range []string{"nested", "deep/er"} {
		if st, err := os.Lstat(filepath.Join(dir, d)); err != nil || !st.IsDir() {
			t.Errorf("%s: %v, %v; want a directory", d, st, err)
		}
	}
	if got := visible(t, dir, []string{"other"}); got["other"] != "z" {
		t.Errorf("other = %q", got["other"])
	}
	// Updates keep the mount points; MakeDirs again is a no-op.
	mustWrite(t, dir, files("other", "z2"), Options{})
	if err := MakeDirs(dir, []string{"nested", "deep/er"}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(filepath.Join(dir, "deep", "er")); err != nil || !st.IsDir() {
		t.Errorf("deep/er after an update: %v, %v", st, err)
	}

	// Never through a link, never outside.
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := MakeDirs(dir, []string{"link/x"}); err == nil {
		t.Error("MakeDirs followed a link")
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("created outside the volume: %v", entries)
	}
	if err := MakeDirs(dir, []string{"../escape"}); err == nil {
		t.Error("MakeDirs accepted '..'")
	}
}
