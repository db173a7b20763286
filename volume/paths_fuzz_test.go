package volume

import (
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/types"
)

// FuzzPathElement checks the two functions every name taken from an object
// goes through before it becomes part of a path under the agent's root.
//
// ValidatePathElement accepts only a name that is one directory entry:
// joined to a directory it stays directly below it, and it is not "." or
// "..". PathElement turns any string into such a name, keeps a name that
// is already safe and short as it is, and never gives two strings the same
// name: a kept name can never look like a hashed one.
func FuzzPathElement(f *testing.F) {
	for _, seed := range []string{
		"pv-1", "", ".", "..", "../../etc", "a/b", "a\x00b", ".hidden", "sp ace", "tab\t", "ünïcode",
		strings.Repeat("x", 128), strings.Repeat("x", 129), strings.Repeat("y", 254),
		"csi.example.com^vol-1",
	} {
		f.Add(seed, "other")
	}
	f.Fuzz(func(t *testing.T, s, other string) {
		const parent = "/var/lib/volume-agent/plugins/p/mounts"
		if ValidatePathElement(s) == nil {
			joined := filepath.Join(parent, s)
			if s == "." || s == ".." || filepath.Dir(joined) != parent || filepath.Base(joined) != s || !utf8.ValidString(s) {
				t.Fatalf("ValidatePathElement accepts %q, which joined to %s is %s", s, parent, joined)
			}
		}
		e := PathElement(s)
		if err := ValidatePathElement(e); err != nil {
			t.Fatalf("PathElement(%q) = %q: %v", s, e, err)
		}
		if filepath.Dir(filepath.Join(parent, e)) != parent {
			t.Fatalf("PathElement(%q) = %q escapes %s", s, e, parent)
		}
		if len(s) <= 128 && ValidatePathElement(s) == nil && !strings.HasPrefix(s, hashedPrefix) && e != s {
			t.Fatalf("PathElement(%q) = %q: a safe short name is not kept readable", s, e)
		}
		if e == s && strings.HasPrefix(s, hashedPrefix) {
			t.Fatalf("PathElement(%q) kept a name that looks hashed: another identity hashes to it", s)
		}
		if s != other && PathElement(other) == e {
			t.Fatalf("PathElement(%q) = PathElement(%q) = %q", s, other, e)
		}
	})
}

// TestPathElementNoCollision: a name that is already of the hashed form,
// such as a PV named after the hash of a long PV name, is hashed too, so it
// cannot share the other's directory (the case fuzzing found, in
// testdata/fuzz/FuzzPathElement).
func TestPathElementNoCollision(t *testing.T) {
	long := strings.Repeat("a", 200)
	hashed := PathElement(long)
	if !strings.HasPrefix(hashed, hashedPrefix) {
		t.Fatalf("PathElement of a 200-character name = %q", hashed)
	}
	if got := PathElement(hashed); got == hashed {
		t.Fatalf("the identity %q gets the directory of %q", hashed, long[:10]+"...")
	}
}

