package opreport

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/internal/logging"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

type recordedEvent struct {
	pod, typ, reason, msg string
}

type fakeRecorder struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (f *fakeRecorder) Event(obj events.Object, typ, reason, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, recordedEvent{obj.Namespace + "/" + obj.Name, typ, reason, msg})
}

func (f *fakeRecorder) take() []recordedEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.events
	f.events = nil
	return out
}

// What people hear of operations: a normal wait (the attach/detach
// controller's attachment) is logged at info level, then debug while
// nothing changes, with no event, until it has lasted the kubelet's 2m3s:
// then one Warning FailedMount names the volume and what it waits for. A
// real failure (an attach error) is logged at error level and gives a
// Warning event each time. A success or a failure ends the wait, so the
// next one is timed from its own start. No line carries a stack trace.
func TestReporterWaits(t *testing.T) {
	waitingErr := volume.Waitingf("waiting for VolumeAttachment csi-1 (driver d, volume v) to be attached")
	attachErr := errors.New("VolumeAttachment csi-1: attach failed: no such disk")
	type step struct {
		after time.Duration // since the previous step
		err   error
		// want
		level  zapcore.Level
		events []string // "Warning FailedMount" ...
		inMsg  string   // in every event's message
	}
	cases := []struct {
		name  string
		steps []step
	}{{
		name: "a wait that ends in time is quiet",
		steps: []step{
			{err: waitingErr, level: zapcore.InfoLevel},
			{after: 30 * time.Second, err: waitingErr, level: zapcore.DebugLevel},
			{after: 90 * time.Second, err: waitingErr, level: zapcore.DebugLevel},
			{after: 2 * time.Second, level: zapcore.InfoLevel},
		},
	}, {
		name: "a long wait gives one Warning",
		steps: []step{
			{err: waitingErr, level: zapcore.InfoLevel},
			{after: 2*time.Minute + 3*time.Second, err: waitingErr, level: zapcore.WarnLevel,
				events: []string{"Warning FailedMount"}, inMsg: `Unable to attach or mount volumes: volume "data (PVC ns/claim)" not ready after 2m3s: waiting for VolumeAttachment csi-1`},
			{after: 2 * time.Minute, err: waitingErr, level: zapcore.DebugLevel},
			{after: 10 * time.Minute, err: waitingErr, level: zapcore.DebugLevel},
		},
	}, {
		name: "an attach error is a failure, every time",
		steps: []step{
			{err: waitingErr, level: zapcore.InfoLevel},
			{after: time.Second, err: attachErr, level: zapcore.ErrorLevel, events: []string{"Warning FailedAttachVolume"}, inMsg: "no such disk"},
			{after: time.Second, err: attachErr, level: zapcore.DebugLevel, events: []string{"Warning FailedAttachVolume"}, inMsg: "no such disk"},
		},
	}, {
		name: "a failure ends the wait: the next one is timed afresh",
		steps: []step{
			{err: waitingErr, level: zapcore.InfoLevel},
			{after: 2 * time.Minute, err: attachErr, level: zapcore.ErrorLevel, events: []string{"Warning FailedAttachVolume"}},
			{after: time.Second, err: waitingErr, level: zapcore.InfoLevel},
			{after: time.Minute, err: waitingErr, level: zapcore.DebugLevel},
			{after: 64 * time.Second, err: waitingErr, level: zapcore.WarnLevel, events: []string{"Warning FailedMount"}},
		},
	}, {
		name: "a success ends the wait",
		steps: []step{
			{err: waitingErr, level: zapcore.InfoLevel},
			{after: 2 * time.Minute, level: zapcore.InfoLevel},
			{after: time.Minute, err: waitingErr, level: zapcore.InfoLevel},
			{after: time.Minute, err: waitingErr, level: zapcore.DebugLevel},
		},
	}, {
		name: "a success forgets the failure: the same one is an error again",
		steps: []step{
			{err: attachErr, level: zapcore.ErrorLevel, events: []string{"Warning FailedAttachVolume"}},
			{after: time.Second, level: zapcore.InfoLevel},
			{after: time.Second, level: zapcore.InfoLevel},
			{after: time.Second, err: attachErr, level: zapcore.ErrorLevel, events: []string{"Warning FailedAttachVolume"}},
			{after: time.Second, err: attachErr, level: zapcore.DebugLevel, events: []string{"Warning FailedAttachVolume"}},
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			// The agent's logger adds stack traces at error level.
			log := zap.New(core, zap.AddStacktrace(zapcore.ErrorLevel))
			rec := &fakeRecorder{}
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			r := New(Options{Log: log, Events: rec, Now: func() time.Time { return now }})
			key := operations.Key{Volume: "kubernetes.io/csi/d^v"}
			pods := []volume.PodRef{{Namespace: "ns", Name: "app", UID: "uid-1"}, {Namespace: "ns", Name: "other", UID: "uid-2"}}
			op := &operations.Operation{Name: operations.OpVerifyAttached,
				Target: operations.Target{Plugin: "kubernetes.io/csi", Waiting: pods, Spec: claimSpec()}}
			for i, s := range c.steps {
				now = now.Add(s.after)
				r.OperationFinished(key, op, time.Millisecond, s.err, time.Second)
				entries := logs.TakeAll()
				if len(entries) != 1 || entries[0].Level != s.level {
					t.Fatalf("step %d (%v): logged %v, want one line at %s", i, s.err, levels(entries), s.level)
				}
				if entries[0].Stack != "" {
					t.Errorf("step %d: the line has a stack trace:\n%s", i, entries[0].Stack)
				}
				var got []string
				for _, ev := range rec.take() {
					got = append(got, ev.typ+" "+ev.reason)
					if !strings.Contains(ev.msg, s.inMsg) {
						t.Errorf("step %d: event message %q does not say %q", i, ev.msg, s.inMsg)
					}
				}
				// Every event goes to each of the two pods.
				var want []string
				for _, e := range s.events {
					want = append(want, e, e)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("step %d (%v): events %v, want %v", i, s.err, got, want)
				}
			}
		})
	}
}

