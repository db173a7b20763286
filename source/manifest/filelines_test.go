package manifest

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/volume-agent/volume-agent/internal/logging"
)

// The per-file lines written straight to the agent's logger (no caller)
// carry the message and fields a plain zap logger gets.
func TestFileLinesLikeZap(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", docs(pod("p1"), pod("p2")))
	write(t, dir, "b.yaml", pod("p3"))

	var out bytes.Buffer
	log, flush := logging.New(zapcore.InfoLevel, &out)
	direct := newSource(t, dir, "", log)
	if direct.fileLines == nil {
		t.Fatal("no direct lines for a logger logging.New made")
	}
	core, seen := observer.New(zapcore.InfoLevel)
	plain := newSource(t, dir, "", zap.New(core))
	if plain.fileLines != nil {
		t.Fatal("direct lines for an observer's logger")
	}
	rescan(direct)
	rescan(plain)
	remove(t, dir, "a.yaml")
	rescan(direct)
	rescan(plain)
	flush()

	var got []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if _, ok := m["caller"]; ok {
			t.Errorf("line %q has a caller", line)
		}
		delete(m, "time")
		delete(m, "level")
		got = append(got, m)
	}
	var want []map[string]any
	for _, e := range seen.All() {
		m := map[string]any{"msg": e.Message}
		// Through JSON, as the line encoder writes them.
		b, _ := json.Marshal(e.ContextMap())
		var fields map[string]any
		_ = json.Unmarshal(b, &fields)
		maps.Copy(m, fields)
		want = append(want, m)
	}
	if len(want) != 3 {
		t.Fatalf("plain logger saw %d lines, want 2 loaded and 1 removed", len(want))
	}
	// Files are read in parallel: lines of one scan come in any order.
	enc := func(ms []map[string]any) []string {
		var out []string
		for _, m := range ms {
			b, _ := json.Marshal(m) // sorted keys
			out = append(out, string(b))
		}
		slices.Sort(out)
		return out
	}
	if g, w := enc(got), enc(want); !slices.Equal(g, w) {
		t.Errorf("direct lines:\n%s\nwant:\n%s", strings.Join(g, "\n"), strings.Join(w, "\n"))
	}
}
