package operations

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/blockpin"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/pathcall"
	"github.com/volume-agent/volume-agent/internal/subpath"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

// Desired is the part of the DSW operations consult: an unmount that was
// planned for a volume a pod wants again by the time it runs is skipped.
type Desired interface {
	HasPodVolume(name volume.UniqueName, pod types.UID) bool
	HasVolume(name volume.UniqueName) bool
}

// Operator holds the operation bodies. Each checks, at the moment it runs,
// that the state the plan saw still holds (returning ErrStale otherwise),
// calls the plugin, and records the outcome in the ASW: done, uncertain, or
// failed.
type Operator struct {
	Plugins *plugins.Registry
	ASW     *cache.ActualStateOfWorld
	DSW     Desired
	Paths   volume.Paths
	Log     *zap.Logger
	// Claims reports node expansion on claims' status (a no-op without an
	// API server).
	Claims ClaimStatus
	Events events.Recorder
	// Pins keeps raw block devices open under their access points.
	Pins blockpin.Pinner
	// Refresh, when set, learns about every successful set up: which
	// content generation it wrote, and when the plugin wants it set up
	// again (refresh.Refresher).
	Refresh Refresh
	// SubPaths prepares and removes containers' sub-paths of volumes:
	// subpath.Host with the plugins' Mounter on the node. Without it,
	// sub-paths are still removed, but preparing one fails.
	SubPaths SubPaths

	dirs podDirs
}

// Refresh tracks content that follows its sources (API volumes, CSI
// requiresRepublish).
type Refresh interface {
	// MountDone: SetUp succeeded and wrote content generation gen;
	// refreshAt is when the plugin wants it set up again (zero: never).
	MountDone(name volume.UniqueName, pod types.UID, gen uint64, refreshAt time.Time)
}

// SubPaths prepares the sub-paths of a pod's volume (a directory of
// targets <dir>/<container>/<index>) and removes them: subpath.Host on the
// node, a recording fake in tests.
type SubPaths interface {
	// Sync makes dir hold exactly the targets of want, bound into
	// volumeDir.
	Sync(volumeDir, dir string, want []subpath.Mount) error
	// Clean removes every target in dir and dir; an error means some are
	// still in place.
	Clean(dir string) error
}

func (o *Operator) subPaths() SubPaths {
	if o.SubPaths == nil {
		return subpath.Host{}
	}
	return o.SubPaths
}

// Target is a volume (and, for pod operations, a pod) an operation is about:
// what the planner decided it from and the body needs.
type Target struct {
	Volume     volume.UniqueName
	Plugin     string
	Attributes volume.Attributes
	Spec       *volume.Spec
	Pod        volume.PodInfo
	// SpecName names the pod's volume directory.
	SpecName string
	// DesiredSize is the size node expansion must reach, if pending.
	DesiredSize *resource.Quantity
	// SubPaths are the sub-paths the pod's containers mount, for
	// prepare_subpaths.
	SubPaths []volume.SubPath
	// ContentGeneration is the content the pod's mount must hold
	// (cache.DesiredPodVolume), for mount_volume, map_volume and
	// prepare_subpaths; a set up records it as written, and the
	// executor's backoff holds back a failed generation only.
	ContentGeneration uint64
	// Waiting are the pods a volume-wide operation works for, so its
	// failures can be reported to them.
	Waiting []volume.PodRef
	// MountPath is the pod's recorded mount (a block volume's access
	// point), for unmount_volume and unmap_volume.
	MountPath string

	// room is where withLog puts the plugin's request and logger: a
	// *logged[R] allocated with the Operation (Operator.Operation), or
	// nil (withLog allocates them).
	room any
}

// Key is the executor key of an operation on t.
func (t *Target) Key() Key { return Key{Volume: t.Volume, Pod: t.Pod.UID} }

func (t *Target) identity() cache.VolumeIdentity {
	return cache.VolumeIdentity{Name: t.Volume, Plugin: t.Plugin, Attributes: t.Attributes, Spec: t.Spec}
}

