package logging

import (
	"io"
	"testing"

	"go.uber.org/zap"
)

// BenchmarkInfoLine measures one info line with a few fields, as each
// operation of a storm writes, through the agent's core.
func BenchmarkInfoLine(b *testing.B) {
	log, stop := New(zap.InfoLevel, io.Discard)
	defer stop()
	log = log.WithOptions(zap.WithCaller(false))
	b.ReportAllocs()
	for b.Loop() {
		log.Info("operation succeeded", zap.String("operation", "mount_volume"), zap.String("volume", "kubernetes.io/empty-dir/uid/scratch"))
	}
}
