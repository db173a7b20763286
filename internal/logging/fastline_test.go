package logging

import (
	"bytes"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// randString draws from pieces zap writes as they are and pieces it
// escapes or replaces (quotes, backslashes, control bytes, invalid UTF-8).
func randString(r *rand.Rand) string {
	plain := []string{"", "a", "mount_volume", "kubernetes.io/empty-dir/", "0123-abcd", " ", "/", "é", "日本", "\u007f", "\ufffd", "<>&"}
	escaped := []string{`"`, `\`, "\n", "\t", "\x00", "\x1f", "\xff", "\xe2\x82", "\xed\xa0\x80"}
	var b strings.Builder
	for range r.IntN(5) {
		if r.IntN(20) == 0 {
			b.WriteString(escaped[r.IntN(len(escaped))])
		} else {
			b.WriteString(plain[r.IntN(len(plain))])
		}
	}
	return b.String()
}

// randObject is an inline object calling a random series of the encoder's
// methods, supported or not.
type randObject struct{ calls []func(zapcore.ObjectEncoder) }

func (o randObject) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for _, c := range o.calls {
		c(enc)
	}
	return nil
}

func randField(r *rand.Rand, depth int) zapcore.Field {
	k := randString(r)
	switch n := r.IntN(13); {
	case n == 0:
		return zap.Bool(k, r.IntN(2) == 0)
	case n == 1:
		return zap.Duration(k, time.Duration(r.Int64N(math.MaxInt64)-r.Int64N(math.MaxInt64)))
	case n == 2:
		return zap.Duration(k, time.Duration(r.IntN(10_000_000)))
	case n == 3:
		return zap.Int64(k, r.Int64()-r.Int64())
	case n == 4:
		return zap.Uint16(k, uint16(r.Uint32()))
	case n == 5:
		return zap.ByteString(k, []byte(randString(r)))
	case n == 6:
		return zap.Error(nil) // skipped
	case n == 7:
		return zap.Float64(k, r.Float64()) // left to zap
	case n == 8 && depth == 0:
		var o randObject
		for range r.IntN(6) {
			f := randField(r, 1)
			o.calls = append(o.calls, func(enc zapcore.ObjectEncoder) { f.AddTo(enc) })
		}
		if r.IntN(4) == 0 {
			o.calls = append(o.calls, func(enc zapcore.ObjectEncoder) { enc.OpenNamespace("ns") })
		}
		return zap.Inline(o)
	default:
		return zap.String(k, randString(r))
	}
}

// The line encoder writes what New's zap encoder writes, byte for byte,
// for every line it does not leave to zap; and it leaves no plain line.
func TestLineEncoderLikeZap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 30))
	zones := []*time.Location{time.UTC, time.FixedZone("plus", 5*3600+30*60)}
	levels := []zapcore.Level{zapcore.DebugLevel, zapcore.InfoLevel, zapcore.WarnLevel, zapcore.ErrorLevel, zapcore.Level(-7)}
	zapEnc := zapcore.NewJSONEncoder(encoderConfig())
	// A few loggers and messages repeat, as in a log, for the encoded
	// heads the reused encoder keeps (more of them than it keeps).
	var names []string
	for range 7 {
		names = append(names, randString(r))
	}
	names = append(names, strings.Repeat("a message built from data ", 12)) // longer than maxHead
	name := func() string {
		if r.IntN(2) == 0 {
			return names[r.IntN(len(names))]
		}
		return randString(r)
	}
	var reused lineEncoder
	fast := 0
	for i := range 20000 {
		ent := zapcore.Entry{Level: levels[r.IntN(len(levels))], LoggerName: name(), Message: name()}
		if r.IntN(8) != 0 {
			ent.Time = time.Unix(1_700_000_000+r.Int64N(1000), r.Int64N(1e9)).In(zones[r.IntN(len(zones))])
		}
		var fields []zapcore.Field
		for range r.IntN(6) {
			fields = append(fields, randField(r, 0))
		}
		want, err := zapEnc.EncodeEntry(ent, fields)
		if err != nil {
			t.Fatal(err)
		}
		var e lineEncoder
		e.encode(ent, fields)
		if !e.failed {
			fast++
			if ok, _ := fastFields(fields); !ok {
				t.Errorf("line %d: written with fields the core leaves to zap: %v", i, fields)
			}
			if !bytes.Equal(e.buf, want.Bytes()) {
				t.Errorf("line %d:\n got %s\nwant %s", i, e.buf, want.Bytes())
			}
		}
		if reused.encode(ent, fields); reused.failed != e.failed || !e.failed && !bytes.Equal(reused.buf, e.buf) {
			t.Errorf("line %d: a reused encoder wrote %s (failed %v), a new one %s (failed %v)", i, reused.buf, reused.failed, e.buf, e.failed)
		}
		want.Free()
	}
	for _, h := range reused.heads {
		if len(h.text) > maxHead {
			t.Errorf("the reused encoder keeps a head of %d bytes, more than %d", len(h.text), maxHead)
		}
	}
	if fast < 4000 {
		t.Errorf("only %d of 20000 random lines were written by the line encoder", fast)
	}

	// Durations in seconds as zap writes them, around the bounds of the
	// exact decimal path and the sizes of operations.
	durations := []time.Duration{0, 1, -1, 999, time.Millisecond, 1e15 - 1, 1e15, 1e15 + 1, math.MaxInt64, math.MinInt64}
	for range 200000 {
		durations = append(durations, time.Duration(r.Int64N(1e15)), time.Duration(r.Int64N(1e10)), time.Duration(r.Int64N(1e6))*1000)
	}
	bare := encoderConfig() // fields only
	bare.LevelKey, bare.TimeKey, bare.MessageKey = "", "", ""
	for _, d := range durations {
		var e lineEncoder
		e.AddDuration("took", d)
		want := zapcore.NewJSONEncoder(bare)
		want.AddDuration("took", d)
		buf, _ := want.EncodeEntry(zapcore.Entry{}, nil)
		if w := strings.TrimSuffix(strings.TrimPrefix(buf.String(), "{"), "}\n"); string(e.buf) != w {
			t.Fatalf("duration %d: got %s, want %s", d, e.buf, w)
		}
		buf.Free()
	}

	// The operation line of a storm is written by the line encoder.
	var e lineEncoder
	e.encode(zapcore.Entry{Level: zapcore.InfoLevel, Time: time.Now(), LoggerName: "operations", Message: "operation succeeded"},
		[]zapcore.Field{zap.String("operation", "mount_volume"), zap.String("volume", "kubernetes.io/empty-dir/uid/scratch"),
			zap.Duration("took", 1234567*time.Nanosecond), zap.ByteString("pod", []byte("default/pod-1"))})
	if e.failed {
		t.Error("a plain operation line was left to zap")
	}
}

// Through New's logger, lines come out as zap writes them, whichever
// encoder wrote them: with and without With's fields, caller and stack.
func TestLoggerLinesLikeZap(t *testing.T) {
	var got, want bytes.Buffer
	log, stop := New(zapcore.DebugLevel, &got)
	ref := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(encoderConfig()), zapcore.AddSync(&want), zapcore.DebugLevel),
		zap.AddCaller(), zap.AddStacktrace(zapcore.ErrorLevel))
	r := rand.New(rand.NewPCG(2, 30))
	for range 2000 {
		var fields []zapcore.Field
		for range r.IntN(4) {
			fields = append(fields, randField(r, 0))
		}
		msg := randString(r)
		variant := r.IntN(3)
		for _, l := range []*zap.Logger{log, ref} {
			// One clock for both: the time is the only thing that differs.
			l = l.WithOptions(zap.WithClock(fixedClock{}))
			switch variant {
			case 0:
				l = l.WithOptions(zap.WithCaller(false)).Named("operations")
			case 1:
				l = l.With(zap.String("pod", "ns/p"))
			}
			l.Info(msg, fields...)
		}
	}
	stop()
	if got.String() != want.String() {
		gl, wl := strings.Split(got.String(), "\n"), strings.Split(want.String(), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("line %d:\n got %s\nwant %s", i, gl[i], wl[i])
			}
		}
		t.Fatalf("got %d lines, want %d", len(gl), len(wl))
	}
}

type fixedClock struct{}

func (fixedClock) Now() time.Time                         { return time.Unix(1_700_000_000, 123_456_789).UTC() }
func (fixedClock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }

// Lines written through Direct, which encodes them straight into the
// buffer (a failed one is taken back and left to zap), come out as zap
// writes them, in order, times aside; the buffer keeps its size.
func TestDirectLinesLikeZap(t *testing.T) {
	var got, want bytes.Buffer
	log, stop := New(zapcore.DebugLevel, &got)
	log = log.WithOptions(zap.WithCaller(false)).Named("operations")
	d := DirectOf(log)
	if d == nil {
		t.Fatal("New's logger gets no Direct")
	}
	ref := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(encoderConfig()), zapcore.AddSync(&want), zapcore.DebugLevel)).Named("operations")
	r := rand.New(rand.NewPCG(3, 30))
	for i := range 3000 {
		var fields []zapcore.Field
		for range r.IntN(4) {
			fields = append(fields, randField(r, 0))
		}
		switch i % 500 {
		case 0: // past the room left for a line
			fields = append(fields, zap.String("pad", strings.Repeat("x", r.IntN(2*lineRoom))))
		case 1: // past the buffer, and left to zap
			fields = append(fields, zap.String("pad", strings.Repeat("x", bufferSize)), zap.String("q", `"`))
		}
		msg := randString(r)
		d.Write(zapcore.InfoLevel, msg, fields)
		ref.Info(msg, fields...)
	}
	if c := cap(log.Core().(*flushingCore).bw.buf); c != bufferSize {
		t.Errorf("the buffer holds %d bytes, want %d", c, bufferSize)
	}
	stop()
	times := regexp.MustCompile(`"time":"[^"]*"`)
	gl := strings.Split(times.ReplaceAllString(got.String(), "T"), "\n")
	wl := strings.Split(times.ReplaceAllString(want.String(), "T"), "\n")
	if len(gl) != len(wl) {
		t.Fatalf("got %d lines, want %d", len(gl), len(wl))
	}
	for i := range gl {
		if gl[i] != wl[i] {
			t.Fatalf("line %d:\n got %s\nwant %s", i, gl[i], wl[i])
		}
	}
}

// appendString's word checks (a string's last word, the byte classes of a
// string shorter than a word) agree with the simple rule byte by byte: a
// string is written as it is when it has no control byte, quote or
// backslash and is valid UTF-8. Every length around the word sizes, with
// each kind of byte at each position.
func TestAppendStringLikeByteRule(t *testing.T) {
	simple := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
				return false
			}
		}
		return utf8.ValidString(s)
	}
	odd := []string{"\x00", "\x1f", `"`, `\`, "\x7f", "\x80", "\xff", "é", "\xc3", "日", " ", "!", "#", "[", "]", "~"}
	for n := 0; n <= 26; n++ {
		base := strings.Repeat("a", n)
		cases := []string{base}
		for p := 0; p < n; p++ {
			for _, o := range odd {
				cases = append(cases, base[:p]+o+base[p+1:])
			}
		}
		for _, s := range cases {
			var e lineEncoder
			got := e.appendString(nil, s)
			if want := simple(s); e.failed == want {
				t.Fatalf("%q: written %v, want %v", s, !e.failed, want)
			}
			if !e.failed && string(got) != `"`+s+`"` {
				t.Fatalf("%q: wrote %q", s, got)
			}
		}
	}
}
