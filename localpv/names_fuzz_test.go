package localpv

import (
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzPVName gives the PV naming arbitrary entry names (whatever an
// administrator, or a tool, put in a discovery directory) and patterns.
// For every pattern validatePattern accepts and every node and class name
// the API allows, both names of an entry are valid PV names, the same every
// time, and the fallback differs for different entries.
func FuzzPVName(f *testing.F) {
	for _, seed := range [][2]string{
		{DefaultNamePattern, "disk1"},
		{DefaultNamePattern, "Disk_1 (old)"},
		{"{node}.{entry}", ".."},
		{"{node}-{entry}", strings.Repeat("x", 300)},
		{"pv-{node}-{class}-{entry}", "-.-"},
		{"{entry}{node}", "ünï\x00code"},
		{"{node}-{entry}", "a..b"},
	} {
		f.Add(seed[0], seed[1], "node-1", "fast")
	}
	f.Fuzz(func(t *testing.T, pattern, entry, node, class string) {
		if validatePattern(pattern) != nil || len(validation.IsDNS1123Subdomain(node)) > 0 || len(validation.IsDNS1123Subdomain(class)) > 0 {
			return
		}
		name := PVName(pattern, node, class, entry)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Fatalf("PVName(%q, %q, %q, %q) = %q: %v", pattern, node, class, entry, name, errs)
		}
		if again := PVName(pattern, node, class, entry); again != name {
			t.Fatalf("PVName is not deterministic: %q, then %q", name, again)
		}
		fallback := FallbackName(pattern, node, class, entry)
		if errs := validation.IsDNS1123Subdomain(fallback); len(errs) > 0 {
			t.Fatalf("FallbackName(%q, %q, %q, %q) = %q: %v", pattern, node, class, entry, fallback, errs)
		}
		if other := FallbackName(pattern, node, class, entry+"x"); other == fallback {
			t.Fatalf("entries %q and %q share the fallback name %q", entry, entry+"x", fallback)
		}
	})
}

// FuzzConfig gives the configuration parser arbitrary files. It never
// panics, and every class it accepts has a name that is a StorageClass
// name, a clean absolute discovery directory other than / that overlaps no
// other class's, a pattern that makes valid PV names, a known cleanup
// method and a positive timeout.
func FuzzConfig(f *testing.F) {
	for _, seed := range []string{
		"storageClasses:\n  fast:\n    discoveryDir: /mnt/disks\n",
		"storageClasses:\n  raw:\n    discoveryDir: /mnt/raw\n    volumeMode: Block\n    blockCleanup: {method: zero, zeroMiB: 10}\n",
		"storageClasses:\n  a: {discoveryDir: /mnt/x}\n  b: {discoveryDir: /mnt/x/y}\n",
		"storageClasses:\n  a: {discoveryDir: /mnt/../etc}\n",
		"storageClasses:\n  a: {discoveryDir: //}\n",
		"storageClasses:\n  A_B: {discoveryDir: /mnt/q, namePattern: \"{entry}\"}\n",
		"storageClasses:\n  c: {discoveryDir: /mnt/c, blockCleanup: {method: command, command: []}, cleanupTimeout: -1s}\n",
		"{}", "", "storageClasses: [1,2]", "unknown: 1",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, _, fatal := ParseConfig("/etc/config.yaml", data)
		if fatal != nil || cfg == nil {
			return
		}
		for name, c := range cfg.Classes {
			switch {
			case name != c.Name || len(validation.IsDNS1123Subdomain(name)) > 0:
				t.Fatalf("class %q (%q): not a StorageClass name", name, c.Name)
			case !strings.HasPrefix(c.DiscoveryDir, "/") || c.DiscoveryDir == "/" || filepath.Clean(c.DiscoveryDir) != c.DiscoveryDir:
				t.Fatalf("class %q: discovery directory %q", name, c.DiscoveryDir)
			case validatePattern(c.NamePattern) != nil:
				t.Fatalf("class %q: pattern %q accepted: %v", name, c.NamePattern, validatePattern(c.NamePattern))
			case c.Timeout <= 0:
				t.Fatalf("class %q: timeout %v", name, c.Timeout)
			case c.Cleanup.Method == CleanupCommand && len(c.Cleanup.Command) == 0:
				t.Fatalf("class %q: cleanup command without a program", name)
			}
			for other, o := range cfg.Classes {
				if other != name && (within(c.DiscoveryDir, o.DiscoveryDir) || c.DiscoveryDir == o.DiscoveryDir) {
					t.Fatalf("classes %q (%s) and %q (%s) overlap", name, c.DiscoveryDir, other, o.DiscoveryDir)
				}
			}
		}
	})
}
