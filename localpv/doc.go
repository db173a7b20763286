// Package localpv makes volume-agent the node's local volume provisioner:
// every disk an administrator mounts (or links, for block devices) in a
// configured discovery directory becomes a local PersistentVolume pinned to
// this node, and a released volume's disk is cleaned, its PV deleted and
// made again so that the disk is offered afresh.
//
// It works in cluster mode only (it creates and deletes PersistentVolumes
// through the API server) and is off unless a configuration file is given.
// The configuration maps StorageClass names to a discovery directory, a
// volume mode, a PV name pattern, labels and a block cleanup method; it is
// reloaded on change without a restart, and a bad edit never takes away
// what worked (see ParseConfig).
//
// Safety rules, each answering a known failure of local provisioners:
//   - only mount points (not plain directories on the root disk) and block
//     devices become volumes, and never a path another PV already uses;
//   - PV names are deterministic, so rediscovery after a restart or a lost
//     response finds the PV it made instead of making a second one;
//   - a PV is deleted only after its disk was cleaned for that very release
//     (cleanups are tracked by PV UID and claim UID), a disk being cleaned
//     is never offered, and a Released PV deleted before it was cleaned has
//     its disk cleaned before the disk is offered again;
//   - a PV whose disk vanished is kept, never cleaned and never offered
//     again, and is reported until the disk is back or an administrator
//     deletes the PV;
//   - cleanup state is in memory only: after a restart, Released PVs are
//     cleaned again from scratch (cleaning is idempotent) before deletion.
package localpv
