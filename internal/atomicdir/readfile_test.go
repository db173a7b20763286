package atomicdir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ReadFile reads back what Write wrote, and nothing a link or a changed
// ..data leads to.
func TestReadFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tamper  func(t *testing.T, dir, data string)
		path    string
		limit   int64
		want    string
		wantErr string
	}{
		{name: "a file", path: "key.pem", limit: 100, want: "KEY"},
		{name: "nested", path: "sub/chain.pem", limit: 100, want: "CHAIN"},
		{name: "limited", path: "key.pem", limit: 2, want: "KE"},
		{name: "missing", path: "nope", limit: 100, wantErr: "no such file"},
		{name: "bad path", path: "../x", limit: 100, wantErr: ".."},
		{name: "file became a link", path: "key.pem", limit: 100, wantErr: "too many levels", tamper: func(t *testing.T, dir, data string) {
			replace(t, filepath.Join(data, "key.pem"), func(p string) error { return os.Symlink("/etc/passwd", p) })
		}},
		{name: "directory became a link", path: "sub/chain.pem", limit: 100, wantErr: "not a directory", tamper: func(t *testing.T, dir, data string) {
			replace(t, filepath.Join(data, "sub"), func(p string) error { return os.Symlink("/etc", p) })
		}},
		{name: "..data points elsewhere", path: "key.pem", limit: 100, wantErr: "does not point at a data directory", tamper: func(t *testing.T, dir, data string) {
			replace(t, filepath.Join(dir, "..data"), func(p string) error { return os.Symlink("/etc", p) })
		}},
		{name: "not a regular file", path: "key.pem", limit: 100, wantErr: "not a regular file", tamper: func(t *testing.T, dir, data string) {
			replace(t, filepath.Join(data, "key.pem"), func(p string) error { return os.Mkdir(p, 0o755) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := Write(dir, Payload{"key.pem": {Data: []byte("KEY"), Mode: 0o600}, "sub/chain.pem": {Data: []byte("CHAIN"), Mode: 0o644}}, Options{}); err != nil {
				t.Fatal(err)
			}
			if tc.tamper != nil {
				target, err := os.Readlink(filepath.Join(dir, "..data"))
				if err != nil {
					t.Fatal(err)
				}
				tc.tamper(t, dir, filepath.Join(dir, target))
			}
			got, err := ReadFile(dir, tc.path, tc.limit)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ReadFile = %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("ReadFile = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func replace(t *testing.T, p string, mk func(string) error) {
	t.Helper()
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
	if err := mk(p); err != nil {
		t.Fatal(err)
	}
}
