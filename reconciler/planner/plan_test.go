package planner

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

// Attributes of the kinds of volumes the planner distinguishes.
var (
	perPodAttrs     = volume.Attributes{}
	remountAttrs    = volume.Attributes{RequiresRemount: true}
	sharedDirAttrs  = volume.Attributes{Identity: "dir"} // shared, no device mount (local directory PV)
	deviceAttrs     = volume.Attributes{Identity: "dev", DeviceMountable: true}
	attachableAttrs = volume.Attributes{Identity: "disk", DeviceMountable: true, Attachable: true}
	localBlockAttrs = volume.Attributes{Identity: "lblk", Block: true} // local block PV: nothing staged
	csiBlockAttrs   = volume.Attributes{Identity: "cblk", DeviceMountable: true, Attachable: true, Block: true}
)

const testPlugin = "test/plugin"

func podInfo(uid string) volume.PodInfo {
	return volume.PodInfo{PodRef: podRef(uid)}
}

func podRef(uid string) volume.PodRef {
	return volume.PodRef{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid}
}

// specs are shared between the DSW and ASW fixtures so tests can check which
// spec an action carries.
var specs = map[string]*volume.Spec{}

func specFor(name string) *volume.Spec {
	if s, ok := specs[name]; ok {
		return s
	}
	s := &volume.Spec{Name: name}
	specs[name] = s
	return s
}

// dvol builds a desired volume wanted by the given pods.
func dvol(name volume.UniqueName, attrs volume.Attributes, pods ...string) *cache.DesiredVolume {
	v := &cache.DesiredVolume{
		Name: name, Plugin: testPlugin, Attributes: attrs, SpecName: specName(name),
		Spec: specFor(string(name)), Pods: cache.PodSet[cache.DesiredPodVolume]{},
	}
	for _, p := range pods {
		v.Pods = v.Pods.With(types.UID(p), &cache.DesiredPodVolume{
			Pod: podInfo(p), OuterNames: []string{"outer"}, Spec: specFor(string(name) + "@" + p),
			ContentGeneration: contentGeneration(attrs, false),
		})
	}
	return v
}

func specName(name volume.UniqueName) string {
	s := string(name)
	return s[strings.LastIndex(s, "/")+1:]
}

func withSize(v *cache.DesiredVolume, size string) *cache.DesiredVolume {
	q := resource.MustParse(size)
	v.DesiredSize = &q
	return v
}

// avOpt changes an actual volume fixture.
type avOpt func(v *cache.ActualVolume)

func avol(name volume.UniqueName, attrs volume.Attributes, opts ...avOpt) *cache.ActualVolume {
	v := &cache.ActualVolume{
		Name: name, Plugin: testPlugin, Attributes: attrs, Spec: specFor(string(name)),
		DeviceState: cache.DeviceNotMounted, Pods: cache.PodSet[cache.ActualPodMount]{},
	}
	for _, o := range opts {
		o(v)
	}
	return v
}

// contentGeneration is the content generation of the fixtures: 1 (the
// DSW's, and a mount's that holds it) for a volume whose content follows
// its sources, 0 for a mount whose content is older, and for other
// volumes.
func contentGeneration(attrs volume.Attributes, outdated bool) uint64 {
	if attrs.RequiresRemount && !outdated {
		return 1
	}
	return 0
}

func podMount(uid string, state cache.MountState, remount bool) avOpt {
	return func(v *cache.ActualVolume) {
		v.Pods = v.Pods.With(types.UID(uid), &cache.ActualPodMount{
			Pod: podRef(uid), SpecName: specName(v.Name), State: state, ContentGeneration: contentGeneration(v.Attributes, remount),
			MountPath: "/pods/" + uid + "/volumes/" + specName(v.Name), Spec: specFor(string(v.Name) + "@" + uid),
		})
	}
}

func mounted(uids ...string) avOpt {
	return func(v *cache.ActualVolume) {
		for _, u := range uids {
			podMount(u, cache.Mounted, false)(v)
		}
	}
}

func uncertain(uid string) avOpt { return podMount(uid, cache.MountUncertain, false) }

func remount(uid string) avOpt { return podMount(uid, cache.Mounted, true) }

// subPathsOf builds a pod's sub-paths of a volume, one container mount
// each.
func subPathsOf(paths ...string) []volume.SubPath {
	var out []volume.SubPath
	for i, p := range paths {
		out = append(out, volume.SubPath{Container: "main", Index: i, MountPath: "/m/" + p, Path: p})
	}
	return out
}

// withSubPaths makes the pod's containers mount the given sub-paths of v.
func withSubPaths(v *cache.DesiredVolume, uid string, paths ...string) *cache.DesiredVolume {
	v.Pods.At(types.UID(uid)).SubPaths = subPathsOf(paths...)
	return v
}

// prepared records the pod's sub-paths of the volume as prepared.
func prepared(uid string, paths ...string) avOpt {
	return func(v *cache.ActualVolume) { v.Pods.At(types.UID(uid)).SubPaths = subPathsOf(paths...) }
}

// outdated marks the pod's prepared sub-paths outdated.
func outdated(uid string) avOpt {
	return func(v *cache.ActualVolume) { v.Pods.At(types.UID(uid)).SubPathsOutdated = true }
}

func device(s cache.DeviceMountState) avOpt {
	return func(v *cache.ActualVolume) { v.DeviceState = s }
}

func attach(s cache.AttachState) avOpt {
	return func(v *cache.ActualVolume) { v.AttachState = s }
}

func size(s string) avOpt {
	return func(v *cache.ActualVolume) { q := resource.MustParse(s); v.Size = &q }
}

func resizeBlocked(reason string) avOpt {
	return func(v *cache.ActualVolume) { v.ResizeBlocked = reason }
}

// protected is a DSW pod that exists but has volumes that never resolved.
func protected(uid string, unresolved ...string) *cache.DesiredPod {
	return &cache.DesiredPod{Pod: podInfo(uid), Unresolved: unresolved}
}

// desiredSnapshot builds a DSW snapshot from volumes; pods are derived from
// the volumes, extra pods (with their Unresolved lists) are added as given.
func desiredSnapshot(vols []*cache.DesiredVolume, extra []*cache.DesiredPod) *cache.DesiredSnapshot {
	vm, pods := map[volume.UniqueName]*cache.DesiredVolume{}, map[types.UID]*cache.DesiredPod{}
	for _, p := range extra {
		pods[p.Pod.UID] = p
	}
	for _, v := range vols {
		vm[v.Name] = v
		for uid, pv := range v.Pods.All() {
			p, ok := pods[uid]
			if !ok {
				p = &cache.DesiredPod{Pod: pv.Pod}
				pods[uid] = p
			}
			p.Volumes = append(p.Volumes, v.Name)
		}
	}
	return cache.NewDesiredSnapshot(vm, pods, 0)
}

