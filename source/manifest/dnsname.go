package manifest

import "k8s.io/apimachinery/pkg/util/validation"

// isDNS1123Label and isDNS1123Subdomain are the apimachinery checks with a
// fast path: a name that a byte loop finds valid (every pod's name,
// namespace and volume names) has no messages, without the regexps'
// backtracking, a twentieth of parsing a pod. Anything else goes to the
// apimachinery function, so the messages stay its own; TestDNS1123Oracle
// and FuzzDNS1123 hold the loops to its answers.
func isDNS1123Label(s string) []string {
	if len(s) <= validation.DNS1123LabelMaxLength && validLabel(s) {
		return nil
	}
	return validation.IsDNS1123Label(s)
}

func isDNS1123Subdomain(s string) []string {
	if len(s) <= validation.DNS1123SubdomainMaxLength && validSubdomain(s) {
		return nil
	}
	return validation.IsDNS1123Subdomain(s)
}

// validLabel reports whether s matches [a-z0-9]([-a-z0-9]*[a-z0-9])?.
func validLabel(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// validSubdomain reports whether s is labels joined by dots.
func validSubdomain(s string) bool {
	for {
		i := 0
		for i < len(s) && s[i] != '.' {
			i++
		}
		if !validLabel(s[:i]) {
			return false
		}
		if i == len(s) {
			return true
		}
		s = s[i+1:]
	}
}
