package subpath

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

// BenchmarkPrepare measures preparing a sub-path three directories deep
// (resolve, bind mount, verify) and removing it again, on the filesystem of
// $TMPDIR (usually the root disk) and on a tmpfs; and preparing one that is
// already in place (what every check after a restart costs).
func BenchmarkPrepare(b *testing.B) {
	mounttest.RequireRoot(b)
	for _, fs := range []string{"disk", "tmpfs"} {
		base := mounttest.TempDir(b)
		if fs == "tmpfs" {
			if err := unix.Mount("tmpfs", base, "tmpfs", 0, "size=16m"); err != nil {
				b.Fatal(err)
			}
		}
		vol := filepath.Join(base, "vol")
		if err := os.MkdirAll(filepath.Join(vol, "a", "b", "c"), 0o755); err != nil {
			b.Fatal(err)
		}
		target := filepath.Join(base, "targets", "app", "0")
		for _, rw := range []struct {
			name     string
			readOnly bool
		}{{"rw", false}, {"ro", true}} {
			b.Run(fs+"/prepare+remove/"+rw.name, func(b *testing.B) {
				for b.Loop() {
					if err := testHost.Prepare(Request{VolumeDir: vol, SubPath: "a/b/c", Target: target, ReadOnly: rw.readOnly}); err != nil {
						b.Fatal(err)
					}
					if err := Remove(target); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(fs+"/already-prepared", func(b *testing.B) {
			if err := testHost.Prepare(Request{VolumeDir: vol, SubPath: "a/b/c", Target: target}); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := testHost.Prepare(Request{VolumeDir: vol, SubPath: "a/b/c", Target: target}); err != nil {
					b.Fatal(err)
				}
			}
			if err := Remove(target); err != nil {
				b.Fatal(err)
			}
		})
	}
}