func actualSnapshot(vols []*cache.ActualVolume) *cache.ActualSnapshot {
	vm := map[volume.UniqueName]*cache.ActualVolume{}
	for _, v := range vols {
		vm[v.Name] = v
	}
	return cache.NewActualSnapshot(vm, 0)
}

// act is the part of an Action the table compares. An empty reason in a
// wanted act is not compared.
type act struct {
	op     operations.Op
	vol    volume.UniqueName
	pod    types.UID
	reason string
}

func (a act) String() string {
	s := fmt.Sprintf("%s %s", a.op, a.vol)
	if a.pod != "" {
		s += " pod=" + string(a.pod)
	}
	if a.reason != "" {
		s += " (" + a.reason + ")"
	}
	return s
}

func summarize(actions []Action) []act {
	out := make([]act, len(actions))
	for i, a := range actions {
		out[i] = act{a.Op, a.Volume, a.Pod.UID, a.Reason}
	}
	return out
}

func sameActs(got, want []act) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g, w := got[i], want[i]
		if w.reason == "" {
			g.reason = ""
		}
		if g != w {
			return false
		}
	}
	return true
}

func formatActs(as []act) string {
	if len(as) == 0 {
		return "  (none)\n"
	}
	var b strings.Builder
	for _, a := range as {
		b.WriteString("  " + a.String() + "\n")
	}
	return b.String()
}

// Volume names used by the table.
const (
	vA    volume.UniqueName = "test/plugin/a"
	vB    volume.UniqueName = "test/plugin/b"
	vC    volume.UniqueName = "test/plugin/c"
	vDev  volume.UniqueName = "test/plugin/dev"
	vDisk volume.UniqueName = "test/plugin/disk"
	vDir  volume.UniqueName = "test/plugin/dir"

	vLocalBlk volume.UniqueName = "test/plugin/lblk"
	vCSIBlk   volume.UniqueName = "test/plugin/cblk"
)

type planCase struct {
	name     string
	dsw      []*cache.DesiredVolume
	pods     []*cache.DesiredPod // extra DSW pods (protected ones)
	asw      []*cache.ActualVolume
	notReady bool // SourcesReady false
	want     []act
}

