// Package opreport owns what people hear of each operation's outcome: a
// log line (repeats of an unchanged failure or wait at debug level), a
// Warning event on the pods concerned when it failed, and one when a wait
// that normally ends on its own has lasted too long. Metrics, the memory
// trimmer and the page's timeline observe operations beside it.
package opreport

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/volume-agent/volume-agent/internal/logging"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

// Reporter tells people how each operation ended: a log line, and an
// event on the pods concerned when it failed.
//
// An operation that waits for something that normally happens on its own
// (volume.IsWaiting: the attach/detach controller's attachment) is no
// failure: it is logged at info level and gets no event, as the kubelet
// keeps such waits quiet, until the wait has lasted waitWarning; then the
// pods get one Warning event, as the kubelet's pod sync reports volumes not
// ready within its timeout.
type Reporter struct {
	log         *zap.Logger
	direct      *logging.Direct // log's lines without zap's Check, when it can
	events      events.Recorder
	now         func() time.Time
	waitWarning time.Duration

	// lastErr remembers each key's last failure: a failure that repeats
	// unchanged is logged at debug level, so a stuck volume does not write
	// the same error line on every retry. waits are the keys waiting now.
	mu      sync.Mutex
	lastErr map[operations.Key]string
	waits   map[operations.Key]*wait
	// remembers is whether either map may hold a key, read without mu: a
	// storm's successes then forget nothing without taking the lock.
	remembers atomic.Bool
}

// wait is one key's current wait.
type wait struct {
	since  time.Time
	warned bool
}

// Options configure a Reporter.
type Options struct {
	// Log gets a line per operation. The reporter drops the caller and
	// stack traces from it: they would only ever show the executor calling
	// the reporter (and, for a storm of failures, cost a stack walk each).
	Log *zap.Logger
	// Events get the Warning events on pods.
	Events events.Recorder
	// WaitWarning is how long an operation may wait before the pods hear
	// of it. Default: the kubelet's pod attach-and-mount timeout, 2m3s
	// (podAttachAndMountTimeout in pkg/kubelet/volumemanager), after which
	// its pod sync reports FailedMount "Unable to attach or mount volumes:
	// ... timed out waiting for the condition".
	WaitWarning time.Duration
	// Now is the clock of waits (default time.Now).
	Now func() time.Time
}

// New is a Reporter.
func New(o Options) *Reporter {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.WaitWarning <= 0 {
		o.WaitWarning = 2*time.Minute + 3*time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	log := o.Log.WithOptions(zap.WithCaller(false), zap.AddStacktrace(zapcore.FatalLevel))
	return &Reporter{
		log: log, direct: logging.DirectOf(log),
		events: o.Events, now: o.Now, waitWarning: o.WaitWarning,
		lastErr: map[operations.Key]string{}, waits: map[operations.Key]*wait{},
	}
}

var _ operations.Observer = (*Reporter)(nil)

// OperationFinished implements operations.Observer.
func (r *Reporter) OperationFinished(key operations.Key, op *operations.Operation, took time.Duration, err error, retryIn time.Duration) {
	switch {
	case err == nil:
		r.forget(key)
		if r.direct != nil {
			r.succeeded(key, op, took)
			return
		}
		// Checked first: the fields are built only for a line written.
		if ce := r.log.Check(zap.InfoLevel, "operation succeeded"); ce != nil {
			ce.Write(lineFields(key, op, took)...)
		}
		return
	case errors.Is(err, operations.ErrStale):
		if ce := r.log.Check(zap.DebugLevel, "operation skipped: plan was stale"); ce != nil {
			ce.Write(lineFields(key, op, took)...)
		}
		return
	case volume.IsWaiting(err):
		r.waiting(key, op, opFields(key, op, took, 3), err, retryIn)
		return
	}
	fields := opFields(key, op, took, 3)
	r.endWait(key)
	fields = append(fields, zap.Error(err), zap.Duration("retryIn", retryIn), zap.Bool("uncertain", volume.IsUncertain(err)))
	if r.repeated(key, err) {
		r.log.Debug("operation failed again", fields...)
	} else {
		r.log.Error("operation failed", fields...)
	}

	kind := operations.KindOf(op.Name)
	if kind == nil {
		return
	}
	r.warn(key, op, kind.FailureReason, fmt.Sprintf("%s of volume %q failed: %v", op.Name, volumeLabel(key.Volume, op.Spec), err))
}

// opFields are the fields of every line about an operation, with room for
// more fields after them: one inline field, encoded as written, not six.
func opFields(key operations.Key, op *operations.Operation, took time.Duration, more int) []zap.Field {
	return append(make([]zap.Field, 0, 1+more), zap.Inline(&opLine{key: key, op: op, took: took}))
}

// lineFields are the fields of a line about an operation that says no
// more, in one allocation: every operation of a storm writes one.
func lineFields(key operations.Key, op *operations.Operation, took time.Duration) []zap.Field {
	l := &struct {
		line   opLine
		fields [1]zap.Field
	}{line: opLine{key: key, op: op, took: took}}
	l.fields[0] = zap.Inline(&l.line)
	return l.fields[:]
}

// succeeded writes the success line through r.direct, which keeps no
// field: its fields are reused, and the line costs no allocation.
func (r *Reporter) succeeded(key operations.Key, op *operations.Operation, took time.Duration) {
	if !r.direct.Enabled(zap.InfoLevel) {
		return
	}
	l := reusedLines.Get().(*reusedLine)
	l.line = opLine{key: key, op: op, took: took}
	r.direct.Write(zap.InfoLevel, "operation succeeded", l.fields[:])
	l.line = opLine{} // holds no operation while pooled
	reusedLines.Put(l)
}

// reusedLine is lineFields' allocation, pooled for r.direct.
type reusedLine struct {
	line   opLine
	fields [1]zap.Field
}

var reusedLines = sync.Pool{New: func() any {
	l := &reusedLine{}
	l.fields[0] = zap.Inline(&l.line)
	return l
}}

// opLine is what every line about an operation says first.
type opLine struct {
	key  operations.Key
	op   *operations.Operation
	took time.Duration
	// pod is room for the pod's "namespace/name" (PodRef.String), which
	// would otherwise cost every line an allocation: encoders copy what
	// they are given.
	pod [96]byte
}

func (l *opLine) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString("operation", string(l.op.Name))
	enc.AddString("volume", string(l.key.Volume))
	enc.AddString("plugin", l.op.Plugin)
	enc.AddDuration("took", l.took)
	if l.key.Pod != "" {
		p := l.op.Pod.PodRef
		enc.AddByteString("pod", append(append(append(l.pod[:0], p.Namespace...), '/'), p.Name...))
		enc.AddString("podUID", string(l.op.Pod.UID))
	}
	return nil
}