// logger is the logger of an operation on t, for lines the operator writes
// itself (rare); plugins get theirs from withLog.
func (o *Operator) logger(t *Target, op Op) plugins.Log {
	return &opLog{base: o.Log, fields: targetFields{t, op}}
}

// withLog returns a plugin request of type R together with the logger the
// plugin gets: handing it over costs nothing more, and the logger encodes
// nothing until a line is written. A lazily encoded zap logger still cost
// every operation of a storm four allocations, for lines most plugins never
// write. They are in the room the operation was allocated with, if it has
// room for an R (Operator.Operation), else allocated here: a request of its
// own cost each set up and tear down an allocation of a third of a KB.
func withLog[R any](o *Operator, t *Target, op Op) (*R, plugins.Log) {
	w, ok := t.room.(*logged[R])
	if !ok {
		w = new(logged[R])
	}
	t.room = nil // used once, even by a body run again
	w.log = opLog{base: o.Log, fields: targetFields{t, op}}
	return &w.req, &w.log
}

// logged is a plugin request and its logger, in one allocation.
type logged[R any] struct {
	req R
	log opLog
}

// opLog writes lines about one operation: base's lines with the target's
// fields first, as base.With(fields) would write them.
type opLog struct {
	base   *zap.Logger
	fields targetFields
}

func (l *opLog) Debug(msg string, fields ...zap.Field) { l.write(zap.DebugLevel, msg, fields) }
func (l *opLog) Info(msg string, fields ...zap.Field)  { l.write(zap.InfoLevel, msg, fields) }
func (l *opLog) Warn(msg string, fields ...zap.Field)  { l.write(zap.WarnLevel, msg, fields) }
func (l *opLog) Error(msg string, fields ...zap.Field) { l.write(zap.ErrorLevel, msg, fields) }

// write builds the zap logger for a line that is written: the caller
// reported is the one of Debug, Info, Warn or Error.
func (l *opLog) write(lvl zapcore.Level, msg string, fields []zap.Field) {
	if !l.base.Core().Enabled(lvl) {
		return
	}
	log := l.base.WithOptions(zap.AddCallerSkip(2)).With(zap.Inline(l.fields))
	if ce := log.Check(lvl, msg); ce != nil {
		ce.Write(fields...)
	}
}

// targetFields are the fields of the lines logged about an operation on a
// target (which does not change once planned).
type targetFields struct {
	t  *Target
	op Op
}

func (f targetFields) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString("volume", string(f.t.Volume))
	enc.AddString("plugin", f.t.Plugin)
	enc.AddString("operation", string(f.op))
	if f.t.Pod.UID != "" {
		enc.AddString("pod", f.t.Pod.String())
		enc.AddString("podUID", string(f.t.Pod.UID))
	}
	return nil
}

func (o *Operator) plugin(name string) (plugins.Plugin, error) {
	p, ok := o.Plugins.ByName(name)
	if !ok {
		return nil, fmt.Errorf("volume plugin %q is not available on this node", name)
	}
	return p, nil
}

// MountDevice mounts (stages) a shared volume's device at its global path.
func (o *Operator) MountDevice(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpMountDevice, t)
	if !needed {
		return ErrStale
	}
	p, err := o.plugin(t.Plugin)
	if err != nil {
		return err
	}
	dm, ok := p.(plugins.DeviceMounter)
	if !ok {
		return fmt.Errorf("plugin %s cannot mount devices", t.Plugin)
	}
	req := o.deviceRequest(t, av, OpMountDevice)
	req.DesiredSize = t.DesiredSize
	err = dm.MountDevice(ctx, req)
	o.recordDevice(t, av, req, err)
	if err == nil && req.Resized != nil {
		// Grown offline before mounting. If the claim cannot be told
		// now, the expansion (a no-op by then) and the report run
		// again as an operation of their own.
		if err := o.expansionDone(ctx, t, req.Resized); err != nil {
			o.logger(t, OpMountDevice).Warn("volume grown offline; reporting it will be retried", zap.Error(err))
		}
	}
	return err
}

