package populator

import (
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/volume"
)

var testNodeInfo = Node{Name: testNode, Labels: map[string]string{"kubernetes.io/hostname": testNode, "zone": "a"}}

// resolveFirst resolves the pod's first volume the way the populator does.
func resolveFirst(t *testing.T, src *fakeSource, node Node, pod *v1.Pod) (cache.PodVolume, *volume.PodVolumeError, *resolver) {
	t.Helper()
	if len(pod.Spec.Volumes) == 0 {
		t.Fatal("fixture: pod has no volume")
	}
	vol := &pod.Spec.Volumes[0]
	use, ok := volumeUsage(pod)[vol.Name]
	if !ok {
		t.Fatalf("fixture: volume %q not used by any container", vol.Name)
	}
	r := &resolver{store: src, plugins: testPlugins(t, nil), node: node}
	pv, err := r.resolve(pod, podInfo(pod), vol, use)
	return pv, err, r
}

// bound returns a pod using claim "claim" under the volume name "data", and
// the claim bound to a local PV "pv-1" at dir; mutate adjusts the objects.
func bound(dir string, mutate func(pod *v1.Pod, pvc *v1.PersistentVolumeClaim, pv *v1.PersistentVolume)) (*v1.Pod, []any) {
	pod := newPod("web", withVolume(claimVol("data", "claim")))
	pvc, pv := boundPair("claim", "pv-1", dir)
	if mutate != nil {
		mutate(pod, pvc, pv)
	}
	return pod, []any{pvc, pv}
}

// useAsDevice turns the pod's use of its first volume into volumeDevices.
func useAsDevice(pod *v1.Pod) {
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = nil
	c.VolumeDevices = []v1.VolumeDevice{{Name: pod.Spec.Volumes[0].Name, DevicePath: "/dev/xvda"}}
}

