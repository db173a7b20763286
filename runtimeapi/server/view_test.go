package server

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/apivolume"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/volume"
)

const (
	emptyDirPlugin = "kubernetes.io/empty-dir"
	localPlugin    = "kubernetes.io/local-volume"
	csiPlugin      = "kubernetes.io/csi"
)

// lastErrors is the executor's backoff, as the view sees it.
type lastErrors map[operations.Key]error

func (l lastErrors) LastError(k operations.Key) error { return l[k] }

// world is a DSW and an ASW with one pod being built.
type world struct {
	paths volume.Paths
	dsw   *cache.DesiredStateOfWorld
	asw   *cache.ActualStateOfWorld
	pod   volume.PodInfo

	vols       []cache.PodVolume
	errs       []*volume.PodVolumeError
	containers []volume.Container
}

func newWorld(uid string) *world {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	return &world{
		paths: volume.Paths{Root: "/var/lib/volume-agent"},
		dsw:   cache.NewDesiredStateOfWorld(clk), asw: cache.NewActualStateOfWorld(clk),
		pod: volume.PodInfo{PodRef: volume.PodRef{UID: types.UID(uid), Namespace: "shop", Name: "web-" + uid}},
	}
}

// volume adds a resolved volume of the pod under outer name.
func (w *world) volume(outer, plugin string, attrs volume.Attributes, spec *volume.Spec, subPaths ...volume.SubPath) volume.UniqueName {
	name := volume.PodScopedName(plugin, w.pod.UID, spec.Name)
	if attrs.Shared() {
		name = volume.SharedName(plugin, attrs.Identity)
	}
	w.vols = append(w.vols, cache.PodVolume{Name: name, Plugin: plugin, Attributes: attrs, OuterName: outer, Spec: spec, SubPaths: subPaths})
	return name
}

func (w *world) mounted(name volume.UniqueName, plugin string, attrs volume.Attributes, specName string, state cache.MountState) string {
	dir := w.paths.PodVolumeDir(w.pod.UID, plugin, specName)
	w.asw.SetPodMount(cache.VolumeIdentity{Name: name, Plugin: plugin, Attributes: attrs}, cache.ActualPodMount{Pod: w.pod.PodRef, SpecName: specName, MountPath: dir, State: state})
	return dir
}

func (w *world) snapshots() (*cache.DesiredPod, *cache.DesiredSnapshot, *cache.ActualSnapshot) {
	w.dsw.SetPodWithContainers(w.pod, w.vols, w.errs, nil, w.containers)
	dsw := w.dsw.Snapshot()
	return dsw.Pod(w.pod.UID), dsw, w.asw.Snapshot()
}

func spec(name string, mode v1.PersistentVolumeMode, readOnly bool) *volume.Spec {
	return &volume.Spec{Name: name, Mode: mode, ReadOnly: readOnly}
}

var bidirectional = v1.MountPropagationBidirectional

