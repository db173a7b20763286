package agent

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/ui/timeline"
	"github.com/volume-agent/volume-agent/volume"
)

// reporter tells people and Prometheus how each operation ended: a log line,
// an event on the pods concerned when it failed, and the duration metric.
type reporter struct {
	log     *zap.Logger
	events  events.Recorder
	metrics *Metrics

	trimmer *memoryTrimmer
	// history is the operation timeline of the operator page.
	history *timeline.Ring

	// lastErr remembers each key's last failure: a failure that repeats
	// unchanged is logged at debug level, so a stuck volume does not write
	// the same error line on every retry.
	mu      sync.Mutex
	lastErr map[operations.Key]string
}

// failureReasons maps operations to the event reason of their failure.
var failureReasons = map[operations.Op]string{
	operations.OpMountVolume:     events.FailedMount,
	operations.OpPrepareSubPaths: events.FailedMount,
	operations.OpMountDevice:     events.FailedMount,
	operations.OpVerifyAttached:  events.FailedAttachVolume,
	operations.OpUnmountVolume:   events.FailedUnmount,
	operations.OpUnmountDevice:   events.FailedUnmountDevice,
	operations.OpExpandVolume:    events.VolumeResizeFailed,
	operations.OpMapDevice:       events.FailedMapVolume,
	operations.OpMapVolume:       events.FailedMapVolume,
	operations.OpUnmapVolume:     events.FailedUnmapDevice,
	operations.OpUnmapDevice:     events.FailedUnmapDevice,
}

func (r *reporter) OperationFinished(key operations.Key, op *operations.Operation, took time.Duration, err error, retryIn time.Duration) {
	r.metrics.OperationFinished(key, op, took, err, retryIn)
	r.trimmer.operationFinished()
	if r.history != nil {
		r.history.OperationFinished(key, op, took, err, retryIn)
	}
	// Room for every field below: one allocation per operation of a storm,
	// not one and a regrowth.
	fields := make([]zap.Field, 0, 9)
	fields = append(fields, zap.String("operation", string(op.Name)), zap.String("volume", string(key.Volume)), zap.String("plugin", op.Plugin),
		zap.Duration("took", took))
	if key.Pod != "" {
		fields = append(fields, zap.Stringer("pod", op.Pod), zap.String("podUID", string(op.Pod.UID)))
	}
	switch {
	case err == nil:
		r.forget(key)
		r.log.Info("operation succeeded", fields...)
		return
	case errors.Is(err, operations.ErrStale):
		r.log.Debug("operation skipped: plan was stale", fields...)
		return
	}
	fields = append(fields, zap.Error(err), zap.Duration("retryIn", retryIn), zap.Bool("uncertain", volume.IsUncertain(err)))
	if r.repeated(key, err) {
		r.log.Debug("operation failed again", fields...)
	} else {
		r.log.Error("operation failed", fields...)
	}

	reason, ok := failureReasons[op.Name]
	if !ok {
		return
	}
	pods := op.Waiting
	if key.Pod != "" {
		pods = []volume.PodRef{op.Pod}
	}
	msg := fmt.Sprintf("%s of volume %q failed: %v", op.Name, volumeLabel(key.Volume, op.Spec), err)
	for _, p := range pods {
		r.events.Event(events.PodObject(p), events.Warning, reason, msg)
	}
}

// volumeLabel names a volume the way a user wrote it when the spec is known.
func volumeLabel(name volume.UniqueName, spec *volume.Spec) string {
	if spec == nil {
		return string(name)
	}
	if spec.PVC != nil {
		return fmt.Sprintf("%s (PVC %s)", spec.Name, spec.ClaimRef())
	}
	return spec.Name
}

func (r *reporter) repeated(key operations.Key, err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastErr == nil {
		r.lastErr = map[operations.Key]string{}
	}
	msg := err.Error()
	if len(r.lastErr) > 10000 { // keys of volumes long gone
		clear(r.lastErr)
	}
	same := r.lastErr[key] == msg
	r.lastErr[key] = msg
	return same
}

func (r *reporter) forget(key operations.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.lastErr, key)
}
