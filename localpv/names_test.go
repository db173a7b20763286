package localpv

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestPVName(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, tc := range []struct {
		name, pattern, node, class, entry string
		want                              string // exact, or prefix ending in "-" for fallbacks
		fallback                          bool
	}{
		{name: "pattern", pattern: DefaultNamePattern, node: "node-1", class: "fast", entry: "disk1", want: "local-node-1-fast-disk1"},
		{name: "dots", pattern: DefaultNamePattern, node: "n1.example.com", class: "fast", entry: "disk1", want: "local-n1.example.com-fast-disk1"},
		{name: "upper case entry", pattern: DefaultNamePattern, node: "node-1", class: "fast", entry: "Disk1", want: "local-node-1-fast-disk1-", fallback: true},
		{name: "underscore", pattern: DefaultNamePattern, node: "node-1", class: "fast", entry: "nvme_0", want: "local-node-1-fast-nvme-0-", fallback: true},
		{name: "space and symbols", pattern: DefaultNamePattern, node: "node-1", class: "fast", entry: "my disk (1)", want: "local-node-1-fast-my-disk-1-", fallback: true},
		{name: "too long", pattern: DefaultNamePattern, node: "node-1", class: "fast", entry: long, want: "local-node-1-fast-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-", fallback: true},
		{name: "entry of dots", pattern: "{node}{entry}", node: "n", class: "c", entry: "..", want: "n-", fallback: true},
		{name: "nothing valid", pattern: "{entry}{node}", node: "", class: "c", entry: "__", want: "local-", fallback: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PVName(tc.pattern, tc.node, tc.class, tc.entry)
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Fatalf("%q is not a valid PV name: %v", got, errs)
			}
			if again := PVName(tc.pattern, tc.node, tc.class, tc.entry); again != got {
				t.Fatalf("not deterministic: %q then %q", got, again)
			}
			if !tc.fallback {
				if got != tc.want {
					t.Fatalf("got %q, want %q", got, tc.want)
				}
				return
			}
			if !strings.HasPrefix(got, tc.want) || len(got) != len(tc.want)+12 {
				t.Fatalf("got %q, want %q followed by a 12-character hash", got, tc.want)
			}
			if len(got) > maxFallbackPrefix+13 {
				t.Fatalf("fallback %q is longer than %d", got, maxFallbackPrefix+13)
			}
		})
	}
}

// Entries that look alike once made valid must still get different names.
func TestPVNameCollisions(t *testing.T) {
	seen := map[string]string{}
	for _, entry := range []string{"a-b", "a_b", "A_B", "a b", "A-B", "a.b", "a..b", "a__b"} {
		name := PVName(DefaultNamePattern, "n", "c", entry)
		if other, ok := seen[name]; ok {
			t.Errorf("entries %q and %q both get %q", other, entry, name)
		}
		seen[name] = entry
	}
	// The fallback of an entry differs from every pattern name it could
	// collide with, and from other classes' and nodes' fallbacks.
	a := FallbackName(DefaultNamePattern, "n", "x-y", "z")
	b := FallbackName(DefaultNamePattern, "n", "x", "y-z")
	if PVName(DefaultNamePattern, "n", "x-y", "z") != PVName(DefaultNamePattern, "n", "x", "y-z") {
		t.Fatal("test premise: the pattern names collide")
	}
	if a == b {
		t.Errorf("fallbacks collide: %s", a)
	}
	if FallbackName(DefaultNamePattern, "n1", "c", "e") == FallbackName(DefaultNamePattern, "n2", "c", "e") {
		t.Error("fallbacks of two nodes collide")
	}
}

func TestPVNameAlwaysValid(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("abcXYZ019-_. ./@:éü\x00")
	randString := func(max int) string {
		n := r.IntN(max)
		var b strings.Builder
		for range n {
			b.WriteRune(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	for i := range 2000 {
		node, class, entry := randString(40), randString(40), randString(300)
		name := PVName(DefaultNamePattern, node, class, entry)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Fatalf("case %d: %q %q %q → %q: %v", i, node, class, entry, name, errs)
		}
		fb := FallbackName(DefaultNamePattern, node, class, entry)
		if errs := validation.IsDNS1123Subdomain(fb); len(errs) > 0 {
			t.Fatalf("case %d: fallback %q: %v", i, fb, errs)
		}
	}
}

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"Local_PV":   "local-pv",
		"a..b":       "a.b",
		"a.-b":       "a-b",
		"-a-":        "a",
		"..":         "",
		"a  b":       "a-b",
		"ÄBC":        "bc",
		"node.x.com": "node.x.com",
	} {
		if got := sanitize(in); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}

func ExamplePVName() {
	fmt.Println(PVName(DefaultNamePattern, "node-1", "local-ssd", "disk1"))
	fmt.Println(PVName(DefaultNamePattern, "node-1", "local-ssd", "Disk_1"))
	// Output:
	// local-node-1-local-ssd-disk1
	// local-node-1-local-ssd-disk-1-d2c388cf5f90
}
