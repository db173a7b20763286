package populator

import (
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/source"
	"github.com/volume-agent/volume-agent/volume"
)

// Reasons classify pod volume errors (metric label, event text).
const (
	ReasonPVCNotFound     = "PVCNotFound"
	ReasonPVCNotBound     = "PVCNotBound"
	ReasonPVCBeingDeleted = "PVCBeingDeleted"
	ReasonPVCNotOwned     = "EphemeralPVCNotOwned"
	ReasonPVNotFound      = "PVNotFound"
	ReasonPVClaimMismatch = "PVClaimMismatch"
	ReasonVolumeMode      = "VolumeModeMismatch"
	ReasonNodeAffinity    = "NodeAffinityMismatch"
	ReasonUnsupported     = "UnsupportedVolume"
	ReasonInvalid         = "InvalidVolume"
	ReasonLookupFailed    = "LookupFailed"
	// ReasonNotRead: the claim or volume is not read from the API server
	// yet (its watch starts with the first pod that uses it). The volume
	// waits; this is not reported as an error (no event, no metric).
	ReasonNotRead          = "NotReadYet"
	ReasonPodUIDUnusable   = "InvalidPodUID"
	pvcProtectionFinalizer = "kubernetes.io/pvc-protection"
)

// Node is what volume resolution needs to know about this node.
type Node struct {
	Name   string
	Labels map[string]string
	// HostIPs are the node's IPs as the kubelet picks them for
	// status.hostIPs (empty: not known).
	HostIPs []string
}

// usage is how a pod's containers use one of its volumes.
type usage struct {
	mounted bool // in some volumeMounts
	device  bool // in some volumeDevices
}

// volumeUsage maps the pod's volume names used by any container (init,
// regular and ephemeral) to how they are used. Volumes no container uses
// are not mounted at all, as in the kubelet.
//
// Small enough to inline, so that the map of a pod with few volumes can
// live on the caller's stack: two allocations per pod less.
func volumeUsage(pod *v1.Pod) map[string]usage {
	out := make(map[string]usage, 8)
	addVolumeUsage(pod, out)
	return out
}

func addVolumeUsage(pod *v1.Pod, out map[string]usage) {
	add := func(mounts []v1.VolumeMount, devices []v1.VolumeDevice) {
		for _, m := range mounts {
			u := out[m.Name]
			u.mounted = true
			out[m.Name] = u
		}
		for _, d := range devices {
			u := out[d.Name]
			u.device = true
			out[d.Name] = u
		}
	}
	for i := range pod.Spec.InitContainers {
		add(pod.Spec.InitContainers[i].VolumeMounts, pod.Spec.InitContainers[i].VolumeDevices)
	}
	for i := range pod.Spec.Containers {
		add(pod.Spec.Containers[i].VolumeMounts, pod.Spec.Containers[i].VolumeDevices)
	}
	for i := range pod.Spec.EphemeralContainers {
		c := &pod.Spec.EphemeralContainers[i].EphemeralContainerCommon
		add(c.VolumeMounts, c.VolumeDevices)
	}
}

// resolver turns one pod volume into a cache.PodVolume, recording which
// store objects it read so the populator can tell when to redo it.
type resolver struct {
	store   source.Store
	plugins *plugins.Registry
	node    Node
	deps    []dep
	notices []notice
}

// dep is a store object a result depends on; obj is the pointer read (nil
// if it was missing). Stores never modify published objects, so an equal
// pointer means an unchanged object.
type dep struct {
	kind, namespace, name string
	obj                   any
}

func (r *resolver) pvc(ns, name string) (*v1.PersistentVolumeClaim, error) {
	pvc, err := r.store.PVC(ns, name)
	r.deps = append(r.deps, dep{"pvc", ns, name, pvc})
	return pvc, err
}

func (r *resolver) csiDriver(name string) {
	d, _ := r.store.CSIDriver(name)
	r.deps = append(r.deps, dep{"csidriver", "", name, d})
}