// FuzzPodPluginPath checks the paths of a pod's volumes, built in one
// allocation, against the simple version: filepath.Join of the escaped
// elements, for any root and elements (dots, slashes, empty ones).
func FuzzPodPluginPath(f *testing.F) {
	for _, seed := range [][4]string{
		{"/var/lib/volume-agent", "0b6c2f1e-7d1a", "kubernetes.io/empty-dir", "cache"},
		{"/", "uid", "p", "v"}, {"", "uid", "p", "v"}, {"/r/", "uid", "p", "v"}, {"/r/../s", "uid", "p", "v"},
		{"/r", "..", "p", "v"}, {"/r", "uid", "..", "v"}, {"/r", "uid", ".", "v"}, {"/r", "uid", "/", "v"},
		{"/r", "uid", "a//b/", "v"}, {"/r", "uid", "p", "../../etc"}, {"/r", "", "", ""}, {"/r", "a/b", "p", "."},
		{"r", "uid", "p", "v"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	f.Fuzz(func(t *testing.T, root, pod, plugin, name string) {
		p := Paths{Root: root}
		uid := types.UID(pod)
		for dir, got := range map[string]string{
			"volumes":         p.PodVolumeDir(uid, plugin, name),
			"volumeDevices":   p.PodDevicePath(uid, plugin, name),
			"volume-subpaths": p.VolumeSubPathsDir(uid, plugin, name),
		} {
			if want := filepath.Join(root, "pods", pod, dir, EscapePlugin(plugin), name); got != want {
				t.Errorf("%s of %q %q %q %q = %q, want %q", dir, root, pod, plugin, name, got, want)
			}
		}
		if got, want := p.PodsDir(), filepath.Join(root, "pods"); got != want {
			t.Errorf("PodsDir of %q = %q, want %q", root, got, want)
		}
	})
}

// FuzzCleanRoot checks the one-scan cleanRoot against its definition, and
// the pod's own paths against filepath.Join.
func FuzzCleanRoot(f *testing.F) {
	for _, r := range []string{"/var/lib/volume-agent", "/", "", "/r/", "/r/../s", "//r", "/r/.", "/r/..", "/.r", "/r/...", "r", "/a//b", "/a/./b"} {
		f.Add(r, "0b6c2f1e-7d1a")
	}
	f.Fuzz(func(t *testing.T, root, pod string) {
		want := len(root) > 1 && root[0] == '/' && filepath.Clean(root) == root
		if got := cleanRoot(root); got != want {
			t.Errorf("cleanRoot(%q) = %v, want %v", root, got, want)
		}
		p, uid := Paths{Root: root}, types.UID(pod)
		for got, want := range map[string]string{
			p.PodDir(uid):            filepath.Join(root, "pods", pod),
			p.PodSubPathsDir(uid):    filepath.Join(root, "pods", pod, "volume-subpaths"),
			p.PodVolumeStateDir(uid): filepath.Join(root, "pods", pod, "volume-state"),
		} {
			if got != want {
				t.Errorf("pod path of %q %q = %q, want %q", root, pod, got, want)
			}
		}
	})
}

// FuzzPodVolumeDirs checks PodVolumeDirs and MatchPodVolumeDirs, sliced
// from one string, against the simple version: each directory built and
// cleaned on its own, and a match by comparing with PodVolumeDir.
func FuzzPodVolumeDirs(f *testing.F) {
	for _, seed := range [][5]string{
		{"/var/lib/volume-agent", "0b6c2f1e-7d1a", "kubernetes.io/empty-dir", "cache", ""},
		{"/var/lib/volume-agent", "0b6c2f1e-7d1a", "kubernetes.io/empty-dir", "cache", "/var/lib/volume-agent/pods/0b6c2f1e-7d1a/volumes/kubernetes.io~empty-dir/cache"},
		{"/var/lib/volume-agent", "0b6c2f1e-7d1a", "kubernetes.io/empty-dir", "cache", "/var/lib/volume-agent/pods/0b6c2f1e-7d1a/volumes/kubernetes.io/empty-dir/cache"},
		{"/r", "u", "p", "v", "/r/pods/u/volumes/p/w"}, {"/r", "u", "p", "v", "/r/pods/u/volumes/p/v/"},
		{"/r", "u", "p", "v", "/r//pods/u/volumes/p/v"}, {"/r", "u", "p~", "v", "/r/pods/u/volumes/p//v"},
		{"/", "uid", "p", "v", "/pods/uid/volumes/p/v"}, {"", "uid", "p", "v", "pods/uid/volumes/p/v"},
		{"/r/", "uid", "p", "v", "/r/pods/uid/volumes/p/v"}, {"/r", "..", "p", "v", "/r/volumes/p/v"},
		{"/r", "uid", "..", "v", "/r/pods/uid/v"}, {"/r", "uid", "/", "v", "/r/pods/uid/volumes/~/v"},
		{"/r", "uid", "p", "../../etc", "/r/pods/uid/etc"}, {"/r", "a/b", "p", ".", "/r/pods/a/b/volumes/p"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3], seed[4])
	}
	f.Fuzz(func(t *testing.T, root, pod, plugin, name, path string) {
		p, uid := Paths{Root: root}, types.UID(pod)
		simple := p.podVolumeDirsSimple(uid, plugin, name)
		want := PodVolumeDirs{
			Dir: filepath.Join(root, "pods", pod, "volumes", EscapePlugin(plugin), name), Pod: filepath.Join(root, "pods", pod),
			Pods: filepath.Join(root, "pods"),
		}
		want.Plugin = filepath.Dir(want.Dir)
		if simple != want {
			t.Fatalf("podVolumeDirsSimple(%q %q %q %q) = %+v, want %+v", root, pod, plugin, name, simple, want)
		}
		if got := p.PodVolumeDirs(uid, plugin, name); got != want {
			t.Errorf("PodVolumeDirs(%q %q %q %q) = %+v, want %+v", root, pod, plugin, name, got, want)
		}
		for _, path := range []string{path, want.Dir} {
			got, ok := p.MatchPodVolumeDirs(path, uid, plugin, name)
			if ok != (path == want.Dir) || (ok && got != want) {
				t.Errorf("MatchPodVolumeDirs(%q, %q %q %q %q) = %+v, %v; PodVolumeDirs %+v", path, root, pod, plugin, name, got, ok, want)
			}
		}
	})
}
