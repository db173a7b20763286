package atomicdir

import (
	"bytes"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzWrite gives the atomic writer of configMap, secret, downwardAPI and
// projected volumes the item paths a pod spec may hold (the API server's
// validation of items paths is the first line; this is the second) and
// checks what a tenant could abuse:
//
//   - a path ValidatePath accepts stays inside the volume and never names
//     the writer's own entries (..data, ..data_tmp, the timestamped
//     directories), however it is spelt;
//   - after Write succeeds, every file reads back through the volume's
//     visible names, ..data still links to a timestamped directory, and
//     nothing was written outside the volume's directory.
func FuzzWrite(f *testing.F) {
	for _, seed := range [][3]string{
		{"key", "dir/nested/key", "v"},
		{"a/b", "a//b", "v"},
		{"..data", "x", "v"},
		{"./..data", "x", "v"},
		{"./..2030_01_01_00_00_00.000000000", "x", "v"},
		{"a/./../b", "c", "v"},
		{"...", "x", "v"},
		{".hidden", "..x/y", "v"},
		{"/abs", "x", "v"},
		{"a/b", "a", "v"},
	} {
		f.Add(seed[0], seed[1], []byte(seed[2]))
	}
	f.Fuzz(func(t *testing.T, p1, p2 string, data []byte) {
		for _, p := range []string{p1, p2} {
			if ValidatePath(p) != nil {
				continue
			}
			c := path.Clean(p)
			if c == "." || c == ".." || strings.HasPrefix(c, "../") || path.IsAbs(c) {
				t.Fatalf("ValidatePath accepts %q, which is %q: outside the volume", p, c)
			}
			if strings.HasPrefix(topLevel(c), "..") {
				t.Fatalf("ValidatePath accepts %q, which is %q: the writer's own names start with '..'", p, c)
			}
		}

		parent := t.TempDir()
		dir := filepath.Join(parent, "vol")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		payload := Payload{p1: {Data: data, Mode: 0o644}}
		if p2 != p1 {
			payload[p2] = File{Data: []byte("second"), Mode: 0o600}
		}
		if _, err := Write(dir, payload, Options{}); err != nil {
			return
		}
		entries, err := os.ReadDir(parent)
		if err != nil || len(entries) != 1 {
			t.Fatalf("Write of %q wrote outside the volume: %v (%v)", []string{p1, p2}, entries, err)
		}
		target, err := os.Readlink(filepath.Join(dir, dataLink))
		if err != nil || !isTimestampDir(target) {
			t.Fatalf("after writing %q, ..data is %q (%v)", []string{p1, p2}, target, err)
		}
		for p, file := range payload {
			got, err := os.ReadFile(filepath.Join(dir, path.Clean(p)))
			if err != nil || !bytes.Equal(got, file.Data) {
				t.Fatalf("after writing %q, %q reads %q (%v), want %q", []string{p1, p2}, p, got, err, file.Data)
			}
		}
	})
}
