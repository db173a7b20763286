package oci

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// A directory built into a layout, resolved by its name and by digest,
// unpacked: the same files, links kept as links; a second build of the
// same files is the same image.
func TestBuildResolveUnpack(t *testing.T) {
	src, layout := t.TempDir(), t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "etc", "greeting"), []byte("hello from an image\n"), 0o644))
	must(t, os.Symlink("etc/greeting", filepath.Join(src, "link")))
	desc, err := Build(src, layout, "example.local/greeting:v1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(src, layout, "example.local/greeting:v1")
	if err != nil || again.Digest != desc.Digest {
		t.Fatalf("rebuilt %s (%v), want the same %s", again.Digest, err, desc.Digest)
	}
	for _, ref := range []string{"example.local/greeting:v1", "example.local/greeting@" + desc.Digest.String()} {
		got, err := Resolve(layout, ref)
		if err != nil || got.Digest != desc.Digest {
			t.Errorf("Resolve(%q) = %s, %v; want %s", ref, got.Digest, err, desc.Digest)
		}
	}
	if _, err := Resolve(layout, "example.local/greeting:v2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Resolve of an unknown tag: %v, want ErrNotFound", err)
	}
	dest := t.TempDir()
	if _, err := Unpack(t.Context(), layout, desc, dest, DefaultLimits); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "etc", "greeting")); err != nil || string(b) != "hello from an image\n" {
		t.Errorf("etc/greeting: %q, %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(dest, "link")); err != nil || l != "etc/greeting" {
		t.Errorf("link: %q, %v", l, err)
	}
}

// The cache unpacks an image once and follows the pull policy.
func TestCachePullPolicy(t *testing.T) {
	src, layout := t.TempDir(), t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "f"), []byte("v1"), 0o644))
	c := &Cache{Dir: t.TempDir(), Layout: layout}
	if _, err := Build(src, layout, "other:v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(t.Context(), "img:v1", "IfNotPresent"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an image not in the layout: %v", err)
	}
	if _, err := Build(src, layout, "img:v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(t.Context(), "img:v1", "Never"); err == nil || !strings.Contains(err.Error(), "not present") {
		t.Fatalf("Never before it is present: %v", err)
	}
	first, err := c.Get(t.Context(), "img:v1", "IfNotPresent")
	if err != nil {
		t.Fatal(err)
	}
	// The layout's image changes: IfNotPresent and Never keep the present
	// one, Always takes the new one.
	must(t, os.WriteFile(filepath.Join(src, "f"), []byte("v2"), 0o644))
	if _, err := Build(src, layout, "img:v1"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		policy, want string
	}{{"IfNotPresent", "v1"}, {"Never", "v1"}, {"Always", "v2"}, {"Never", "v2"}} {
		dir, err := c.Get(t.Context(), "img:v1", tc.policy)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != tc.want {
			t.Errorf("%s: f = %q, want %q", tc.policy, b, tc.want)
		}
	}
	if again, _ := c.Get(t.Context(), "img:v1", "IfNotPresent"); again == first {
		t.Errorf("still the first image after Always took the new one")
	}
}

// entry is one tar entry of a hostile layer.
type entry struct {
	typ      byte
	name     string
	link     string
	mode     int64
	body     string
	size     int64 // header size without a body (huge entries)
	devMajor int64
}

// layoutOf writes a layout whose image has the given layers (uncompressed
// tars) and returns its manifest's descriptor.
func layoutOf(t *testing.T, layers ...[]entry) (string, ocispec.Descriptor) {
	t.Helper()
	layout := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(layout, "blobs", "sha256"), 0o755))
	var descs []ocispec.Descriptor
	for _, l := range layers {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range l {
			h := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: e.mode, Size: int64(len(e.body)), Devmajor: e.devMajor}
			if h.Mode == 0 {
				h.Mode = 0o644
			}
			if e.size > 0 {
				h.Size = e.size
			}
			must(t, tw.WriteHeader(h))
			if e.body != "" {
				if _, err := tw.Write([]byte(e.body)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if l[len(l)-1].size == 0 {
			must(t, tw.Close())
		} else {
			tw.Flush() // a huge entry's body is never written
		}
		d, err := writeBlob(layout, ocispec.MediaTypeImageLayer, buf.Bytes())
		must(t, err)
		descs = append(descs, d)
	}
	cfg, err := writeBlob(layout, ocispec.MediaTypeImageConfig, []byte("{}"))
	must(t, err)
	m, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: cfg, Layers: descs})
	desc, err := writeBlob(layout, ocispec.MediaTypeImageManifest, m)
	must(t, err)
	return layout, desc
}

