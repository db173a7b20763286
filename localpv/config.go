package localpv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Block cleanup methods.
const (
	CleanupWipefs     = "wipefs"
	CleanupBlkdiscard = "blkdiscard"
	CleanupZero       = "zero"
	CleanupCommand    = "command"
)

// Defaults applied to a class that leaves a field out.
const (
	DefaultNamePattern    = "local-{node}-{class}-{entry}"
	DefaultCleanupMethod  = CleanupWipefs
	DefaultZeroMiB        = 100
	DefaultCleanupTimeout = time.Hour
)

// Config is a validated configuration: the storage classes this node
// provisions local volumes for.
type Config struct {
	Classes map[string]*Class
}

// Class is one storage class's configuration.
type Class struct {
	// Name is the StorageClass's name.
	Name string
	// DiscoveryDir is the node's directory whose entries become volumes.
	DiscoveryDir string
	// VolumeMode is Filesystem or Block.
	VolumeMode v1.PersistentVolumeMode
	// FSType, in a Filesystem class, lets block devices found in the
	// discovery directory become Filesystem volumes with this filesystem
	// (formatted by whoever mounts them first).
	FSType string
	// NamePattern makes PV names from {node}, {class} and {entry}.
	NamePattern string
	// Labels are added to every PV of the class.
	Labels      map[string]string
	AccessModes []v1.PersistentVolumeAccessMode
	Cleanup     BlockCleanup
	// Timeout bounds one cleanup of a volume of the class.
	Timeout time.Duration
}

// BlockCleanup says how a block device is cleaned before its volume is
// offered again.
type BlockCleanup struct {
	// Method is wipefs, blkdiscard, zero or command.
	Method string `json:"method"`
	// ZeroMiB is how many MiB at the start of the device the zero method
	// overwrites.
	ZeroMiB int64 `json:"zeroMiB,omitempty"`
	// Command is run by the command method with the device in the
	// environment variable LOCAL_PV_BLKDEVICE.
	Command []string `json:"command,omitempty"`
}

// ConfigError is one problem with the configuration file. Class and Field
// are empty for problems with the file as a whole.
type ConfigError struct {
	File  string
	Class string
	Field string
	Why   string
}

func (e *ConfigError) Error() string {
	switch {
	case e.Class == "":
		return fmt.Sprintf("%s: %s", e.File, e.Why)
	case e.Field == "":
		return fmt.Sprintf("%s: storage class %q: %s", e.File, e.Class, e.Why)
	}
	return fmt.Sprintf("%s: storage class %q: %s: %s", e.File, e.Class, e.Field, e.Why)
}

// fileConfig is the file's top level. Classes are decoded one by one so
// that one bad class does not reject the others.
type fileConfig struct {
	StorageClasses map[string]json.RawMessage `json:"storageClasses"`
}

type fileClass struct {
	DiscoveryDir   string            `json:"discoveryDir"`
	VolumeMode     string            `json:"volumeMode"`
	FSType         string            `json:"fsType"`
	NamePattern    string            `json:"namePattern"`
	Labels         map[string]string `json:"labels"`
	AccessModes    []string          `json:"accessModes"`
	BlockCleanup   *fileCleanup      `json:"blockCleanup"`
	CleanupTimeout string            `json:"cleanupTimeout"`
}

type fileCleanup struct {
	Method  string   `json:"method"`
	ZeroMiB *int64   `json:"zeroMiB"`
	Command []string `json:"command"`
}

// ParseConfig parses and validates a configuration file's content; file
// names it in messages. A file that cannot be read as a whole is an error
// (fatal); a class that is wrong is left out and reported in classErrs,
// the other classes are kept.
func ParseConfig(file string, data []byte) (cfg *Config, classErrs []*ConfigError, fatal error) {
	cfg = &Config{Classes: map[string]*Class{}}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, nil, &ConfigError{File: file, Why: "not valid YAML: " + err.Error()}
	}
	var top fileConfig
	if len(bytes.TrimSpace(js)) > 0 && string(bytes.TrimSpace(js)) != "null" {
		if err := strictDecode(js, &top); err != nil {
			return nil, nil, &ConfigError{File: file, Why: "top level: " + err.Error() + " (expected a map with the key storageClasses)"}
		}
	}
	names := make([]string, 0, len(top.StorageClasses))
	for name := range top.StorageClasses {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c, cerr := parseClass(file, name, top.StorageClasses[name])
		if cerr != nil {
			classErrs = append(classErrs, cerr)
			continue
		}
		cfg.Classes[name] = c
	}
	classErrs = append(classErrs, checkOverlaps(file, cfg)...)
	return cfg, classErrs, nil
}

