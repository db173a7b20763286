package logging

import (
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
)

// encodeLine is the JSON line a zap encoder with timeEnc writes for an
// entry at t.
func encodeLine(t *testing.T, timeEnc zapcore.TimeEncoder, at time.Time) string {
	t.Helper()
	cfg := zapcore.EncoderConfig{TimeKey: "time", MessageKey: "msg", EncodeTime: timeEnc}
	buf, err := zapcore.NewJSONEncoder(cfg).EncodeEntry(zapcore.Entry{Time: at, Message: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	return buf.String()
}

// The cached encoder writes what zap's ISO8601TimeEncoder writes, for times
// in the same second and across seconds, zones and daylight saving changes.
func TestEncodeTimeLikeISO8601(t *testing.T) {
	zones := []*time.Location{time.UTC, time.Local, time.FixedZone("plus", 5*3600+30*60), time.FixedZone("minus", -7*3600)}
	for _, name := range []string{"America/New_York", "Europe/Berlin", "Australia/Lord_Howe"} {
		if loc, err := time.LoadLocation(name); err == nil {
			zones = append(zones, loc)
		}
	}
	// Around a daylight saving change in 2026, both directions, and a
	// spread of times, each seen several times in a row as a storm would.
	starts := []time.Time{
		time.Date(2026, 3, 8, 6, 59, 58, 0, time.UTC),
		time.Date(2026, 11, 1, 5, 59, 58, 0, time.UTC),
		time.Date(2026, 3, 29, 0, 59, 59, 999_000_000, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 500_000_000, time.UTC),
		time.Unix(0, 0),
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		starts = append(starts, time.Unix(r.Int64N(4_000_000_000), r.Int64N(1e9)))
	}
	for _, loc := range zones {
		for _, s := range starts {
			at := s.In(loc)
			for range 8 {
				want := encodeLine(t, zapcore.ISO8601TimeEncoder, at)
				// Twice: formatted, then from the millisecond's cache.
				for range 2 {
					if got := encodeLine(t, encodeTime, at); got != want {
						t.Fatalf("%v in %v: got %s, want %s", s, loc, got, want)
					}
				}
				at = at.Add(time.Duration(r.Int64N(int64(700 * time.Millisecond))))
			}
		}
	}
}

func BenchmarkEncodeTime(b *testing.B) {
	cfg := zapcore.EncoderConfig{TimeKey: "time", MessageKey: "msg"}
	for _, c := range []struct {
		name string
		enc  zapcore.TimeEncoder
	}{{"zap", zapcore.ISO8601TimeEncoder}, {"cached", encodeTime}} {
		b.Run(c.name, func(b *testing.B) {
			cfg.EncodeTime = c.enc
			e := zapcore.NewJSONEncoder(cfg)
			b.ReportAllocs()
			for b.Loop() {
				buf, _ := e.EncodeEntry(zapcore.Entry{Time: time.Now(), Message: "m"}, nil)
				buf.Free()
			}
		})
	}
}