func TestResolveErrors(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name       string
		setup      func(dir string) (*v1.Pod, []any)
		node       *Node
		wantReason string
		wantMsg    string // a substring of the error, besides pod and volume
	}{
		{
			name: "PVC not found",
			setup: func(dir string) (*v1.Pod, []any) {
				pod, _ := bound(dir, nil)
				return pod, nil
			},
			wantReason: ReasonPVCNotFound, wantMsg: "PVC ns/claim not found",
		},
		{
			name: "PVC being deleted without protection finalizer",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, pvc *v1.PersistentVolumeClaim, _ *v1.PersistentVolume) {
					pvc.DeletionTimestamp = &now
					pvc.Finalizers = []string{"example.com/other"}
				})
			},
			wantReason: ReasonPVCBeingDeleted, wantMsg: "PVC ns/claim is being deleted",
		},
		{
			name: "PVC pending",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, pvc *v1.PersistentVolumeClaim, _ *v1.PersistentVolume) {
					pvc.Status.Phase = v1.ClaimPending
				})
			},
			wantReason: ReasonPVCNotBound, wantMsg: "PVC ns/claim is not bound (phase Pending)",
		},
		{
			name: "PVC without phase counts as pending",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, pvc *v1.PersistentVolumeClaim, _ *v1.PersistentVolume) {
					pvc.Status.Phase = ""
				})
			},
			wantReason: ReasonPVCNotBound, wantMsg: "(phase Pending)",
		},
		{
			name: "PVC lost",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, pvc *v1.PersistentVolumeClaim, _ *v1.PersistentVolume) {
					pvc.Status.Phase = v1.ClaimLost
				})
			},
			wantReason: ReasonPVCNotBound, wantMsg: "(phase Lost)",
		},
		{
			name: "PVC bound but names no volume",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, pvc *v1.PersistentVolumeClaim, _ *v1.PersistentVolume) {
					pvc.Spec.VolumeName = ""
				})
			},
			wantReason: ReasonPVCNotBound, wantMsg: "bound but names no volume",
		},
		{
			name: "PV not found",
			setup: func(dir string) (*v1.Pod, []any) {
				pod, objs := bound(dir, nil)
				return pod, objs[:1]
			},
			wantReason: ReasonPVNotFound, wantMsg: "PV pv-1 (bound to PVC ns/claim) not found",
		},
		{
			name: "PV without claimRef",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.ClaimRef = nil
				})
			},
			wantReason: ReasonPVClaimMismatch, wantMsg: "PV pv-1 is not bound to any claim",
		},
		{
			name: "PV bound to another claim name",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.ClaimRef.Name = "other"
				})
			},
			wantReason: ReasonPVClaimMismatch, wantMsg: "PV pv-1 is bound to claim ns/other, not to PVC ns/claim",
		},
		{
			name: "PV bound to a claim in another namespace",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.ClaimRef.Namespace = "elsewhere"
				})
			},
			wantReason: ReasonPVClaimMismatch, wantMsg: "bound to claim elsewhere/claim",
		},
		{
			name: "PV bound to an earlier claim of the same name",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.ClaimRef.UID = "old-uid"
				})
			},
			wantReason: ReasonPVClaimMismatch, wantMsg: `claimRef UID "old-uid" does not match PVC ns/claim UID "claim-uid"`,
		},
		{
			name: "ephemeral PVC without owner",
			setup: func(dir string) (*v1.Pod, []any) {
				pod := newPod("web", withVolume(ephemeralVol("data")))
				pvc, pv := boundPair("web-data", "pv-1", dir)
				return pod, []any{pvc, pv}
			},
			wantReason: ReasonPVCNotOwned, wantMsg: "PVC ns/web-data was not created for pod ns/web (pod is not owner)",
		},
		{
			name: "ephemeral PVC owned by the pod but not as controller",
			setup: func(dir string) (*v1.Pod, []any) {
				pod := newPod("web", withVolume(ephemeralVol("data")))
				pvc, pv := boundPair("web-data", "pv-1", dir)
				ownPVC(pvc, pod).OwnerReferences[0].Controller = ptr.To(false)
				return pod, []any{pvc, pv}
			},
			wantReason: ReasonPVCNotOwned, wantMsg: "pod is not owner",
		},
		{
			name: "ephemeral PVC controlled by a pod of the same name with another UID",
			setup: func(dir string) (*v1.Pod, []any) {
				pod := newPod("web", withVolume(ephemeralVol("data")))
				pvc, pv := boundPair("web-data", "pv-1", dir)
				ownPVC(pvc, pod).OwnerReferences[0].UID = "previous-web-uid"
				return pod, []any{pvc, pv}
			},
			wantReason: ReasonPVCNotOwned, wantMsg: "pod is not owner",
		},
		{
			name: "ephemeral PVC not created yet",
			setup: func(dir string) (*v1.Pod, []any) {
				return newPod("web", withVolume(ephemeralVol("data"))), nil
			},
			wantReason: ReasonPVCNotFound, wantMsg: "PVC ns/web-data not found",
		},
		{
			name: "ephemeral PVC owned but pending",
			setup: func(dir string) (*v1.Pod, []any) {
				pod := newPod("web", withVolume(ephemeralVol("data")))
				pvc, pv := boundPair("web-data", "pv-1", dir)
				ownPVC(pvc, pod).Status.Phase = v1.ClaimPending
				return pod, []any{pvc, pv}
			},
			wantReason: ReasonPVCNotBound, wantMsg: "PVC ns/web-data is not bound",
		},
		{
			name: "block PV in volumeMounts",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.VolumeMode = ptr.To(v1.PersistentVolumeBlock)
				})
			},
			wantReason: ReasonVolumeMode, wantMsg: "volume has volumeMode Block, but is specified in volumeMounts",
		},
		{
			name: "filesystem PV in volumeDevices",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(pod *v1.Pod, _ *v1.PersistentVolumeClaim, _ *v1.PersistentVolume) { useAsDevice(pod) })
			},
			wantReason: ReasonVolumeMode, wantMsg: "volume has volumeMode Filesystem, but is specified in volumeDevices",
		},
		{
			name: "PV without volumeMode in volumeDevices",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(pod *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					useAsDevice(pod)
					pv.Spec.VolumeMode = nil
				})
			},
			wantReason: ReasonVolumeMode, wantMsg: "volumeMode Filesystem, but is specified in volumeDevices",
		},
		{
			name: "inline emptyDir in volumeDevices",
			setup: func(dir string) (*v1.Pod, []any) {
				return newPod("web", withDevice(emptyDirVol("data"))), nil
			},
			wantReason: ReasonVolumeMode, wantMsg: "inline volume is specified in volumeDevices",
		},
		{
			name: "inline hostPath in volumeDevices",
			setup: func(dir string) (*v1.Pod, []any) {
				return newPod("web", withDevice(hostPathVol("data", dir))), nil
			},
			wantReason: ReasonVolumeMode, wantMsg: "inline volume is specified in volumeDevices",
		},
		{
			name: "volume in both volumeMounts and volumeDevices",
			setup: func(dir string) (*v1.Pod, []any) {
				pod := newPod("web", withVolume(emptyDirVol("data")))
				pod.Spec.InitContainers = []v1.Container{{Name: "init", VolumeDevices: []v1.VolumeDevice{{Name: "data", DevicePath: "/dev/x"}}}}
				return pod, nil
			},
			wantReason: ReasonVolumeMode, wantMsg: "used both in volumeMounts and in volumeDevices",
		},
		{
			name: "node affinity does not match",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.NodeAffinity = affinity("kubernetes.io/hostname", v1.NodeSelectorOpIn, "node-2")
				})
			},
			wantReason: ReasonNodeAffinity, wantMsg: "PV pv-1 node affinity does not match node node-1",
		},
		{
			name: "node affinity on a label the node lacks",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.NodeAffinity = affinity("rack", v1.NodeSelectorOpExists)
				})
			},
			wantReason: ReasonNodeAffinity, wantMsg: "does not match node node-1",
		},
		{
			name: "invalid node affinity",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.NodeAffinity = affinity("size", v1.NodeSelectorOpGt, "not-a-number")
				})
			},
			wantReason: ReasonNodeAffinity, wantMsg: "PV pv-1 has an invalid node affinity",
		},
		{
			name: "nfs volume",
			setup: func(dir string) (*v1.Pod, []any) {
				return newPod("web", withVolume(v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{
					NFS: &v1.NFSVolumeSource{Server: "nfs.example.com", Path: "/export"},
				}})), nil
			},
			wantReason: ReasonUnsupported, wantMsg: "no plugin on this node supports nfs volumes",
		},
		{
			name: "PV of an unsupported kind",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.PersistentVolumeSource = v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/p"}}
				})
			},
			wantReason: ReasonUnsupported, wantMsg: "PersistentVolume nfs",
		},
		{
			name: "volume name with a slash",
			setup: func(dir string) (*v1.Pod, []any) {
				return newPod("web", withVolume(emptyDirVol("a/b"))), nil
			},
			wantReason: ReasonInvalid, wantMsg: "volume name is not usable as a directory name",
		},
		{
			name: "volume name dot-dot",
			setup: func(dir string) (*v1.Pod, []any) {
				return newPod("web", withVolume(emptyDirVol(".."))), nil
			},
			wantReason: ReasonInvalid, wantMsg: "starts with a dot",
		},
		{
			name: "PV name unusable as a directory name",
			setup: func(dir string) (*v1.Pod, []any) {
				pod := newPod("web", withVolume(claimVol("data", "claim")))
				pvc, pv := boundPair("claim", ".hidden", dir)
				return pod, []any{pvc, pv}
			},
			wantReason: ReasonInvalid, wantMsg: "PV name is not usable as a directory name",
		},
		{
			name: "hostPath relative path",
			setup: func(dir string) (*v1.Pod, []any) {
				return newPod("web", withVolume(hostPathVol("data", "relative/path"))), nil
			},
			wantReason: ReasonInvalid, wantMsg: `hostPath "relative/path" is not an absolute path`,
		},
		{
			name: "hostPath with dot-dot",
			setup: func(dir string) (*v1.Pod, []any) {
				return newPod("web", withVolume(hostPathVol("data", "/var/../etc"))), nil
			},
			wantReason: ReasonInvalid, wantMsg: "must not contain '..'",
		},
		{
			name: "hostPath of an unknown type",
			setup: func(dir string) (*v1.Pod, []any) {
				vol := hostPathVol("data", dir)
				vol.HostPath.Type = ptr.To(v1.HostPathType("Weird"))
				return newPod("web", withVolume(vol)), nil
			},
			wantReason: ReasonInvalid, wantMsg: `hostPath type "Weird"`,
		},
		{
			name: "emptyDir with a hugepages medium of no size",
			setup: func(dir string) (*v1.Pod, []any) {
				vol := emptyDirVol("data")
				vol.EmptyDir.Medium = "HugePages-huge"
				return newPod("web", withVolume(vol)), nil
			},
			wantReason: ReasonInvalid, wantMsg: `emptyDir medium "HugePages-huge": page size "huge"`,
		},
		{
			name: "local PV path missing",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(filepath.Join(dir, "missing"), nil)
			},
			wantReason: ReasonInvalid, wantMsg: "local path of PV pv-1",
		},
		{
			name: "local PV with a relative path",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound("relative", nil)
			},
			wantReason: ReasonInvalid, wantMsg: `local path "relative" of PV pv-1 is not absolute`,
		},
		{
			name: "local PV with a mount option a bind mount cannot honour",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.MountOptions = []string{"discard"}
				})
			},
			wantReason: ReasonInvalid, wantMsg: `mount option "discard" cannot be applied to a bind mount`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pod, objs := tc.setup(dir)
			src := newFakeSource()
			src.Add(objs...)
			node := testNodeInfo
			if tc.node != nil {
				node = *tc.node
			}
			pv, err, _ := resolveFirst(t, src, node, pod)
			if err == nil {
				t.Fatalf("resolved to %+v, want %s", pv, tc.wantReason)
			}
			if err.Reason != tc.wantReason {
				t.Errorf("reason = %s, want %s (error: %v)", err.Reason, tc.wantReason, err)
			}
			checkPodVolumeError(t, err, pod, pod.Spec.Volumes[0].Name, tc.wantMsg)
			if pv.Name != "" || pv.Spec != nil {
				t.Errorf("failed resolution returned a volume: %+v", pv)
			}
		})
	}
}