func planCases() []planCase {
	return []planCase{
		{name: "empty"},
		{name: "empty before sources ready", notReady: true},

		// Per-pod volumes.
		{
			name: "per-pod volume desired, not mounted",
			dsw:  []*cache.DesiredVolume{dvol(vA, perPodAttrs, "p1")},
			want: []act{{operations.OpMountVolume, vA, "p1", "not mounted"}},
		},
		{
			name:     "per-pod volume desired, not mounted, before sources ready",
			dsw:      []*cache.DesiredVolume{dvol(vA, perPodAttrs, "p1")},
			notReady: true,
			want:     []act{{operations.OpMountVolume, vA, "p1", "not mounted"}},
		},
		{
			name: "per-pod volume desired and mounted",
			dsw:  []*cache.DesiredVolume{dvol(vA, perPodAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"))},
		},
		{
			name: "uncertain mount still desired is retried",
			dsw:  []*cache.DesiredVolume{dvol(vA, perPodAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, uncertain("p1"))},
			want: []act{{operations.OpMountVolume, vA, "p1", "mount uncertain"}},
		},
		{
			name: "mounted but no longer desired",
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"))},
			want: []act{{operations.OpUnmountVolume, vA, "p1", "no longer desired (mount Mounted)"}},
		},
		{
			name: "uncertain and no longer desired",
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, uncertain("p1"))},
			want: []act{{operations.OpUnmountVolume, vA, "p1", "no longer desired (mount Uncertain)"}},
		},
		{
			name:     "mounted, not desired, sources not ready: nothing destructive",
			asw:      []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"))},
			notReady: true,
		},
		{
			name:     "uncertain, not desired, sources not ready: nothing destructive",
			asw:      []*cache.ActualVolume{avol(vA, perPodAttrs, uncertain("p1"))},
			notReady: true,
		},
		{
			name: "pod wants a different volume than it has mounted",
			dsw:  []*cache.DesiredVolume{dvol(vB, perPodAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"))},
			want: []act{
				{operations.OpUnmountVolume, vA, "p1", ""},
				{operations.OpMountVolume, vB, "p1", "not mounted"},
			},
		},
		{
			name: "volume desired by one pod, mounted for another",
			dsw:  []*cache.DesiredVolume{dvol(vDir, sharedDirAttrs, "p2")},
			asw:  []*cache.ActualVolume{avol(vDir, sharedDirAttrs, mounted("p1"))},
			want: []act{
				{operations.OpUnmountVolume, vDir, "p1", ""},
				{operations.OpMountVolume, vDir, "p2", "not mounted"},
			},
		},
		{
			name: "remount required",
			dsw:  []*cache.DesiredVolume{dvol(vA, remountAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vA, remountAttrs, remount("p1"))},
			want: []act{{operations.OpMountVolume, vA, "p1", "remount required"}},
		},
		{
			name: "remount required but not desired: unmount, not remount",
			asw:  []*cache.ActualVolume{avol(vA, remountAttrs, remount("p1"))},
			want: []act{{operations.OpUnmountVolume, vA, "p1", ""}},
		},

		// Sub-paths.
		{
			name: "mounted, sub-paths wanted, none prepared",
			dsw:  []*cache.DesiredVolume{withSubPaths(dvol(vA, perPodAttrs, "p1"), "p1", "logs")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"))},
			want: []act{{operations.OpPrepareSubPaths, vA, "p1", "sub-paths changed (1 wanted, 0 prepared)"}},
		},
		{
			name: "sub-paths prepared as wanted",
			dsw:  []*cache.DesiredVolume{withSubPaths(dvol(vA, perPodAttrs, "p1", "p2"), "p1", "logs", "conf")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1", "p2"), prepared("p1", "logs", "conf"))},
		},
		{
			name: "sub-paths prepared but another one wanted now",
			dsw:  []*cache.DesiredVolume{withSubPaths(dvol(vA, perPodAttrs, "p1"), "p1", "logs/canary")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"), prepared("p1", "logs/stable"))},
			want: []act{{operations.OpPrepareSubPaths, vA, "p1", "sub-paths changed (1 wanted, 1 prepared)"}},
		},
		{
			name: "sub-paths prepared, none wanted any more",
			dsw:  []*cache.DesiredVolume{dvol(vA, sharedDirAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vA, sharedDirAttrs, mounted("p1"), prepared("p1", "logs"))},
			want: []act{{operations.OpPrepareSubPaths, vA, "p1", "sub-paths changed (0 wanted, 1 prepared)"}},
		},
		{
			name: "sub-paths prepared before the volume was set up again",
			dsw:  []*cache.DesiredVolume{withSubPaths(dvol(vA, remountAttrs, "p1"), "p1", "key")},
			asw:  []*cache.ActualVolume{avol(vA, remountAttrs, mounted("p1"), prepared("p1", "key"), outdated("p1"))},
			want: []act{{operations.OpPrepareSubPaths, vA, "p1", "volume set up again since its sub-paths were prepared"}},
		},
		{
			name: "sub-paths wait for an uncertain mount to be set up",
			dsw:  []*cache.DesiredVolume{withSubPaths(dvol(vA, perPodAttrs, "p1"), "p1", "logs")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, uncertain("p1"))},
			want: []act{{operations.OpMountVolume, vA, "p1", "mount uncertain"}},
		},
		{
			name: "sub-paths wait for a remount",
			dsw:  []*cache.DesiredVolume{withSubPaths(dvol(vA, remountAttrs, "p1"), "p1", "key")},
			asw:  []*cache.ActualVolume{avol(vA, remountAttrs, remount("p1"), prepared("p1", "old"))},
			want: []act{{operations.OpMountVolume, vA, "p1", "remount required"}},
		},
		{
			name: "a pod that no longer wants the volume: unmounted, sub-paths and all",
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"), prepared("p1", "logs"))},
			want: []act{{operations.OpUnmountVolume, vA, "p1", ""}},
		},

		// Protected pods.
		{
			name: "protected pod: nothing unmounted",
			pods: []*cache.DesiredPod{protected("p1", "data")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"))},
		},
		{
			name: "protected pod: uncertain mount kept too",
			pods: []*cache.DesiredPod{protected("p1", "data")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, uncertain("p1"))},
		},
		{
			name: "protected pod: resolved volumes still mounted, others kept",
			dsw:  []*cache.DesiredVolume{dvol(vB, perPodAttrs, "p1")},
			pods: []*cache.DesiredPod{protected("p1", "data")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"))},
			want: []act{{operations.OpMountVolume, vB, "p1", "not mounted"}},
		},
		{
			name: "pod in DSW with no unresolved volumes is not protected",
			pods: []*cache.DesiredPod{{Pod: podInfo("p1")}},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"))},
			want: []act{{operations.OpUnmountVolume, vA, "p1", ""}},
		},
		{
			name: "protection is per pod: other pods' mounts are unmounted",
			pods: []*cache.DesiredPod{protected("p1", "data")},
			asw:  []*cache.ActualVolume{avol(vDir, sharedDirAttrs, mounted("p1", "p2"))},
			want: []act{{operations.OpUnmountVolume, vDir, "p2", ""}},
		},
		{
			name: "protected pod keeps shared device mounted",
			pods: []*cache.DesiredPod{protected("p1", "data")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1"))},
		},

		// Shared volumes without device mount.
		{
			name: "shared directory volume: one mount per pod, no device mount",
			dsw:  []*cache.DesiredVolume{dvol(vDir, sharedDirAttrs, "p1", "p2")},
			want: []act{
				{operations.OpMountVolume, vDir, "p1", "not mounted"},
				{operations.OpMountVolume, vDir, "p2", "not mounted"},
			},
		},

		// Device-mountable volumes.
		{
			name: "device not mounted: one mount_device for all pods, no mount_volume yet",
			dsw:  []*cache.DesiredVolume{dvol(vDev, deviceAttrs, "p1", "p2", "p3")},
			want: []act{{operations.OpMountDevice, vDev, "", "device not mounted"}},
		},
		{
			name: "device recorded NotMounted: mount_device",
			dsw:  []*cache.DesiredVolume{dvol(vDev, deviceAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceNotMounted), uncertain("p1"))},
			want: []act{{operations.OpMountDevice, vDev, "", "device not mounted"}},
		},
		{
			name: "device mount uncertain: mount_device",
			dsw:  []*cache.DesiredVolume{dvol(vDev, deviceAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceMountUncertain))},
			want: []act{{operations.OpMountDevice, vDev, "", "device mount uncertain"}},
		},
		{
			name: "device mounted: mount_volume for each pod not mounted",
			dsw:  []*cache.DesiredVolume{dvol(vDev, deviceAttrs, "p1", "p2", "p3")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p2"))},
			want: []act{
				{operations.OpMountVolume, vDev, "p1", "not mounted"},
				{operations.OpMountVolume, vDev, "p3", "not mounted"},
			},
		},
		{
			name: "device mounted, all pods mounted: nothing",
			dsw:  []*cache.DesiredVolume{dvol(vDev, deviceAttrs, "p1", "p2")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1", "p2"))},
		},
		{
			name: "one of two pods gone: unmount it, device stays",
			dsw:  []*cache.DesiredVolume{dvol(vDev, deviceAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1", "p2"))},
			want: []act{{operations.OpUnmountVolume, vDev, "p2", ""}},
		},
		{
			name: "last pod gone: unmount_volume, no unmount_device while it is mounted",
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1"))},
			want: []act{{operations.OpUnmountVolume, vDev, "p1", ""}},
		},
		{
			name: "no pods left: unmount_device",
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted))},
			want: []act{{operations.OpUnmountDevice, vDev, "", "no pod uses it (device GloballyMounted)"}},
		},
		{
			name: "no pods left, device uncertain: unmount_device",
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceMountUncertain))},
			want: []act{{operations.OpUnmountDevice, vDev, "", "no pod uses it (device Uncertain)"}},
		},
		{
			name:     "no pods left, sources not ready: device kept",
			asw:      []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted))},
			notReady: true,
		},
		{
			name: "device mounted, no pod mounted, still desired: mount pods, no teardown",
			dsw:  []*cache.DesiredVolume{dvol(vDev, deviceAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted))},
			want: []act{{operations.OpMountVolume, vDev, "p1", "not mounted"}},
		},
		{
			name: "device uncertain, pod mount uncertain, still desired: mount_device first",
			dsw:  []*cache.DesiredVolume{dvol(vDev, deviceAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceMountUncertain), uncertain("p1"))},
			want: []act{{operations.OpMountDevice, vDev, "", "device mount uncertain"}},
		},
		{
			name: "device uncertain, pod mount not desired: unmount the pod first",
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceMountUncertain), uncertain("p1"))},
			want: []act{{operations.OpUnmountVolume, vDev, "p1", "no longer desired (mount Uncertain)"}},
		},

		// Attachable volumes.
		{
			name: "attachable, not in ASW: verify_attached only",
			dsw:  []*cache.DesiredVolume{dvol(vDisk, attachableAttrs, "p1", "p2")},
			want: []act{{operations.OpVerifyAttached, vDisk, "", "not attached"}},
		},
		{
			name: "attachable, NotAttached: verify_attached only",
			dsw:  []*cache.DesiredVolume{dvol(vDisk, attachableAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDisk, attachableAttrs, attach(cache.NotAttached))},
			want: []act{{operations.OpVerifyAttached, vDisk, "", "not attached"}},
		},
		{
			name: "attachable, attach uncertain: verify_attached only",
			dsw:  []*cache.DesiredVolume{dvol(vDisk, attachableAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDisk, attachableAttrs, attach(cache.AttachUncertain))},
			want: []act{{operations.OpVerifyAttached, vDisk, "", "not attached"}},
		},
		{
			name: "attached, device not mounted: mount_device",
			dsw:  []*cache.DesiredVolume{dvol(vDisk, attachableAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDisk, attachableAttrs, attach(cache.Attached))},
			want: []act{{operations.OpMountDevice, vDisk, "", "device not mounted"}},
		},
		{
			name: "attached, device mounted: mount_volume",
			dsw:  []*cache.DesiredVolume{dvol(vDisk, attachableAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDisk, attachableAttrs, attach(cache.Attached), device(cache.DeviceGloballyMounted))},
			want: []act{{operations.OpMountVolume, vDisk, "p1", "not mounted"}},
		},
		{
			name: "attached, not wanted, device not mounted: detach_volume",
			asw:  []*cache.ActualVolume{avol(vDisk, attachableAttrs, attach(cache.Attached))},
			want: []act{{operations.OpDetachVolume, vDisk, "", "no pod uses it (attach Attached)"}},
		},
		{
			name: "attach uncertain, not wanted: detach_volume",
			asw:  []*cache.ActualVolume{avol(vDisk, attachableAttrs, attach(cache.AttachUncertain))},
			want: []act{{operations.OpDetachVolume, vDisk, "", "no pod uses it (attach Uncertain)"}},
		},
		{
			name: "attached, not wanted, device mounted: unmount_device before detach",
			asw:  []*cache.ActualVolume{avol(vDisk, attachableAttrs, attach(cache.Attached), device(cache.DeviceGloballyMounted))},
			want: []act{{operations.OpUnmountDevice, vDisk, "", ""}},
		},
		{
			name: "attached, not wanted, pod still mounted: unmount_volume only",
			asw:  []*cache.ActualVolume{avol(vDisk, attachableAttrs, attach(cache.Attached), device(cache.DeviceGloballyMounted), mounted("p1"))},
			want: []act{{operations.OpUnmountVolume, vDisk, "p1", ""}},
		},
		{
			name:     "attached, not wanted, sources not ready: not detached",
			asw:      []*cache.ActualVolume{avol(vDisk, attachableAttrs, attach(cache.Attached))},
			notReady: true,
		},
		{
			name: "attached, still desired, no pods mounted: no detach",
			dsw:  []*cache.DesiredVolume{dvol(vDisk, attachableAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDisk, attachableAttrs, attach(cache.Attached), device(cache.DeviceGloballyMounted))},
			want: []act{{operations.OpMountVolume, vDisk, "p1", ""}},
		},
		{
			name: "attach not needed, not wanted: nothing to detach",
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, attach(cache.AttachNotNeeded))},
		},

		// Expansion.
		{
			name: "desired size larger, all pods mounted: expand_volume",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1", "p2"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1", "p2"), size("1Gi"))},
			want: []act{{operations.OpExpandVolume, vDev, "", "filesystem must grow to 2Gi (node made it fit 1Gi)"}},
		},
		{
			name: "per-pod volume larger: expand_volume",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vA, perPodAttrs, "p1"), "10Gi")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, mounted("p1"), size("5Gi"))},
			want: []act{{operations.OpExpandVolume, vA, "", "filesystem must grow to 10Gi (node made it fit 5Gi)"}},
		},
		{
			name: "desired size larger, one pod not mounted: online expansion and mount (the executor serialises them)",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1", "p2"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1"), size("1Gi"))},
			want: []act{{operations.OpExpandVolume, vDev, "", ""}, {operations.OpMountVolume, vDev, "p2", "not mounted"}},
		},
		{
			name: "desired size larger, one pod mount uncertain: expansion and remount",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1", "p2"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1"), uncertain("p2"), size("1Gi"))},
			want: []act{{operations.OpExpandVolume, vDev, "", ""}, {operations.OpMountVolume, vDev, "p2", "mount uncertain"}},
		},
		{
			name: "offline expansion: staged, no pod mounted yet: grow before publishing",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1", "p2"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), size("1Gi"))},
			want: []act{{operations.OpExpandVolume, vDev, "", "filesystem must grow to 2Gi (node made it fit 1Gi) (before publishing)"}},
		},
		{
			name: "offline expansion with the size not known yet",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted))},
			want: []act{{operations.OpExpandVolume, vDev, "", "filesystem must grow to 2Gi (node made it fit unknown) (before publishing)"}},
		},
		{
			name: "per-pod volume not mounted yet: mount first, no expansion",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vA, perPodAttrs, "p1"), "10Gi")},
			asw:  []*cache.ActualVolume{avol(vA, perPodAttrs, uncertain("p1"), size("5Gi"))},
			want: []act{{operations.OpMountVolume, vA, "p1", "mount uncertain"}},
		},
		{
			name: "desired size larger, device not mounted: no expansion",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceMountUncertain), size("1Gi"))},
			want: []act{{operations.OpMountDevice, vDev, "", ""}},
		},
		{
			name: "resize blocked: no expansion",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1"), size("1Gi"), resizeBlocked("in use"))},
		},
		{
			name: "desired size smaller: no expansion",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1"), "1Gi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1"), size("2Gi"))},
		},
		{
			name: "desired size equal in other units: no expansion",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1"), "1024Mi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1"), size("1Gi"))},
		},
		{
			name: "ASW size unknown: expand (growing is idempotent)",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1"))},
			want: []act{{operations.OpExpandVolume, vDev, "", "filesystem must grow to 2Gi (node made it fit unknown)"}},
		},
		{
			name: "desired size unknown: no expansion",
			dsw:  []*cache.DesiredVolume{dvol(vDev, deviceAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1"), size("1Gi"))},
		},
		{
			name: "expansion with an extra unwanted pod mount: unmount it and expand",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vDev, deviceAttrs, "p1"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1", "p2"), size("1Gi"))},
			want: []act{
				{operations.OpUnmountVolume, vDev, "p2", ""},
				{operations.OpExpandVolume, vDev, "", ""},
			},
		},

		// Ordering across phases and volumes.
		{
			name: "all three phases, sorted by phase then volume then pod",
			dsw: []*cache.DesiredVolume{
				dvol(vC, perPodAttrs, "p3", "p1"),
				dvol(vB, perPodAttrs, "p2"),
				dvol(vDisk, attachableAttrs, "p4"),
			},
			asw: []*cache.ActualVolume{
				avol(vA, perPodAttrs, mounted("p9", "p1")),
				avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted)),
				avol("test/plugin/att", attachableAttrs, attach(cache.Attached)),
				avol(vB, perPodAttrs, uncertain("p2")),
			},
			want: []act{
				{operations.OpUnmountVolume, vA, "p1", ""},
				{operations.OpUnmountVolume, vA, "p9", ""},
				{operations.OpMountVolume, vB, "p2", "mount uncertain"},
				{operations.OpMountVolume, vC, "p1", "not mounted"},
				{operations.OpMountVolume, vC, "p3", "not mounted"},
				{operations.OpVerifyAttached, vDisk, "", ""},
				{operations.OpDetachVolume, "test/plugin/att", "", ""},
				{operations.OpUnmountDevice, vDev, "", ""},
			},
		},
		{
			name: "mixed pods and volumes, sources not ready: only mount side",
			dsw: []*cache.DesiredVolume{
				dvol(vC, perPodAttrs, "p3", "p1"),
				dvol(vDev, deviceAttrs, "p1", "p2"),
			},
			asw: []*cache.ActualVolume{
				avol(vA, perPodAttrs, mounted("p9")),
				avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1", "p5")),
				avol(vDisk, attachableAttrs, attach(cache.Attached), device(cache.DeviceGloballyMounted)),
			},
			notReady: true,
			want: []act{
				{operations.OpMountVolume, vC, "p1", ""},
				{operations.OpMountVolume, vC, "p3", ""},
				{operations.OpMountVolume, vDev, "p2", ""},
			},
		},
		{
			name: "many pods on one volume with mixed states",
			dsw:  []*cache.DesiredVolume{dvol(vDir, sharedDirAttrs, "p1", "p2", "p3", "p4")},
			asw: []*cache.ActualVolume{avol(vDir, sharedDirAttrs,
				mounted("p1"), uncertain("p2"), mounted("p5"), uncertain("p6"))},
			want: []act{
				{operations.OpUnmountVolume, vDir, "p5", "no longer desired (mount Mounted)"},
				{operations.OpUnmountVolume, vDir, "p6", "no longer desired (mount Uncertain)"},
				{operations.OpMountVolume, vDir, "p2", "mount uncertain"},
				{operations.OpMountVolume, vDir, "p3", "not mounted"},
				{operations.OpMountVolume, vDir, "p4", "not mounted"},
			},
		},
		{
			name: "remount required with expansion: expand sorts before the pod's remount",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vA, remountAttrs, "p1"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vA, remountAttrs, remount("p1"), size("1Gi"))},
			want: []act{
				{operations.OpExpandVolume, vA, "", ""},
				{operations.OpMountVolume, vA, "p1", "remount required"},
			},
		},

		// Raw block volumes (volumeMode Block) get the map operations, in
		// the same order and on the same predicates as mounts.
		{
			name: "local block volume: mapped for each pod, no device phase",
			dsw:  []*cache.DesiredVolume{dvol(vLocalBlk, localBlockAttrs, "p1", "p2")},
			asw:  []*cache.ActualVolume{avol(vLocalBlk, localBlockAttrs, mounted("p1"))},
			want: []act{{operations.OpMapVolume, vLocalBlk, "p2", "not mounted"}},
		},
		{
			name: "CSI block volume: attach, then map the device (stage), then each pod",
			dsw:  []*cache.DesiredVolume{dvol(vCSIBlk, csiBlockAttrs, "p1")},
			want: []act{{operations.OpVerifyAttached, vCSIBlk, "", "not attached"}},
		},
		{
			name: "CSI block volume attached: map_device",
			dsw:  []*cache.DesiredVolume{dvol(vCSIBlk, csiBlockAttrs, "p1")},
			asw:  []*cache.ActualVolume{avol(vCSIBlk, csiBlockAttrs, attach(cache.Attached))},
			want: []act{{operations.OpMapDevice, vCSIBlk, "", "device not mounted"}},
		},
		{
			name: "CSI block volume staged: map_volume for the pods",
			dsw:  []*cache.DesiredVolume{dvol(vCSIBlk, csiBlockAttrs, "p1", "p2")},
			asw:  []*cache.ActualVolume{avol(vCSIBlk, csiBlockAttrs, attach(cache.Attached), device(cache.DeviceGloballyMounted), uncertain("p2"))},
			want: []act{
				{operations.OpMapVolume, vCSIBlk, "p1", "not mounted"},
				{operations.OpMapVolume, vCSIBlk, "p2", "mount uncertain"},
			},
		},
		{
			name: "block volumes no pod wants: unmap_volume, then (next pass) unmap_device and detach",
			asw: []*cache.ActualVolume{
				avol(vCSIBlk, csiBlockAttrs, attach(cache.Attached), device(cache.DeviceGloballyMounted), mounted("p1")),
				avol(vLocalBlk, localBlockAttrs, uncertain("p2")),
			},
			want: []act{
				{operations.OpUnmapVolume, vCSIBlk, "p1", "no longer desired (mount Mounted)"},
				{operations.OpUnmapVolume, vLocalBlk, "p2", "no longer desired (mount Uncertain)"},
			},
		},
		{
			name: "block device no pod has: unmap_device",
			asw:  []*cache.ActualVolume{avol(vCSIBlk, csiBlockAttrs, attach(cache.Attached), device(cache.DeviceMountUncertain))},
			want: []act{{operations.OpUnmapDevice, vCSIBlk, "", "no pod uses it (device Uncertain)"}},
		},
		{
			name: "block device unmapped: detach",
			asw:  []*cache.ActualVolume{avol(vCSIBlk, csiBlockAttrs, attach(cache.Attached))},
			want: []act{{operations.OpDetachVolume, vCSIBlk, "", ""}},
		},
		{
			name: "block volume expansion waits for a pod to have it mapped (no offline growth)",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vCSIBlk, csiBlockAttrs, "p1"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vCSIBlk, csiBlockAttrs, attach(cache.Attached), device(cache.DeviceGloballyMounted), size("1Gi"))},
			want: []act{{operations.OpMapVolume, vCSIBlk, "p1", "not mounted"}},
		},
		{
			name: "block volume mapped: expanded online",
			dsw:  []*cache.DesiredVolume{withSize(dvol(vCSIBlk, csiBlockAttrs, "p1"), "2Gi")},
			asw:  []*cache.ActualVolume{avol(vCSIBlk, csiBlockAttrs, attach(cache.Attached), device(cache.DeviceGloballyMounted), size("1Gi"), mounted("p1"))},
			want: []act{{operations.OpExpandVolume, vCSIBlk, "", ""}},
		},
	}
}

