package mountutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kernelEscaper spells a path as the kernel writes it in mountinfo
// (fs/proc_namespace.c: mangle): space, tab, newline and backslash in
// octal, every other byte as it is.
var kernelEscaper = strings.NewReplacer(`\`, `\134`, " ", `\040`, "\t", `\011`, "\n", `\012`)

// FuzzMountInfoPath checks how the agent reads paths from
// /proc/self/mountinfo. A tenant names the directories inside its volumes,
// and anyone who may mount (a FUSE user, a CSI driver) chooses mount
// points, so any byte but NUL can be in a mount point. Whatever the path,
// the mount table reader returns it decoded, exactly, with the line's other
// fields intact; and mountsBelow's notion of "below dir" is the path's.
//
// k8s.io/mount-utils' parser, used before, splits lines on every kind of
// white space and misread a mount point with \r, \v, \f or U+00A0 in it
// (testdata/fuzz/FuzzMountInfoPath).
func FuzzMountInfoPath(f *testing.F) {
	for _, seed := range [][2]string{
		{"/var/lib/volume-agent/pods/u/volumes/v", "/var/lib/volume-agent"},
		{"/a b/c\td\ne", "/a b"},
		{`/x\040y`, `/x`},
		{`/back\slash/`, `/back\`},
		{"/a\\134", "/a"},
		{"/dir/../etc", "/dir"},
		{"/nbsp\u00a0x", "/nbsp"},
		{"/", "/"},
		{"/dir", "/dir/"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, p, d string) {
		if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
			return // the kernel has no such mount point
		}
		lines := "36 35 98:0 /sub " + kernelEscaper.Replace(p) + " rw,noatime shared:1 - ext4 /dev/vd\\040a rw,errors=continue\n" +
			"37 36 0:52 / /other rw - tmpfs tmpfs rw\n"
		mountInfoPath = filepath.Join(t.TempDir(), "mountinfo")
		t.Cleanup(func() { mountInfoPath = "/proc/self/mountinfo" })
		if err := os.WriteFile(mountInfoPath, []byte(lines), 0o644); err != nil {
			t.Fatal(err)
		}
		mounts, err := ReadMountInfo()
		if err != nil {
			t.Fatalf("mount point %q: %v", p, err)
		}
		if len(mounts) != 2 {
			t.Fatalf("mount point %q: %d mounts read", p, len(mounts))
		}
		m := mounts[0]
		if m.Mountpoint != p || m.Root != "/sub" || m.Major != 98 || m.Minor != 0 || m.FSType != "ext4" || m.Source != "/dev/vd a" || m.Options != "rw,noatime" || m.Optional != "shared:1" {
			t.Fatalf("mount point %q read as %+v", p, m)
		}
		if d == "" || strings.ContainsRune(d, 0) {
			return
		}
		rest, ok := within(p, d)
		want := p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/")
		if ok != want || (ok && p != d && strings.TrimSuffix(d, "/")+rest != p) {
			t.Fatalf("within(%q, %q) = %q, %v", p, d, rest, ok)
		}
	})
}