// deviceRequest is the request to prepare a volume's device (mount or map)
// once per node, at the path computed from its identity.
func (o *Operator) deviceRequest(t *Target, av *cache.ActualVolume, op Op) *plugins.DeviceRequest {
	req := &plugins.DeviceRequest{
		VolumeName: t.Volume, Spec: t.Spec, Identity: t.Attributes.Identity, Attachable: t.Attributes.Attachable,
		DeviceMountPath: o.Paths.DeviceMountPath(t.Plugin, t.Attributes.Identity),
		Log:             o.logger(t, op),
	}
	if av != nil {
		req.DevicePath, req.PublishContext = av.DevicePath, av.PublishContext
	}
	return req
}

// recordDevice records how preparing the device went: prepared, uncertain
// (it may be half done), or, after a final error, nothing left of an
// earlier uncertain attempt.
func (o *Operator) recordDevice(t *Target, av *cache.ActualVolume, req *plugins.DeviceRequest, err error) {
	switch {
	case err == nil:
		o.ASW.SetDeviceState(t.identity(), cache.DeviceGloballyMounted, req.DevicePath, req.DeviceMountPath)
	case volume.IsUncertain(err):
		o.ASW.SetDeviceState(t.identity(), cache.DeviceMountUncertain, req.DevicePath, req.DeviceMountPath)
	case av != nil && av.DeviceState == cache.DeviceMountUncertain:
		o.ASW.SetDeviceState(t.identity(), cache.DeviceNotMounted, "", "")
	}
}

// MountVolume sets a volume up for one pod.
func (o *Operator) MountVolume(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpMountVolume, t)
	if !needed {
		// E.g. planned from a snapshot taken before an earlier mount
		// finished.
		return ErrStale
	}
	p, err := o.plugin(t.Plugin)
	if err != nil {
		return err
	}
	req, log := withLog[plugins.SetUpRequest](o, t, OpMountVolume)
	dirs := o.Paths.PodVolumeDirs(t.Pod.UID, t.Plugin, t.SpecName)
	*req = plugins.SetUpRequest{
		VolumeName: t.Volume, Spec: t.Spec, Pod: t.Pod,
		Dir: dirs.Dir, Log: log,
	}
	if t.Attributes.DeviceMountable {
		req.DeviceMountPath = av.DeviceMountPath
	}
	prev := podMount(av, t)
	if av != nil {
		req.DevicePath, req.PublishContext = av.DevicePath, av.PublishContext
	}
	if t.Attributes.NoHostPath {
		// Nothing on the node: no directory to make, none to record.
		req.Dir = ""
		err = p.SetUp(ctx, req)
	} else {
		made := o.dirs.ensure(dirs.Pods, dirs.Plugin)
		err = p.SetUp(ctx, req)
		if err != nil && !volume.IsUncertain(err) {
			o.dirs.undo(dirs.Plugin, made)
		}
	}
	mount := cache.ActualPodMount{Pod: t.Pod.PodRef, SpecName: t.SpecName, MountPath: req.Dir, Spec: t.Spec}
	switch {
	case err == nil:
		// The generation was planned from the DSW before SetUp read the
		// sources: a change that came in since may or may not be in what
		// was written, and its newer generation has it written again.
		mount.State, mount.ContentGeneration = cache.Mounted, t.ContentGeneration
		if prev != nil && ((prev.State == cache.Mounted && len(prev.SubPaths) > 0) || prev.SubPathsOutdated) {
			// Set up again (a remount), or found after a restart with
			// sub-paths on disk: what is there is prepared again (and
			// what is no longer wanted removed); prepared ones stay
			// usable meanwhile.
			mount.SubPaths, mount.SubPathsOutdated = prev.SubPaths, true
		}
		o.ASW.SetPodMount(t.identity(), mount)
		if o.Refresh != nil {
			o.Refresh.MountDone(t.Volume, t.Pod.UID, t.ContentGeneration, req.RefreshAt)
		}
	case volume.IsUncertain(err):
		mount.State = cache.MountUncertain
		o.ASW.SetPodMount(t.identity(), mount)
	case prev != nil && prev.State == cache.MountUncertain && !prev.Reconstructed:
		// A final error means the plugin left nothing mounted. A mount
		// found on disk after a restart stays uncertain regardless: it is
		// someone's data and must still be torn down properly.
		o.ASW.DeletePodMount(t.Volume, t.Pod.UID)
	}
	return err
}