func TestPlan(t *testing.T) {
	for _, tc := range planCases() {
		t.Run(tc.name, func(t *testing.T) {
			dsw := desiredSnapshot(tc.dsw, tc.pods)
			asw := actualSnapshot(tc.asw)
			got := summarize(Plan(dsw, asw, Options{SourcesReady: !tc.notReady}))
			if !sameActs(got, tc.want) {
				t.Errorf("Plan:\n got:\n%s want:\n%s", formatActs(got), formatActs(tc.want))
			}
		})
	}
}

// TestPlanCaseCount keeps the table from shrinking by accident.
func TestPlanCaseCount(t *testing.T) {
	if n := len(planCases()); n < 40 {
		t.Errorf("only %d plan cases", n)
	}
}

// TestPlanActionFields checks what each kind of action carries besides its
// op, volume and pod: the dispatcher and operations depend on it.
func TestPlanActionFields(t *testing.T) {
	t.Run("mount_volume carries the pod's own spec", func(t *testing.T) {
		dv := dvol(vDir, sharedDirAttrs, "p1")
		got := Plan(desiredSnapshot([]*cache.DesiredVolume{dv}, nil), actualSnapshot(nil), Options{SourcesReady: true})
		if len(got) != 1 {
			t.Fatalf("got %d actions, want 1", len(got))
		}
		a := got[0]
		if a.Spec != dv.Pods.At("p1").Spec {
			t.Errorf("Spec = %+v, want the pod's spec %+v", a.Spec, dv.Pods.At("p1").Spec)
		}
		if a.Pod != podInfo("p1") || a.Plugin != testPlugin || a.Attributes != sharedDirAttrs || a.SpecName != "dir" {
			t.Errorf("action = %+v", a)
		}
		if a.MountPath != "" || a.Waiting != nil {
			t.Errorf("mount_volume has MountPath %q, Pods %v; want neither", a.MountPath, a.Waiting)
		}
	})
	t.Run("unmount_volume carries the recorded mount", func(t *testing.T) {
		av := avol(vDir, sharedDirAttrs, uncertain("p1"))
		got := Plan(desiredSnapshot(nil, nil), actualSnapshot([]*cache.ActualVolume{av}), Options{SourcesReady: true})
		if len(got) != 1 {
			t.Fatalf("got %d actions, want 1", len(got))
		}
		a, m := got[0], av.Pods.At("p1")
		if a.MountPath != m.MountPath || a.Spec != m.Spec || a.SpecName != m.SpecName || a.Pod.PodRef != m.Pod {
			t.Errorf("action = %+v, want mount %+v", a, m)
		}
		if a.Plugin != testPlugin || a.Attributes != sharedDirAttrs {
			t.Errorf("action plugin/attributes = %q/%+v", a.Plugin, a.Attributes)
		}
	})
	t.Run("unmount_volume of a reconstructed mount has no spec", func(t *testing.T) {
		av := avol(vA, perPodAttrs, mounted("p1"))
		av.Pods.At("p1").Spec = nil
		av.Spec = nil
		got := Plan(desiredSnapshot(nil, nil), actualSnapshot([]*cache.ActualVolume{av}), Options{SourcesReady: true})
		if len(got) != 1 || got[0].Spec != nil || got[0].MountPath == "" {
			t.Fatalf("got %+v", got)
		}
	})
	t.Run("volume-wide actions list the waiting pods sorted", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			dv   *cache.DesiredVolume
			av   *cache.ActualVolume
			op   operations.Op
		}{
			{"verify_attached", dvol(vDisk, attachableAttrs, "p3", "p1", "p2"), nil, operations.OpVerifyAttached},
			{"mount_device", dvol(vDev, deviceAttrs, "p3", "p1", "p2"), nil, operations.OpMountDevice},
			{"volume_fs_resize", withSize(dvol(vDev, deviceAttrs, "p3", "p1", "p2"), "2Gi"),
				avol(vDev, deviceAttrs, device(cache.DeviceGloballyMounted), mounted("p1", "p2", "p3"), size("1Gi")), operations.OpExpandVolume},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var avs []*cache.ActualVolume
				if tc.av != nil {
					avs = append(avs, tc.av)
				}
				got := Plan(desiredSnapshot([]*cache.DesiredVolume{tc.dv}, nil), actualSnapshot(avs), Options{SourcesReady: true})
				if len(got) != 1 || got[0].Op != tc.op {
					t.Fatalf("got %v, want one %s", summarize(got), tc.op)
				}
				a := got[0]
				want := []volume.PodRef{podRef("p1"), podRef("p2"), podRef("p3")}
				if !slices.Equal(a.Waiting, want) {
					t.Errorf("Pods = %v, want %v", a.Waiting, want)
				}
				if a.Spec != tc.dv.Spec || a.SpecName != tc.dv.SpecName || a.Pod != (volume.PodInfo{}) {
					t.Errorf("action = %+v; want the volume's spec and no pod", a)
				}
			})
		}
	})
	t.Run("device teardown carries the recorded spec", func(t *testing.T) {
		av := avol(vDisk, attachableAttrs, attach(cache.Attached), device(cache.DeviceMountUncertain))
		got := Plan(desiredSnapshot(nil, nil), actualSnapshot([]*cache.ActualVolume{av}), Options{SourcesReady: true})
		if len(got) != 1 || got[0].Op != operations.OpUnmountDevice || got[0].Spec != av.Spec || got[0].Attributes != attachableAttrs {
			t.Fatalf("got %+v", got)
		}
	})
}