func strictDecode(js []byte, into any) error {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	return dec.Decode(into)
}

var fsTypeRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

func parseClass(file, name string, raw json.RawMessage) (*Class, *ConfigError) {
	bad := func(field, format string, args ...any) *ConfigError {
		return &ConfigError{File: file, Class: name, Field: field, Why: fmt.Sprintf(format, args...)}
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return nil, bad("", "not a valid StorageClass name: %s", strings.Join(errs, "; "))
	}
	var fc fileClass
	if string(bytes.TrimSpace(raw)) == "null" {
		return nil, bad("", "empty: discoveryDir is required")
	}
	if err := strictDecode(raw, &fc); err != nil {
		return nil, bad("", "%s", strings.TrimPrefix(err.Error(), "json: "))
	}
	c := &Class{Name: name, DiscoveryDir: fc.DiscoveryDir, FSType: fc.FSType, Labels: fc.Labels}

	switch {
	case fc.DiscoveryDir == "":
		return nil, bad("discoveryDir", "required")
	case !filepath.IsAbs(fc.DiscoveryDir):
		return nil, bad("discoveryDir", "%q is not an absolute path", fc.DiscoveryDir)
	case slices.Contains(strings.Split(fc.DiscoveryDir, "/"), ".."):
		return nil, bad("discoveryDir", "%q must not contain '..'", fc.DiscoveryDir)
	case filepath.Clean(fc.DiscoveryDir) == "/":
		return nil, bad("discoveryDir", "the root directory cannot be a discovery directory")
	}
	c.DiscoveryDir = filepath.Clean(fc.DiscoveryDir)

	switch fc.VolumeMode {
	case "", string(v1.PersistentVolumeFilesystem):
		c.VolumeMode = v1.PersistentVolumeFilesystem
	case string(v1.PersistentVolumeBlock):
		c.VolumeMode = v1.PersistentVolumeBlock
	default:
		return nil, bad("volumeMode", "%q is neither Filesystem nor Block", fc.VolumeMode)
	}
	if fc.FSType != "" {
		if c.VolumeMode == v1.PersistentVolumeBlock {
			return nil, bad("fsType", "only applies to volumeMode Filesystem (block devices used as filesystems); a Block class hands out raw devices")
		}
		if !fsTypeRE.MatchString(fc.FSType) {
			return nil, bad("fsType", "%q is not a filesystem type name (such as ext4 or xfs)", fc.FSType)
		}
	}

	c.NamePattern = fc.NamePattern
	if c.NamePattern == "" {
		c.NamePattern = DefaultNamePattern
	}
	if err := validatePattern(c.NamePattern); err != nil {
		return nil, bad("namePattern", "%v", err)
	}

	for k, v := range fc.Labels {
		if k == LabelNode {
			return nil, bad("labels", "%s is the provisioner's own label", LabelNode)
		}
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, bad("labels", "key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, bad("labels", "value %q of %q: %s", v, k, strings.Join(errs, "; "))
		}
	}

	if len(fc.AccessModes) == 0 {
		c.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	}
	for _, m := range fc.AccessModes {
		switch am := v1.PersistentVolumeAccessMode(m); am {
		case v1.ReadWriteOnce, v1.ReadOnlyMany, v1.ReadWriteMany, v1.ReadWriteOncePod:
			if !slices.Contains(c.AccessModes, am) {
				c.AccessModes = append(c.AccessModes, am)
			}
		default:
			return nil, bad("accessModes", "%q is not an access mode (ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod)", m)
		}
	}

	c.Timeout = DefaultCleanupTimeout
	if fc.CleanupTimeout != "" {
		d, err := time.ParseDuration(fc.CleanupTimeout)
		if err != nil || d <= 0 {
			return nil, bad("cleanupTimeout", "%q is not a positive duration (such as 30m)", fc.CleanupTimeout)
		}
		c.Timeout = d
	}

	c.Cleanup = BlockCleanup{Method: DefaultCleanupMethod}
	if bc := fc.BlockCleanup; bc != nil {
		if bc.Method != "" {
			c.Cleanup.Method = bc.Method
		}
		switch c.Cleanup.Method {
		case CleanupWipefs, CleanupBlkdiscard, CleanupZero, CleanupCommand:
		default:
			return nil, bad("blockCleanup.method", "%q is not one of wipefs, blkdiscard, zero, command", bc.Method)
		}
		if bc.ZeroMiB != nil {
			if c.Cleanup.Method != CleanupZero {
				return nil, bad("blockCleanup.zeroMiB", "only applies to method zero")
			}
			if *bc.ZeroMiB <= 0 {
				return nil, bad("blockCleanup.zeroMiB", "must be a positive number of MiB, not %d", *bc.ZeroMiB)
			}
			c.Cleanup.ZeroMiB = *bc.ZeroMiB
		}
		if len(bc.Command) > 0 && c.Cleanup.Method != CleanupCommand {
			return nil, bad("blockCleanup.command", "only applies to method command")
		}
		if c.Cleanup.Method == CleanupCommand {
			if len(bc.Command) == 0 || bc.Command[0] == "" {
				return nil, bad("blockCleanup.command", "required by method command: the program and its arguments, the device is in $LOCAL_PV_BLKDEVICE")
			}
			if !filepath.IsAbs(bc.Command[0]) {
				return nil, bad("blockCleanup.command", "the program %q must be an absolute path", bc.Command[0])
			}
			c.Cleanup.Command = slices.Clone(bc.Command)
		}
	}
	if c.Cleanup.Method == CleanupZero && c.Cleanup.ZeroMiB == 0 {
		c.Cleanup.ZeroMiB = DefaultZeroMiB
	}
	return c, nil
}