// A pod using every kind of volume the agent supports, each in a different
// state, and what each container gets.
func TestView(t *testing.T) {
	w := newWorld("u1")
	fsMode := v1.PersistentVolumeFilesystem
	logs := volume.SubPath{Container: "app", Index: 1, MountPath: "/var/log/app", Path: "logs/web-u1"}
	conf := volume.SubPath{Container: "app", Index: 3, MountPath: "/etc/app.conf", Path: "app.conf", ReadOnly: true}

	scratch := w.volume("scratch", emptyDirPlugin, volume.Attributes{}, spec("scratch", fsMode, false), logs)
	scratchDir := w.mounted(scratch, emptyDirPlugin, volume.Attributes{}, "scratch", cache.Mounted)
	w.asw.SetSubPaths(scratch, w.pod.UID, []volume.SubPath{logs})

	host := w.volume("host", "kubernetes.io/host-path", volume.Attributes{}, spec("host", fsMode, false))
	hostDir := w.mounted(host, "kubernetes.io/host-path", volume.Attributes{}, "host", cache.Mounted)

	sharedAttrs := volume.Attributes{Identity: "pv-content"}
	content := w.volume("content", localPlugin, sharedAttrs, spec("pv-content", fsMode, true), conf)
	w.mounted(content, localPlugin, sharedAttrs, "pv-content", cache.Mounted) // sub-path not prepared yet

	csiAttrs := volume.Attributes{Identity: "csi-handle", Attachable: true, DeviceMountable: true}
	w.volume("data", csiPlugin, csiAttrs, spec("pv-data", fsMode, false))

	blockAttrs := volume.Attributes{Identity: "pv-raw"}
	raw := w.volume("raw", localPlugin, blockAttrs, spec("pv-raw", v1.PersistentVolumeBlock, false))
	rawPath := w.mounted(raw, localPlugin, blockAttrs, "pv-raw", cache.Mounted)

	mem := w.volume("mem", emptyDirPlugin, volume.Attributes{}, spec("mem", fsMode, false))
	w.mounted(mem, emptyDirPlugin, volume.Attributes{}, "mem", cache.MountUncertain)

	w.errs = []*volume.PodVolumeError{{Pod: w.pod.PodRef, Volume: "claim", Reason: "ClaimNotFound", Err: errors.New(`persistentvolumeclaim "db" not found`)}}
	w.containers = []volume.Container{
		{Name: "init", Type: volume.InitContainer, Mounts: []volume.ContainerMount{{Volume: "scratch", Index: 0, MountPath: "/work"}}},
		{Name: "app", Type: volume.RegularContainer, Mounts: []volume.ContainerMount{
			{Volume: "scratch", Index: 0, MountPath: "/scratch", Propagation: bidirectional},
			{Volume: "scratch", Index: 1, MountPath: "/var/log/app", SubPath: "logs/web-u1"},
			{Volume: "content", Index: 2, MountPath: "/content"},
			{Volume: "content", Index: 3, MountPath: "/etc/app.conf", SubPath: "app.conf", ReadOnly: true},
			{Volume: "host", Index: 4, MountPath: "/host", ReadOnly: true},
			{Volume: "data", Index: 5, MountPath: "/data"},
			{Volume: "mem", Index: 6, MountPath: "/mem"},
			{Volume: "claim", Index: 7, MountPath: "/db"},
		}, Devices: []volume.ContainerDevice{{Volume: "raw", DevicePath: "/dev/xvdb"}}},
	}
	errs := lastErrors{{Volume: mem, Pod: w.pod.UID}: errors.New("mount: no space left on device")}
	p, dsw, asw := w.snapshots()
	got := View(p, dsw, asw, errs, w.paths)

	wantVolumes := []runtimeapi.Volume{
		{Name: "claim", Reason: "ClaimNotFound", Message: `persistentvolumeclaim "db" not found`, NeedsChange: true, VolumeMode: runtimeapi.Filesystem},
		{Name: "content", Reason: runtimeapi.ReasonWaitingForSubPaths, Message: "1 sub-paths to prepare", Plugin: localPlugin, VolumeMode: runtimeapi.Filesystem, ReadOnly: true, SELinuxRelabel: true},
		{Name: "data", Reason: runtimeapi.ReasonWaitingForAttach, Plugin: csiPlugin, VolumeMode: runtimeapi.Filesystem, SELinuxRelabel: true},
		{Name: "host", Ready: true, Plugin: "kubernetes.io/host-path", VolumeMode: runtimeapi.Filesystem, HostPath: hostDir},
		{Name: "mem", Reason: runtimeapi.ReasonMountFailed, Message: "mount: no space left on device", Plugin: emptyDirPlugin, VolumeMode: runtimeapi.Filesystem, SELinuxRelabel: true},
		{Name: "raw", Ready: true, Plugin: localPlugin, VolumeMode: runtimeapi.Block, DevicePath: rawPath},
		{Name: "scratch", Ready: true, Plugin: emptyDirPlugin, VolumeMode: runtimeapi.Filesystem, HostPath: scratchDir, SELinuxRelabel: true},
	}
	if diff := cmp.Diff(wantVolumes, got.Volumes); diff != "" {
		t.Errorf("volumes (-want +got):\n%s", diff)
	}
	logsTarget := w.paths.SubPathTarget(w.pod.UID, emptyDirPlugin, "scratch", "app", 1)
	wantContainers := []runtimeapi.Container{
		{Name: "init", Type: "init", Mounts: []runtimeapi.Mount{{Volume: "scratch", ContainerPath: "/work", HostPath: scratchDir, Propagation: "None", SELinuxRelabel: true}}},
		{Name: "app", Type: "regular", Mounts: []runtimeapi.Mount{
			{Volume: "scratch", ContainerPath: "/scratch", HostPath: scratchDir, Propagation: "Bidirectional", SELinuxRelabel: true},
			{Volume: "scratch", ContainerPath: "/var/log/app", HostPath: logsTarget, SubPath: "logs/web-u1", Propagation: "None", SELinuxRelabel: true},
			{Volume: "content", ContainerPath: "/content", ReadOnly: true, Propagation: "None", SELinuxRelabel: true},
			{Volume: "content", ContainerPath: "/etc/app.conf", ReadOnly: true, SubPath: "app.conf", Propagation: "None", SELinuxRelabel: true},
			{Volume: "host", ContainerPath: "/host", HostPath: hostDir, ReadOnly: true, Propagation: "None"},
			{Volume: "data", ContainerPath: "/data", Propagation: "None", SELinuxRelabel: true},
			{Volume: "mem", ContainerPath: "/mem", Propagation: "None", SELinuxRelabel: true},
			{Volume: "claim", ContainerPath: "/db", Propagation: "None"},
		}, Devices: []runtimeapi.Device{{Volume: "raw", ContainerPath: "/dev/xvdb", HostPath: rawPath, Permissions: "mrw"}}},
	}
	if diff := cmp.Diff(wantContainers, got.Containers); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	if got.Ready {
		t.Error("pod ready with volumes not ready")
	}
	wantMsg := `volumes not ready: claim (ClaimNotFound: persistentvolumeclaim "db" not found), content (WaitingForSubPaths: 1 sub-paths to prepare), ` +
		`data (WaitingForAttach), mem (MountFailed: mount: no space left on device)`
	if got.Message != wantMsg {
		t.Errorf("message:\n got %s\nwant %s", got.Message, wantMsg)
	}
	if got.APIVersion != "v1" || got.UID != "u1" || got.Namespace != "shop" || got.Name != "web-u1" {
		t.Errorf("pod header %+v", got)
	}

	// Everything in place: ready, every path given.
	w.errs = nil
	w.containers[1].Mounts = w.containers[1].Mounts[:7]
	w.vols = w.vols[:len(w.vols)] // the claim never resolved: not in vols
	w.asw.SetSubPaths(content, w.pod.UID, []volume.SubPath{conf})
	w.asw.SetAttachState(cache.VolumeIdentity{Name: volume.SharedName(csiPlugin, "csi-handle"), Plugin: csiPlugin, Attributes: csiAttrs}, cache.Attached, "", nil)
	w.asw.SetDeviceState(cache.VolumeIdentity{Name: volume.SharedName(csiPlugin, "csi-handle")}, cache.DeviceGloballyMounted, "", "/staging")
	w.mounted(volume.SharedName(csiPlugin, "csi-handle"), csiPlugin, csiAttrs, "pv-data", cache.Mounted)
	w.mounted(mem, emptyDirPlugin, volume.Attributes{}, "mem", cache.Mounted)
	p, dsw, asw = w.snapshots()
	got = View(p, dsw, asw, errs, w.paths)
	if !got.Ready || got.Message != "" {
		t.Fatalf("not ready: %s", got.Message)
	}
	for _, c := range got.Containers {
		for _, m := range c.Mounts {
			if m.HostPath == "" {
				t.Errorf("%s %s: no host path although ready", c.Name, m.ContainerPath)
			}
		}
	}
	if m := got.Containers[1].Mounts[3]; m.HostPath != w.paths.SubPathTarget(w.pod.UID, localPlugin, "pv-content", "app", 3) {
		t.Errorf("sub-path mount %+v, want the prepared target", m)
	}
}

