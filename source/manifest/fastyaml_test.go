package manifest

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// fastYAMLCases are documents the fast conversion takes (take true) or
// leaves to the YAML library (take false). Either way the result must be
// the library's.
var fastYAMLCases = []struct {
	name string
	doc  string
	take bool
}{
	{"bench pod", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bench-0001\n  namespace: default\nspec:\n  containers:\n  - name: c\n    image: busybox\n    volumeMounts:\n    - {name: v0, mountPath: /v0}\n    - {name: v1, mountPath: /v1}\n  volumes:\n  - name: v0\n    emptyDir: {medium: Memory, sizeLimit: 1Mi}\n  - name: v1\n    emptyDir: {}\n", true},
	{"indented sequence", "a:\n  - p\n  - q\nb: r\n", true},
	{"quantities", "a: 1Mi\nb: [500m, 2Gi, 10k]\n", true},
	{"sequence of sequences", "- - a\n  - b\n- c\n", true},
	{"empty values", "a:\nb: ~\nc: null\nd: []\ne: {}\n", true},
	{"comments", "# head\na: b # tail\n\n  # indented\nc: 'd # not a comment'\n", true},
	{"quotes", "a: 'it''s'\nb: \"say \\\"hi\\\" \\\\o/\"\n'c d': \"e: f\"\n", true},
	{"integers and booleans", "a: 0\nb: -12\nc: 123456789012345678\nd: true\ne: False\nf: [1, true, x]\n", true},
	{"colons and hashes inside", "image: nginx:1.25\nurl: http://x/y#z\nk: a:b\n", true},
	{"flow over lines", "metadata: {name: a,\n  namespace: b}\nl: [a,\n  b]\n", true},
	{"html characters", "a: x <b> & c\n", true},
	{"only comments", "# nothing\n", true},
	{"quote inside plain", "a: b \"c\"\nd\"e: f\n", true},

	{"anchor", "a: &x b\nc: *x\n", false},
	{"tag", "a: !!str 1\n", false},
	{"block scalar", "a: |\n  line\n", false},
	{"folded scalar", "a: >\n  line\n", false},
	{"multi-line plain", "a: b\n  c\n", false},
	{"yes", "a: yes\n", false},
	{"on as key", "on: push\n", false},
	{"octal", "mode: 0644\n", false},
	{"float", "a: 1.5\n", false},
	{"exponent", "a: 1e3\n", false},
	{"hex", "a: 0x1f\n", false},
	{"y", "a: [y, n]\n", false},
	{"big integer", "a: 1234567890123456789\n", false},
	{"minus zero", "a: -0\n", false},
	{"underscore number", "a: 1_000\n", false},
	{"timestamp", "a: 2001-12-14\n", false},
	{"special float", "a: .inf\n", false},
	{"numeric key", "1: a\n", false},
	{"duplicate key", "a: 1\na: 2\n", false},
	{"duplicate flow key", "a: {b: 1, b: 2}\n", false},
	{"tab", "a:\tb\n", false},
	{"non-ASCII", "a: é\n", false},
	{"trailing comma", "a: [b, ]\n", false},
	{"flow null value", "a: {b: }\n", false},
	{"escape", "a: \"\\n\"\n", false},
	{"multi-line quoted", "a: 'b\n  c'\n", false},
	{"directive", "%YAML 1.1\n---\na: b\n", false},
	{"merge key", "<<: {a: b}\n", false},
	{"bad indentation", "a:\n    b: c\n  d: e\n", false},
	{"mapping in value", "a: b: c\n", false},
	{"colon in flow scalar", "a: [b:c]\n", false},
	{"question mark key", "? a\n: b\n", false},
	{"windows line ends", "a: b\r\n", false},
	{"dash key", "-a: b\n", false},
	{"not YAML", "a: [b\n", false},
}

func TestFastYAMLToJSON(t *testing.T) {
	for w := range yaml11Words {
		if len(w) > 5 { // yamlPlainString looks up only strings this short
			t.Fatalf("yaml11Words: %q is longer than 5 bytes", w)
		}
		if !isYAML11Word(w) {
			t.Fatalf("isYAML11Word(%q) is false", w)
		}
	}
	for _, c := range fastYAMLCases {
		t.Run(c.name, func(t *testing.T) {
			js, took := fastYAMLToJSON(nil, []byte(c.doc))
			if took != c.take {
				t.Fatalf("taken %v, want %v (%s)", took, c.take, js)
			}
			if took {
				checkSameJSON(t, []byte(c.doc), js)
			}
		})
	}
}

// checkSameJSON fails unless js means what the YAML library makes of doc.
func checkSameJSON(t *testing.T, doc, js []byte) {
	t.Helper()
	want, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		t.Fatalf("fast conversion took a document the library rejects (%v): %q -> %s", err, doc, js)
	}
	var got, exp any
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatalf("fast conversion gave invalid JSON %s: %v", js, err)
	}
	if err := json.Unmarshal(want, &exp); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("%q:\nfast    %s\nlibrary %s", doc, js, want)
	}
}

// FuzzFastYAMLToJSON: whatever the fast conversion takes, it converts as
// the YAML library does.
func FuzzFastYAMLToJSON(f *testing.F) {
	for _, c := range fastYAMLCases {
		f.Add([]byte(c.doc))
	}
	f.Add([]byte(podYAML))
	f.Fuzz(func(t *testing.T, doc []byte) {
		if js, ok := fastYAMLToJSON(nil, doc); ok {
			checkSameJSON(t, doc, js)
		}
	})
}

func BenchmarkYAMLToJSON(b *testing.B) {
	doc := podManifestForBench()
	b.Run("library", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := yaml.YAMLToJSONStrict(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := fastYAMLToJSON(nil, doc); !ok {
				b.Fatal("not taken")
			}
		}
	})
}

func podManifestForBench() []byte {
	for _, c := range fastYAMLCases {
		if c.name == "bench pod" {
			return []byte(c.doc)
		}
	}
	panic("no bench pod case")
}

// FuzzYAMLPlainString holds yamlPlainString's one pass to the checks it
// replaced, written plainly.
func FuzzYAMLPlainString(f *testing.F) {
	for _, s := range []string{"a", "a #b", "a#b", "a: b", "a:b", "a:", "a,b", "a[b]", "{a}", "1Mi", "yes", "-a", "a :", "ab  #"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, s string, flow bool) {
		want := quantityLike(s) || (s != "" && !notPlainStart[s[0]] && !(len(s) <= 5 && yaml11First[s[0]] && yaml11Words[s]) &&
			!strings.Contains(s, " #") && !strings.Contains(s, ": ") && !strings.HasSuffix(s, ":") &&
			(!flow || !strings.ContainsAny(s, ",[]{}")))
		if got := yamlPlainString(s, flow); got != want {
			t.Fatalf("yamlPlainString(%q, %v) = %v, want %v", s, flow, got, want)
		}
		// Where a scanner has refused what the pass looks for, plainScanned
		// answers alike.
		if !strings.Contains(s, " #") && !strings.Contains(s, ": ") && !strings.HasSuffix(s, ":") && (!flow || !strings.ContainsAny(s, ",[]{}")) {
			if got := plainScanned(s); got != want {
				t.Fatalf("plainScanned(%q) = %v, want %v", s, got, want)
			}
		}
	})
}
