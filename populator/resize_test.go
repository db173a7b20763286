package populator

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/volume"
)

// resizeSpec builds the spec of a claim bound to a PV: the PV's capacity,
// the claim's status capacity and its expansion status. An empty size leaves
// the field out; mutate adjusts the objects further.
func resizeSpec(pvCap, claimCap string, mutate func(pv *v1.PersistentVolume, pvc *v1.PersistentVolumeClaim, spec *volume.Spec)) *volume.Spec {
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}}
	if pvCap != "" {
		pv.Spec.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse(pvCap)}
	}
	pvc := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim", UID: "claim-uid"}}
	pvc.Status.Phase = v1.ClaimBound
	if claimCap != "" {
		pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse(claimCap)}
	}
	spec := &volume.Spec{Name: pv.Name, PV: pv, PVC: pvc, Mode: v1.PersistentVolumeFilesystem}
	if mutate != nil {
		mutate(pv, pvc, spec)
	}
	return spec
}

// allocated sets what the resize controller records: the new size and the
// expansion status of storage.
func allocated(size string, st v1.ClaimResourceStatus) func(*v1.PersistentVolume, *v1.PersistentVolumeClaim, *volume.Spec) {
	return func(_ *v1.PersistentVolume, pvc *v1.PersistentVolumeClaim, _ *volume.Spec) {
		if size != "" {
			pvc.Status.AllocatedResources = v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)}
		}
		if st != "" {
			pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: st}
		}
	}
}

