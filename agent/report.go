package agent

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/volume-agent/volume-agent/events"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// reporter tells people and Prometheus how each operation ended: a log line,
// an event on the pods concerned when it failed, and the duration metric.
type reporter struct {
	log     *zap.Logger
	events  events.Recorder
	metrics *Metrics
}

// failureReasons maps operations to the event reason of their failure.
var failureReasons = map[string]string{
	"mount_volume":     events.FailedMount,
	"mount_device":     events.FailedMount,
	"verify_attached":  events.FailedAttachVolume,
	"unmount_volume":   events.FailedUnmount,
	"unmount_device":   events.FailedUnmountDevice,
	"volume_fs_resize": events.VolumeResizeFailed,
}

func (r *reporter) OperationFinished(key operations.Key, op *operations.Operation, took time.Duration, err error, retryIn time.Duration) {
	r.metrics.OperationFinished(key, op, took, err, retryIn)
	fields := []zap.Field{
		zap.String("operation", op.Name), zap.String("volume", string(key.Volume)), zap.String("plugin", op.Plugin),
		zap.Duration("took", took),
	}
	if key.Pod != "" {
		fields = append(fields, zap.String("pod", op.Pod.String()), zap.String("podUID", string(op.Pod.UID)))
	}
	switch {
	case err == nil:
		r.log.Info("operation succeeded", fields...)
		return
	case errors.Is(err, operations.ErrStale):
		r.log.Debug("operation skipped: plan was stale", fields...)
		return
	}
	fields = append(fields, zap.Error(err), zap.Duration("retryIn", retryIn), zap.Bool("uncertain", volume.IsUncertain(err)))
	r.log.Error("operation failed", fields...)

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