// Waiting for a device mount, a failed volume-wide operation, a failed
// sub-path, an invalid sub-path.
func TestViewReasons(t *testing.T) {
	fsMode := v1.PersistentVolumeFilesystem
	devAttrs := volume.Attributes{Identity: "dev", DeviceMountable: true}
	sub := volume.SubPath{Container: "app", Index: 0, MountPath: "/x", Path: "x"}
	for _, tc := range []struct {
		name         string
		setup        func(w *world) lastErrors
		reason, text string
	}{
		{"device not staged", func(w *world) lastErrors {
			w.volume("v", localPlugin, devAttrs, spec("pv", fsMode, false))
			return nil
		}, runtimeapi.ReasonWaitingForDevice, ""},
		{"staging failed", func(w *world) lastErrors {
			n := w.volume("v", localPlugin, devAttrs, spec("pv", fsMode, false))
			return lastErrors{{Volume: n}: errors.New("mkfs failed")}
		}, runtimeapi.ReasonMountFailed, "mkfs failed"},
		{"sub-path failed", func(w *world) lastErrors {
			n := w.volume("v", emptyDirPlugin, volume.Attributes{}, spec("v", fsMode, false), sub)
			w.mounted(n, emptyDirPlugin, volume.Attributes{}, "v", cache.Mounted)
			return lastErrors{{Volume: n, Pod: w.pod.UID}: errors.New("leaves the volume")}
		}, runtimeapi.ReasonSubPathFailed, "leaves the volume"},
		{"invalid sub-path", func(w *world) lastErrors {
			n := w.volume("v", emptyDirPlugin, volume.Attributes{}, spec("v", fsMode, false))
			w.mounted(n, emptyDirPlugin, volume.Attributes{}, "v", cache.Mounted)
			w.errs = []*volume.PodVolumeError{{Pod: w.pod.PodRef, Volume: "v", Reason: "InvalidSubPath", Err: errors.New(`container "app" volumeMount at /x: missing value for POD`)}}
			return nil
		}, "InvalidSubPath", "missing value for POD"},
		{"uncertain mount", func(w *world) lastErrors {
			n := w.volume("v", emptyDirPlugin, volume.Attributes{}, spec("v", fsMode, false))
			w.mounted(n, emptyDirPlugin, volume.Attributes{}, "v", cache.MountUncertain)
			return nil
		}, runtimeapi.ReasonWaitingForMount, "may have been left half done"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld("u")
			w.containers = []volume.Container{{Name: "app", Type: volume.RegularContainer, Mounts: []volume.ContainerMount{{Volume: "v", MountPath: "/x"}}}}
			errs := tc.setup(w)
			p, dsw, asw := w.snapshots()
			got := View(p, dsw, asw, errs, w.paths)
			v := got.Volumes[0]
			if got.Ready || v.Ready || v.Reason != tc.reason || !strings.Contains(v.Message, tc.text) {
				t.Errorf("volume %+v, want reason %s saying %q", v, tc.reason, tc.text)
			}
			if got.Containers[0].Mounts[0].HostPath != "" {
				t.Errorf("a mount of a volume that is not ready has a host path: %+v", got.Containers[0].Mounts[0])
			}
		})
	}
}

