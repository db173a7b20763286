// Package events reports what happened to pods' volumes to people: as
// Kubernetes Events in cluster mode and, in every mode, as structured log
// lines and a bounded list of recent events on the debug endpoint.
package events

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/volume-agent/volume-agent/volume"
)

// Event types, as in Kubernetes.
const (
	Normal  = "Normal"
	Warning = "Warning"
)

// Reasons, named as the kubelet names them where it has one.
const (
	FailedMount                = "FailedMount"
	FailedMapVolume            = "FailedMapVolume"
	FailedAttachVolume         = "FailedAttachVolume"
	FailedUnmount              = "FailedUnmount"
	FailedUnmountDevice        = "FailedUnmountDevice"
	FailedUnmapDevice          = "FailedUnmapDevice"
	SuccessfulMountVolume      = "SuccessfulMountVolume"
	FileSystemResizeSuccessful = "FileSystemResizeSuccessful"
	FileSystemResizeFailed     = "FileSystemResizeFailed"
	VolumeResizeFailed         = "VolumeResizeFailed"
	VolumeConditionAbnormal    = "VolumeConditionAbnormal"
)

// FailedDetachVolume has no kubelet counterpart (the attach/detach
// controller detaches, and only logs a failure): it is named after
// FailedAttachVolume.
const FailedDetachVolume = "FailedDetachVolume"

// Object names what an event is about.
type Object struct {
	Kind      string `json:"kind"` // Pod, PersistentVolumeClaim, PersistentVolume
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
}

// PodObject names a pod.
func PodObject(p volume.PodRef) Object {
	return Object{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}
}

// Event is one recorded event.
type Event struct {
	Time    time.Time `json:"time"`
	Object  Object    `json:"object"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
}

// Recorder records events.
type Recorder interface {
	Event(obj Object, eventType, reason, message string)
}

// Sink receives events after the log and ring buffer (the Kubernetes
// recorder in cluster mode).
type Sink interface {
	Event(obj Object, eventType, reason, message string)
}

// Log is a Recorder that logs every event and keeps the most recent ones,
// then forwards them to an optional Sink.
type Log struct {
	log  *zap.Logger
	sink Sink
	max  int

	mu     sync.Mutex
	recent []Event
	next   int
}

// NewLog returns a Log keeping up to max recent events.
func NewLog(log *zap.Logger, max int, sink Sink) *Log {
	return &Log{log: log, sink: sink, max: max}
}

// Event implements Recorder.
func (l *Log) Event(obj Object, eventType, reason, message string) {
	fields := []zap.Field{zap.String("kind", obj.Kind), zap.String("reason", reason), zap.String("message", message)}
	if obj.Kind == "Pod" {
		fields = append(fields, zap.String("pod", obj.Namespace+"/"+obj.Name))
	} else {
		fields = append(fields, zap.String("object", obj.Namespace+"/"+obj.Name))
	}
	if eventType == Warning {
		l.log.Warn("event", fields...)
	} else {
		l.log.Info("event", fields...)
	}
	ev := Event{Time: time.Now(), Object: obj, Type: eventType, Reason: reason, Message: message}
	l.mu.Lock()
	if len(l.recent) < l.max {
		l.recent = append(l.recent, ev)
	} else if l.max > 0 {
		l.recent[l.next] = ev
		l.next = (l.next + 1) % l.max
	}
	l.mu.Unlock()
	if l.sink != nil {
		l.sink.Event(obj, eventType, reason, message)
	}
}

// Recent returns the recent events, oldest first.
func (l *Log) Recent() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Event, 0, len(l.recent))
	out = append(out, l.recent[l.next:]...)
	out = append(out, l.recent[:l.next]...)
	return out
}

// Memory is a Recorder that only keeps what it is told, for tests of the
// parts that report events.
type Memory struct {
	mu     sync.Mutex
	events []Event
}

// Event implements Recorder.
func (m *Memory) Event(obj Object, eventType, reason, message string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, Event{Time: time.Now(), Object: obj, Type: eventType, Reason: reason, Message: message})
}

// Take returns the events recorded since the last Take, oldest first.
func (m *Memory) Take() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.events
	m.events = nil
	return out
}
