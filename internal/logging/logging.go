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
	"io"
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
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "time"
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	buf := &zapcore.BufferedWriteSyncer{WS: zapcore.AddSync(w), Size: bufferSize, FlushInterval: FlushInterval}
	core := flushingCore{Core: zapcore.NewCore(zapcore.NewJSONEncoder(enc), buf, level), ws: buf}
	log := zap.New(core, zap.AddCaller(), zap.AddStacktrace(zapcore.ErrorLevel), zap.ErrorOutput(zapcore.Lock(zapcore.AddSync(w))))
	return log, func() { _ = buf.Stop() }
}

// flushingCore writes entries at warn level and above through at once: a
// problem is what an operator tails the log for, and what must not be lost
// if the agent dies next.
type flushingCore struct {
	zapcore.Core
	ws zapcore.WriteSyncer
}

func (c flushingCore) With(fields []zapcore.Field) zapcore.Core {
	return flushingCore{Core: c.Core.With(fields), ws: c.ws}
}

func (c flushingCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c flushingCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if err := c.Core.Write(ent, fields); err != nil {
		return err
	}
	if ent.Level >= zapcore.WarnLevel {
		return c.ws.Sync()
	}
	return nil
}