// The API says ready exactly when the pod's VolumesReady condition is True:
// on random worlds, both from the same snapshots.
func TestViewAgreesWithVolumesReady(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	states := []cache.MountState{"", cache.Mounted, cache.MountUncertain}
	ready := 0
	for i := range 2000 {
		w := newWorld(fmt.Sprintf("u%d", i))
		var mounts []volume.ContainerMount
		errs := lastErrors{}
		for v := range r.IntN(4) + 1 {
			outer := fmt.Sprintf("v%d", v)
			var subs []volume.SubPath
			if r.IntN(3) == 0 {
				subs = []volume.SubPath{{Container: "app", Index: v, MountPath: "/" + outer, Path: "s"}}
			}
			n := w.volume(outer, emptyDirPlugin, volume.Attributes{}, spec(outer, v1.PersistentVolumeFilesystem, false), subs...)
			mounts = append(mounts, volume.ContainerMount{Volume: outer, Index: v, MountPath: "/" + outer})
			if s := states[r.IntN(len(states))]; s != "" {
				w.mounted(n, emptyDirPlugin, volume.Attributes{}, outer, s)
				if r.IntN(2) == 0 {
					w.asw.SetSubPaths(n, w.pod.UID, subs)
				}
			}
			if r.IntN(5) == 0 {
				errs[operations.Key{Volume: n, Pod: w.pod.UID}] = errors.New("boom")
			}
		}
		if r.IntN(6) == 0 {
			w.errs = []*volume.PodVolumeError{{Pod: w.pod.PodRef, Volume: "v0", Reason: "Invalid", Err: errors.New("bad")}}
		}
		w.containers = []volume.Container{{Name: "app", Type: volume.RegularContainer, Mounts: mounts}}
		p, dsw, asw := w.snapshots()
		view := View(p, dsw, asw, errs, w.paths)
		cond := podstatus.Compute(p, dsw, asw, errs)
		if view.Ready != (cond.Status == v1.ConditionTrue) {
			t.Fatalf("world %d: the API says ready=%v, the condition %s (%s)", i, view.Ready, cond.Status, cond.Message)
		}
		allReady := true
		for _, v := range view.Volumes {
			allReady = allReady && v.Ready
		}
		if view.Ready != allReady {
			t.Fatalf("world %d: pod ready=%v but volumes %+v", i, view.Ready, view.Volumes)
		}
		if view.Ready {
			ready++
		}
	}
	if ready == 0 || ready == 2000 {
		t.Errorf("%d of 2000 worlds ready: the test does not cover both", ready)
	}
}

