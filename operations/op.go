package operations

// Op names a kind of operation. The planner plans actions of these kinds,
// the executor keeps backoff per kind, and the name is what logs, metrics
// (the operation label), events and the debug endpoint show, so the values
// are part of the agent's interface. What each kind means is in the table
// of kinds (kinds.go).
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

	// The operations of raw block volumes (Attributes.Block) take the
	// places of the four mount operations above, under the kubelet's
	// names, so logs, metrics and events tell them apart.

	// OpMapDevice prepares a block volume's device once per node (CSI:
	// stage with the block capability).
	OpMapDevice Op = "map_device"
	// OpMapVolume gives one pod the block device at its access point and
	// pins the device.
	OpMapVolume Op = "map_volume"
	// OpUnmapVolume releases the pin and removes one pod's access point.
	OpUnmapVolume Op = "unmap_volume"
	// OpUnmapDevice undoes OpMapDevice once no pod has the device.
	OpUnmapDevice Op = "unmap_device"
)