func csiDriverName(spec *volume.Spec) string {
	switch {
	case spec.PV != nil && spec.PV.Spec.CSI != nil:
		return spec.PV.Spec.CSI.Driver
	case spec.Volume != nil && spec.Volume.CSI != nil:
		return spec.Volume.CSI.Driver
	}
	return ""
}

func (r *resolver) pv(name string) (*v1.PersistentVolume, error) {
	pv, err := r.store.PV(name)
	r.deps = append(r.deps, dep{"pv", "", name, pv})
	return pv, err
}

// resolve builds the spec of one pod volume and asks its plugin how to
// handle it.
func (r *resolver) resolve(pod *v1.Pod, podInfo volume.PodInfo, vol *v1.Volume, use usage) (cache.PodVolume, *volume.PodVolumeError) {
	fail := func(reason string, err error) (cache.PodVolume, *volume.PodVolumeError) {
		return cache.PodVolume{}, &volume.PodVolumeError{Pod: podInfo.PodRef, Volume: vol.Name, Reason: reason, Err: err,
			Transient: reason == ReasonNotRead || reason == ReasonLookupFailed}
	}
	if err := volume.ValidatePathElement(vol.Name); err != nil {
		return fail(ReasonInvalid, fmt.Errorf("volume name is not usable as a directory name: %w", err))
	}
	if use.mounted && use.device {
		return fail(ReasonVolumeMode, errors.New("volume is used both in volumeMounts and in volumeDevices"))
	}

	spec := &volume.Spec{Name: vol.Name, Volume: vol, Mode: v1.PersistentVolumeFilesystem}
	var claimName string
	var claimReadOnly bool
	switch {
	case vol.PersistentVolumeClaim != nil:
		claimName, claimReadOnly = vol.PersistentVolumeClaim.ClaimName, vol.PersistentVolumeClaim.ReadOnly
	case vol.Ephemeral != nil:
		claimName = pod.Name + "-" + vol.Name
	}
	if claimName != "" {
		pvc, pv, reason, err := r.claim(pod, claimName, vol.Ephemeral != nil)
		if err != nil {
			return fail(reason, err)
		}
		spec = &volume.Spec{Name: pv.Name, PV: pv, PVC: pvc, ReadOnly: claimReadOnly, Mode: v1.PersistentVolumeFilesystem}
		if pv.Spec.VolumeMode != nil {
			spec.Mode = *pv.Spec.VolumeMode
		}
		if err := volume.ValidatePathElement(pv.Name); err != nil {
			return fail(ReasonInvalid, fmt.Errorf("PV name is not usable as a directory name: %w", err))
		}
		if err := r.checkNodeAffinity(pv); err != nil {
			return fail(ReasonNodeAffinity, err)
		}
	} else {
		spec.ReadOnly = inlineReadOnly(vol)
		spec.InlineEphemeral = vol.CSI != nil
	}
	switch {
	case use.mounted && spec.IsBlock():
		return fail(ReasonVolumeMode, fmt.Errorf("volume has volumeMode Block, but is specified in volumeMounts"))
	case use.device && !spec.IsBlock():
		if spec.PV == nil {
			return fail(ReasonVolumeMode, fmt.Errorf("inline volume is specified in volumeDevices, but only PersistentVolumes with volumeMode Block can be"))
		}
		return fail(ReasonVolumeMode, fmt.Errorf("volume has volumeMode %s, but is specified in volumeDevices", spec.Mode))
	}

	if driver := csiDriverName(spec); driver != "" {
		// The plugin's decisions depend on the CSIDriver object: record it
		// so a change to it re-resolves the pod.
		r.csiDriver(driver)
	}
	plugin, err := r.plugins.ForSpec(spec)
	if err != nil {
		return fail(ReasonUnsupported, err)
	}
	if _, ok := plugin.(plugins.BlockMapper); spec.IsBlock() && !ok {
		return fail(ReasonUnsupported, fmt.Errorf("volume plugin %s does not support raw block volumes (volumeMode Block)", plugin.Name()))
	}
	attrs, err := plugin.Attributes(spec)
	if err != nil {
		return fail(ReasonInvalid, err)
	}
	// The volume mode decides which operations the volume gets; it comes
	// from the PV, never from the plugin's guess.
	attrs.Block = spec.IsBlock()
	pv := cache.PodVolume{Plugin: plugin.Name(), Attributes: attrs, OuterName: vol.Name, Spec: spec}
	if attrs.Shared() {
		pv.Name = volume.SharedName(plugin.Name(), attrs.Identity)
	} else {
		pv.Name = volume.PodScopedName(plugin.Name(), podInfo.UID, spec.Name)
	}
	var n *notice
	pv.DesiredSize, n = resizeTarget(spec)
	if n != nil {
		n.pod, n.volume = podInfo.PodRef, vol.Name
		r.notices = append(r.notices, *n)
	}
	return pv, nil
}

