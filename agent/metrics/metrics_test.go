package metrics

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// Waits are counted as such in the operation metrics, not as failures.
func TestResultOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, "success"},
		{volume.Waitingf("waiting"), "waiting"},
		{fmt.Errorf("wrapped: %w", volume.Waitingf("waiting")), "waiting"},
		{volume.Uncertainf("timed out"), "uncertain"},
		{errors.New("attach failed"), "failure"},
		{operations.ErrStale, "stale"},
	} {
		if got := resultOf(c.err); got != c.want {
			t.Errorf("resultOf(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

// The cached observer of each label set must record what the vector's own
// lookup does: the same operations, observed through OperationFinished on
// one Metrics and through WithLabelValues on another, gather the same.
func TestOperationObserverCacheAgreesWithVector(t *testing.T) {
	cached, plain := New(), New()
	for i, c := range []struct {
		op     operations.Op
		plugin string
		err    error
	}{
		{operations.OpMountVolume, "kubernetes.io/empty-dir", nil},
		{operations.OpMountVolume, "kubernetes.io/empty-dir", nil},
		{operations.OpUnmountVolume, "kubernetes.io/empty-dir", nil},
		{operations.OpMountVolume, "kubernetes.io/csi", volume.Uncertainf("timed out")},
		{operations.OpMountVolume, "kubernetes.io/csi", errors.New("failed")},
		{operations.OpMountVolume, "kubernetes.io/csi", nil},
		{operations.OpMountDevice, "kubernetes.io/csi", operations.ErrStale},
		{operations.OpMountVolume, "kubernetes.io/empty-dir", volume.Waitingf("waiting")},
		{operations.OpMountVolume, "kubernetes.io/empty-dir", nil},
	} {
		took := time.Duration(i+1) * 700 * time.Microsecond
		op := &operations.Operation{Name: c.op, Target: operations.Target{Plugin: c.plugin}}
		cached.OperationFinished(op.Key(), op, took, c.err, 0)
		plain.operationDuration.WithLabelValues(string(c.op), c.plugin, resultOf(c.err)).Observe(took.Seconds())
		if got, want := cached.operationObserver(opLabels{string(c.op), c.plugin, resultOf(c.err)}),
			cached.operationDuration.WithLabelValues(string(c.op), c.plugin, resultOf(c.err)); got != want {
			t.Errorf("%s %s %v: cached observer %p is not the vector's %p", c.op, c.plugin, c.err, got, want)
		}
	}
	if got, want := gather(t, cached), gather(t, plain); got != want {
		t.Errorf("cached observers gathered\n%s\nthe vector's own lookups\n%s", got, want)
	}
}

func gather(t *testing.T, m *Metrics) string {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range fams {
		if f.GetName() != "volume_agent_operation_duration_seconds" {
			continue
		}
		for _, m := range f.Metric {
			m.Histogram.CreatedTimestamp = nil // when the series was made
		}
		b.WriteString(f.String())
	}
	if b.Len() == 0 {
		t.Fatal("no operation_duration_seconds gathered")
	}
	return b.String()
}

// BenchmarkOperationFinished measures the metrics of one successful
// operation, observed on every operation of a storm.
func BenchmarkOperationFinished(b *testing.B) {
	m := New()
	op := &operations.Operation{Name: operations.OpMountVolume, Target: operations.Target{Plugin: "kubernetes.io/empty-dir"}}
	b.ReportAllocs()
	for b.Loop() {
		m.OperationFinished(op.Key(), op, time.Millisecond, nil, 0)
	}
}

// BenchmarkOperationFinishedParallel is the same from every P at once, as
// the executor's workers observe operations.
func BenchmarkOperationFinishedParallel(b *testing.B) {
	m := New()
	op := &operations.Operation{Name: operations.OpMountVolume, Target: operations.Target{Plugin: "kubernetes.io/empty-dir"}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.OperationFinished(op.Key(), op, time.Millisecond, nil, 0)
		}
	})
}