// claimSpec is a volume "data" reached through claim ns/claim.
func claimSpec() *volume.Spec {
	return &volume.Spec{Name: "data", PVC: &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim"}}}
}

func levels(entries []observer.LoggedEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Level.String()+" "+e.Message)
	}
	return out
}

// Every line about an operation starts with the same fields: the pod's
// only for a pod operation, and a failure's after them.
func TestOperationLineFields(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	r := New(Options{Log: zap.New(core)})
	podOp := &operations.Operation{Name: operations.OpMountVolume, Target: operations.Target{Volume: "p/v", Plugin: "p",
		Pod: volume.PodInfo{PodRef: volume.PodRef{Namespace: "ns", Name: "pod", UID: "uid-1"}}}}
	volOp := &operations.Operation{Name: operations.OpMountDevice, Target: operations.Target{Volume: "p/v", Plugin: "p"}}
	for _, tc := range []struct {
		op   *operations.Operation
		err  error
		want map[string]any
	}{
		{podOp, nil, map[string]any{"operation": "mount_volume", "volume": "p/v", "plugin": "p", "took": time.Second, "pod": "ns/pod", "podUID": "uid-1"}},
		{volOp, nil, map[string]any{"operation": "mount_device", "volume": "p/v", "plugin": "p", "took": time.Second}},
		{volOp, errors.New("boom"), map[string]any{"operation": "mount_device", "volume": "p/v", "plugin": "p", "took": time.Second,
			"error": "boom", "retryIn": 2 * time.Second, "uncertain": false}},
	} {
		r.OperationFinished(tc.op.Key(), tc.op, time.Second, tc.err, 2*time.Second)
		entries := logs.TakeAll()
		if len(entries) != 1 || fmt.Sprint(entries[0].ContextMap()) != fmt.Sprint(tc.want) {
			t.Errorf("%s (%v): logged %v, want one line with %v", tc.op.Name, tc.err, entries, tc.want)
		}
	}
}