// TestPlanDoesNotModifyInputs: Plan is pure; snapshots are shared with other
// readers. Each world is built twice with nothing shared between the copies
// (specs included); Plan reads one, and it must still equal the other, values
// behind pointers included.
func TestPlanDoesNotModifyInputs(t *testing.T) {
	var worlds []func() (*cache.DesiredSnapshot, *cache.ActualSnapshot)
	for _, tc := range planCases() {
		worlds = append(worlds, func() (*cache.DesiredSnapshot, *cache.ActualSnapshot) {
			// planCases again: fresh fixtures for every copy.
			for _, c := range planCases() {
				if c.name == tc.name {
					return desiredSnapshot(c.dsw, c.pods), actualSnapshot(c.asw)
				}
			}
			panic("no plan case " + tc.name)
		})
	}
	for i := range 50 {
		worlds = append(worlds, func() (*cache.DesiredSnapshot, *cache.ActualSnapshot) {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			dsw, asw := randomWorld(r, 20, 10)
			enrichWorld(r, dsw, asw)
			return dsw, asw
		})
	}
	for i, build := range worlds {
		for _, opts := range []Options{{}, {SourcesReady: true}, {SourcesReady: true, OrphanCleanupAllowed: true}} {
			dsw, asw := buildIsolated(build)
			wantDSW, wantASW := buildIsolated(build)
			if !reflect.DeepEqual(dsw, wantDSW) || !reflect.DeepEqual(asw, wantASW) {
				t.Fatalf("world %d: two builds differ before planning", i)
			}
			Plan(dsw, asw, opts)
			for _, d := range diffWorlds(dsw, asw, wantDSW, wantASW) {
				t.Errorf("world %d, %+v: Plan modified %s", i, opts, d)
			}
		}
	}
}