// claim looks up and checks the claim and its volume the way the kubelet
// does, with errors that say exactly what is wrong.
func (r *resolver) claim(pod *v1.Pod, name string, ephemeral bool) (*v1.PersistentVolumeClaim, *v1.PersistentVolume, string, error) {
	ns := pod.Namespace
	pvc, err := r.pvc(ns, name)
	if errors.Is(err, source.ErrNotRead) {
		return nil, nil, ReasonNotRead, volume.Waitingf("PVC %s/%s is not read from the API server yet", ns, name)
	}
	if apierrors.IsNotFound(err) {
		return nil, nil, ReasonPVCNotFound, fmt.Errorf("PVC %s/%s not found", ns, name)
	}
	if err != nil {
		return nil, nil, ReasonLookupFailed, fmt.Errorf("reading PVC %s/%s: %w", ns, name, err)
	}
	if ephemeral && !ownedBy(pvc, pod) {
		return nil, nil, ReasonPVCNotOwned, fmt.Errorf("PVC %s/%s was not created for pod %s/%s (pod is not owner)", ns, name, ns, pod.Name)
	}
	if pvc.DeletionTimestamp != nil && !hasFinalizer(pvc, pvcProtectionFinalizer) {
		return nil, nil, ReasonPVCBeingDeleted, fmt.Errorf("PVC %s/%s is being deleted", ns, name)
	}
	if pvc.Status.Phase != v1.ClaimBound {
		phase := pvc.Status.Phase
		if phase == "" {
			phase = v1.ClaimPending
		}
		return nil, nil, ReasonPVCNotBound, fmt.Errorf("PVC %s/%s is not bound (phase %s)", ns, name, phase)
	}
	if pvc.Spec.VolumeName == "" {
		return nil, nil, ReasonPVCNotBound, fmt.Errorf("PVC %s/%s is bound but names no volume", ns, name)
	}
	pv, err := r.pv(pvc.Spec.VolumeName)
	if errors.Is(err, source.ErrNotRead) {
		return nil, nil, ReasonNotRead, volume.Waitingf("PV %s (bound to PVC %s/%s) is not read from the API server yet", pvc.Spec.VolumeName, ns, name)
	}
	if apierrors.IsNotFound(err) {
		return nil, nil, ReasonPVNotFound, fmt.Errorf("PV %s (bound to PVC %s/%s) not found", pvc.Spec.VolumeName, ns, name)
	}
	if err != nil {
		return nil, nil, ReasonLookupFailed, fmt.Errorf("reading PV %s: %w", pvc.Spec.VolumeName, err)
	}
	ref := pv.Spec.ClaimRef
	switch {
	case ref == nil:
		return nil, nil, ReasonPVClaimMismatch, fmt.Errorf("PV %s is not bound to any claim, but PVC %s/%s names it", pv.Name, ns, name)
	case ref.Namespace != ns || ref.Name != name:
		return nil, nil, ReasonPVClaimMismatch, fmt.Errorf("PV %s is bound to claim %s/%s, not to PVC %s/%s", pv.Name, ref.Namespace, ref.Name, ns, name)
	case ref.UID != pvc.UID:
		return nil, nil, ReasonPVClaimMismatch, fmt.Errorf("PV %s claimRef UID %q does not match PVC %s/%s UID %q", pv.Name, ref.UID, ns, name, pvc.UID)
	}
	return pvc, pv, "", nil
}

