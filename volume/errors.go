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

// PodVolumeError is a problem with one volume of one pod, found before any
// operation could run (missing claim, wrong volume mode, unsupported type...).
// It names the pod, the volume and the reason so the person reading it needs
// nothing else.
type PodVolumeError struct {
	Pod    PodRef
	Volume string // the pod's volume name
	Reason string // a short CamelCase classification, used as a metric label
	Err    error
}

func (e *PodVolumeError) Error() string {
	if e.Volume == "" {
		return fmt.Sprintf("pod %s: %v", e.Pod, e.Err)
	}
	return fmt.Sprintf("pod %s volume %q: %v", e.Pod, e.Volume, e.Err)
}

func (e *PodVolumeError) Unwrap() error { return e.Err }
