package opreport

import (
	"io"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/volume-agent/volume-agent/internal/logging"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// BenchmarkOperationSucceeded measures the report of one successful pod
// operation, the line every operation of a storm writes, through the
// agent's logger at info level.
func BenchmarkOperationSucceeded(b *testing.B) {
	log, stop := logging.New(zap.InfoLevel, io.Discard)
	defer stop()
	r := New(Options{Log: log.Named("operations")})
	op := &operations.Operation{Name: operations.OpMountVolume, Target: operations.Target{
		Volume: "kubernetes.io/empty-dir/0123456789-abcdef/scratch-0", Plugin: "kubernetes.io/empty-dir",
		Pod: volume.PodInfo{PodRef: volume.PodRef{Namespace: "default", Name: "pod-0001", UID: "0123456789-abcdef"}},
	}}
	key := op.Key()
	b.ReportAllocs()
	for b.Loop() {
		r.OperationFinished(key, op, 3*time.Millisecond, nil, 0)
	}
}