func (r *resolver) checkNodeAffinity(pv *v1.PersistentVolume) error {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return nil
	}
	node := &v1.Node{}
	node.Name = r.node.Name
	node.Labels = r.node.Labels
	ok, err := nodeaffinity.NewLazyErrorNodeSelector(pv.Spec.NodeAffinity.Required).Match(node)
	if err != nil {
		return fmt.Errorf("PV %s has an invalid node affinity: %w", pv.Name, err)
	}
	if !ok {
		return fmt.Errorf("PV %s node affinity does not match node %s", pv.Name, r.node.Name)
	}
	return nil
}

func ownedBy(pvc *v1.PersistentVolumeClaim, pod *v1.Pod) bool {
	for _, o := range pvc.OwnerReferences {
		if o.Controller != nil && *o.Controller && o.UID == pod.UID && o.Kind == "Pod" {
			return true
		}
	}
	return false
}

func hasFinalizer(pvc *v1.PersistentVolumeClaim, f string) bool {
	for _, x := range pvc.Finalizers {
		if x == f {
			return true
		}
	}
	return false
}

func inlineReadOnly(vol *v1.Volume) bool {
	switch {
	case vol.CSI != nil && vol.CSI.ReadOnly != nil:
		return *vol.CSI.ReadOnly
	}
	return false
}

// notice is something worth telling people about a volume that is not an
// error: an expansion skipped because the volume is read-only, a PV smaller
// than its claim.
type notice struct {
	pod     volume.PodRef
	volume  string
	pvc     *v1.PersistentVolumeClaim
	reason  string
	message string
}

// resizeTarget decides whether the node must grow the volume's filesystem,
// and to what size, the way the kubelet reads a claim since Kubernetes 1.34:
// the resize controller records the new size in status.allocatedResources
// and sets status.allocatedResourceStatuses[storage] to NodeResizePending;
// the node works while it is Pending or InProgress. A claim from an older
// controller (neither field set) needs node expansion while the PV's
// capacity exceeds the claim's status capacity.
func resizeTarget(spec *volume.Spec) (*resource.Quantity, *notice) {
	if spec.PV == nil || spec.PVC == nil {
		return nil, nil
	}
	pvSize, ok := spec.PV.Spec.Capacity[v1.ResourceStorage]
	if !ok {
		return nil, nil
	}
	status := spec.PVC.Status
	claimSize, hasClaimSize := status.Capacity[v1.ResourceStorage]
	var target *resource.Quantity
	switch st := status.AllocatedResourceStatuses[v1.ResourceStorage]; {
	case st == v1.PersistentVolumeClaimNodeResizePending || st == v1.PersistentVolumeClaimNodeResizeInProgress:
		q := pvSize
		if alloc, ok := status.AllocatedResources[v1.ResourceStorage]; ok {
			q = alloc
		}
		if !hasClaimSize || q.Cmp(claimSize) > 0 {
			target = &q
		}
	case st == "" && status.AllocatedResources == nil && hasClaimSize:
		switch pvSize.Cmp(claimSize) {
		case 1:
			target = &pvSize
		case -1:
			return nil, &notice{pvc: spec.PVC, reason: "VolumeShrinkIgnored",
				message: fmt.Sprintf("PV %s capacity %s is smaller than claim %s capacity %s; volumes never shrink, ignoring",
					spec.PV.Name, pvSize.String(), spec.ClaimRef(), claimSize.String())}
		}
	}
	if target == nil {
		return nil, nil
	}
	if spec.ReadOnly {
		return nil, &notice{pvc: spec.PVC, reason: "FileSystemResizeFailed",
			message: fmt.Sprintf("volume %s (claim %s) needs its filesystem grown to %s, but it is mounted read-only; not expanding",
				spec.PV.Name, spec.ClaimRef(), target.String())}
	}
	return target, nil
}