func TestResizeTarget(t *testing.T) {
	tests := []struct {
		name       string
		spec       *volume.Spec
		want       string // "" for no expansion
		wantNotice string // the notice's reason, "" for none
		noticeMsg  []string
	}{
		// The resize controller of Kubernetes >= 1.34: allocatedResources
		// and allocatedResourceStatuses.
		{
			name: "NodeResizePending with allocatedResources",
			spec: resizeSpec("2Gi", "1Gi", allocated("2Gi", v1.PersistentVolumeClaimNodeResizePending)),
			want: "2Gi",
		},
		{
			name: "NodeResizeInProgress with allocatedResources (the node's own mark, or a retry after a failure)",
			spec: resizeSpec("2Gi", "1Gi", allocated("2Gi", v1.PersistentVolumeClaimNodeResizeInProgress)),
			want: "2Gi",
		},
		{
			name: "allocatedResources wins over the PV capacity",
			spec: resizeSpec("3Gi", "1Gi", allocated("2Gi", v1.PersistentVolumeClaimNodeResizePending)),
			want: "2Gi",
		},
		{
			name: "NodeResizePending without allocatedResources uses the PV capacity",
			spec: resizeSpec("2Gi", "1Gi", allocated("", v1.PersistentVolumeClaimNodeResizePending)),
			want: "2Gi",
		},
		{
			name: "NodeResizeInProgress without allocatedResources uses the PV capacity",
			spec: resizeSpec("2Gi", "1Gi", allocated("", v1.PersistentVolumeClaimNodeResizeInProgress)),
			want: "2Gi",
		},
		{
			name: "NodeResizePending on a claim without status capacity",
			spec: resizeSpec("2Gi", "", allocated("2Gi", v1.PersistentVolumeClaimNodeResizePending)),
			want: "2Gi",
		},
		{
			name: "NodeResizePending but the claim already reports the size",
			spec: resizeSpec("2Gi", "2Gi", allocated("2Gi", v1.PersistentVolumeClaimNodeResizePending)),
		},
		{
			name: "NodeResizePending but the claim reports more than allocated",
			spec: resizeSpec("2Gi", "3Gi", allocated("2Gi", v1.PersistentVolumeClaimNodeResizePending)),
		},
		{
			name: "ControllerResizeInProgress: the controller is not done, nothing for the node yet",
			spec: resizeSpec("1Gi", "1Gi", allocated("2Gi", v1.PersistentVolumeClaimControllerResizeInProgress)),
		},
		{
			name: "ControllerResizeInfeasible: nothing for the node",
			spec: resizeSpec("1Gi", "1Gi", allocated("2Gi", v1.PersistentVolumeClaimControllerResizeInfeasible)),
		},
		{
			name: "NodeResizeInfeasible: nothing for the node",
			spec: resizeSpec("2Gi", "1Gi", allocated("2Gi", v1.PersistentVolumeClaimNodeResizeInfeasible)),
		},
		{
			// Another node (RWX) or an earlier run finished: the status
			// entry is gone and allocatedResources is set, so the new
			// controller's fields say there is nothing left to do, even
			// though the PV is larger than this claim's status says.
			name: "RWX expanded elsewhere: allocatedResources without a status",
			spec: resizeSpec("2Gi", "2Gi", func(pv *v1.PersistentVolume, pvc *v1.PersistentVolumeClaim, s *volume.Spec) {
				pv.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}
				pvc.Spec.AccessModes = pv.Spec.AccessModes
				allocated("2Gi", "")(pv, pvc, s)
			}),
		},
		{
			name: "allocatedResources without a status never falls back to the legacy rule",
			spec: resizeSpec("3Gi", "2Gi", allocated("2Gi", "")),
		},

		// Old resize controllers: only PV capacity versus claim capacity.
		{
			name: "legacy: PV larger than the claim's status capacity",
			spec: resizeSpec("2Gi", "1Gi", nil),
			want: "2Gi",
		},
		{
			name: "legacy: already big enough",
			spec: resizeSpec("2Gi", "2Gi", nil),
		},
		{
			name: "legacy: equal sizes in other units",
			spec: resizeSpec("1024Mi", "1Gi", nil),
		},
		{
			name: "legacy: claim without status capacity is not expanded",
			spec: resizeSpec("2Gi", "", nil),
		},
		{
			name:       "legacy: PV smaller than the claim is a shrink, ignored with a notice",
			spec:       resizeSpec("1Gi", "2Gi", nil),
			wantNotice: "VolumeShrinkIgnored",
			noticeMsg:  []string{"pv-1", "1Gi", "ns/claim", "2Gi", "never shrink"},
		},
		{
			name: "a shrink under the new controller's fields is silently nothing",
			spec: resizeSpec("1Gi", "2Gi", allocated("1Gi", v1.PersistentVolumeClaimNodeResizePending)),
		},

		// Read-only: the node must not touch the filesystem.
		{
			name: "read-only claim with pending expansion: notice, no expansion",
			spec: resizeSpec("2Gi", "1Gi", func(pv *v1.PersistentVolume, pvc *v1.PersistentVolumeClaim, s *volume.Spec) {
				allocated("2Gi", v1.PersistentVolumeClaimNodeResizePending)(pv, pvc, s)
				s.ReadOnly = true
			}),
			wantNotice: "FileSystemResizeFailed",
			noticeMsg:  []string{"pv-1", "ns/claim", "2Gi", "read-only"},
		},
		{
			name: "read-only claim, legacy expansion: notice, no expansion",
			spec: resizeSpec("2Gi", "1Gi", func(_ *v1.PersistentVolume, _ *v1.PersistentVolumeClaim, s *volume.Spec) {
				s.ReadOnly = true
			}),
			wantNotice: "FileSystemResizeFailed",
			noticeMsg:  []string{"read-only"},
		},
		{
			name: "read-only claim with nothing to expand: no notice",
			spec: resizeSpec("2Gi", "2Gi", func(_ *v1.PersistentVolume, _ *v1.PersistentVolumeClaim, s *volume.Spec) {
				s.ReadOnly = true
			}),
		},

		// Not a claim at all, or nothing to compare.
		{
			name: "inline volume: no PV, no claim",
			spec: &volume.Spec{Name: "scratch", Volume: &v1.Volume{Name: "scratch"}},
		},
		{
			name: "PV without a claim",
			spec: resizeSpec("2Gi", "1Gi", func(_ *v1.PersistentVolume, _ *v1.PersistentVolumeClaim, s *volume.Spec) {
				s.PVC = nil
			}),
		},
		{
			name: "PV without a storage capacity",
			spec: resizeSpec("", "1Gi", allocated("2Gi", v1.PersistentVolumeClaimNodeResizePending)),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			beforePVC, beforePV := tc.spec.PVC.DeepCopy(), tc.spec.PV.DeepCopy()
			got, n := resizeTarget(tc.spec)
			switch {
			case tc.want == "" && got != nil:
				t.Errorf("target = %s, want no expansion", got)
			case tc.want != "" && got == nil:
				t.Errorf("no expansion, want a target of %s", tc.want)
			case tc.want != "" && got.Cmp(resource.MustParse(tc.want)) != 0:
				t.Errorf("target = %s, want %s", got, tc.want)
			}
			switch {
			case tc.wantNotice == "" && n != nil:
				t.Errorf("unexpected notice %s: %s", n.reason, n.message)
			case tc.wantNotice != "" && n == nil:
				t.Errorf("no notice, want %s", tc.wantNotice)
			case tc.wantNotice != "":
				if n.reason != tc.wantNotice {
					t.Errorf("notice reason %q, want %q", n.reason, tc.wantNotice)
				}
				for _, s := range tc.noticeMsg {
					if !strings.Contains(n.message, s) {
						t.Errorf("notice message %q does not contain %q", n.message, s)
					}
				}
				if n.pvc != tc.spec.PVC {
					t.Errorf("notice is not about the volume's claim: %v", n.pvc)
				}
			}
			if got != nil {
				// The result is a copy: changing it must not change the
				// claim or the PV the store shares.
				got.Add(resource.MustParse("1Ti"))
				if !equality.Semantic.DeepEqual(tc.spec.PVC, beforePVC) || !equality.Semantic.DeepEqual(tc.spec.PV, beforePV) {
					t.Error("changing the returned target changed the claim or the PV")
				}
			}
		})
	}
}

