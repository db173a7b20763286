package logging

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// syncBuffer is a writer the test can read while the logger writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestWarningsAreWrittenAtOnce(t *testing.T) {
	out := &syncBuffer{}
	log, stop := New(zapcore.InfoLevel, out)
	defer stop()
	log.Info("first", zap.String("pod", "ns/a"))
	log.With(zap.String("volume", "v")).Warn("problem")
	// No waiting: the warning, and the info line before it, are out when
	// Warn returns.
	got := out.String()
	if !strings.Contains(got, `"msg":"first"`) || !strings.Contains(got, `"msg":"problem"`) || !strings.Contains(got, `"volume":"v"`) {
		t.Fatalf("after a warning the output is %q; want both lines", got)
	}
	log.Debug("below the level")
	stop()
	if strings.Contains(out.String(), "below the level") {
		t.Error("a debug line was written at info level")
	}
}

func TestInfoLinesAreFlushedWithinTheInterval(t *testing.T) {
	out := &syncBuffer{}
	log, stop := New(zapcore.InfoLevel, out)
	defer stop()
	log.Info("buffered", zap.String("operation", "mount_volume"))
	deadline := time.Now().Add(20 * FlushInterval)
	for !strings.Contains(out.String(), `"msg":"buffered"`) {
		if time.Now().After(deadline) {
			t.Fatalf("info line not written %v after it was logged", 20*FlushInterval)
		}
		time.Sleep(FlushInterval / 10)
	}
}

func TestStopFlushesAndLinesAreJSON(t *testing.T) {
	out := &syncBuffer{}
	log, stop := New(zapcore.InfoLevel, out)
	for i := range 100 {
		log.Info("line", zap.Int("i", i))
	}
	stop()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 100 {
		t.Fatalf("%d lines after stop, want 100", len(lines))
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		for _, k := range []string{"level", "time", "caller", "msg"} {
			if _, ok := m[k]; !ok {
				t.Errorf("line %q has no %q", l, k)
			}
		}
	}
}

// Lines come out in the order they were logged, whatever flushes them: a
// full buffer, a line larger than the buffer, the timer, or stop; lines
// logged after stop are written straight through.
func TestOrderKeptAcrossFlushes(t *testing.T) {
	out := &syncBuffer{}
	log, stop := New(zapcore.InfoLevel, out)
	huge := strings.Repeat("x", bufferSize)
	var want []string
	for i := range 2000 { // more than a buffer full
		log.Info("line", zap.Int("i", i))
		want = append(want, `"i":`+strconv.Itoa(i))
		if i == 1000 {
			log.Info("huge", zap.String("pad", huge))
			want = append(want, `"msg":"huge"`)
		}
	}
	stop()
	log.Info("after stop")
	want = append(want, `"msg":"after stop"`)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d", len(lines), len(want))
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Fatalf("line %d is %.80q, want it to contain %q", i, lines[i], w)
		}
	}
}