// Volumes whose plugin says so (API data volumes) go to containers
// read-only, as with the kubelet.
func TestViewAPIVolumesReadOnly(t *testing.T) {
	for _, plugin := range []string{apivolume.ConfigMapName, apivolume.SecretName, apivolume.DownwardAPIName, apivolume.ProjectedName} {
		w := newWorld("u")
		n := w.volume("cfg", plugin, volume.Attributes{RequiresRemount: true, ReadOnlyForContainers: true}, spec("cfg", v1.PersistentVolumeFilesystem, false))
		w.mounted(n, plugin, volume.Attributes{RequiresRemount: true, ReadOnlyForContainers: true}, "cfg", cache.Mounted)
		w.containers = []volume.Container{{Name: "app", Type: volume.RegularContainer, Mounts: []volume.ContainerMount{{Volume: "cfg", MountPath: "/etc/cfg"}}}}
		p, dsw, asw := w.snapshots()
		got := View(p, dsw, asw, nil, w.paths)
		if !got.Ready || !got.Volumes[0].ReadOnly || !got.Containers[0].Mounts[0].ReadOnly || !got.Volumes[0].SELinuxRelabel {
			t.Errorf("%s: %+v %+v, want a read-only mount (relabelled)", plugin, got.Volumes[0], got.Containers[0].Mounts[0])
		}
	}
}
