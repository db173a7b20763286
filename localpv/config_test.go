package localpv

import (
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

const exampleConfig = `
storageClasses:
  local-ssd:
    discoveryDir: /mnt/disks/ssd
    fsType: ext4
    labels:
      example.com/tier: fast
    blockCleanup:
      method: zero
      zeroMiB: 16
    cleanupTimeout: 10m
  raw:
    discoveryDir: /mnt/disks/raw/
    volumeMode: Block
    namePattern: "raw-{node}-{entry}"
    accessModes: [ReadWriteOnce, ReadWriteOncePod]
    blockCleanup:
      method: command
      command: ["/scripts/clean.sh", "--quick"]
  plain:
    discoveryDir: /mnt/disks/plain
`

func TestParseConfigExample(t *testing.T) {
	cfg, errs, fatal := ParseConfig("lv.yaml", []byte(exampleConfig))
	if fatal != nil || len(errs) > 0 {
		t.Fatalf("fatal %v, class errors %v", fatal, errs)
	}
	if got := cfg.classNames(); strings.Join(got, ",") != "local-ssd,plain,raw" {
		t.Fatalf("classes %v", got)
	}
	ssd := cfg.Classes["local-ssd"]
	if ssd.VolumeMode != v1.PersistentVolumeFilesystem || ssd.FSType != "ext4" || ssd.Labels["example.com/tier"] != "fast" ||
		ssd.Cleanup.Method != CleanupZero || ssd.Cleanup.ZeroMiB != 16 || ssd.Timeout != 10*time.Minute ||
		ssd.NamePattern != DefaultNamePattern || len(ssd.AccessModes) != 1 || ssd.AccessModes[0] != v1.ReadWriteOnce {
		t.Errorf("local-ssd: %+v", ssd)
	}
	raw := cfg.Classes["raw"]
	if raw.DiscoveryDir != "/mnt/disks/raw" || raw.VolumeMode != v1.PersistentVolumeBlock || raw.NamePattern != "raw-{node}-{entry}" ||
		raw.Cleanup.Method != CleanupCommand || strings.Join(raw.Cleanup.Command, " ") != "/scripts/clean.sh --quick" ||
		len(raw.AccessModes) != 2 {
		t.Errorf("raw: %+v", raw)
	}
	plain := cfg.Classes["plain"]
	if plain.Cleanup.Method != DefaultCleanupMethod || plain.Timeout != DefaultCleanupTimeout {
		t.Errorf("plain defaults: %+v", plain)
	}
}

func TestParseConfigEmpty(t *testing.T) {
	for _, data := range []string{"", "\n# nothing\n", "storageClasses: {}\n", "storageClasses:\n"} {
		cfg, errs, fatal := ParseConfig("f", []byte(data))
		if fatal != nil || len(errs) > 0 || len(cfg.Classes) != 0 {
			t.Errorf("%q: %v %v %v", data, cfg, errs, fatal)
		}
	}
}

func TestParseConfigFileErrors(t *testing.T) {
	for _, tc := range []struct{ data, want string }{
		{"storageClasses: [", "f.yaml: not valid YAML"},
		{"storageClass:\n  a: {}\n", `f.yaml: top level: json: unknown field "storageClass"`},
		{"- a\n- b\n", "f.yaml: top level: json: cannot unmarshal array"},
		{"storageClasses: 3\n", "f.yaml: top level: json: cannot unmarshal number"},
	} {
		_, _, fatal := ParseConfig("f.yaml", []byte(tc.data))
		if fatal == nil || !strings.HasPrefix(fatal.Error(), tc.want) {
			t.Errorf("%q: got %v, want prefix %q", tc.data, fatal, tc.want)
		}
	}
}

func TestParseConfigClassErrors(t *testing.T) {
	for _, tc := range []struct {
		name, class, want string
	}{
		{"missing dir", `{}`, `f: storage class "c": discoveryDir: required`},
		{"null class", `null`, `f: storage class "c": empty: discoveryDir is required`},
		{"relative dir", `{discoveryDir: disks}`, `f: storage class "c": discoveryDir: "disks" is not an absolute path`},
		{"dotdot", `{discoveryDir: /mnt/../etc}`, `f: storage class "c": discoveryDir: "/mnt/../etc" must not contain '..'`},
		{"root", `{discoveryDir: /}`, `f: storage class "c": discoveryDir: the root directory cannot be a discovery directory`},
		{"unknown field", `{discoveryDir: /d, hostDir: /x}`, `f: storage class "c": unknown field "hostDir"`},
		{"bad mode", `{discoveryDir: /d, volumeMode: Raw}`, `f: storage class "c": volumeMode: "Raw" is neither Filesystem nor Block`},
		{"fsType with block", `{discoveryDir: /d, volumeMode: Block, fsType: ext4}`, `f: storage class "c": fsType: only applies to volumeMode Filesystem`},
		{"bad fsType", `{discoveryDir: /d, fsType: "ext 4"}`, `f: storage class "c": fsType: "ext 4" is not a filesystem type name`},
		{"pattern without entry", `{discoveryDir: /d, namePattern: "x-{node}"}`, `f: storage class "c": namePattern: "x-{node}" must contain {entry}`},
		{"pattern without node", `{discoveryDir: /d, namePattern: "x-{entry}"}`, `f: storage class "c": namePattern: "x-{entry}" must contain {node}`},
		{"pattern unknown placeholder", `{discoveryDir: /d, namePattern: "{node}-{entry}-{uuid}"}`, `f: storage class "c": namePattern: "{node}-{entry}-{uuid}": unknown placeholder {uuid}`},
		{"pattern invalid", `{discoveryDir: /d, namePattern: "PV_{node}-{entry}"}`, `f: storage class "c": namePattern: "PV_{node}-{entry}" does not make valid PV names`},
		{"bad label key", `{discoveryDir: /d, labels: {"a b": x}}`, `f: storage class "c": labels: key "a b"`},
		{"bad label value", `{discoveryDir: /d, labels: {a: "x y"}}`, `f: storage class "c": labels: value "x y" of "a"`},
		{"the provisioner's label", `{discoveryDir: /d, labels: {"local.volume-agent.io/node": x}}`, `f: storage class "c": labels: local.volume-agent.io/node is the provisioner's own label`},
		{"bad access mode", `{discoveryDir: /d, accessModes: [RWO]}`, `f: storage class "c": accessModes: "RWO" is not an access mode`},
		{"bad timeout", `{discoveryDir: /d, cleanupTimeout: soon}`, `f: storage class "c": cleanupTimeout: "soon" is not a positive duration`},
		{"negative timeout", `{discoveryDir: /d, cleanupTimeout: -1m}`, `f: storage class "c": cleanupTimeout: "-1m" is not a positive duration`},
		{"bad method", `{discoveryDir: /d, blockCleanup: {method: shred}}`, `f: storage class "c": blockCleanup.method: "shred" is not one of wipefs, blkdiscard, zero, command`},
		{"zeroMiB without zero", `{discoveryDir: /d, blockCleanup: {method: wipefs, zeroMiB: 3}}`, `f: storage class "c": blockCleanup.zeroMiB: only applies to method zero`},
		{"zeroMiB zero", `{discoveryDir: /d, blockCleanup: {method: zero, zeroMiB: 0}}`, `f: storage class "c": blockCleanup.zeroMiB: must be a positive number of MiB, not 0`},
		{"command without method", `{discoveryDir: /d, blockCleanup: {command: [/bin/true]}}`, `f: storage class "c": blockCleanup.command: only applies to method command`},
		{"command missing", `{discoveryDir: /d, blockCleanup: {method: command}}`, `f: storage class "c": blockCleanup.command: required by method command`},
		{"command relative", `{discoveryDir: /d, blockCleanup: {method: command, command: [clean.sh]}}`, `f: storage class "c": blockCleanup.command: the program "clean.sh" must be an absolute path`},
		{"cleanup unknown field", `{discoveryDir: /d, blockCleanup: {method: zero, passes: 3}}`, `f: storage class "c": unknown field "passes"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := "storageClasses:\n  c: " + tc.class + "\n  good: {discoveryDir: /good}\n"
			cfg, errs, fatal := ParseConfig("f", []byte(data))
			if fatal != nil {
				t.Fatalf("fatal: %v", fatal)
			}
			if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), tc.want) {
				t.Fatalf("errors %v, want one starting with %q", errs, tc.want)
			}
			if errs[0].Class != "c" {
				t.Errorf("error names class %q", errs[0].Class)
			}
			// One bad class never stops the others.
			if _, ok := cfg.Classes["good"]; !ok || len(cfg.Classes) != 1 {
				t.Errorf("classes %v, want only good", cfg.classNames())
			}
		})
	}
}

func TestParseConfigBadClassName(t *testing.T) {
	_, errs, _ := ParseConfig("f", []byte("storageClasses:\n  Bad_Name: {discoveryDir: /d}\n"))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `storage class "Bad_Name": not a valid StorageClass name`) {
		t.Fatalf("%v", errs)
	}
}

func TestParseConfigOverlaps(t *testing.T) {
	data := `
storageClasses:
  a: {discoveryDir: /mnt/disks}
  b: {discoveryDir: /mnt/disks/ssd}
  c: {discoveryDir: /mnt/other}
  d: {discoveryDir: /mnt/other/}
  e: {discoveryDir: /mnt/disks-2}
`
	cfg, errs, fatal := ParseConfig("f", []byte(data))
	if fatal != nil {
		t.Fatal(fatal)
	}
	if got := strings.Join(cfg.classNames(), ","); got != "e" {
		t.Errorf("classes %s, want e (a/b nested, c/d equal)", got)
	}
	if len(errs) != 4 {
		t.Fatalf("errors %v", errs)
	}
	if !strings.Contains(errs[0].Error(), `storage class "a": discoveryDir: /mnt/disks overlaps the discovery directory /mnt/disks/ssd of class "b"`) {
		t.Errorf("%v", errs[0])
	}
}

func TestMergeConfigKeepsLastGood(t *testing.T) {
	prev, _, _ := ParseConfig("f", []byte("storageClasses:\n  a: {discoveryDir: /a}\n  b: {discoveryDir: /b}\n  gone: {discoveryDir: /g}\n"))
	// a is broken now, b changes, gone is removed, n is new.
	next, errs, fatal := ParseConfig("f", []byte("storageClasses:\n  a: {discoveryDir: relative}\n  b: {discoveryDir: /b2}\n  nn: {discoveryDir: /n}\n"))
	if fatal != nil || len(errs) != 1 {
		t.Fatalf("%v %v", fatal, errs)
	}
	got := mergeConfig(prev, next, errs)
	if names := strings.Join(got.classNames(), ","); names != "a,b,nn" {
		t.Fatalf("classes %s", names)
	}
	if got.Classes["a"].DiscoveryDir != "/a" {
		t.Errorf("a should keep its last good definition: %+v", got.Classes["a"])
	}
	if got.Classes["b"].DiscoveryDir != "/b2" {
		t.Errorf("b should be updated: %+v", got.Classes["b"])
	}

	// A kept class that now overlaps a new one is dropped.
	next2, errs2, _ := ParseConfig("f", []byte("storageClasses:\n  a: {discoveryDir: relative}\n  x: {discoveryDir: /a/sub}\n"))
	got2 := mergeConfig(prev, next2, errs2)
	if names := strings.Join(got2.classNames(), ","); names != "x" {
		t.Errorf("classes %s, want x", names)
	}

	// No previous configuration: only what parsed.
	if got := mergeConfig(nil, next, errs); strings.Join(got.classNames(), ",") != "b,nn" {
		t.Errorf("no previous: %v", got.classNames())
	}
}

func TestConfigErrorFormats(t *testing.T) {
	for _, tc := range []struct {
		e    ConfigError
		want string
	}{
		{ConfigError{File: "f", Why: "bad"}, "f: bad"},
		{ConfigError{File: "f", Class: "c", Why: "bad"}, `f: storage class "c": bad`},
		{ConfigError{File: "f", Class: "c", Field: "x", Why: "bad"}, `f: storage class "c": x: bad`},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("got %q want %q", got, tc.want)
		}
	}
}

// The documented example parses without an error.
func TestParseConfigDocumentedExample(t *testing.T) {
	data, err := os.ReadFile("testdata/local-volumes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, errs, fatal := ParseConfig("testdata/local-volumes.yaml", data)
	if fatal != nil || len(errs) > 0 {
		t.Fatalf("%v %v", fatal, errs)
	}
	if got := strings.Join(cfg.classNames(), ","); got != "local-nvme,local-raw,local-ssd" {
		t.Fatalf("classes %s", got)
	}
	if c := cfg.Classes["local-raw"]; c.Cleanup.Method != CleanupZero || c.Cleanup.ZeroMiB != 64 || c.VolumeMode != v1.PersistentVolumeBlock {
		t.Errorf("local-raw %+v", c)
	}
}
