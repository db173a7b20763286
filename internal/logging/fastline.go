package logging

import (
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
// rather than after a wasted attempt.
func fastFields(fields []zapcore.Field) bool {
	for i := range fields {
		switch fields[i].Type {
		case zapcore.StringType, zapcore.ByteStringType, zapcore.BoolType, zapcore.DurationType,
			zapcore.Int64Type, zapcore.Int32Type, zapcore.Int16Type, zapcore.Int8Type,
			zapcore.Uint64Type, zapcore.Uint32Type, zapcore.Uint16Type, zapcore.Uint8Type,
			zapcore.InlineMarshalerType, zapcore.SkipType:
		default:
			return false
		}
	}
	return true
}

// encode writes the line of ent and fields into e.buf; e.failed tells
// whether it could. The layout is zapcore's jsonEncoder.EncodeEntry for
// New's config: level, time, logger, message, fields, line end.
func (e *lineEncoder) encode(ent zapcore.Entry, fields []zapcore.Field) {
	e.buf, e.failed = append(e.buf[:0], '{'), false
	e.AddString("level", ent.Level.String())
	if !ent.Time.IsZero() {
		e.AddString("time", timeText(ent.Time))
	}
	if ent.LoggerName != "" {
		e.AddString("logger", ent.LoggerName)
	}
	e.AddString("msg", ent.Message)
	for i := range fields {
		fields[i].AddTo(e)
	}
	e.buf = append(e.buf, '}', '\n')
}

// addKey is jsonEncoder.addKey for keys that need no escaping.
func (e *lineEncoder) addKey(key string) {
	e.separate()
	e.buf = append(e.buf, '"')
	e.appendSafe(key)
	e.buf = append(e.buf, '"', ':')
}

// separate is jsonEncoder.addElementSeparator.
func (e *lineEncoder) separate() {
	if n := len(e.buf); n > 0 {
		switch e.buf[n-1] {
		case '{', '[', ':', ',', ' ':
		default:
			e.buf = append(e.buf, ',')
		}
	}
}

// appendSafe appends s if zap would write it unescaped: printable ASCII
// other than '"' and '\\', and valid UTF-8. Else the line fails.
func (e *lineEncoder) appendSafe(s string) {
	ascii := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' {
			e.failed = true
			return
		}
		ascii = ascii && c < utf8.RuneSelf
	}
	if !ascii && !utf8.ValidString(s) {
		e.failed = true
		return
	}
	e.buf = append(e.buf, s...)
}

func (e *lineEncoder) AddString(key, val string) {
	e.addKey(key)
	e.buf = append(e.buf, '"')
	e.appendSafe(val)
	e.buf = append(e.buf, '"')
}

func (e *lineEncoder) AddByteString(key string, val []byte) {
	e.addKey(key)
	e.buf = append(e.buf, '"')
	// Not copied into a string: appendSafe keeps no reference to it.
	e.appendSafe(unsafe.String(unsafe.SliceData(val), len(val)))
	e.buf = append(e.buf, '"')
}

func (e *lineEncoder) AddBool(key string, val bool) {
	e.addKey(key)
	e.buf = strconv.AppendBool(e.buf, val)
}

// AddDuration writes seconds, as zapcore.SecondsDurationEncoder (New's)
// through jsonEncoder.AppendFloat64.
func (e *lineEncoder) AddDuration(key string, val time.Duration) {
	e.addKey(key)
	f := float64(val) / float64(time.Second)
	if math.IsNaN(f) || math.IsInf(f, 0) { // cannot happen; zap quotes them
		e.failed = true
		return
	}
	e.buf = strconv.AppendFloat(e.buf, f, 'f', -1, 64)
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