// Hostile layers: nothing is ever written outside the destination, no
// link is followed, no device node is made, sizes are bounded.
func TestUnpackHostileLayers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		layers  func(outside string) [][]entry
		limits  Limits
		wantErr string
		// check runs on the destination after the unpack.
		check func(t *testing.T, dest, outside string)
	}{{
		name:    "dot-dot entry",
		layers:  func(string) [][]entry { return [][]entry{{{typ: tar.TypeReg, name: "../escaped", body: "x"}}} },
		wantErr: `".." element`,
	}, {
		name:    "dot-dot inside a name",
		layers:  func(string) [][]entry { return [][]entry{{{typ: tar.TypeReg, name: "a/../../escaped", body: "x"}}} },
		wantErr: `".." element`,
	}, {
		name: "absolute symlink, then a write through it",
		layers: func(outside string) [][]entry {
			return [][]entry{{{typ: tar.TypeSymlink, name: "link", link: outside}, {typ: tar.TypeReg, name: "link/evil", body: "x"}}}
		},
		wantErr: "symbolic links are never followed",
	}, {
		name: "absolute symlink in one layer, a write through it in the next",
		layers: func(outside string) [][]entry {
			return [][]entry{{{typ: tar.TypeSymlink, name: "etc", link: outside}}, {{typ: tar.TypeReg, name: "etc/passwd", body: "x"}}}
		},
		wantErr: "symbolic links are never followed",
	}, {
		name: "relative symlink upwards, then a directory through it",
		layers: func(string) [][]entry {
			return [][]entry{{{typ: tar.TypeSymlink, name: "up", link: "../../.."}, {typ: tar.TypeDir, name: "up/made", mode: 0o755}}}
		},
		wantErr: "symbolic links are never followed",
	}, {
		name: "symlink to a host file, then a file of that name: the link is replaced, not written through",
		layers: func(outside string) [][]entry {
			return [][]entry{{{typ: tar.TypeSymlink, name: "f", link: filepath.Join(outside, "victim")}, {typ: tar.TypeReg, name: "f", body: "tenant"}}}
		},
		check: func(t *testing.T, dest, outside string) {
			if b, _ := os.ReadFile(filepath.Join(outside, "victim")); string(b) != "host" {
				t.Errorf("the host file now holds %q", b)
			}
			if fi, err := os.Lstat(filepath.Join(dest, "f")); err != nil || !fi.Mode().IsRegular() {
				t.Errorf("f: %v %v, want a regular file", fi, err)
			}
		},
	}, {
		name: "hard link to a host file",
		layers: func(outside string) [][]entry {
			return [][]entry{{{typ: tar.TypeLink, name: "h", link: filepath.Join(outside, "victim")}}}
		},
		wantErr: "hard link to",
	}, {
		name: "hard link through a symlinked directory",
		layers: func(outside string) [][]entry {
			return [][]entry{{{typ: tar.TypeSymlink, name: "d", link: outside}, {typ: tar.TypeLink, name: "h", link: "d/victim"}}}
		},
		wantErr: "symbolic links are never followed",
	}, {
		name: "whiteout of the parent directory",
		layers: func(string) [][]entry {
			return [][]entry{{{typ: tar.TypeReg, name: ".wh...", body: ""}}}
		},
		wantErr: "whiteout names no entry",
	}, {
		name: "device nodes and FIFOs are skipped",
		layers: func(string) [][]entry {
			return [][]entry{{{typ: tar.TypeChar, name: "dev/mem", devMajor: 1}, {typ: tar.TypeBlock, name: "sda", devMajor: 8}, {typ: tar.TypeFifo, name: "pipe"}, {typ: tar.TypeReg, name: "kept", body: "k"}}}
		},
		check: func(t *testing.T, dest, _ string) {
			for _, n := range []string{"dev/mem", "sda", "pipe"} {
				if _, err := os.Lstat(filepath.Join(dest, n)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s was made (%v)", n, err)
				}
			}
			if _, err := os.Stat(filepath.Join(dest, "kept")); err != nil {
				t.Error(err)
			}
		},
	}, {
		name:    "an entry larger than the limit",
		layers:  func(string) [][]entry { return [][]entry{{{typ: tar.TypeReg, name: "huge", size: 1 << 40}}} },
		limits:  Limits{Bytes: 1 << 20, Entries: 10},
		wantErr: "more than 1048576 bytes",
	}, {
		name: "files adding up past the limit",
		layers: func(string) [][]entry {
			return [][]entry{{{typ: tar.TypeReg, name: "a", body: strings.Repeat("a", 600)}, {typ: tar.TypeReg, name: "b", body: strings.Repeat("b", 600)}}}
		},
		limits:  Limits{Bytes: 1000, Entries: 10},
		wantErr: "more than 1000 bytes",
	}, {
		name: "too many entries",
		layers: func(string) [][]entry {
			var l []entry
			for _, n := range []string{"a", "b", "c", "d"} {
				l = append(l, entry{typ: tar.TypeDir, name: n, mode: 0o755})
			}
			return [][]entry{l}
		},
		limits:  Limits{Bytes: 1000, Entries: 3},
		wantErr: "more than 3 entries",
	}, {
		name: "set-user-ID bits dropped, absolute names kept inside",
		layers: func(string) [][]entry {
			return [][]entry{{{typ: tar.TypeReg, name: "/bin/su", mode: 0o4755, body: "x"}}}
		},
		check: func(t *testing.T, dest, _ string) {
			if fi, err := os.Stat(filepath.Join(dest, "bin", "su")); err != nil || fi.Mode() != 0o755 {
				t.Errorf("bin/su: %v %v, want mode 0755 (no set-user-ID)", fi.Mode(), err)
			}
		},
	}, {
		name: "whiteouts remove what lower layers made",
		layers: func(string) [][]entry {
			return [][]entry{
				{{typ: tar.TypeReg, name: "a/x", body: "x"}, {typ: tar.TypeReg, name: "a/y", body: "y"}, {typ: tar.TypeReg, name: "o/old", body: "o"}},
				{{typ: tar.TypeReg, name: "a/.wh.x"}, {typ: tar.TypeReg, name: "o/.wh..wh..opq"}, {typ: tar.TypeReg, name: "o/new", body: "n"}},
			}
		},
		check: func(t *testing.T, dest, _ string) {
			for n, want := range map[string]bool{"a/x": false, "a/y": true, "o/old": false, "o/new": true, "a/.wh.x": false} {
				_, err := os.Lstat(filepath.Join(dest, n))
				if (err == nil) != want {
					t.Errorf("%s exists: %v, want %v", n, err == nil, want)
				}
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			outside := t.TempDir()
			must(t, os.WriteFile(filepath.Join(outside, "victim"), []byte("host"), 0o644))
			base := t.TempDir()
			dest := filepath.Join(base, "dest")
			must(t, os.Mkdir(dest, 0o755))
			layout, desc := layoutOf(t, tc.layers(outside)...)
			limits := tc.limits
			if limits == (Limits{}) {
				limits = DefaultLimits
			}
			_, err := Unpack(t.Context(), layout, desc, dest, limits)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			// Nothing outside the destination changed.
			assertOnly(t, outside, "victim")
			assertOnly(t, base, "dest")
			if b, _ := os.ReadFile(filepath.Join(outside, "victim")); string(b) != "host" {
				t.Errorf("the host file now holds %q", b)
			}
			if tc.check != nil {
				tc.check(t, dest, outside)
			}
		})
	}
}

// A blob that is not what its descriptor says is refused.
func TestUnpackCorruptBlob(t *testing.T) {
	layout, desc := layoutOf(t, []entry{{typ: tar.TypeReg, name: "f", body: "content"}})
	var m ocispec.Manifest
	must(t, readDocument(layout, desc, &m))
	p := blobPath(layout, m.Layers[0].Digest)
	b, err := os.ReadFile(p)
	must(t, err)
	b[600] ^= 1 // inside the file's content
	must(t, os.WriteFile(p, b, 0o644))
	if _, err := Unpack(t.Context(), layout, desc, t.TempDir(), DefaultLimits); err == nil || !strings.Contains(err.Error(), "has digest") {
		t.Fatalf("error %v, want a digest mismatch", err)
	}
}

func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	must(t, err)
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("%s holds %v, want %v", dir, got, names)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
