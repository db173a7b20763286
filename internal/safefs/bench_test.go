package safefs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/safefs"
	"github.com/volume-agent/volume-agent/test/bench/ownershipfloor"
)

// A volume's worth of small files: 100 directories of 100 files, 3 levels.
func benchTree(b *testing.B, dir string) {
	b.Helper()
	for i := range 100 {
		d := filepath.Join(dir, fmt.Sprintf("a%d", i%10), fmt.Sprintf("b%d", i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
		for j := range 100 {
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", j)), nil, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// benchSetups are where volumes live: the machine's own disk (a
// directory emptyDir) and a tmpfs (a Memory emptyDir). The tmpfs needs
// root; without it only the disk runs.
func benchSetups(b *testing.B, run func(b *testing.B, dir string)) {
	b.Run("disk", func(b *testing.B) { run(b, b.TempDir()) })
	b.Run("tmpfs", func(b *testing.B) {
		mounttest.RequireRoot(b) // to mount a tmpfs
		dir := mounttest.TempDir(b)
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1g"); err != nil {
			b.Fatal(err)
		}
		run(b, dir)
	})
}

// BenchmarkRemoveAll compares safefs's removal (file descriptors, bounded
// memory) with the standard library's, which holds a path string per level
// and follows no symbolic link either but crosses mounts.
func BenchmarkRemoveAll(b *testing.B) {
	for _, impl := range []struct {
		name   string
		remove func(string) error
	}{
		{"safefs", func(dir string) error { return safefs.RemoveAll(context.Background(), dir) }},
		{"os", os.RemoveAll},
	} {
		b.Run(impl.name, func(b *testing.B) {
			benchSetups(b, func(b *testing.B, tmp string) {
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					dir := filepath.Join(tmp, fmt.Sprint(i))
					benchTree(b, dir)
					b.StartTimer()
					if err := impl.remove(dir); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkSetGroup compares the parallel walk with the sequential
// reference (test/bench -scenario ownership compares both with the
// kubelet's code) and with the kernel floor (ownershipfloor: the same
// system calls on a tree listed beforehand): "change", every entry changes
// on every walk; "right", nothing does (the walk only reads).
func BenchmarkSetGroup(b *testing.B) {
	mounttest.RequireRoot(b) // to change groups
	for _, impl := range []struct {
		name string
		set  func(context.Context, string, safefs.Group) error
	}{{"parallel", safefs.SetGroup}, {"sequential", safefs.SetGroupSequential}, {"floor", nil}} {
		b.Run(impl.name, func(b *testing.B) {
			for _, mode := range []string{"change", "right"} {
				b.Run(mode, func(b *testing.B) {
					benchSetups(b, func(b *testing.B, tmp string) {
						dir := filepath.Join(tmp, "vol")
						benchTree(b, dir)
						set := impl.set
						if set == nil {
							tree, err := ownershipfloor.List(dir)
							if err != nil {
								b.Fatal(err)
							}
							set = func(_ context.Context, _ string, g safefs.Group) error {
								return tree.Run(g.GID, g.FileBits, g.DirBits, 0, false)
							}
						}
						for i := 0; b.Loop(); i++ {
							gid := 4000
							if mode == "change" {
								gid += i % 2 // alternating groups: every entry changes
							}
							if err := set(context.Background(), dir, safefs.Group{GID: gid, FileBits: 0o660, DirBits: 0o2770}); err != nil {
								b.Fatal(err)
							}
						}
					})
				})
			}
		})
	}
}
