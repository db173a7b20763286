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
	core := &flushingCore{Core: zapcore.NewCore(zapcore.NewJSONEncoder(encoderConfig()), buf, level), ws: buf, fast: true, errOut: errOut}
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
	if !b.armed {
		b.armed = true
		if b.timer == nil {
			b.timer = time.AfterFunc(FlushInterval, b.flushLater)
		} else {
			b.timer.Reset(FlushInterval)
		}
	}
	return len(p), nil
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
	fast   bool
	errOut zapcore.WriteSyncer // the logger's ErrorOutput
}

func (c *flushingCore) With(fields []zapcore.Field) zapcore.Core {
	return &flushingCore{Core: c.Core.With(fields), ws: c.ws, fast: c.fast && len(fields) == 0, errOut: c.errOut}
}

func (c *flushingCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *flushingCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if err := c.write(ent, fields); err != nil {
		return err
	}
	if ent.Level >= zapcore.WarnLevel {
		return c.ws.Sync()
	}
	return nil
}

// write writes the line through the line encoder when it can, else
// through zap's.
func (c *flushingCore) write(ent zapcore.Entry, fields []zapcore.Field) error {
	if !c.fast || ent.Caller.Defined || ent.Stack != "" || !fastFields(fields) {
		return c.Core.Write(ent, fields)
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
// log must add no caller and no stack trace at the levels written.
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
	if err := d.core.Write(ent, fields); err != nil {
		_, _ = fmt.Fprintf(d.core.errOut, "%v write error: %v\n", ent.Time, err)
		_ = d.core.errOut.Sync()
	}
}