// UnmountVolume tears a volume down for one pod (its mount at t.MountPath)
// and removes the pod's directories that are left empty.
func (o *Operator) UnmountVolume(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpUnmountVolume, t)
	if !needed {
		return ErrStale
	}
	p, err := o.plugin(t.Plugin)
	if err != nil {
		return err
	}
	prev := podMount(av, t)
	// The recorded mount is the volume's directory, unless it is a block
	// volume's access point: then it is named here.
	dirs, ok := o.Paths.MatchPodVolumeDirs(t.MountPath, t.Pod.UID, t.Plugin, t.SpecName)
	if !ok {
		dirs = o.Paths.PodVolumeDirs(t.Pod.UID, t.Plugin, t.SpecName)
	}
	lone := o.onlyVolumesDir(t, prev, dirs)
	// Never tear a volume down under a sub-path bind mount of it.
	if !lone {
		if err := o.cleanSubPaths(t, prev); err != nil {
			return err
		}
	}
	req, log := withLog[plugins.TearDownRequest](o, t, OpUnmountVolume)
	*req = plugins.TearDownRequest{
		VolumeName: t.Volume, Spec: prev.Spec, Pod: t.Pod.PodRef, Dir: t.MountPath,
		DeviceMountPath: av.DeviceMountPath, NoSizeLimit: t.Attributes.NoSizeLimit, Log: log,
	}
	if err := p.TearDown(ctx, req); err != nil {
		if prev.State != cache.MountUncertain || len(prev.SubPaths) > 0 {
			m := *prev
			m.State, m.SubPaths = cache.MountUncertain, nil
			o.ASW.SetPodMount(t.identity(), m)
		}
		return err
	}
	o.ASW.DeletePodMount(t.Volume, t.Pod.UID)
	if lone {
		// Nor a state file: only the volume's own operations write it.
		o.removeVolumeDirs(dirs)
	} else {
		o.removePodDirs(t, dirs)
	}
	return nil
}

// onlyVolumesDir reports whether the pod's directory holds no directory but
// "volumes": then neither sub-paths (volume-subpaths) nor state files
// (volume-state) can be left of the volume, whatever a crash kept from
// being recorded. One lstat of the pod's directory, by its link count (2
// and one per subdirectory, see mountutil.RemoveEmptyDirs), settles what
// took an lstat of each (and a Join to name it) per volume in a teardown
// storm. It knows "volumes" is the one only while m, a set up volume, is
// in it (at dir); otherwise, or when the count says anything else, it says
// no and each is checked on its own.
func (o *Operator) onlyVolumesDir(t *Target, m *cache.ActualPodMount, dirs volume.PodVolumeDirs) bool {
	if m == nil || m.State != cache.Mounted || len(m.SubPaths) > 0 || m.SubPathsOutdated ||
		t.Attributes.NoHostPath || t.Attributes.Block || m.MountPath != dirs.Dir {
		return false
	}
	isDir, nlink, err := pathcall.Links(dirs.Pod)
	return err == nil && isDir && nlink == 3
}

