// Package logging builds the agent's zap logger: JSON lines on one writer,
// buffered so that a storm of operations does not pay a write(2) per line
// under one lock, yet with warnings and errors written at once.
//
// The kubelet's klog buffers the same way (flushing every 5 s); the agent
// flushes every FlushInterval, on every line at warn level or above, and
// when the logger is stopped. A crash can lose at most the info lines of
// the last interval.
package logging

import (
	"fmt"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const (
	// FlushInterval bounds how long an info line waits in the buffer.
	FlushInterval = 100 * time.Millisecond
	// bufferSize is flushed when full, whatever the interval.
	bufferSize = 256 << 10
)

// New returns a logger at level writing JSON lines to w, and a function
// that flushes what is buffered and stops the flushing goroutine (call it
// once, last).
func New(level zapcore.LevelEnabler, w io.Writer) (*zap.Logger, func()) {
	buf := &bufferedWriter{w: w}
	errOut := zapcore.Lock(zapcore.AddSync(w))
	core := &flushingCore{Core: zapcore.NewCore(zapcore.NewJSONEncoder(encoderConfig()), buf, level), ws: buf, bw: buf, fast: true, errOut: errOut}
	log := zap.New(core, zap.AddCaller(), zap.AddStacktrace(zapcore.ErrorLevel), zap.ErrorOutput(errOut))
	return log, buf.stop
}

// encoderConfig is the lines' encoding; lineEncoder writes the same.
func encoderConfig() zapcore.EncoderConfig {
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "time"
	enc.EncodeTime = encodeTime
	return enc
}

// bufferedWriter holds lines for at most FlushInterval. Unlike zap's
// BufferedWriteSyncer it has no ticker: a timer is armed by the first line
// written into an empty buffer, so an idle agent wakes for nothing (the
// ticker cost 0.07 s of CPU per 20 s at idle).
type bufferedWriter struct {
	w io.Writer

	mu      sync.Mutex
	buf     []byte
	timer   *time.Timer
	armed   bool
	stopped bool
	// enc encodes lines into buf (see writeLine).
	enc lineEncoder
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped || len(p) >= bufferSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		return b.w.Write(p)
	}
	if len(b.buf)+len(p) > bufferSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	if b.buf == nil {
		// At its full size once: grown by append it went past bufferSize
		// and was dropped and grown again after every flush.
		b.buf = make([]byte, 0, bufferSize)
	}
	b.buf = append(b.buf, p...)
	b.armLocked()
	return len(p), nil
}

// armLocked arms the timer for a buffer that now holds a line. b.mu is
// held.
func (b *bufferedWriter) armLocked() {
	if !b.armed {
		b.armed = true
		if b.timer == nil {
			b.timer = time.AfterFunc(FlushInterval, b.flushLater)
		} else {
			b.timer.Reset(FlushInterval)
		}
	}
}

// lineRoom is the room writeLine leaves for a line: with less left, the
// buffer is flushed first, so it keeps its size.
const lineRoom = 4 << 10

// writeLine encodes the line straight into the buffer under b.mu: what
// flushingCore.write does through a pooled encoder and Write, without the
// pool, the copy and a second pass over the line. It reports false, having
// written nothing, for a line the line encoder leaves to zap and once the
// writer is stopped (lines go straight to w then).
func (b *bufferedWriter) writeLine(ent zapcore.Entry, fields []zapcore.Field) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return false, nil
	}
	if bufferSize-len(b.buf) < lineRoom {
		if err := b.flushLocked(); err != nil {
			return false, err
		}
	}
	if b.buf == nil {
		b.buf = make([]byte, 0, bufferSize)
	}
	start := len(b.buf)
	b.enc.buf = b.buf
	b.enc.appendLine(ent, fields)
	b.buf, b.enc.buf = b.enc.buf, nil
	if b.enc.failed {
		b.buf = b.buf[:start]
		if cap(b.buf) > bufferSize { // grown by the part of a huge line
			err := b.flushLocked()
			b.buf = make([]byte, 0, bufferSize)
			return false, err
		}
		return false, nil
	}
	if len(b.buf) > bufferSize {
		// A huge line: out at once, and the buffer back to its size.
		err := b.flushLocked()
		if cap(b.buf) > bufferSize {
			b.buf = make([]byte, 0, bufferSize)
		}
		return true, err
	}
	b.armLocked()
	return true, nil
}