// checkOverlaps rejects classes whose discovery directories are the same or
// nested: an entry would belong to two classes. Both classes are rejected,
// since neither is more right than the other.
func checkOverlaps(file string, cfg *Config) []*ConfigError {
	names := make([]string, 0, len(cfg.Classes))
	for n := range cfg.Classes {
		names = append(names, n)
	}
	sort.Strings(names)
	bad := map[string]string{}
	for i, a := range names {
		for _, b := range names[i+1:] {
			da, db := cfg.Classes[a].DiscoveryDir, cfg.Classes[b].DiscoveryDir
			if within(da, db) || within(db, da) {
				if _, ok := bad[a]; !ok {
					bad[a] = b
				}
				if _, ok := bad[b]; !ok {
					bad[b] = a
				}
			}
		}
	}
	var errs []*ConfigError
	for _, n := range names {
		other, ok := bad[n]
		if !ok {
			continue
		}
		errs = append(errs, &ConfigError{File: file, Class: n, Field: "discoveryDir",
			Why: fmt.Sprintf("%s overlaps the discovery directory %s of class %q: every entry must belong to one class", cfg.Classes[n].DiscoveryDir, cfg.Classes[other].DiscoveryDir, other)})
	}
	for n := range bad {
		delete(cfg.Classes, n)
	}
	return errs
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// mergeConfig makes the configuration to use after a reload: the classes
// that parsed, plus the previous definition of every class that is now
// wrong (one bad edit must not take a working class away). A kept class
// that now overlaps a new one is dropped.
func mergeConfig(prev, next *Config, classErrs []*ConfigError) *Config {
	out := &Config{Classes: map[string]*Class{}}
	for n, c := range next.Classes {
		out.Classes[n] = c
	}
	if prev == nil {
		return out
	}
	for _, e := range classErrs {
		old, ok := prev.Classes[e.Class]
		if !ok || e.Class == "" {
			continue
		}
		if _, ok := out.Classes[e.Class]; ok {
			continue
		}
		clash := false
		for _, c := range out.Classes {
			if within(c.DiscoveryDir, old.DiscoveryDir) || within(old.DiscoveryDir, c.DiscoveryDir) {
				clash = true
			}
		}
		if !clash {
			out.Classes[e.Class] = old
		}
	}
	return out
}

// joinErrors flattens config errors for logs.
func joinErrors(errs []*ConfigError) error {
	var all []error
	for _, e := range errs {
		all = append(all, e)
	}
	return errors.Join(all...)
}

// classNames returns the classes' names, sorted.
func (c *Config) classNames() []string {
	if c == nil {
		return nil
	}
	out := make([]string, 0, len(c.Classes))
	for n := range c.Classes {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