// checkPodVolumeError checks that err names the pod, the volume and says
// what is wrong.
func checkPodVolumeError(t *testing.T, err *volume.PodVolumeError, pod *v1.Pod, volName, wantMsg string) {
	t.Helper()
	if err.Pod.UID != pod.UID || err.Pod.Name != pod.Name || err.Pod.Namespace != pod.Namespace {
		t.Errorf("error pod = %+v, want %s/%s", err.Pod, pod.Namespace, pod.Name)
	}
	if err.Volume != volName {
		t.Errorf("error volume = %q, want %q", err.Volume, volName)
	}
	msg := err.Error()
	for _, want := range []string{"pod " + pod.Namespace + "/" + pod.Name, `volume "` + volName + `"`, wantMsg} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
	if err.Err == nil || !errors.Is(err, err.Err) {
		t.Errorf("error does not wrap its cause")
	}
}

func affinity(key string, op v1.NodeSelectorOperator, values ...string) *v1.VolumeNodeAffinity {
	return &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchExpressions: []v1.NodeSelectorRequirement{{Key: key, Operator: op, Values: values}},
	}}}}
}

// A plugin without raw block support gets a Block volume refused for the
// pod, naming the plugin.
func TestResolveBlockUnsupportedByPlugin(t *testing.T) {
	pod, objs := bound(t.TempDir(), func(pod *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
		useAsDevice(pod)
		pv.Spec.VolumeMode = ptr.To(v1.PersistentVolumeBlock)
	})
	src := newFakeSource()
	src.Add(objs...)
	host := plugins.Host{Paths: volume.Paths{Root: t.TempDir()}, Mounter: mountutil.New(), NodeName: testNode}
	// countingPlugin hides every capability but Plugin.
	r := &resolver{store: src, plugins: plugins.NewRegistry(countingPlugin{local.New(host), &atomic.Int64{}}), node: testNodeInfo}
	_, err := r.resolve(pod, podInfo(pod), &pod.Spec.Volumes[0], volumeUsage(pod)["data"])
	if err == nil || err.Reason != ReasonUnsupported || !strings.Contains(err.Error(), "kubernetes.io/local-volume does not support raw block volumes") {
		t.Errorf("error = %v, want %s naming the plugin", err, ReasonUnsupported)
	}
}

