package volume

import (
	"errors"
	"fmt"
)

// uncertainError marks an operation that may or may not have taken effect:
// a mount that timed out may still complete, a driver that went away may have
// published the volume before it did. The caller must treat the volume as
// possibly mounted: retry it while wanted, unmount it when no longer wanted.
type uncertainError struct{ err error }

func (e *uncertainError) Error() string { return e.err.Error() }
func (e *uncertainError) Unwrap() error { return e.err }

// Uncertain wraps err to say the operation's outcome is unknown.
func Uncertain(err error) error {
	if err == nil {
		return nil
	}
	return &uncertainError{err: err}
}

// Uncertainf is Uncertain(fmt.Errorf(...)).
func Uncertainf(format string, args ...any) error {
	return Uncertain(fmt.Errorf(format, args...))
}

// IsUncertain reports whether err (or anything it wraps) is uncertain.
func IsUncertain(err error) bool {
	var u *uncertainError
	return errors.As(err, &u)
}

// waitingError marks an operation that could not proceed because something
// outside the agent has not happened yet and normally will without anyone's
// help: the attach/detach controller has not created or attached the
// volume's VolumeAttachment, or the node's status does not list the volume
// in use yet. It is retried like any failure, but it is no failure: the
// kubelet logs such waits at a debug level and records no event, and so
// does the agent, until a wait lasts longer than the kubelet would let a
// pod wait for its volumes.
type waitingError struct{ err error }

func (e *waitingError) Error() string { return e.err.Error() }
func (e *waitingError) Unwrap() error { return e.err }

// Waiting wraps err to say the operation waits for something that normally
// happens on its own.
func Waiting(err error) error {
	if err == nil {
		return nil
	}
	return &waitingError{err: err}
}

// Waitingf is Waiting(fmt.Errorf(...)).
func Waitingf(format string, args ...any) error {
	return Waiting(fmt.Errorf(format, args...))
}

// IsWaiting reports whether err (or anything it wraps) is a normal wait.
func IsWaiting(err error) bool {
	var w *waitingError
	return errors.As(err, &w)
}

// PodVolumeError is a problem with one volume of one pod, found before any
// operation could run (missing claim, wrong volume mode, unsupported type...).
// It names the pod, the volume and the reason so the person reading it needs
// nothing else.
type PodVolumeError struct {
	Pod    PodRef
	Volume string // the pod's volume name
	Reason string // a short CamelCase classification, used as a metric label
	Err    error
	// Transient: the error may go away with no change to the pod or to
	// what it refers to (a lookup that failed is retried; a claim not
	// read yet, whose Err is a Waiting error, is a normal wait).
	Transient bool
}

func (e *PodVolumeError) Error() string {
	if e.Volume == "" {
		return fmt.Sprintf("pod %s: %v", e.Pod, e.Err)
	}
	return fmt.Sprintf("pod %s volume %q: %v", e.Pod, e.Volume, e.Err)
}

func (e *PodVolumeError) Unwrap() error { return e.Err }
