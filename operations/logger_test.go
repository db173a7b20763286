package operations

import (
	"io"
	"maps"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/volume-agent/volume-agent/volume"
)

// An operation's logger carries the target's fields: the pod's only for a
// pod operation.
func TestOperationLoggerFields(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	o := &Operator{Log: zap.New(core)}
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
		o.logger(&tc.target, tc.op).Info("line")
		entries := logs.TakeAll()
		if len(entries) != 1 || !maps.Equal(entries[0].ContextMap(), tc.want) {
			t.Errorf("%s: logged %+v, want one line with %v", tc.op, entries, tc.want)
		}
	}
}

// BenchmarkOperationLogger measures the logger each operation hands its
// plugin, which most never write to.
func BenchmarkOperationLogger(b *testing.B) {
	o := &Operator{Log: zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))}
	t := &Target{Volume: "kubernetes.io/empty-dir/uid-1/scratch", Plugin: "kubernetes.io/empty-dir",
		Pod: volume.PodInfo{PodRef: volume.PodRef{Namespace: "default", Name: "pod-0001", UID: "uid-1"}}}
	b.ReportAllocs()
	for b.Loop() {
		o.logger(t, OpMountVolume)
	}
}
