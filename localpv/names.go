package localpv

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Placeholders of a name pattern.
const (
	phNode  = "{node}"
	phClass = "{class}"
	phEntry = "{entry}"
)

var placeholderRE = regexp.MustCompile(`\{[^}]*\}`)

// validatePattern checks a name pattern: it must name the entry (or every
// entry of a class would get the same name) and the node (PV names are
// cluster-wide, and every node discovers the same directory names), use no
// other placeholder, and make valid names from ordinary values.
func validatePattern(p string) error {
	for _, ph := range placeholderRE.FindAllString(p, -1) {
		if ph != phNode && ph != phClass && ph != phEntry {
			return fmt.Errorf("%q: unknown placeholder %s (known: {node}, {class}, {entry})", p, ph)
		}
	}
	if !strings.Contains(p, phEntry) {
		return fmt.Errorf("%q must contain {entry}: otherwise every entry of the class gets the same name", p)
	}
	if !strings.Contains(p, phNode) {
		return fmt.Errorf("%q must contain {node}: PV names are cluster-wide and every node may have the same entries", p)
	}
	sample := expandPattern(p, "node-1", "class", "disk1")
	if errs := validation.IsDNS1123Subdomain(sample); len(errs) > 0 {
		return fmt.Errorf("%q does not make valid PV names (e.g. %q: %s)", p, sample, strings.Join(errs, "; "))
	}
	return nil
}

func expandPattern(p, node, class, entry string) string {
	return strings.NewReplacer(phNode, node, phClass, class, phEntry, entry).Replace(p)
}

// maxFallbackPrefix keeps fallback names short enough to read and well
// below the 253 characters a PV name may have.
const maxFallbackPrefix = 52

// PVName returns the name of the PV for an entry of a class on a node: the
// pattern expanded, when that is a valid PV name, and otherwise a fallback
// (see FallbackName). Both are deterministic, so rediscovery finds the PV
// it made before.
func PVName(pattern, node, class, entry string) string {
	name := expandPattern(pattern, node, class, entry)
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	return FallbackName(pattern, node, class, entry)
}

// FallbackName is the name used when the pattern makes an invalid name
// (entry names are file names: upper case, underscores, spaces, too long)
// or a name another PV already has: the expansion made valid and cut
// short, followed by a hash of node, class and entry, so that different
// entries never share it even when they look alike once made valid.
func FallbackName(pattern, node, class, entry string) string {
	sum := sha256.Sum256([]byte(node + "\x00" + class + "\x00" + entry))
	hash := hex.EncodeToString(sum[:])[:12]
	prefix := sanitize(expandPattern(pattern, node, class, entry))
	if len(prefix) > maxFallbackPrefix {
		prefix = strings.TrimRight(prefix[:maxFallbackPrefix], "-.")
	}
	if prefix == "" {
		prefix = "local"
	}
	return prefix + "-" + hash
}

// sanitize lower-cases s and replaces what a DNS subdomain cannot hold,
// then trims what it cannot start or end with.
func sanitize(s string) string {
	var b strings.Builder
	lastDash := false
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.':
			b.WriteRune(r)
			lastDash = false
		default:
			if !lastDash {
				b.WriteByte('-')
			}
			lastDash = true
		}
	}
	out := b.String()
	// Dots only between alphanumerics: "a..b" and "a.-b" are invalid.
	for strings.Contains(out, "..") || strings.Contains(out, ".-") || strings.Contains(out, "-.") {
		out = strings.NewReplacer("..", ".", ".-", "-", "-.", "-").Replace(out)
	}
	return strings.Trim(out, "-.")
}

// errNameTaken says that both of an entry's names belong to other PVs.
var errNameTaken = errors.New("name collision")
