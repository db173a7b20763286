package claimstatus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/status/claimstatus"
)

// The Reporter is what the agent hands the operations.
var _ operations.ClaimStatus = (*claimstatus.Reporter)(nil)
var _ operations.ClaimStatus = claimstatus.None{}

type patchCall struct {
	namespace, name string
	pt              types.PatchType
	patch           []byte
}

// fakePatcher records patches and fails with err if set.
type fakePatcher struct {
	mu    sync.Mutex
	calls []patchCall
	err   error
}

func (f *fakePatcher) PatchPVCStatus(_ context.Context, namespace, name string, pt types.PatchType, patch []byte) (*v1.PersistentVolumeClaim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, patchCall{namespace, name, pt, append([]byte(nil), patch...)})
	if f.err != nil {
		return nil, f.err
	}
	return &v1.PersistentVolumeClaim{}, nil
}

func (f *fakePatcher) only(t *testing.T) patchCall {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) != 1 {
		t.Fatalf("%d patches sent, want 1: %q", len(f.calls), f.calls)
	}
	return f.calls[0]
}

func (f *fakePatcher) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// claim is a bound 1Gi claim that the resize controller grew to 2Gi: it
// waits for the node.
func claim() *v1.PersistentVolumeClaim {
	old := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "uid-1", ResourceVersion: "42"},
		Spec: v1.PersistentVolumeClaimSpec{
			VolumeName: "pv-1",
			Resources:  v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("2Gi")}},
		},
		Status: v1.PersistentVolumeClaimStatus{
			Phase:                     v1.ClaimBound,
			AccessModes:               []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity:                  v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			AllocatedResources:        v1.ResourceList{v1.ResourceStorage: resource.MustParse("2Gi")},
			AllocatedResourceStatuses: map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: v1.PersistentVolumeClaimNodeResizePending},
			Conditions: []v1.PersistentVolumeClaimCondition{
				{Type: v1.PersistentVolumeClaimFileSystemResizePending, Status: v1.ConditionTrue, LastTransitionTime: old,
					Message: "Waiting for user to (re-)start a pod to finish file system resize of volume on node."},
				// Not the node's business: must survive every patch.
				{Type: v1.PersistentVolumeClaimVolumeModifyingVolume, Status: v1.ConditionTrue, LastTransitionTime: old, Reason: "Modifying"},
			},
		},
	}
}

// newReporter returns a Reporter whose informer copy is current (nil: the
// claim is not in the informer).
func newReporter(p *fakePatcher, current *v1.PersistentVolumeClaim) *claimstatus.Reporter {
	return claimstatus.New(p, func(namespace, name string) (*v1.PersistentVolumeClaim, error) {
		if current == nil || current.Namespace != namespace || current.Name != name {
			return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "persistentvolumeclaims"}, name)
		}
		return current, nil
	})
}

