package logging

import (
	"encoding/binary"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"

	"go.uber.org/zap/zapcore"
)

// lineEncoder writes the common lines (no caller, no stack, fields of a
// few plain kinds, strings that need no escaping) byte for byte as New's
// zap JSON encoder does, without its clone, pooled buffers and per-byte
// escaping: every operation of a storm writes such a line, and zap's
// encoder was most of its cost. Anything else sets failed, and the line is
// left to zap: the encoder is the simple version the fast path must agree
// with (fastline_test.go compares the two on random lines).
type lineEncoder struct {
	buf    []byte
	failed bool
	// heads are the logger and message parts of recent lines, encoded:
	// most lines repeat a few of them (a storm's are all "operations",
	// "operation succeeded"), so they are checked and quoted once.
	heads    [4]head
	nextHead int
}

// maxHead bounds the bytes a head keeps.
const maxHead = 256

// head is the encoded logger and message of a line (`,"logger":"x","msg":"y"`).
type head struct {
	logger, msg string
	text        []byte
}

var lineEncoders = sync.Pool{New: func() any { return &lineEncoder{buf: make([]byte, 0, 512)} }}

// free returns e to the pool, unless a huge line grew its buffer.
func (e *lineEncoder) free() {
	if cap(e.buf) <= 64<<10 {
		lineEncoders.Put(e)
	}
}

// fastFields reports whether every field is of a kind the line encoder
// may write: others (errors, reflected values, ...) go to zap at once
// rather than after a wasted attempt; and whether some field is an inline
// object, whose marshaller is code of its own.
func fastFields(fields []zapcore.Field) (fast, inline bool) {
	for i := range fields {
		switch fields[i].Type {
		case zapcore.StringType, zapcore.ByteStringType, zapcore.BoolType, zapcore.DurationType,
			zapcore.Int64Type, zapcore.Int32Type, zapcore.Int16Type, zapcore.Int8Type,
			zapcore.Uint64Type, zapcore.Uint32Type, zapcore.Uint16Type, zapcore.Uint8Type,
			zapcore.SkipType:
		case zapcore.InlineMarshalerType:
			inline = true
		default:
			return false, inline
		}
	}
	return true, inline
}

// encode writes the line of ent and fields into e.buf; e.failed tells
// whether it could. The layout is zapcore's jsonEncoder.EncodeEntry for
// New's config: level, time, logger, message, fields, line end.
func (e *lineEncoder) encode(ent zapcore.Entry, fields []zapcore.Field) {
	e.buf = e.buf[:0]
	e.appendLine(ent, fields)
}

// appendLine is encode appending to e.buf; on failure e.buf holds a part.
func (e *lineEncoder) appendLine(ent zapcore.Entry, fields []zapcore.Field) {
	e.failed = false
	if l := ent.Level - zapcore.DebugLevel; l >= 0 && int(l) < len(levelRuns) {
		e.buf = append(e.buf, levelRuns[l]...)
	} else {
		e.buf = append(e.buf, '{')
		e.AddString("level", ent.Level.String())
	}
	if !ent.Time.IsZero() {
		// timeText is digits, '-', ':', 'T', '.', '+' and 'Z': nothing
		// to check or escape.
		e.buf = append(e.buf, `,"time":"`...)
		e.buf = append(append(e.buf, timeText(ent.Time)...), '"')
	}
	e.appendHead(ent.LoggerName, ent.Message)
	for i := range fields {
		fields[i].AddTo(e)
	}
	e.buf = append(e.buf, '}', '\n')
}

// levelRuns are the starts of lines at the levels zap names, debug to
// fatal: `{"level":"info"`.
var levelRuns = func() (runs [zapcore.FatalLevel - zapcore.DebugLevel + 1][]byte) {
	for i := range runs {
		var e lineEncoder
		e.buf = append(e.buf, '{')
		e.AddString("level", (zapcore.DebugLevel + zapcore.Level(i)).String())
		runs[i] = e.buf
	}
	return runs
}()

// appendHead appends the logger (if any) and message of a line, from
// e.heads when a recent line had the same.
func (e *lineEncoder) appendHead(logger, msg string) {
	for i := range e.heads {
		if h := &e.heads[i]; h.text != nil && h.msg == msg && h.logger == logger {
			e.buf = append(e.buf, h.text...)
			return
		}
	}
	start := len(e.buf)
	if logger != "" {
		e.AddString("logger", logger)
	}
	e.AddString("msg", msg)
	// A long head (a message built from data) is not kept: the pooled
	// encoder would hold its bytes, and it seldom repeats.
	if e.failed || len(e.buf)-start > maxHead {
		return
	}
	h := &e.heads[e.nextHead]
	e.nextHead = (e.nextHead + 1) % len(e.heads)
	h.logger, h.msg = logger, msg
	h.text = append(h.text[:0], e.buf[start:]...)
}

// addKey is jsonEncoder.addKey for keys that need no escaping.
func (e *lineEncoder) addKey(key string) {
	e.buf = e.appendString(separate(e.buf), key)
	e.buf = append(e.buf, ':')
}

// separate is jsonEncoder.addElementSeparator.
func separate(b []byte) []byte {
	if n := len(b); n > 0 {
		switch b[n-1] {
		case '{', '[', ':', ',', ' ':
		default:
			b = append(b, ',')
		}
	}
	return b
}