// A line about an operation is, byte for byte in the agent's JSON, the
// line written with one plain field per value: the pod spelt by
// PodRef.String, however long its name, and for a failure too.
func TestOperationLineJSON(t *testing.T) {
	cfg := zap.NewProductionEncoderConfig()
	cfg.TimeKey = ""
	newLog := func(w *strings.Builder) *zap.Logger {
		return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(cfg), zapcore.AddSync(w), zap.DebugLevel))
	}
	long := strings.Repeat("n", 253)
	for _, ref := range []volume.PodRef{
		{Namespace: "ns", Name: "pod", UID: "uid-1"},
		{Namespace: strings.Repeat("s", 63), Name: long, UID: "uid-2"},
		{Namespace: "ns", Name: `q"uote\ünï`, UID: "uid-3"},
		{},
	} {
		for _, err := range []error{nil, errors.New("boom")} {
			op := &operations.Operation{Name: operations.OpMountVolume, Target: operations.Target{Volume: "p/v", Plugin: "p", Pod: volume.PodInfo{PodRef: ref}}}
			var got, want strings.Builder
			New(Options{Log: newLog(&got), Events: &fakeRecorder{}}).OperationFinished(op.Key(), op, time.Second, err, 2*time.Second)
			fields := []zap.Field{zap.String("operation", "mount_volume"), zap.String("volume", "p/v"), zap.String("plugin", "p"), zap.Duration("took", time.Second)}
			if ref.UID != "" {
				fields = append(fields, zap.String("pod", ref.String()), zap.String("podUID", string(ref.UID)))
			}
			if err == nil {
				newLog(&want).Info("operation succeeded", fields...)
			} else {
				fields = append(fields, zap.Error(err), zap.Duration("retryIn", 2*time.Second), zap.Bool("uncertain", false))
				newLog(&want).Error("operation failed", fields...)
			}
			if got.String() != want.String() {
				t.Errorf("%v, %v: logged\n%s\nwant\n%s", ref, err, got.String(), want.String())
			}
		}
	}
}

// Through the agent's logger, a success line written by the direct path
// is byte for byte the line zap's Check and Write give (times aside), and
// the direct path is taken; observers and other cores get lines from zap.
func TestDirectLineLikeZap(t *testing.T) {
	times := regexp.MustCompile(`"time":"[^"]*"`)
	long := strings.Repeat("n", 253)
	for _, ref := range []volume.PodRef{
		{Namespace: "ns", Name: "pod", UID: "uid-1"},
		{Namespace: strings.Repeat("s", 63), Name: long, UID: "uid-2"},
		{Namespace: "ns", Name: `q"uote\ünï`, UID: "uid-3"},
		{},
	} {
		op := &operations.Operation{Name: operations.OpMountVolume, Target: operations.Target{Volume: "p/v", Plugin: "p", Pod: volume.PodInfo{PodRef: ref}}}
		var lines [2]strings.Builder
		for i, direct := range []bool{true, false} {
			log, stop := logging.New(zap.InfoLevel, &lines[i])
			r := New(Options{Log: log.Named("operations"), Events: &fakeRecorder{}})
			if r.direct == nil {
				t.Fatal("the agent's logger gets no direct path")
			}
			if !direct {
				r.direct = nil
			}
			r.OperationFinished(op.Key(), op, 1500*time.Millisecond, nil, 0)
			stop()
		}
		got, want := times.ReplaceAllString(lines[0].String(), "T"), times.ReplaceAllString(lines[1].String(), "T")
		if got != want || !strings.Contains(want, `"msg":"operation succeeded"`) {
			t.Errorf("%v: direct line\n%s\nwant\n%s", ref, got, want)
		}
	}
	core, _ := observer.New(zap.DebugLevel)
	if New(Options{Log: zap.New(core)}).direct != nil {
		t.Error("an observer's logger gets the direct path")
	}
}