// resolve puts the target on the pod volume (the DSW's desired size) and
// tags notices with the pod and the pod's volume name, for the events.
func TestResolveResize(t *testing.T) {
	grow := func(ro bool) func(*v1.Pod, *v1.PersistentVolumeClaim, *v1.PersistentVolume) {
		return func(pod *v1.Pod, pvc *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
			pv.Spec.Capacity[v1.ResourceStorage] = resource.MustParse("2Gi")
			pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}
			pvc.Status.AllocatedResources = v1.ResourceList{v1.ResourceStorage: resource.MustParse("2Gi")}
			pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: v1.PersistentVolumeClaimNodeResizePending}
			pod.Spec.Volumes[0].PersistentVolumeClaim.ReadOnly = ro
		}
	}

	t.Run("pending expansion", func(t *testing.T) {
		pod, objs := bound(t.TempDir(), grow(false))
		src := newFakeSource()
		src.Add(objs...)
		pv, err, r := resolveFirst(t, src, testNodeInfo, pod)
		if err != nil {
			t.Fatalf("resolve: %v", err)
		}
		if pv.DesiredSize == nil || pv.DesiredSize.Cmp(resource.MustParse("2Gi")) != 0 {
			t.Errorf("desired size %v, want 2Gi", pv.DesiredSize)
		}
		if len(r.notices) != 0 {
			t.Errorf("notices %+v, want none", r.notices)
		}
	})

	t.Run("read-only", func(t *testing.T) {
		pod, objs := bound(t.TempDir(), grow(true))
		src := newFakeSource()
		src.Add(objs...)
		pv, err, r := resolveFirst(t, src, testNodeInfo, pod)
		if err != nil {
			t.Fatalf("resolve: %v", err)
		}
		if pv.DesiredSize != nil {
			t.Errorf("desired size %v for a read-only claim, want none", pv.DesiredSize)
		}
		if len(r.notices) != 1 {
			t.Fatalf("notices %+v, want one", r.notices)
		}
		n := r.notices[0]
		if n.pod.UID != pod.UID || n.volume != "data" || n.reason != "FileSystemResizeFailed" {
			t.Errorf("notice for pod %v volume %q reason %q, want pod %s volume data FileSystemResizeFailed", n.pod, n.volume, n.reason, pod.UID)
		}
	})

	t.Run("no expansion", func(t *testing.T) {
		pod, objs := bound(t.TempDir(), nil)
		src := newFakeSource()
		src.Add(objs...)
		pv, err, r := resolveFirst(t, src, testNodeInfo, pod)
		if err != nil {
			t.Fatalf("resolve: %v", err)
		}
		if pv.DesiredSize != nil || len(r.notices) != 0 {
			t.Errorf("desired size %v, notices %+v: want neither", pv.DesiredSize, r.notices)
		}
	})
}
