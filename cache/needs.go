package cache

import (
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/volume"
)

// What is left to do for a volume, as pure functions of the actual state and
// of the facts the desired state gives (attributes, desired size, whether a
// pod wants it). The planner plans an operation when its predicate holds, and
// the operation checks the same predicate again when it runs, because the plan
// was made from a snapshot that may be out of date by then. They share one
// definition: if the two ever disagreed, the operation would find every plan
// stale and the planner would plan it again, in a loop.
//
// av is nil when the actual state has nothing for the volume; m is nil when
// the pod has no mount of it.

// AttachNeeded reports whether an attachable volume still has to be attached
// (or its attachment verified) before anything else is done with it.
func AttachNeeded(attrs volume.Attributes, av *ActualVolume) bool {
	return attrs.Attachable && (av == nil || av.AttachState != Attached)
}

// DeviceMountNeeded reports whether a device-mountable volume's device still
// has to be mounted (staged) at its global path.
func DeviceMountNeeded(attrs volume.Attributes, av *ActualVolume) bool {
	return attrs.DeviceMountable && (av == nil || av.DeviceState != DeviceGloballyMounted)
}

// ReadyForPods reports whether what a volume needs before any pod can have it
// is done: attached if attachable, device mounted if device-mountable.
func ReadyForPods(attrs volume.Attributes, av *ActualVolume) bool {
	return !AttachNeeded(attrs, av) && !DeviceMountNeeded(attrs, av)
}

// PodMountNeeded reports whether a pod's mount of a volume it wants still has
// to be set up: it is missing, uncertain, or holds content older than the
// content generation the DSW wants (gen, DesiredPodVolume.ContentGeneration).
func PodMountNeeded(m *ActualPodMount, gen uint64) bool {
	return m == nil || m.State != Mounted || ContentOutdated(m, gen)
}

// ContentOutdated reports whether a pod's mount holds content written
// before the content generation gen: what it is built from changed since,
// or it was found after a restart (generation 0). Setting it up again
// rewrites the content.
func ContentOutdated(m *ActualPodMount, gen uint64) bool {
	return m.ContentGeneration < gen
}

// SubPathsNeeded reports whether the sub-paths of a pod's mount must be
// prepared (or removed): the mount is set up with current content (gen as
// for PodMountNeeded), and what was prepared for it is not what its
// containers want, or was prepared before the volume was last set up again.
func SubPathsNeeded(want []volume.SubPath, m *ActualPodMount, gen uint64) bool {
	return m != nil && m.State == Mounted && !ContentOutdated(m, gen) &&
		(m.SubPathsOutdated || !volume.SameSubPaths(want, m.SubPaths))
}

// PodVolumeReady reports whether a pod can be given a volume: the pod's
// mount is set up and the sub-paths its containers want are in place. It
// is the one definition of a ready volume; explain.Explain builds on it.
func PodVolumeReady(want []volume.SubPath, m *ActualPodMount) bool {
	return m != nil && m.State == Mounted && volume.SameSubPaths(want, m.SubPaths)
}

// PodUnmountNeeded reports whether a pod's mount must be torn down: the pod
// has one and no longer wants the volume.
func PodUnmountNeeded(wanted bool, m *ActualPodMount) bool {
	return !wanted && m != nil
}

// ExpansionNeeded reports whether node expansion of a volume to desired is
// pending and can run now: the node has not yet made the filesystem fit it,
// nothing said to stop retrying, and the volume is there to be grown (staged
// for device-mountable volumes, unless the plugin can only grow it once
// published; mounted for some pod otherwise). A raw block volume has no
// filesystem to grow offline: it is grown once a pod has it mapped.
func ExpansionNeeded(desired *resource.Quantity, attrs volume.Attributes, av *ActualVolume) bool {
	if desired == nil || av == nil || av.ResizeBlocked != "" {
		return false
	}
	if av.Size != nil && volume.SizeCmp(desired, av.Size) <= 0 {
		return false
	}
	if attrs.DeviceMountable && !attrs.Block && !av.ExpandAfterPublish {
		return av.DeviceState == DeviceGloballyMounted
	}
	return AnyPodMounted(av)
}

// AnyPodMounted reports whether some pod has the volume mounted.
func AnyPodMounted(av *ActualVolume) bool {
	if av == nil {
		return false
	}
	for _, m := range av.Pods.All() {
		if m.State == Mounted {
			return true
		}
	}
	return false
}

// DeviceUnmountNeeded reports whether a volume's device must be unmounted:
// no pod wants the volume, none has it mounted, and the device may be
// mounted.
func DeviceUnmountNeeded(wanted bool, av *ActualVolume) bool {
	return !wanted && av != nil && av.Pods.Len() == 0 && av.DeviceState.MayBeMounted()
}

// DetachNeeded reports whether a volume must be detached: no pod wants it,
// none has it mounted, its device is unmounted, and it is (or may be)
// attached.
func DetachNeeded(wanted bool, av *ActualVolume) bool {
	return !wanted && av != nil && av.Pods.Len() == 0 && !av.DeviceState.MayBeMounted() &&
		(av.AttachState == Attached || av.AttachState == AttachUncertain)
}