// buildIsolated builds a world with specs of its own.
func buildIsolated(build func() (*cache.DesiredSnapshot, *cache.ActualSnapshot)) (*cache.DesiredSnapshot, *cache.ActualSnapshot) {
	saved := specs
	defer func() { specs = saved }()
	specs = map[string]*volume.Spec{}
	return build()
}

// diffWorlds names the entries that differ, comparing the values behind
// every pointer.
func diffWorlds(dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, wantDSW *cache.DesiredSnapshot, wantASW *cache.ActualSnapshot) []string {
	var out []string
	for name, v := range wantDSW.Volumes() {
		if !reflect.DeepEqual(dsw.Volume(name), v) {
			out = append(out, fmt.Sprintf("desired volume %s", name))
		}
	}
	for uid, p := range wantDSW.Pods() {
		if !reflect.DeepEqual(dsw.Pod(uid), p) {
			out = append(out, fmt.Sprintf("desired pod %s", uid))
		}
	}
	for name, v := range wantASW.Volumes() {
		if !reflect.DeepEqual(asw.Volume(name), v) {
			out = append(out, fmt.Sprintf("actual volume %s", name))
		}
	}
	if len(out) == 0 && (!reflect.DeepEqual(dsw, wantDSW) || !reflect.DeepEqual(asw, wantASW)) {
		out = append(out, "the snapshots")
	}
	slices.Sort(out)
	return out
}