// apply applies a patch to the claim as the API server would, and returns
// the result.
func apply(t *testing.T, pvc *v1.PersistentVolumeClaim, patch []byte) *v1.PersistentVolumeClaim {
	t.Helper()
	orig, err := json.Marshal(pvc)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := strategicpatch.StrategicMergePatch(orig, patch, v1.PersistentVolumeClaim{})
	if err != nil {
		t.Fatalf("applying patch %s: %v", patch, err)
	}
	out := &v1.PersistentVolumeClaim{}
	if err := json.Unmarshal(patched, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkShape checks what every patch must be: a strategic merge patch of the
// claim's status, with its UID as a precondition, touching nothing else.
func checkShape(t *testing.T, c patchCall, pvc *v1.PersistentVolumeClaim) map[string]any {
	t.Helper()
	if c.namespace != pvc.Namespace || c.name != pvc.Name {
		t.Errorf("patched %s/%s, want %s/%s", c.namespace, c.name, pvc.Namespace, pvc.Name)
	}
	if c.pt != types.StrategicMergePatchType {
		t.Errorf("patch type %s, want %s", c.pt, types.StrategicMergePatchType)
	}
	var m map[string]any
	if err := json.Unmarshal(c.patch, &m); err != nil {
		t.Fatalf("patch %s is not JSON: %v", c.patch, err)
	}
	for k := range m {
		if k != "status" && k != "metadata" {
			t.Errorf("patch %s touches %q; only status (and the UID precondition) may appear", c.patch, k)
		}
	}
	meta, _ := m["metadata"].(map[string]any)
	if len(meta) != 1 || meta["uid"] != string(pvc.UID) {
		t.Errorf("patch metadata %v, want exactly the UID precondition {uid: %s}", meta, pvc.UID)
	}
	if _, ok := m["status"]; !ok {
		t.Errorf("patch %s has no status", c.patch)
	}
	return m
}

func condition(pvc *v1.PersistentVolumeClaim, typ v1.PersistentVolumeClaimConditionType) *v1.PersistentVolumeClaimCondition {
	for i := range pvc.Status.Conditions {
		if pvc.Status.Conditions[i].Type == typ {
			return &pvc.Status.Conditions[i]
		}
	}
	return nil
}

func TestResizeInProgress(t *testing.T) {
	pvc := claim()
	p := &fakePatcher{}
	if err := newReporter(p, pvc).ResizeInProgress(t.Context(), pvc); err != nil {
		t.Fatal(err)
	}
	c := p.only(t)
	checkShape(t, c, pvc)
	t.Logf("patch: %s", c.patch)
	got := apply(t, pvc, c.patch)
	if st := got.Status.AllocatedResourceStatuses[v1.ResourceStorage]; st != v1.PersistentVolumeClaimNodeResizeInProgress {
		t.Errorf("storage status %q, want %q", st, v1.PersistentVolumeClaimNodeResizeInProgress)
	}
	// Nothing else changes: capacity, allocated size, conditions.
	want := claim()
	want.Status.AllocatedResourceStatuses[v1.ResourceStorage] = v1.PersistentVolumeClaimNodeResizeInProgress
	assertStatus(t, got, want)
}

func TestResizeInProgressUnchanged(t *testing.T) {
	pvc := claim()
	pvc.Status.AllocatedResourceStatuses[v1.ResourceStorage] = v1.PersistentVolumeClaimNodeResizeInProgress
	p := &fakePatcher{}
	if err := newReporter(p, pvc).ResizeInProgress(t.Context(), pvc); err != nil {
		t.Fatal(err)
	}
	if n := p.count(); n != 0 {
		t.Errorf("%d patches for a claim already marked in progress, want none: %q", n, p.calls)
	}
}

// The Reporter works from the informer's copy when it is the same claim: a
// stale copy (from the operation's spec) must not produce a patch that
// reverts newer status.
func TestUsesInformerCopy(t *testing.T) {
	stale := claim()
	current := claim()
	current.ResourceVersion = "43"
	current.Status.AllocatedResourceStatuses[v1.ResourceStorage] = v1.PersistentVolumeClaimNodeResizeInProgress
	p := &fakePatcher{}
	if err := newReporter(p, current).ResizeInProgress(t.Context(), stale); err != nil {
		t.Fatal(err)
	}
	if n := p.count(); n != 0 {
		t.Errorf("%d patches although the informer's copy is already in progress: %q", n, p.calls)
	}
}

// A claim deleted and created again under the same name has a new UID: the
// Reporter must not take the new claim's status as its base, and the patch
// carries the old UID so the API server rejects it.
func TestRecreatedClaimKeepsUIDPrecondition(t *testing.T) {
	old := claim()
	recreated := claim()
	recreated.UID = "uid-2"
	recreated.Status.AllocatedResourceStatuses = nil
	recreated.Status.Conditions = nil
	p := &fakePatcher{}
	if err := newReporter(p, recreated).ResizeInProgress(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	m := checkShape(t, p.only(t), old)
	if uid := m["metadata"].(map[string]any)["uid"]; uid != "uid-1" {
		t.Errorf("UID precondition %v, want the original claim's uid-1", uid)
	}
}

func TestResizeFinished(t *testing.T) {
	pvc := claim()
	pvc.Status.AllocatedResourceStatuses[v1.ResourceStorage] = v1.PersistentVolumeClaimNodeResizeInProgress
	// A failure before this success left its condition, and the
	// controller's Resizing (and an earlier controller error) may be left
	// for the node to clear.
	pvc.Status.Conditions = append(pvc.Status.Conditions, v1.PersistentVolumeClaimCondition{
		Type: v1.PersistentVolumeClaimNodeResizeError, Status: v1.ConditionTrue, Message: "resize2fs: boom",
	}, v1.PersistentVolumeClaimCondition{
		Type: v1.PersistentVolumeClaimResizing, Status: v1.ConditionTrue,
	}, v1.PersistentVolumeClaimCondition{
		Type: v1.PersistentVolumeClaimControllerResizeError, Status: v1.ConditionTrue, Message: "quota",
	})
	p := &fakePatcher{}
	if err := newReporter(p, pvc).ResizeFinished(t.Context(), pvc, resource.MustParse("2Gi")); err != nil {
		t.Fatal(err)
	}
	c := p.only(t)
	m := checkShape(t, c, pvc)
	t.Logf("patch: %s", c.patch)
	// The kubelet's patch: allocatedResourceStatuses null when storage was
	// its only entry.
	if st := m["status"].(map[string]any); st["allocatedResourceStatuses"] != nil {
		t.Errorf("patch sets allocatedResourceStatuses to %v, want null (removed)", st["allocatedResourceStatuses"])
	} else if _, ok := st["allocatedResourceStatuses"]; !ok {
		t.Errorf("patch %s does not remove allocatedResourceStatuses", c.patch)
	}
	got := apply(t, pvc, c.patch)
	if q := got.Status.Capacity[v1.ResourceStorage]; q.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("capacity %s, want 2Gi", q.String())
	}
	if got.Status.AllocatedResourceStatuses != nil {
		t.Errorf("allocatedResourceStatuses %v, want none", got.Status.AllocatedResourceStatuses)
	}
	for _, typ := range []v1.PersistentVolumeClaimConditionType{v1.PersistentVolumeClaimFileSystemResizePending, v1.PersistentVolumeClaimNodeResizeError,
		v1.PersistentVolumeClaimResizing, v1.PersistentVolumeClaimControllerResizeError} {
		if c := condition(got, typ); c != nil {
			t.Errorf("condition %s still there: %+v", typ, c)
		}
	}
	if c := condition(got, v1.PersistentVolumeClaimVolumeModifyingVolume); c == nil || c.Reason != "Modifying" {
		t.Errorf("the ModifyingVolume condition was lost or changed: %+v", got.Status.Conditions)
	}
	if a := got.Status.AllocatedResources[v1.ResourceStorage]; a.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("allocatedResources changed to %s; it is the controller's", a.String())
	}
	if got.Status.Phase != v1.ClaimBound || len(got.Status.AccessModes) != 1 {
		t.Errorf("phase or access modes changed: %+v", got.Status)
	}
}

// Other resources' statuses are not the node's to remove.
func TestResizeFinishedKeepsOtherResourceStatuses(t *testing.T) {
	pvc := claim()
	pvc.Status.AllocatedResourceStatuses["example.com/iops"] = v1.PersistentVolumeClaimControllerResizeInProgress
	p := &fakePatcher{}
	if err := newReporter(p, pvc).ResizeFinished(t.Context(), pvc, resource.MustParse("2Gi")); err != nil {
		t.Fatal(err)
	}
	got := apply(t, pvc, checkPatch(t, p, pvc))
	want := map[v1.ResourceName]v1.ClaimResourceStatus{"example.com/iops": v1.PersistentVolumeClaimControllerResizeInProgress}
	if len(got.Status.AllocatedResourceStatuses) != 1 || got.Status.AllocatedResourceStatuses["example.com/iops"] != want["example.com/iops"] {
		t.Errorf("allocatedResourceStatuses %v, want %v", got.Status.AllocatedResourceStatuses, want)
	}
}

// Only resize conditions go; when none is left the list is empty.
func TestResizeFinishedOnlyResizeConditions(t *testing.T) {
	pvc := claim()
	pvc.Status.Conditions = pvc.Status.Conditions[:1] // FileSystemResizePending only
	p := &fakePatcher{}
	if err := newReporter(p, pvc).ResizeFinished(t.Context(), pvc, resource.MustParse("2Gi")); err != nil {
		t.Fatal(err)
	}
	got := apply(t, pvc, checkPatch(t, p, pvc))
	if len(got.Status.Conditions) != 0 {
		t.Errorf("conditions %+v, want none", got.Status.Conditions)
	}
}

// A claim of an old resize controller (no allocatedResources): the capacity
// is all there is to report.
func TestResizeFinishedLegacyClaim(t *testing.T) {
	pvc := claim()
	pvc.Status.AllocatedResources = nil
	pvc.Status.AllocatedResourceStatuses = nil
	pvc.Status.Capacity = nil
	p := &fakePatcher{}
	if err := newReporter(p, pvc).ResizeFinished(t.Context(), pvc, resource.MustParse("2Gi")); err != nil {
		t.Fatal(err)
	}
	got := apply(t, pvc, checkPatch(t, p, pvc))
	if q := got.Status.Capacity[v1.ResourceStorage]; q.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("capacity %s, want 2Gi", q.String())
	}
	if got.Status.AllocatedResourceStatuses != nil || got.Status.AllocatedResources != nil {
		t.Errorf("allocated fields appeared: %+v", got.Status)
	}
}