func TestResolveLookupFailed(t *testing.T) {
	dir := t.TempDir()
	pod, objs := bound(dir, nil)
	src := newFakeSource()
	src.Add(objs...)
	src.SetPVCError(testNS, "claim", errors.New("connection refused"))
	_, err, _ := resolveFirst(t, src, testNodeInfo, pod)
	if err == nil || err.Reason != ReasonLookupFailed {
		t.Fatalf("error = %v, want %s", err, ReasonLookupFailed)
	}
	checkPodVolumeError(t, err, pod, "data", "reading PVC ns/claim: connection refused")
}

func TestResolveSuccess(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name      string
		setup     func(dir string) (*v1.Pod, []any)
		wantName  func(pod *v1.Pod) volume.UniqueName
		wantAttrs volume.Attributes
		check     func(t *testing.T, pod *v1.Pod, objs []any, pv cache.PodVolume)
	}{
		{
			name:  "emptyDir",
			setup: func(string) (*v1.Pod, []any) { return newPod("web", withVolume(emptyDirVol("scratch"))), nil },
			wantName: func(pod *v1.Pod) volume.UniqueName {
				return volume.PodScopedName(emptydir.Name, pod.UID, "scratch")
			},
			wantAttrs: volume.Attributes{NoSizeLimit: true},
			check: func(t *testing.T, pod *v1.Pod, _ []any, pv cache.PodVolume) {
				s := pv.Spec
				if s.Name != "scratch" || s.Volume != &pod.Spec.Volumes[0] || s.PV != nil || s.PVC != nil || s.ReadOnly ||
					s.Mode != v1.PersistentVolumeFilesystem || s.InlineEphemeral || pv.DesiredSize != nil {
					t.Errorf("spec = %+v, size %v", s, pv.DesiredSize)
				}
			},
		},
		{
			name: "memory emptyDir",
			setup: func(string) (*v1.Pod, []any) {
				vol := emptyDirVol("shm")
				vol.EmptyDir.Medium = v1.StorageMediumMemory
				return newPod("web", withVolume(vol)), nil
			},
			wantName:  func(pod *v1.Pod) volume.UniqueName { return volume.PodScopedName(emptydir.Name, pod.UID, "shm") },
			wantAttrs: volume.Attributes{NoSizeLimit: true},
		},
		{
			name:  "hostPath",
			setup: func(dir string) (*v1.Pod, []any) { return newPod("web", withVolume(hostPathVol("host", dir))), nil },
			wantName: func(pod *v1.Pod) volume.UniqueName {
				return volume.PodScopedName(hostpath.Name, pod.UID, "host")
			},
		},
		{
			name: "hostPath that does not exist yet (checked at mount time)",
			setup: func(dir string) (*v1.Pod, []any) {
				vol := hostPathVol("host", filepath.Join(dir, "later"))
				vol.HostPath.Type = ptr.To(v1.HostPathDirectoryOrCreate)
				return newPod("web", withVolume(vol)), nil
			},
			wantName: func(pod *v1.Pod) volume.UniqueName { return volume.PodScopedName(hostpath.Name, pod.UID, "host") },
		},
		{
			name: "local PV used as raw block (volumeDevices)",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(pod *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					useAsDevice(pod)
					pv.Spec.VolumeMode = ptr.To(v1.PersistentVolumeBlock)
					pv.Spec.Local.Path = "/dev/disk/by-id/not-looked-at-when-resolving"
				})
			},
			wantName:  func(*v1.Pod) volume.UniqueName { return volume.SharedName(local.Name, "pv-1") },
			wantAttrs: volume.Attributes{Identity: "pv-1", Block: true},
			check: func(t *testing.T, _ *v1.Pod, _ []any, pv cache.PodVolume) {
				if !pv.Spec.IsBlock() {
					t.Errorf("spec mode %s, want Block", pv.Spec.Mode)
				}
			},
		},
		{
			name:      "local PV through a claim",
			setup:     func(dir string) (*v1.Pod, []any) { return bound(dir, nil) },
			wantName:  func(*v1.Pod) volume.UniqueName { return volume.SharedName(local.Name, "pv-1") },
			wantAttrs: volume.Attributes{Identity: "pv-1"},
			check: func(t *testing.T, pod *v1.Pod, objs []any, pv cache.PodVolume) {
				s := pv.Spec
				if s.Name != "pv-1" || s.PV != objs[1] || s.PVC != objs[0] || s.Volume != nil || s.ReadOnly || s.Mode != v1.PersistentVolumeFilesystem {
					t.Errorf("spec = %+v", s)
				}
				if s.ClaimRef() != "ns/claim" {
					t.Errorf("ClaimRef = %q", s.ClaimRef())
				}
				if pv.DesiredSize != nil {
					t.Errorf("desired size = %v, want none: no node expansion is pending", pv.DesiredSize)
				}
			},
		},
		{
			name: "read-only claim has no desired size",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(pod *v1.Pod, _ *v1.PersistentVolumeClaim, _ *v1.PersistentVolume) {
					pod.Spec.Volumes[0].PersistentVolumeClaim.ReadOnly = true
				})
			},
			wantName:  func(*v1.Pod) volume.UniqueName { return volume.SharedName(local.Name, "pv-1") },
			wantAttrs: volume.Attributes{Identity: "pv-1"},
			check: func(t *testing.T, _ *v1.Pod, _ []any, pv cache.PodVolume) {
				if !pv.Spec.ReadOnly || pv.DesiredSize != nil {
					t.Errorf("ReadOnly %v, desired size %v", pv.Spec.ReadOnly, pv.DesiredSize)
				}
			},
		},
		{
			name: "PV without capacity has no desired size",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) { pv.Spec.Capacity = nil })
			},
			wantName:  func(*v1.Pod) volume.UniqueName { return volume.SharedName(local.Name, "pv-1") },
			wantAttrs: volume.Attributes{Identity: "pv-1"},
			check: func(t *testing.T, _ *v1.Pod, _ []any, pv cache.PodVolume) {
				if pv.DesiredSize != nil {
					t.Errorf("desired size %v", pv.DesiredSize)
				}
			},
		},
		{
			name: "PVC being deleted but protected by its finalizer",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, pvc *v1.PersistentVolumeClaim, _ *v1.PersistentVolume) {
					pvc.DeletionTimestamp = &now
					pvc.Finalizers = []string{"example.com/other", "kubernetes.io/pvc-protection"}
				})
			},
			wantName:  func(*v1.Pod) volume.UniqueName { return volume.SharedName(local.Name, "pv-1") },
			wantAttrs: volume.Attributes{Identity: "pv-1"},
		},
		{
			name: "ephemeral volume with its owned claim",
			setup: func(dir string) (*v1.Pod, []any) {
				pod := newPod("web", withVolume(ephemeralVol("data")))
				pvc, pv := boundPair("web-data", "pv-1", dir)
				ownPVC(pvc, pod)
				return pod, []any{pvc, pv}
			},
			wantName:  func(*v1.Pod) volume.UniqueName { return volume.SharedName(local.Name, "pv-1") },
			wantAttrs: volume.Attributes{Identity: "pv-1"},
			check: func(t *testing.T, _ *v1.Pod, _ []any, pv cache.PodVolume) {
				if pv.Spec.ClaimRef() != "ns/web-data" || pv.OuterName != "data" {
					t.Errorf("claim %q, outer name %q", pv.Spec.ClaimRef(), pv.OuterName)
				}
			},
		},
		{
			name: "node affinity matches",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.NodeAffinity = affinity("kubernetes.io/hostname", v1.NodeSelectorOpIn, "node-2", testNode)
				})
			},
			wantName:  func(*v1.Pod) volume.UniqueName { return volume.SharedName(local.Name, "pv-1") },
			wantAttrs: volume.Attributes{Identity: "pv-1"},
		},
		{
			name: "node affinity without required terms",
			setup: func(dir string) (*v1.Pod, []any) {
				return bound(dir, func(_ *v1.Pod, _ *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
					pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{}
				})
			},
			wantName:  func(*v1.Pod) volume.UniqueName { return volume.SharedName(local.Name, "pv-1") },
			wantAttrs: volume.Attributes{Identity: "pv-1"},
		},
		{
			name: "volume used only by an init container",
			setup: func(string) (*v1.Pod, []any) {
				pod := newPod("web", withUnusedVolume(emptyDirVol("init-only")))
				pod.Spec.InitContainers = []v1.Container{{Name: "init", VolumeMounts: []v1.VolumeMount{{Name: "init-only", MountPath: "/x"}}}}
				return pod, nil
			},
			wantName:  func(pod *v1.Pod) volume.UniqueName { return volume.PodScopedName(emptydir.Name, pod.UID, "init-only") },
			wantAttrs: volume.Attributes{NoSizeLimit: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pod, objs := tc.setup(dir)
			src := newFakeSource()
			src.Add(objs...)
			pv, err, _ := resolveFirst(t, src, testNodeInfo, pod)
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}
			if want := tc.wantName(pod); pv.Name != want {
				t.Errorf("name = %q, want %q", pv.Name, want)
			}
			if pv.Attributes != tc.wantAttrs {
				t.Errorf("attributes = %+v, want %+v", pv.Attributes, tc.wantAttrs)
			}
			if pv.OuterName != pod.Spec.Volumes[0].Name || pv.Spec == nil || !strings.HasPrefix(string(pv.Name), pv.Plugin+"/") {
				t.Errorf("volume = %+v", pv)
			}
			if tc.check != nil {
				tc.check(t, pod, objs, pv)
			}
		})
	}
}