// waiting reports an operation that waits: at info level (debug when
// nothing changed since the last attempt), and once it has waited
// the wait warning, one Warning event and log line.
func (r *Reporter) waiting(key operations.Key, op *operations.Operation, fields []zap.Field, err error, retryIn time.Duration) {
	fields = append(fields, zap.String("waitingFor", err.Error()), zap.Duration("retryIn", retryIn))
	now := r.now()
	r.mu.Lock()
	w, ok := r.waits[key]
	if !ok {
		w = &wait{since: now}
		r.waits[key] = w
		r.remembers.Store(true)
	}
	waited := now.Sub(w.since)
	warn := waited >= r.waitWarning && !w.warned
	w.warned = w.warned || warn
	r.mu.Unlock()

	fields = append(fields, zap.Duration("waited", waited))
	switch {
	case warn:
		r.log.Warn("operation still waiting", fields...)
		r.warn(key, op, events.FailedMount, fmt.Sprintf("Unable to attach or mount volumes: volume %q not ready after %s: %v",
			volumeLabel(key.Volume, op.Spec), waited.Round(time.Second), err))
	case r.repeated(key, err):
		r.log.Debug("operation still waiting", fields...)
	default:
		r.log.Info("operation waiting", fields...)
	}
}

// warn puts a Warning event on the pods the operation works for.
func (r *Reporter) warn(key operations.Key, op *operations.Operation, reason, msg string) {
	pods := op.Waiting
	if key.Pod != "" {
		pods = []volume.PodRef{op.Pod.PodRef}
	}
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

func (r *Reporter) repeated(key operations.Key, err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	msg := err.Error()
	if len(r.lastErr) > 10000 { // keys of volumes long gone
		clear(r.lastErr)
	}
	if len(r.waits) > 10000 {
		clear(r.waits)
	}
	same := r.lastErr[key] == msg
	r.lastErr[key] = msg
	r.remembers.Store(true)
	return same
}

// forget drops what the reporter remembers of a key that succeeded.
func (r *Reporter) forget(key operations.Key) {
	if !r.remembers.Load() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.lastErr, key)
	delete(r.waits, key)
	if len(r.lastErr) == 0 && len(r.waits) == 0 {
		r.remembers.Store(false)
	}
}

// endWait: the key failed for real, its wait (if any) is over.
func (r *Reporter) endWait(key operations.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waits, key)
}