func TestResizeFinishedUnchanged(t *testing.T) {
	pvc := claim()
	pvc.Status.Capacity[v1.ResourceStorage] = resource.MustParse("2Gi")
	pvc.Status.AllocatedResourceStatuses = nil
	pvc.Status.Conditions = pvc.Status.Conditions[1:]
	p := &fakePatcher{}
	// Same size in other units: still nothing to change.
	if err := newReporter(p, pvc).ResizeFinished(t.Context(), pvc, resource.MustParse("2048Mi")); err != nil {
		t.Fatal(err)
	}
	if n := p.count(); n != 0 {
		t.Errorf("%d patches for a claim that already says so, want none: %q", n, p.calls)
	}
}

func TestResizeFailed(t *testing.T) {
	pvc := claim()
	p := &fakePatcher{}
	r := newReporter(p, pvc)
	start := time.Now().Add(-time.Second)
	if err := r.ResizeFailed(t.Context(), pvc, errors.New("resize2fs: Permission denied")); err != nil {
		t.Fatal(err)
	}
	c := p.only(t)
	checkShape(t, c, pvc)
	t.Logf("patch: %s", c.patch)
	if strings.Contains(string(c.patch), "NodeResizeFailed") {
		t.Errorf("patch %s uses NodeResizeFailed, which the API server rejects", c.patch)
	}
	got := apply(t, pvc, c.patch)
	// Still the node's to finish: it retries.
	if st := got.Status.AllocatedResourceStatuses[v1.ResourceStorage]; st != v1.PersistentVolumeClaimNodeResizeInProgress {
		t.Errorf("storage status %q, want %q", st, v1.PersistentVolumeClaimNodeResizeInProgress)
	}
	e := condition(got, v1.PersistentVolumeClaimNodeResizeError)
	if e == nil {
		t.Fatalf("no NodeResizeError condition: %+v", got.Status.Conditions)
	}
	if e.Status != v1.ConditionTrue || e.Message != "resize2fs: Permission denied" || e.Reason == "" {
		t.Errorf("NodeResizeError condition %+v, want True with the cause as message and a reason", e)
	}
	if e.LastTransitionTime.Time.Before(start) {
		t.Errorf("NodeResizeError transition time %v, want now", e.LastTransitionTime)
	}
	// The controller's conditions stay.
	for _, typ := range []v1.PersistentVolumeClaimConditionType{v1.PersistentVolumeClaimFileSystemResizePending, v1.PersistentVolumeClaimVolumeModifyingVolume} {
		if condition(got, typ) == nil {
			t.Errorf("condition %s lost: %+v", typ, got.Status.Conditions)
		}
	}
	if q := got.Status.Capacity[v1.ResourceStorage]; q.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("capacity changed to %s on a failure", q.String())
	}
}

