package logging

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap/zapcore"
)

// encodeTime writes t as zap's ISO8601TimeEncoder does
// ("2006-01-02T15:04:05.000Z0700"), with the date, time of day and zone
// formatted once per second and location: a storm writes thousands of
// lines a second, and formatting the whole layout for each was a fifth of
// the cost of an operation's line. Within one second of one location only
// the milliseconds change (a zone's offset changes on whole seconds), and
// lines of the same millisecond share its string.
func encodeTime(t time.Time, enc zapcore.PrimitiveArrayEncoder) {
	enc.AppendString(timeText(t))
}

// timeText is t as encodeTime writes it.
func timeText(t time.Time) string {
	milli, loc := t.UnixMilli(), t.Location()
	if m := lastMilli.Load(); m != nil && m.milli == milli && m.loc == loc {
		return m.text
	}
	sec := t.Unix()
	c := lastSecond.Load()
	if c == nil || c.sec != sec || c.loc != loc {
		c = &formattedSecond{sec: sec, loc: loc, prefix: t.Format("2006-01-02T15:04:05."), zone: t.Format("Z0700")}
		lastSecond.Store(c)
	}
	var buf [48]byte
	b := append(buf[:0], c.prefix...)
	ms := t.Nanosecond() / int(time.Millisecond)
	b = append(b, byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10))
	b = append(b, c.zone...)
	m := &formattedMilli{milli: milli, loc: loc, text: string(b)}
	lastMilli.Store(m)
	return m.text
}

// formattedSecond is one second of one location, formatted up to its
// milliseconds, and its zone.
type formattedSecond struct {
	sec          int64
	loc          *time.Location
	prefix, zone string
}

// formattedMilli is one millisecond of one location, formatted.
type formattedMilli struct {
	milli int64
	loc   *time.Location
	text  string
}

var (
	lastSecond atomic.Pointer[formattedSecond]
	lastMilli  atomic.Pointer[formattedMilli]
)