// TestResolveRecordsDependencies: the populator re-resolves a pod when an
// object it read changes, including objects that were missing.
func TestResolveRecordsDependencies(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		objs func(pvc *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) []any
		want []string
	}{
		{"both found", func(c *v1.PersistentVolumeClaim, v *v1.PersistentVolume) []any { return []any{c, v} },
			[]string{"pvc ns/claim found", "pv /pv-1 found"}},
		{"PVC missing", func(*v1.PersistentVolumeClaim, *v1.PersistentVolume) []any { return nil },
			[]string{"pvc ns/claim missing"}},
		{"PV missing", func(c *v1.PersistentVolumeClaim, _ *v1.PersistentVolume) []any { return []any{c} },
			[]string{"pvc ns/claim found", "pv /pv-1 missing"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod, _ := bound(dir, nil)
			pvc, pv := boundPair("claim", "pv-1", dir)
			src := newFakeSource()
			src.Add(tc.objs(pvc, pv)...)
			_, _, r := resolveFirst(t, src, testNodeInfo, pod)
			var got []string
			for _, d := range r.deps {
				state := "missing"
				switch o := d.obj.(type) {
				case *v1.PersistentVolumeClaim:
					if o != nil {
						state = "found"
					}
				case *v1.PersistentVolume:
					if o != nil {
						state = "found"
					}
				}
				got = append(got, d.kind+" "+d.namespace+"/"+d.name+" "+state)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("deps = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestVolumeUsage(t *testing.T) {
	pod := newPod("web", withVolume(emptyDirVol("main")))
	pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: "side",
		VolumeMounts:  []v1.VolumeMount{{Name: "main"}, {Name: "side"}},
		VolumeDevices: []v1.VolumeDevice{{Name: "blk"}}})
	pod.Spec.InitContainers = []v1.Container{{Name: "init", VolumeMounts: []v1.VolumeMount{{Name: "init"}}}}
	pod.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{
		Name: "debug", VolumeMounts: []v1.VolumeMount{{Name: "debug"}}, VolumeDevices: []v1.VolumeDevice{{Name: "dbgblk"}},
	}}}
	got := volumeUsage(pod)
	want := map[string]usage{
		"main": {mounted: true}, "side": {mounted: true}, "blk": {device: true},
		"init": {mounted: true}, "debug": {mounted: true}, "dbgblk": {device: true},
	}
	if len(got) != len(want) {
		t.Errorf("usage = %v, want %v", got, want)
	}
	for name, u := range want {
		if got[name] != u {
			t.Errorf("usage[%s] = %+v, want %+v", name, got[name], u)
		}
	}
}