// appendString appends s quoted if zap would write it unescaped: printable
// ASCII other than '"' and '\\', and valid UTF-8. Else the line fails.
// It works on b, not e.buf, so as not to store the slice in the heap for
// each byte.
func (e *lineEncoder) appendString(b []byte, s string) []byte {
	ascii := true
	i := 0
	// Eight bytes at a time while none is below 0x20, '"', '\\' or
	// above 0x7f; such a word is left to the loop below.
	for ; i+8 <= len(s); i += 8 {
		x := binary.LittleEndian.Uint64([]byte(s[i : i+8]))
		if (below(x, 0x20)|zeroByte(x^(ones*'"'))|zeroByte(x^(ones*'\\'))|x)&highBits != 0 {
			break
		}
	}
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c == '"' || c == '\\':
			e.failed = true
			return b
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	if !ascii && !utf8.ValidString(s) {
		e.failed = true
		return b
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

const (
	ones     = 0x0101010101010101
	highBits = 0x8080808080808080
)

// zeroByte has the high bit of some byte set if a byte of x is zero (and
// of none if none is; it may mark more than the first).
func zeroByte(x uint64) uint64 { return (x - ones) & ^x & highBits }

// below has the high bit of some byte set if a byte of x below 0x80 is
// below n, n <= 0x80, or possibly if some byte is above 0x7f.
func below(x uint64, n byte) uint64 { return (x - ones*uint64(n)) & ^x & highBits }

func (e *lineEncoder) AddString(key, val string) {
	e.addKey(key)
	e.buf = e.appendString(e.buf, val)
}

func (e *lineEncoder) AddByteString(key string, val []byte) {
	e.addKey(key)
	// Not copied into a string: appendString keeps no reference to it.
	e.buf = e.appendString(e.buf, unsafe.String(unsafe.SliceData(val), len(val)))
}

func (e *lineEncoder) AddBool(key string, val bool) {
	e.addKey(key)
	e.buf = strconv.AppendBool(e.buf, val)
}

// AddDuration writes seconds, as zapcore.SecondsDurationEncoder (New's)
// through jsonEncoder.AppendFloat64.
func (e *lineEncoder) AddDuration(key string, val time.Duration) {
	e.addKey(key)
	if val >= 0 && val < 1e15 {
		e.buf = appendSeconds(e.buf, val)
		return
	}
	f := float64(val) / float64(time.Second)
	if math.IsNaN(f) || math.IsInf(f, 0) { // cannot happen; zap quotes them
		e.failed = true
		return
	}
	e.buf = strconv.AppendFloat(e.buf, f, 'f', -1, 64)
}

// appendSeconds writes d in seconds as strconv's shortest 'f' format of
// float64(d)/1e9 does, without its float arithmetic, for 0 <= d < 1e15:
// the division is rounded to the double nearest d/1e9, a decimal of at
// most 15 digits, which is then the shortest one that reads back as it.
func appendSeconds(b []byte, d time.Duration) []byte {
	b = strconv.AppendInt(b, int64(d/time.Second), 10)
	frac := int64(d % time.Second)
	if frac == 0 {
		return b
	}
	var digits [10]byte
	digits[0] = '.'
	for i := 9; i > 0; i-- {
		digits[i] = byte('0' + frac%10)
		frac /= 10
	}
	n := 10
	for digits[n-1] == '0' {
		n--
	}
	return append(b, digits[:n]...)
}

func (e *lineEncoder) AddInt64(key string, val int64) {
	e.addKey(key)
	e.buf = strconv.AppendInt(e.buf, val, 10)
}

func (e *lineEncoder) AddUint64(key string, val uint64) {
	e.addKey(key)
	e.buf = strconv.AppendUint(e.buf, val, 10)
}

func (e *lineEncoder) AddInt(k string, v int)         { e.AddInt64(k, int64(v)) }
func (e *lineEncoder) AddInt32(k string, v int32)     { e.AddInt64(k, int64(v)) }
func (e *lineEncoder) AddInt16(k string, v int16)     { e.AddInt64(k, int64(v)) }
func (e *lineEncoder) AddInt8(k string, v int8)       { e.AddInt64(k, int64(v)) }
func (e *lineEncoder) AddUint(k string, v uint)       { e.AddUint64(k, uint64(v)) }
func (e *lineEncoder) AddUint32(k string, v uint32)   { e.AddUint64(k, uint64(v)) }
func (e *lineEncoder) AddUint16(k string, v uint16)   { e.AddUint64(k, uint64(v)) }
func (e *lineEncoder) AddUint8(k string, v uint8)     { e.AddUint64(k, uint64(v)) }
func (e *lineEncoder) AddUintptr(k string, v uintptr) { e.AddUint64(k, uint64(v)) }

// The rest are left to zap.

func (e *lineEncoder) AddArray(string, zapcore.ArrayMarshaler) error   { e.failed = true; return nil }
func (e *lineEncoder) AddObject(string, zapcore.ObjectMarshaler) error { e.failed = true; return nil }
func (e *lineEncoder) AddBinary(string, []byte)                        { e.failed = true }
func (e *lineEncoder) AddComplex128(string, complex128)                { e.failed = true }
func (e *lineEncoder) AddComplex64(string, complex64)                  { e.failed = true }
func (e *lineEncoder) AddFloat64(string, float64)                      { e.failed = true }
func (e *lineEncoder) AddFloat32(string, float32)                      { e.failed = true }
func (e *lineEncoder) AddTime(string, time.Time)                       { e.failed = true }
func (e *lineEncoder) AddReflected(string, any) error                  { e.failed = true; return nil }
func (e *lineEncoder) OpenNamespace(string)                            { e.failed = true }

var _ zapcore.ObjectEncoder = (*lineEncoder)(nil)