func (b *bufferedWriter) flushLater() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed = false
	_ = b.flushLocked()
}

// Sync writes out what is buffered.
func (b *bufferedWriter) Sync() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked()
}

func (b *bufferedWriter) flushLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.w.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// stop flushes, and makes every later line go straight to the writer.
func (b *bufferedWriter) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = b.flushLocked()
	b.stopped = true
	if b.timer != nil {
		b.timer.Stop()
	}
}

// flushingCore writes entries at warn level and above through at once: a
// problem is what an operator tails the log for, and what must not be lost
// if the agent dies next. A pointer: Check hands it to every line's entry
// as a Core, and a value would be copied to the heap for each.
//
// fast: the core writes common lines with its lineEncoder, not zap's
// encoder; only the core New made, whose encoder has no fields of With.
type flushingCore struct {
	zapcore.Core
	ws     zapcore.WriteSyncer
	bw     *bufferedWriter // ws, for writeLine
	fast   bool
	errOut zapcore.WriteSyncer // the logger's ErrorOutput
}

func (c *flushingCore) With(fields []zapcore.Field) zapcore.Core {
	return &flushingCore{Core: c.Core.With(fields), ws: c.ws, bw: c.bw, fast: c.fast && len(fields) == 0, errOut: c.errOut}
}

func (c *flushingCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *flushingCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	return c.writeSync(ent, fields, false)
}

// writeSync writes the line, and syncs at warn level and above; see write
// for trusted.
func (c *flushingCore) writeSync(ent zapcore.Entry, fields []zapcore.Field, trusted bool) error {
	if err := c.write(ent, fields, trusted); err != nil {
		return err
	}
	if ent.Level >= zapcore.WarnLevel {
		return c.ws.Sync()
	}
	return nil
}

// write writes the line through the line encoder when it can, else
// through zap's. It encodes straight into the buffer, under its lock, when
// no field runs code of its own (an inline object's marshaller that logs
// would deadlock there), or when trusted: Direct's callers promise theirs
// do not log.
func (c *flushingCore) write(ent zapcore.Entry, fields []zapcore.Field, trusted bool) error {
	fast, inline := fastFields(fields)
	if !c.fast || ent.Caller.Defined || ent.Stack != "" || !fast {
		return c.Core.Write(ent, fields)
	}
	if trusted || !inline {
		if ok, err := c.bw.writeLine(ent, fields); ok || err != nil {
			return err
		}
	}
	e := lineEncoders.Get().(*lineEncoder)
	defer e.free()
	if e.encode(ent, fields); e.failed {
		return c.Core.Write(ent, fields)
	}
	_, err := c.ws.Write(e.buf)
	return err
}

// Direct writes lines straight to the core of a logger New made, as the
// logger's Check and CheckedEntry.Write would with no caller and no stack
// trace, without their pooled entry and annotation: every operation of a
// storm writes a line. Unlike a zap core in general (zap's test observer
// keeps them), it keeps no field after Write returns, so a caller may
// reuse what they point to.
type Direct struct {
	core *flushingCore
	name string
}

// DirectOf is a Direct for log's lines, or nil if log's core is not one
// New made (a test observer, hooks, a tee): those get lines through log.
// log must add no caller and no stack trace at the levels written, and
// the marshallers of the inline objects written must not log (they run
// under the buffer's lock).
func DirectOf(log *zap.Logger) *Direct {
	c, ok := log.Core().(*flushingCore)
	if !ok || !c.fast {
		return nil
	}
	return &Direct{core: c, name: log.Name()}
}

// Enabled reports whether lines at lvl are written.
func (d *Direct) Enabled(lvl zapcore.Level) bool { return d.core.Enabled(lvl) }

// Write writes a line at lvl (below DPanicLevel, which zap may act on),
// if enabled; a write error goes to the error output as zap reports it.
func (d *Direct) Write(lvl zapcore.Level, msg string, fields []zapcore.Field) {
	if lvl >= zapcore.DPanicLevel || !d.core.Enabled(lvl) {
		return
	}
	ent := zapcore.Entry{LoggerName: d.name, Time: time.Now(), Level: lvl, Message: msg}
	if err := d.core.writeSync(ent, fields, true); err != nil {
		_, _ = fmt.Fprintf(d.core.errOut, "%v write error: %v\n", ent.Time, err)
		_ = d.core.errOut.Sync()
	}
}