// TestUniqueNames: per-pod volumes are named per pod, volumes of the same
// PV are shared.
func TestUniqueNames(t *testing.T) {
	dir := t.TempDir()
	src := newFakeSource()
	pvc, pv := boundPair("claim", "pv-1", dir)
	src.Add(pvc, pv)
	podA := newPod("a", withVolume(emptyDirVol("scratch")), withVolume(claimVol("data", "claim")))
	podB := newPod("b", withVolume(emptyDirVol("scratch")), withVolume(claimVol("other-name", "claim")))
	names := map[string][2]volume.UniqueName{}
	r := &resolver{store: src, plugins: testPlugins(t, nil), node: testNodeInfo}
	for i, pod := range []*v1.Pod{podA, podB} {
		use := volumeUsage(pod)
		for j := range pod.Spec.Volumes {
			vol := &pod.Spec.Volumes[j]
			res, err := r.resolve(pod, podInfo(pod), vol, use[vol.Name])
			if err != nil {
				t.Fatalf("%s/%s: %v", pod.Name, vol.Name, err)
			}
			kind := "emptyDir"
			if vol.PersistentVolumeClaim != nil {
				kind = "pvc"
			}
			n := names[kind]
			n[i] = res.Name
			names[kind] = n
		}
	}
	if e := names["emptyDir"]; e[0] == e[1] {
		t.Errorf("two pods' emptyDirs share the name %q", e[0])
	}
	if p := names["pvc"]; p[0] != p[1] || p[0] != volume.SharedName(local.Name, "pv-1") {
		t.Errorf("the same local PV got names %q and %q", p[0], p[1])
	}
}