// randomWorld builds a random but consistent pair of snapshots.
func randomWorld(r *rand.Rand, nVols, nPods int) (*cache.DesiredSnapshot, *cache.ActualSnapshot) {
	attrs := []volume.Attributes{perPodAttrs, remountAttrs, sharedDirAttrs, deviceAttrs, attachableAttrs}
	devStates := []cache.DeviceMountState{cache.DeviceNotMounted, cache.DeviceMountUncertain, cache.DeviceGloballyMounted}
	attStates := []cache.AttachState{"", cache.NotAttached, cache.AttachUncertain, cache.Attached}
	var dvs []*cache.DesiredVolume
	var avs []*cache.ActualVolume
	var extra []*cache.DesiredPod
	pod := func() string { return fmt.Sprintf("p%02d", r.IntN(nPods)) }
	for i := range nVols {
		name := volume.UniqueName(fmt.Sprintf("test/plugin/v%03d", i))
		a := attrs[r.IntN(len(attrs))]
		if r.IntN(3) > 0 {
			var pods []string
			for range r.IntN(4) + 1 {
				pods = append(pods, pod())
			}
			dv := dvol(name, a, pods...)
			if r.IntN(4) == 0 {
				withSize(dv, fmt.Sprintf("%dGi", r.IntN(3)+1))
			}
			dvs = append(dvs, dv)
		}
		if r.IntN(3) > 0 {
			opts := []avOpt{device(devStates[r.IntN(len(devStates))]), attach(attStates[r.IntN(len(attStates))])}
			for range r.IntN(4) {
				switch r.IntN(3) {
				case 0:
					opts = append(opts, mounted(pod()))
				case 1:
					opts = append(opts, uncertain(pod()))
				case 2:
					opts = append(opts, remount(pod()))
				}
			}
			if r.IntN(3) == 0 {
				opts = append(opts, size(fmt.Sprintf("%dGi", r.IntN(3)+1)))
			}
			avs = append(avs, avol(name, a, opts...))
		}
	}
	for range r.IntN(3) {
		extra = append(extra, protected(fmt.Sprintf("x%02d", r.IntN(nPods)), "data"))
	}
	return desiredSnapshot(dvs, extra), actualSnapshot(avs)
}

