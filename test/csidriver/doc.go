// Package csidriver is a small but real CSI driver for volume-agent's tests.
//
// Volumes are sparse files under a state directory. The node service attaches
// them to loop devices, formats them (ext4 by default, xfs on request) and
// mounts them, so the paths a CO sees behave like real volumes: data written
// through a publish target lands in the backing file, statfs reports real
// numbers, and expansion grows the file, the loop device and the filesystem.
// All bookkeeping lives in a JSON state file next to the backing files, so a
// driver that is stopped (or killed) and started again on the same state
// directory picks up where it left off; stopping never unmounts anything.
//
// Besides the CSI services the driver can serve the kubelet plugin
// registration API (so a plugin watcher can discover it) and a tiny HTTP
// control API on a unix socket (so a test can steer a driver running as a
// separate process).
//
// For the tests that use it, the driver can misbehave on purpose: any gRPC
// method can be made to fail with a chosen status code (always or for the
// next N calls), to hang until the caller gives up, or the whole process can
// exit after a number of calls. Every call is counted per method. With
// Config.VolumeCondition it plays a driver built with CSI spec 1.12 that
// reports volume health: it advertises VOLUME_CONDITION (value 4, removed in
// spec 1.13) and sends volume_condition (field 2 of
// NodeGetVolumeStatsResponse) as unknown fields, abnormal when a test says
// so (SetVolumeCondition, or POST /conditions on the control API).
//
// Expansion: ControllerExpandVolume grows the backing file, NodeExpandVolume
// refreshes the loop device and grows the mounted filesystem (resize2fs,
// xfs_growfs). Growing a mounted ext4 filesystem needs CAP_SYS_RESOURCE; where
// the kernel refuses, NodeExpandVolume fails with FailedPrecondition, and the
// filesystem is grown offline the next time the volume is staged. XFS grows
// online but mkfs.xfs wants volumes of at least 300 MiB.
//
// The binary in cmd/test-csi-driver wraps this package with command-line
// flags; sanity_test.go proves the driver against the csi-test sanity suite.
// The node service needs root, loop devices and mkfs.ext4 (mkfs.xfs and
// xfs_growfs from Debian's xfsprogs for xfs volumes).
package csidriver
