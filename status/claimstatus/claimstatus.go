// Package claimstatus writes the node's side of volume expansion onto
// PersistentVolumeClaims: allocatedResourceStatuses[storage] =
// NodeResizeInProgress while the node works (and while it retries after a
// failure; NodeResizeInfeasible when the storage says it cannot be done), a
// NodeResizeError condition carrying the last failure, and on
// success status.capacity = the new size with the storage entry and every
// resize condition (FileSystemResizePending, Resizing,
// ControllerResizeError, NodeResizeError) removed, as the kubelet does.
//
// The API documentation mentions a "NodeResizeFailed" status, but the
// Kubernetes 1.36 API server rejects it (only ControllerResizeInProgress,
// ControllerResizeInfeasible, NodeResizePending, NodeResizeInProgress and
// NodeResizeInfeasible validate); like the kubelet, the agent reports
// failures with the NodeResizeError condition instead.
//
// Each change is sent as a strategic merge patch computed from the claim as
// last read and the claim as it should be, so it touches only the fields the
// node owns, and it carries the claim's UID so it can never land on a newer
// claim of the same name.
package claimstatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/volume-agent/volume-agent/plugins"
)

// Patcher writes a claim's status.
type Patcher interface {
	PatchPVCStatus(ctx context.Context, namespace, name string, pt types.PatchType, patch []byte) (*v1.PersistentVolumeClaim, error)
}

// Reporter implements operations.ClaimStatus against the API server.
type Reporter struct {
	patcher Patcher
	// current returns the freshest copy of the claim (the informer's).
	current func(namespace, name string) (*v1.PersistentVolumeClaim, error)
}

// New returns a Reporter.
func New(p Patcher, current func(namespace, name string) (*v1.PersistentVolumeClaim, error)) *Reporter {
	return &Reporter{patcher: p, current: current}
}

func (r *Reporter) latest(pvc *v1.PersistentVolumeClaim) *v1.PersistentVolumeClaim {
	if cur, err := r.current(pvc.Namespace, pvc.Name); err == nil && cur.UID == pvc.UID {
		return cur
	}
	return pvc
}

// ResizeInProgress implements operations.ClaimStatus.
func (r *Reporter) ResizeInProgress(ctx context.Context, pvc *v1.PersistentVolumeClaim) error {
	return r.update(ctx, pvc, func(s *v1.PersistentVolumeClaimStatus) {
		setResizeStatus(s, v1.PersistentVolumeClaimNodeResizeInProgress)
	})
}

// ResizeFailed implements operations.ClaimStatus. An infeasible expansion
// (plugins.ErrExpansionInfeasible) is marked NodeResizeInfeasible, as the
// kubelet's MarkNodeExpansionInfeasible does: the node stops retrying and
// the resize controller lets the user ask for less; any other failure keeps
// NodeResizeInProgress, and the node retries.
func (r *Reporter) ResizeFailed(ctx context.Context, pvc *v1.PersistentVolumeClaim, cause error) error {
	st := v1.PersistentVolumeClaimNodeResizeInProgress
	if errors.Is(cause, plugins.ErrExpansionInfeasible) {
		st = v1.PersistentVolumeClaimNodeResizeInfeasible
	}
	return r.update(ctx, pvc, func(s *v1.PersistentVolumeClaimStatus) {
		setResizeStatus(s, st)
		msg := cause.Error()
		for i := range s.Conditions {
			if c := &s.Conditions[i]; c.Type == v1.PersistentVolumeClaimNodeResizeError {
				if c.Message != msg {
					c.Message, c.LastTransitionTime = msg, metav1.Now()
				}
				return
			}
		}
		s.Conditions = append(s.Conditions, v1.PersistentVolumeClaimCondition{
			Type: v1.PersistentVolumeClaimNodeResizeError, Status: v1.ConditionTrue,
			Reason: "NodeExpansionFailed", Message: msg, LastTransitionTime: metav1.Now(),
		})
	})
}

// ResizeFinished implements operations.ClaimStatus.
func (r *Reporter) ResizeFinished(ctx context.Context, pvc *v1.PersistentVolumeClaim, size resource.Quantity) error {
	return r.update(ctx, pvc, func(s *v1.PersistentVolumeClaimStatus) {
		if s.Capacity == nil {
			s.Capacity = v1.ResourceList{}
		}
		s.Capacity[v1.ResourceStorage] = size
		if s.AllocatedResourceStatuses != nil {
			delete(s.AllocatedResourceStatuses, v1.ResourceStorage)
			if len(s.AllocatedResourceStatuses) == 0 {
				s.AllocatedResourceStatuses = nil
			}
		}
		conds := s.Conditions[:0:0]
		for _, c := range s.Conditions {
			if !resizeConditions[c.Type] {
				conds = append(conds, c)
			}
		}
		s.Conditions = conds
	})
}

// resizeConditions are the conditions a finished expansion removes, as the
// kubelet's MarkNodeExpansionFinishedWithRecovery does (knownResizeConditions
// in pkg/volume/util/resize_util.go): the node's, and the controller's
// Resizing and ControllerResizeError, which may be left for the node to
// clear.
var resizeConditions = map[v1.PersistentVolumeClaimConditionType]bool{
	v1.PersistentVolumeClaimFileSystemResizePending: true,
	v1.PersistentVolumeClaimResizing:                true,
	v1.PersistentVolumeClaimControllerResizeError:   true,
	v1.PersistentVolumeClaimNodeResizeError:         true,
}

func setResizeStatus(s *v1.PersistentVolumeClaimStatus, st v1.ClaimResourceStatus) {
	if s.AllocatedResourceStatuses == nil {
		s.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{}
	}
	s.AllocatedResourceStatuses[v1.ResourceStorage] = st
}

func (r *Reporter) update(ctx context.Context, pvc *v1.PersistentVolumeClaim, change func(*v1.PersistentVolumeClaimStatus)) error {
	old := r.latest(pvc)
	updated := old.DeepCopy()
	change(&updated.Status)
	patch, err := Patch(old, updated)
	if err != nil || patch == nil {
		return err
	}
	_, err = r.patcher.PatchPVCStatus(ctx, old.Namespace, old.Name, types.StrategicMergePatchType, patch)
	if err != nil {
		return fmt.Errorf("patching status of PVC %s/%s: %w", old.Namespace, old.Name, err)
	}
	return nil
}

// Patch returns the strategic merge patch from old to updated with a UID
// precondition, or nil when nothing changed.
func Patch(old, updated *v1.PersistentVolumeClaim) ([]byte, error) {
	oldJSON, err := json.Marshal(old)
	if err != nil {
		return nil, err
	}
	newJSON, err := json.Marshal(updated)
	if err != nil {
		return nil, err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldJSON, newJSON, v1.PersistentVolumeClaim{})
	if err != nil {
		return nil, err
	}
	if string(patch) == "{}" {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal(patch, &m); err != nil {
		return nil, err
	}
	meta, _ := m["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["uid"] = old.UID
	m["metadata"] = meta
	return json.Marshal(m)
}

// None records nothing: standalone mode has no API server to tell. The
// expansion itself still happens and is logged, evented and measured.
type None struct{}

func (None) ResizeInProgress(context.Context, *v1.PersistentVolumeClaim) error { return nil }
func (None) ResizeFinished(context.Context, *v1.PersistentVolumeClaim, resource.Quantity) error {
	return nil
}
func (None) ResizeFailed(context.Context, *v1.PersistentVolumeClaim, error) error { return nil }