// PrepareSubPaths prepares the sub-paths of a pod's volume that its
// containers mount, safely (see internal/subpath), at
// volume.Paths.SubPathTarget, and removes those they no longer mount.
func (o *Operator) PrepareSubPaths(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpPrepareSubPaths, t)
	if !needed {
		return ErrStale
	}
	m := podMount(av, t)
	dir := o.Paths.VolumeSubPathsDir(t.Pod.UID, t.Plugin, t.SpecName)
	if len(t.SubPaths) == 0 {
		if err := o.cleanSubPaths(t, m); err != nil {
			return err
		}
	} else {
		want := make([]subpath.Mount, len(t.SubPaths))
		for i, s := range t.SubPaths {
			want[i] = subpath.Mount{Container: s.Container, Index: s.Index, MountPath: s.MountPath, SubPath: s.Path, ReadOnly: s.ReadOnly,
				// The content of API data volumes is the agent's to keep
				// in sync with its sources: no directory is added to it.
				NoCreate: t.Attributes.ReadOnlyForContainers}
		}
		if err := o.subPaths().Sync(m.MountPath, dir, want); err != nil {
			return err
		}
	}
	o.ASW.SetSubPaths(t.Volume, t.Pod.UID, t.SubPaths)
	return nil
}

// cleanSubPaths removes every sub-path of the pod's volume, and the
// directories that held them once empty.
// m is the recorded mount, if any.
func (o *Operator) cleanSubPaths(t *Target, m *cache.ActualPodMount) error {
	// Most volumes never had a sub-path: when none is recorded, one lstat
	// of the pod's sub-path directory settles it instead of a failing open
	// and three failing rmdirs per volume in a teardown storm. If it is
	// missing, no volume of the pod can have a sub-path left (they all
	// live below it), even one a crash kept from being recorded.
	if m == nil || (len(m.SubPaths) == 0 && !m.SubPathsOutdated) {
		if !exists(o.Paths.PodSubPathsDir(t.Pod.UID)) {
			return nil
		}
	}
	dir := o.Paths.VolumeSubPathsDir(t.Pod.UID, t.Plugin, t.SpecName)
	if err := o.subPaths().Clean(dir); err != nil {
		return fmt.Errorf("removing the sub-paths prepared for the pod's containers (the volume stays until they are gone): %w", err)
	}
	mountutil.RemoveEmptyDirs(filepath.Dir(dir), o.Paths.PodDir(t.Pod.UID))
	return nil
}

// exists reports whether path names something (not following a final
// symlink); when it cannot tell, it says yes, so callers clean up.
func exists(path string) bool {
	var st unix.Stat_t
	return !errors.Is(unix.Lstat(path, &st), unix.ENOENT)
}

// removePodDirs removes the volume's state file and the directories above
// its directory in the pod that are now empty, up to the pod directory
// itself once nothing is left.
func (o *Operator) removePodDirs(t *Target, dirs volume.PodVolumeDirs) {
	// Plugins that keep state remove their file themselves; remove it in
	// case one did not, then its directories once empty. Most plugins keep
	// none: when the pod has no state directory at all, that is one lstat
	// (and no path of a file that is not there to build) instead of a
	// failing unlink and a chain of failing rmdirs.
	if exists(o.Paths.PodVolumeStateDir(t.Pod.UID)) {
		state := o.Paths.PodVolumeStateFile(t.Pod.UID, t.Plugin, t.SpecName)
		_ = unix.Unlink(state)
		mountutil.RemoveEmptyDirs(filepath.Dir(state), dirs.Pods)
	}
	o.removeVolumeDirs(dirs)
}

// removeVolumeDirs removes the directories above the volume's directory
// that are now empty, up to the pod directory itself once nothing is
// left. ensure's hint for the plugin's directory goes with it (it is only
// a hint: an ensure that trusts it in between finds the directory gone by
// the plugin's own mkdir); while the pod's other volumes keep it, the hint
// stays.
func (o *Operator) removeVolumeDirs(dirs volume.PodVolumeDirs) {
	if mountutil.RemoveEmptyCleanDirs(dirs.Plugin, dirs.Pods) {
		o.dirs.forget(dirs.Plugin)
	}
}

// UnmountDevice unmounts (unstages) a shared volume's device once no pod
// uses it.
func (o *Operator) UnmountDevice(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpUnmountDevice, t)
	if !needed {
		return ErrStale
	}
	p, err := o.plugin(t.Plugin)
	if err != nil {
		return err
	}
	dm, ok := p.(plugins.DeviceMounter)
	if !ok {
		return fmt.Errorf("plugin %s cannot unmount devices", t.Plugin)
	}
	return o.releaseDevice(ctx, t, av, OpUnmountDevice, dm.UnmountDevice)
}