// TestPlanInvariants checks properties that must hold for any input, on
// random worlds.
func TestPlanInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		dsw, asw := randomWorld(r, 20, 10)
		for _, ready := range []bool{false, true} {
			got := Plan(dsw, asw, Options{SourcesReady: ready})
			ctx := fmt.Sprintf("world %d, ready=%v", i, ready)

			// Deterministic: planning again (maps iterate in another
			// order) gives the same result.
			if again := Plan(dsw, asw, Options{SourcesReady: ready}); !reflect.DeepEqual(got, again) {
				t.Fatalf("%s: Plan is not deterministic:\n%v\n%v", ctx, summarize(got), summarize(again))
			}
			perVolume := map[volume.UniqueName][]operations.Op{}
			for j, a := range got {
				if j > 0 {
					p := got[j-1]
					if k1, k2 := sortKey(p), sortKey(a); k1 >= k2 {
						t.Fatalf("%s: actions %d and %d out of order or duplicated: %v, %v", ctx, j-1, j, p, a)
					}
				}
				perVolume[a.Volume] = append(perVolume[a.Volume], a.Op)
				if !ready && phase(a.Op) != operations.PhaseMount {
					t.Fatalf("%s: destructive %s before sources are ready", ctx, a.Op)
				}
				dv := dsw.Volume(a.Volume)
				av := asw.Volume(a.Volume)
				switch a.Op {
				case operations.OpMountVolume:
					if dv == nil || dv.Pods.At(a.Pod.UID) == nil {
						t.Fatalf("%s: %v for a pod that does not want the volume", ctx, a)
					}
					if dv.Attributes.DeviceMountable && (av == nil || av.DeviceState != cache.DeviceGloballyMounted) {
						t.Fatalf("%s: %v before its device is mounted", ctx, a)
					}
				case operations.OpUnmountVolume:
					if dsw.HasPodVolume(a.Volume, a.Pod.UID) {
						t.Fatalf("%s: %v of a wanted mount", ctx, a)
					}
					if p := dsw.Pod(a.Pod.UID); p != nil && len(p.Unresolved) > 0 {
						t.Fatalf("%s: %v of a protected pod", ctx, a)
					}
				case operations.OpUnmountDevice, operations.OpDetachVolume:
					if dv != nil || av.Pods.Len() > 0 {
						t.Fatalf("%s: %v of a volume still wanted or mounted", ctx, a)
					}
				case operations.OpVerifyAttached, operations.OpMountDevice, operations.OpExpandVolume:
					if dv == nil || a.Pod.UID != "" {
						t.Fatalf("%s: %v of an unwanted volume or with a pod", ctx, a)
					}
				}
			}
			for name, ops := range perVolume {
				mountSide := slices.DeleteFunc(slices.Clone(ops), func(o operations.Op) bool { return o == operations.OpUnmountVolume })
				if slices.Contains(ops, operations.OpVerifyAttached) && len(mountSide) > 1 {
					t.Fatalf("%s: %s: verify_attached together with %v", ctx, name, ops)
				}
				if slices.Contains(ops, operations.OpMountDevice) && slices.Contains(ops, operations.OpMountVolume) {
					t.Fatalf("%s: %s: mount_device together with mount_volume", ctx, name)
				}
				if slices.Contains(ops, operations.OpUnmountDevice) && slices.Contains(ops, operations.OpDetachVolume) {
					t.Fatalf("%s: %s: unmount_device together with detach", ctx, name)
				}
			}
		}
	}
}

func sortKey(a Action) string {
	return fmt.Sprintf("%d\x00%s\x00%s", phase(a.Op), a.Volume, a.Pod.UID)
}

// TestPlanDeterministic: the same inputs give exactly the same actions
// (maps are iterated in random order, so run it a few times).
func TestPlanDeterministic(t *testing.T) {
	var dvs []*cache.DesiredVolume
	var avs []*cache.ActualVolume
	for i := range 50 {
		name := volume.UniqueName(fmt.Sprintf("test/plugin/v%02d", i))
		pods := []string{fmt.Sprintf("p%d", i%7), fmt.Sprintf("p%d", (i+3)%7)}
		switch i % 5 {
		case 0:
			dvs = append(dvs, dvol(name, perPodAttrs, pods...))
		case 1:
			dvs = append(dvs, dvol(name, deviceAttrs, pods...))
			avs = append(avs, avol(name, deviceAttrs, device(cache.DeviceGloballyMounted), mounted(pods[0], "p9")))
		case 2:
			avs = append(avs, avol(name, deviceAttrs, device(cache.DeviceGloballyMounted), mounted(pods...)))
		case 3:
			avs = append(avs, avol(name, attachableAttrs, attach(cache.Attached)))
		case 4:
			dvs = append(dvs, dvol(name, attachableAttrs, pods...))
		}
	}
	dsw, asw := desiredSnapshot(dvs, nil), actualSnapshot(avs)
	first := Plan(dsw, asw, Options{SourcesReady: true})
	if len(first) == 0 {
		t.Fatal("no actions")
	}
	for range 20 {
		if again := Plan(dsw, asw, Options{SourcesReady: true}); !reflect.DeepEqual(first, again) {
			t.Fatalf("Plan is not deterministic:\n%s\n%s", formatActs(summarize(first)), formatActs(summarize(again)))
		}
	}
	if !slices.IsSortedFunc(first, func(a, b Action) int { return strings.Compare(sortKey(a), sortKey(b)) }) {
		t.Errorf("actions not sorted by phase, volume, pod:\n%s", formatActs(summarize(first)))
	}
	seen := map[operations.Phase]bool{}
	for _, a := range first {
		seen[phase(a.Op)] = true
	}
	if len(seen) != 3 {
		t.Errorf("fixture should cover all three phases, covers %v", seen)
	}
}

// benchWorld builds n per-pod volumes, one pod each; mounted says whether
// the ASW has them all mounted.
func benchWorld(n int, mountedAll bool) (*cache.DesiredSnapshot, *cache.ActualSnapshot) {
	dvs := make([]*cache.DesiredVolume, 0, n)
	avs := make([]*cache.ActualVolume, 0, n)
	for i := range n {
		uid := fmt.Sprintf("pod-%05d", i)
		name := volume.PodScopedName("kubernetes.io/empty-dir", types.UID(uid), "scratch")
		spec := &volume.Spec{Name: "scratch"}
		dvs = append(dvs, &cache.DesiredVolume{
			Name: name, Plugin: "kubernetes.io/empty-dir", SpecName: "scratch", Spec: spec,
			Pods: cache.PodSetOf(map[types.UID]*cache.DesiredPodVolume{types.UID(uid): {Pod: podInfo(uid), OuterNames: []string{"scratch"}, Spec: spec}}),
		})
		if mountedAll {
			avs = append(avs, &cache.ActualVolume{
				Name: name, Plugin: "kubernetes.io/empty-dir", Spec: spec, DeviceState: cache.DeviceNotMounted,
				Pods: cache.PodSetOf(map[types.UID]*cache.ActualPodMount{types.UID(uid): {Pod: podRef(uid), SpecName: "scratch", State: cache.Mounted, Spec: spec}}),
			})
		}
	}
	return desiredSnapshot(dvs, nil), actualSnapshot(avs)
}

func BenchmarkPlan10000Volumes(b *testing.B) {
	for _, bc := range []struct {
		name        string
		mounted     bool
		wantActions int
	}{
		{"steady", true, 0},
		{"nothing-mounted", false, 10000},
	} {
		b.Run(bc.name, func(b *testing.B) {
			dsw, asw := benchWorld(10000, bc.mounted)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if got := Plan(dsw, asw, Options{SourcesReady: true}); len(got) != bc.wantActions {
					b.Fatalf("%d actions, want %d", len(got), bc.wantActions)
				}
			}
		})
	}
}
