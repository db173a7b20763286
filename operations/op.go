package operations

// Op names a kind of operation. The planner plans actions of these kinds,
// the executor keeps backoff per kind, and the name is what logs, metrics
// (the operation label), events and the debug endpoint show, so the values
// are part of the agent's interface.
type Op string

const (
	// OpUnmountVolume tears a volume down for one pod.
	OpUnmountVolume Op = "unmount_volume"
	// OpVerifyAttached waits for (or makes) an attachment of the volume.
	OpVerifyAttached Op = "verify_attached"
	// OpMountDevice mounts (stages) a volume's device at its global path.
	OpMountDevice Op = "mount_device"
	// OpMountVolume sets a volume up for one pod.
	OpMountVolume Op = "mount_volume"
	// OpPrepareSubPaths prepares the sub-paths of a pod's volume that its
	// containers mount (and removes those they no longer do).
	OpPrepareSubPaths Op = "prepare_subpaths"
	// OpExpandVolume grows a volume's filesystem on the node (the
	// kubelet's name for it).
	OpExpandVolume Op = "volume_fs_resize"
	// OpUnmountDevice unmounts (unstages) a device no pod uses.
	OpUnmountDevice Op = "unmount_device"
	// OpDetachVolume detaches a volume no pod uses.
	OpDetachVolume Op = "detach_volume"
)

// Ops lists every kind of operation.
var Ops = []Op{OpUnmountVolume, OpVerifyAttached, OpMountDevice, OpMountVolume, OpPrepareSubPaths, OpExpandVolume, OpUnmountDevice, OpDetachVolume}