// releaseDevice runs the plugin's release of a volume's device (unmount or
// unmap) and records the outcome: not mounted, or uncertain after a failure
// (it may be half released).
func (o *Operator) releaseDevice(ctx context.Context, t *Target, av *cache.ActualVolume, op Op, release func(context.Context, *plugins.DeviceRequest) error) error {
	req := &plugins.DeviceRequest{
		VolumeName: t.Volume, Spec: av.Spec, Identity: av.Attributes.Identity,
		DevicePath: av.DevicePath, DeviceMountPath: av.DeviceMountPath,
		Log: o.logger(t, op),
	}
	if req.DeviceMountPath == "" {
		req.DeviceMountPath = o.Paths.DeviceMountPath(t.Plugin, av.Attributes.Identity)
	}
	if err := release(ctx, req); err != nil {
		if av.DeviceState != cache.DeviceMountUncertain {
			o.ASW.SetDeviceState(t.identity(), cache.DeviceMountUncertain, "", "")
		}
		return err
	}
	o.ASW.SetDeviceState(t.identity(), cache.DeviceNotMounted, "", "")
	mountutil.RemoveEmptyDirs(o.Paths.VolumeDir(t.Plugin, av.Attributes.Identity), o.Paths.Root)
	return nil
}

// VerifyAttached makes sure an attachable volume is attached to the node
// (attaching it when the plugin attaches itself) and records what attaching
// returned.
func (o *Operator) VerifyAttached(ctx context.Context, t *Target) error {
	if _, needed := o.needed(OpVerifyAttached, t); !needed {
		return ErrStale
	}
	p, err := o.plugin(t.Plugin)
	if err != nil {
		return err
	}
	at, ok := p.(plugins.Attacher)
	if !ok {
		return fmt.Errorf("plugin %s cannot attach volumes", t.Plugin)
	}
	res, err := at.Attach(ctx, &plugins.AttachRequest{VolumeName: t.Volume, Spec: t.Spec, Log: o.logger(t, OpVerifyAttached)})
	switch {
	case err == nil:
		o.ASW.SetAttachState(t.identity(), cache.Attached, res.DevicePath, res.PublishContext)
	case volume.IsUncertain(err):
		o.ASW.SetAttachState(t.identity(), cache.AttachUncertain, "", nil)
	}
	return err
}

// DetachVolume detaches a volume that no pod uses and whose device is
// unmounted.
func (o *Operator) DetachVolume(ctx context.Context, t *Target) error {
	av, needed := o.needed(OpDetachVolume, t)
	if !needed {
		return ErrStale
	}
	p, err := o.plugin(t.Plugin)
	if err != nil {
		return err
	}
	at, ok := p.(plugins.Attacher)
	if !ok {
		return fmt.Errorf("plugin %s cannot detach volumes", t.Plugin)
	}
	if err := at.Detach(ctx, &plugins.AttachRequest{VolumeName: t.Volume, Spec: av.Spec, Log: o.logger(t, OpDetachVolume)}); err != nil {
		return err
	}
	o.ASW.SetAttachState(t.identity(), cache.NotAttached, "", nil)
	if av.Attributes.Identity != "" {
		// The volume's directory outlived its device mount only to keep
		// the attachment's state.
		mountutil.RemoveEmptyDirs(o.Paths.VolumeDir(t.Plugin, av.Attributes.Identity), o.Paths.Root)
	}
	return nil
}

// AdoptVolume confirms reconstructed state of a volume that pods want: its
// device mount (if device is true) and the given pods' mounts were found in
// place after a restart and are now known to be mounted. No mount
// operation runs.
func (o *Operator) AdoptVolume(id cache.VolumeIdentity, device bool, pods map[types.UID]cache.ActualPodMount) {
	o.ASW.Adopt(id, device, pods)
	o.Log.Info("adopted volume found after restart", zap.String("volume", string(id.Name)), zap.Bool("device", device), zap.Int("pods", len(pods)))
}