// The same failure again changes nothing (no patch, no new transition
// time); a different one updates the message.
func TestResizeFailedRepeated(t *testing.T) {
	pvc := claim()
	pvc.Status.AllocatedResourceStatuses[v1.ResourceStorage] = v1.PersistentVolumeClaimNodeResizeInProgress
	then := metav1.NewTime(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
	pvc.Status.Conditions = append(pvc.Status.Conditions, v1.PersistentVolumeClaimCondition{
		Type: v1.PersistentVolumeClaimNodeResizeError, Status: v1.ConditionTrue, Reason: "NodeExpansionFailed",
		Message: "first", LastTransitionTime: then,
	})
	p := &fakePatcher{}
	r := newReporter(p, pvc)
	if err := r.ResizeFailed(t.Context(), pvc, errors.New("first")); err != nil {
		t.Fatal(err)
	}
	if n := p.count(); n != 0 {
		t.Fatalf("%d patches for the same failure again, want none: %q", n, p.calls)
	}
	if err := r.ResizeFailed(t.Context(), pvc, errors.New("second")); err != nil {
		t.Fatal(err)
	}
	got := apply(t, pvc, checkPatch(t, p, pvc))
	var errs []v1.PersistentVolumeClaimCondition
	for _, c := range got.Status.Conditions {
		if c.Type == v1.PersistentVolumeClaimNodeResizeError {
			errs = append(errs, c)
		}
	}
	if len(errs) != 1 {
		t.Fatalf("%d NodeResizeError conditions, want 1: %+v", len(errs), got.Status.Conditions)
	}
	if errs[0].Message != "second" || !errs[0].LastTransitionTime.After(then.Time) {
		t.Errorf("NodeResizeError %+v, want message %q and a new transition time", errs[0], "second")
	}
}

func TestPatchError(t *testing.T) {
	pvc := claim()
	boom := errors.New("connection refused")
	p := &fakePatcher{err: boom}
	err := newReporter(p, pvc).ResizeFinished(t.Context(), pvc, resource.MustParse("2Gi"))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "ns/data") {
		t.Errorf("error %v, want the patcher's error, naming the claim", err)
	}
}