func TestPodInfo(t *testing.T) {
	mem := func(s string) v1.ResourceRequirements {
		return v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse(s)}}
	}
	tests := []struct {
		name    string
		mutate  func(p *v1.Pod)
		wantMem string // "" for no limit
	}{
		{"no limits", func(p *v1.Pod) {}, ""},
		{"one container", func(p *v1.Pod) { p.Spec.Containers[0].Resources = mem("64Mi") }, "64Mi"},
		{"sum of containers", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources = mem("64Mi")
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "b", Resources: mem("192Mi")})
		}, "256Mi"},
		{"one container unlimited", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources = mem("64Mi")
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "b"})
		}, ""},
		{"pod-level limit wins", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources = mem("64Mi")
			r := mem("1Gi")
			p.Spec.Resources = &r
		}, "1Gi"},
		{"no containers", func(p *v1.Pod) { p.Spec.Containers = nil }, ""},
		// As the kubelet computes the pod's cgroup limit: an init container
		// runs alone, so the larger of it and the containers counts...
		{"init container larger than the containers", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources = mem("64Mi")
			p.Spec.InitContainers = []v1.Container{{Name: "init", Resources: mem("512Mi")}}
		}, "512Mi"},
		{"init container smaller than the containers", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources = mem("64Mi")
			p.Spec.InitContainers = []v1.Container{{Name: "init", Resources: mem("16Mi")}}
		}, "64Mi"},
		{"init container without a limit", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources = mem("64Mi")
			p.Spec.InitContainers = []v1.Container{{Name: "init"}}
		}, ""},
		// ...a sidecar runs beside them, so it is added...
		{"sidecar", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources = mem("64Mi")
			p.Spec.InitContainers = []v1.Container{{Name: "proxy", RestartPolicy: ptr.To(v1.ContainerRestartPolicyAlways), Resources: mem("32Mi")}}
		}, "96Mi"},
		// ...and so is the pod's overhead (runtime class).
		{"overhead", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources = mem("64Mi")
			p.Spec.Overhead = v1.ResourceList{v1.ResourceMemory: resource.MustParse("8Mi")}
		}, "72Mi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := newPod("web")
			pod.Spec.ServiceAccountName = "sa"
			pod.Spec.SecurityContext = &v1.PodSecurityContext{FSGroup: ptr.To[int64](1234), FSGroupChangePolicy: ptr.To(v1.FSGroupChangeOnRootMismatch)}
			tc.mutate(pod)
			info := podInfo(pod)
			if info.PodRef != (volume.PodRef{UID: "web-uid", Namespace: testNS, Name: "web"}) || info.ServiceAccount != "sa" ||
				info.FSGroup == nil || *info.FSGroup != 1234 || *info.FSGroupChangePolicy != v1.FSGroupChangeOnRootMismatch {
				t.Errorf("info = %+v", info)
			}
			switch {
			case tc.wantMem == "" && info.MemoryLimit != nil:
				t.Errorf("memory limit = %v, want none", info.MemoryLimit)
			case tc.wantMem != "" && (info.MemoryLimit == nil || info.MemoryLimit.Cmp(resource.MustParse(tc.wantMem)) != 0):
				t.Errorf("memory limit = %v, want %s", info.MemoryLimit, tc.wantMem)
			}
		})
	}
}
