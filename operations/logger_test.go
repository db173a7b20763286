package operations

import (
	"io"
	"maps"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// An operation's logger carries the target's fields: the pod's only for a
// pod operation.
func TestOperationLoggerFields(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	o := &Operator{Log: zap.New(core, zap.AddCaller())}
	pod := volume.PodInfo{PodRef: volume.PodRef{Namespace: "ns", Name: "p", UID: "uid-1"}}
	for _, tc := range []struct {
		target Target
		op     Op
		want   map[string]any
	}{
		{Target{Volume: "plugin/v", Plugin: "plugin", Pod: pod}, OpMountVolume,
			map[string]any{"volume": "plugin/v", "plugin": "plugin", "operation": "mount_volume", "pod": "ns/p", "podUID": "uid-1"}},
		{Target{Volume: "plugin/v", Plugin: "plugin"}, OpMountDevice,
			map[string]any{"volume": "plugin/v", "plugin": "plugin", "operation": "mount_device"}},
	} {
		_, fromRequest := withLog[plugins.SetUpRequest](o, &tc.target, tc.op)
		for _, log := range []plugins.Log{o.logger(&tc.target, tc.op), fromRequest} {
			log.Info("line")
			log.Debug("line")
			entries := logs.TakeAll()
			if len(entries) != 2 {
				t.Fatalf("%s: logged %+v, want two lines", tc.op, entries)
			}
			for _, e := range entries {
				if !maps.Equal(e.ContextMap(), tc.want) || !strings.HasSuffix(e.Caller.File, "operations/logger_test.go") {
					t.Errorf("%s: logged %+v from %s, want one line with %v from this test", tc.op, e.ContextMap(), e.Caller.File, tc.want)
				}
			}
		}
	}
}

// The operation's logger writes what a logger With the target's fields
// writes, byte for byte, and nothing below the base's level.
func TestOperationLoggerLikeWith(t *testing.T) {
	var got, want strings.Builder
	cfg := zap.NewProductionEncoderConfig()
	cfg.TimeKey = "" // lines written a moment apart
	newLog := func(w io.Writer) *zap.Logger {
		return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(cfg), zapcore.AddSync(w), zap.InfoLevel))
	}
	target := &Target{Volume: "plugin/v", Plugin: "plugin", Pod: volume.PodInfo{PodRef: volume.PodRef{Namespace: "ns", Name: "p", UID: "uid-1"}}}
	log := (&Operator{Log: newLog(&got)}).logger(target, OpMountVolume)
	with := newLog(&want).With(zap.Inline(targetFields{target, OpMountVolume}))
	log.Debug("hidden")
	log.Info("info", zap.String("dir", "/d"))
	log.Warn("warn", zap.Int("n", 1))
	log.Error("error")
	with.Info("info", zap.String("dir", "/d"))
	with.Warn("warn", zap.Int("n", 1))
	with.Error("error")
	if got.String() != want.String() {
		t.Errorf("logged\n%s\nwant\n%s", got.String(), want.String())
	}
	if !strings.Contains(got.String(), `"pod":"ns/p","podUID":"uid-1","dir":"/d"`) {
		t.Errorf("logged\n%s\nwithout the target's fields before the line's", got.String())
	}
}

// BenchmarkOperationLogger measures the logger each operation hands its
// plugin, which most never write to, with the request it comes with.
func BenchmarkOperationLogger(b *testing.B) {
	o := &Operator{Log: zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))}
	t := &Target{Volume: "kubernetes.io/empty-dir/uid-1/scratch", Plugin: "kubernetes.io/empty-dir",
		Pod: volume.PodInfo{PodRef: volume.PodRef{Namespace: "default", Name: "pod-0001", UID: "uid-1"}}}
	b.ReportAllocs()
	for b.Loop() {
		// Kept, as a plugin's interface call keeps them: one allocation,
		// the request's own.
		benchRequest, benchLog = withLog[plugins.SetUpRequest](o, t, OpMountVolume)
	}
}

var (
	benchRequest *plugins.SetUpRequest
	benchLog     plugins.Log
)

// The room an operation of a storm's kinds is allocated with (withRoom) is
// an oracle's fast path: the request and logger withLog takes from it are
// those it allocates for a bare target (the simple version), zero and
// writing the same lines, and the room serves one request only.
func TestOperationRoomLikeWithLog(t *testing.T) {
	var got, want strings.Builder
	cfg := zap.NewProductionEncoderConfig()
	cfg.TimeKey = ""
	newLog := func(w io.Writer) *zap.Logger {
		return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(cfg), zapcore.AddSync(w), zap.InfoLevel))
	}
	target := Target{Volume: "plugin/v", Plugin: "plugin", SpecName: "v",
		Pod: volume.PodInfo{PodRef: volume.PodRef{Namespace: "ns", Name: "p", UID: "uid-1"}}}
	check := func(op Op, room bool, take func(*Operator, *Target) (zero bool, log plugins.Log)) {
		t.Helper()
		fast := (&Operator{Log: newLog(&got)}).Operation(op, target)
		if (fast.Target.room != nil) != room {
			t.Fatalf("%s: operation allocated with room %T, want room: %v", op, fast.Target.room, room)
		}
		bare := target
		for i := range 2 { // the second from a fresh allocation
			zero, log := take(&Operator{Log: newLog(&got)}, &fast.Target)
			wantZero, wantLog := take(&Operator{Log: newLog(&want)}, &bare)
			if !zero || !wantZero {
				t.Errorf("%s #%d: request not zero", op, i)
			}
			log.Info("line", zap.Int("n", i))
			wantLog.Info("line", zap.Int("n", i))
			if fast.Target.room != nil {
				t.Errorf("%s #%d: room %T kept after use", op, i, fast.Target.room)
			}
		}
		if got.String() != want.String() {
			t.Errorf("%s: logged\n%s\nwant\n%s", op, got.String(), want.String())
		}
		got.Reset()
		want.Reset()
	}
	setUp := func(o *Operator, t *Target) (bool, plugins.Log) {
		req, log := withLog[plugins.SetUpRequest](o, t, OpMountVolume)
		zero := req.VolumeName == "" && req.Log == nil && req.Dir == ""
		req.VolumeName = "dirty" // a second request must not see it
		return zero, log
	}
	tearDown := func(o *Operator, t *Target) (bool, plugins.Log) {
		req, log := withLog[plugins.TearDownRequest](o, t, OpUnmountVolume)
		zero := *req == plugins.TearDownRequest{}
		req.Dir = "dirty"
		return zero, log
	}
	check(OpMountVolume, true, setUp)
	check(OpUnmountVolume, true, tearDown)
	// A room of the other request's type is not taken for it, and kinds
	// whose bodies take none get none.
	check(OpMountVolume, true, tearDown)
	check(OpMountDevice, false, setUp)
}