// Patch, used directly: nil when nothing changed; the UID precondition
// otherwise, even when the change touches no metadata.
func TestPatch(t *testing.T) {
	pvc := claim()
	patch, err := claimstatus.Patch(pvc, pvc.DeepCopy())
	if err != nil || patch != nil {
		t.Errorf("Patch of an unchanged claim = %s, %v; want nil, nil", patch, err)
	}
	updated := pvc.DeepCopy()
	updated.Status.Capacity[v1.ResourceStorage] = resource.MustParse("2Gi")
	patch, err = claimstatus.Patch(pvc, updated)
	if err != nil {
		t.Fatal(err)
	}
	checkShape(t, patchCall{namespace: pvc.Namespace, name: pvc.Name, pt: types.StrategicMergePatchType, patch: patch}, pvc)
	if got := apply(t, pvc, patch); got.UID != pvc.UID {
		t.Errorf("applying the patch changed the UID to %s", got.UID)
	}
}

func TestNone(t *testing.T) {
	var n claimstatus.None
	pvc := claim()
	ctx := t.Context()
	if err := errors.Join(n.ResizeInProgress(ctx, pvc), n.ResizeFinished(ctx, pvc, resource.MustParse("2Gi")), n.ResizeFailed(ctx, pvc, errors.New("x"))); err != nil {
		t.Errorf("None: %v", err)
	}
}

func checkPatch(t *testing.T, p *fakePatcher, pvc *v1.PersistentVolumeClaim) []byte {
	t.Helper()
	p.mu.Lock()
	n := len(p.calls)
	p.mu.Unlock()
	if n == 0 {
		t.Fatal("no patch sent")
	}
	c := p.calls[n-1]
	checkShape(t, c, pvc)
	return c.patch
}

// assertStatus compares the fields the Reporter may touch.
func assertStatus(t *testing.T, got, want *v1.PersistentVolumeClaim) {
	t.Helper()
	g, _ := json.Marshal(got.Status)
	w, _ := json.Marshal(want.Status)
	if string(g) != string(w) {
		t.Errorf("status\n got %s\nwant %s", g, w)
	}
}

// An infeasible expansion (the driver said InvalidArgument, OutOfRange or
// NotFound) is marked NodeResizeInfeasible, as the kubelet marks it, so the
// node stops retrying; the error condition carries the cause.
func TestResizeFailedInfeasible(t *testing.T) {
	for _, c := range []struct {
		name  string
		cause error
		want  v1.ClaimResourceStatus
	}{
		{"infeasible", fmt.Errorf("NodeExpandVolume: OutOfRange: too big: %w", plugins.ErrExpansionInfeasible), v1.PersistentVolumeClaimNodeResizeInfeasible},
		{"ordinary", errors.New("NodeExpandVolume: Internal: boom"), v1.PersistentVolumeClaimNodeResizeInProgress},
	} {
		t.Run(c.name, func(t *testing.T) {
			pvc := claim()
			p := &fakePatcher{}
			if err := newReporter(p, pvc).ResizeFailed(t.Context(), pvc, c.cause); err != nil {
				t.Fatal(err)
			}
			got := apply(t, pvc, checkPatch(t, p, pvc))
			if st := got.Status.AllocatedResourceStatuses[v1.ResourceStorage]; st != c.want {
				t.Errorf("storage status %q, want %q", st, c.want)
			}
			if e := condition(got, v1.PersistentVolumeClaimNodeResizeError); e == nil || e.Message != c.cause.Error() {
				t.Errorf("NodeResizeError %+v, want the cause", e)
			}
		})
	}
}
