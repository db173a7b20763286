package reconciler

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/internal/atomicfile"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/plugins/pluginstest"
	"github.com/volume-agent/volume-agent/volume"
)

// The tests of this file build real directory trees under a temporary root
// (real tmpfs mounts where the plugins check the mount table themselves)
// and compare what Reconstruct finds with the names the populator gives the
// same volumes: SharedName(plugin, identity) for shared volumes,
// PodScopedName(plugin, pod, spec name) otherwise, with the identity the
// plugin's own Attributes derives from the spec.

const (
	rcDriver = "rc.csi.example.com"
	rcNode   = "rc-node"
)

// rcWorld is a root directory with the agent's real plugins.
type rcWorld struct {
	t        *testing.T
	paths    volume.Paths
	host     string // where hostPath and local paths live
	plugins  *plugins.Registry
	byName   map[string]plugins.Plugin
	mounter  *mountutil.Mounter
	mounted  map[string]bool // the fake pod-mount table (see isMountPoint)
	failures map[string]error
}

func newRCWorld(t *testing.T) *rcWorld {
	t.Helper()
	w := &rcWorld{
		t: t, paths: volume.Paths{Root: mounttest.TempDir(t)}, host: mounttest.TempDir(t),
		mounter: mountutil.New(), mounted: map[string]bool{}, failures: map[string]error{},
	}
	host := plugins.Host{Paths: w.paths, Mounter: w.mounter, NodeName: rcNode, Log: zap.NewNop()}
	csiDrivers := map[string]*storagev1.CSIDriver{
		rcDriver: {ObjectMeta: metav1.ObjectMeta{Name: rcDriver}, Spec: storagev1.CSIDriverSpec{
			AttachRequired:       ptrTo(true),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral},
		}},
	}
	csi := csiplugin.New(csiplugin.Config{
		Host: host, Drivers: registry.New(zap.NewNop()), AttachMode: csiplugin.AttachSelf,
		CSIDriver: func(name string) (*storagev1.CSIDriver, error) {
			if d, ok := csiDrivers[name]; ok {
				return d, nil
			}
			return nil, apierrors.NewNotFound(schema.GroupResource{Group: "storage.k8s.io", Resource: "csidrivers"}, name)
		},
	})
	ps := []plugins.Plugin{emptydir.New(host), hostpath.New(host), local.New(host), csi}
	w.plugins = plugins.NewRegistry(ps...)
	w.byName = map[string]plugins.Plugin{}
	for _, p := range ps {
		w.byName[p.Name()] = p
	}
	return w
}

func ptrTo[T any](v T) *T { return &v }

// isMountPoint is the fake mount table for pod volume directories.
func (w *rcWorld) isMountPoint(path string) (bool, error) {
	if err := w.failures[path]; err != nil {
		return false, err
	}
	return w.mounted[path], nil
}

func (w *rcWorld) mkdir(path string) string {
	w.t.Helper()
	if err := os.MkdirAll(path, 0o750); err != nil {
		w.t.Fatal(err)
	}
	return path
}

func (w *rcWorld) writeFile(path, content string) {
	w.t.Helper()
	w.mkdir(filepath.Dir(path))
	if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
		w.t.Fatal(err)
	}
}

// podVolume creates a pod's volume directory; mounted marks it mounted in
// the fake table.
func (w *rcWorld) podVolume(uid types.UID, plugin, specName string, mounted bool) string {
	w.t.Helper()
	dir := w.mkdir(w.paths.PodVolumeDir(uid, plugin, specName))
	w.mounted[dir] = mounted
	return dir
}

// populatorName is the name the populator gives a pod's volume: the
// plugin's Attributes for the spec, then SharedName or PodScopedName
// (populator/resolve.go).
func (w *rcWorld) populatorName(uid types.UID, spec *volume.Spec) (volume.UniqueName, string, volume.Attributes) {
	w.t.Helper()
	p, err := w.plugins.ForSpec(spec)
	if err != nil {
		w.t.Fatal(err)
	}
	attrs, err := pluginstest.Attributes(w.t, p, spec)
	if err != nil {
		w.t.Fatalf("attributes of %s: %v", spec.Name, err)
	}
	if attrs.Shared() {
		return volume.SharedName(p.Name(), attrs.Identity), p.Name(), attrs
	}
	return volume.PodScopedName(p.Name(), uid, spec.Name), p.Name(), attrs
}

func emptyDirSpec(name string, medium v1.StorageMedium) *volume.Spec {
	vol := &v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: medium}}}
	return &volume.Spec{Name: name, Volume: vol, Mode: v1.PersistentVolumeFilesystem}
}

func hostPathSpec(name, path string) *volume.Spec {
	vol := &v1.Volume{Name: name, VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path}}}
	return &volume.Spec{Name: name, Volume: vol, Mode: v1.PersistentVolumeFilesystem}
}

func localSpec(pv, path string) *volume.Spec {
	p := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv}, Spec: v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: path}},
	}}
	return &volume.Spec{Name: pv, PV: p, Mode: v1.PersistentVolumeFilesystem}
}

func csiSpec(pv, handle string) *volume.Spec {
	p := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv}, Spec: v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: rcDriver, VolumeHandle: handle}},
	}}
	return &volume.Spec{Name: pv, PV: p, Mode: v1.PersistentVolumeFilesystem}
}

func csiInlineSpec(name string) *volume.Spec {
	vol := &v1.Volume{Name: name, VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: rcDriver}}}
	return &volume.Spec{Name: name, Volume: vol, Mode: v1.PersistentVolumeFilesystem, InlineEphemeral: true}
}

// csiPodState writes the state file CSI SetUp writes before NodePublish.
func (w *rcWorld) csiPodState(uid types.UID, spec *volume.Spec, name volume.UniqueName, staging string) {
	w.t.Helper()
	st := csiplugin.PodState{
		VolumeName: name, Driver: rcDriver, TargetPath: w.paths.PodVolumeDir(uid, csiplugin.Name, spec.Name),
		StagingPath: staging, SpecName: spec.Name, PodUID: string(uid),
	}
	if spec.PV != nil {
		st.VolumeID, st.PV = spec.PV.Spec.CSI.VolumeHandle, spec.PV.Name
	} else {
		// The plugin's names for an inline volume: its handle is unique
		// per pod and volume.
		sum := sha256.Sum256([]byte(string(uid) + spec.Name))
		st.Inline, st.VolumeID = true, "csi-"+hex.EncodeToString(sum[:])
		st.VolumeName = volume.PodScopedName(csiplugin.Name, uid, spec.Name)
	}
	if err := atomicfile.WriteJSON(w.paths.PodVolumeStateFile(uid, csiplugin.Name, spec.Name), st); err != nil {
		w.t.Fatal(err)
	}
}

// csiDeviceState writes the state file CSI MountDevice (or attach) writes
// before NodeStage (or ControllerPublish).
func (w *rcWorld) csiDeviceState(identity string, st csiplugin.DeviceState) {
	w.t.Helper()
	if err := atomicfile.WriteJSON(w.paths.VolumeStateFile(csiplugin.Name, identity), st); err != nil {
		w.t.Fatal(err)
	}
}

// mountTmpfs mounts a real tmpfs at dir (created): device reconstruction
// asks the kernel, not the fake table. Skips without root.
func (w *rcWorld) mountTmpfs(dir string) {
	w.t.Helper()
	mounttest.RequireRoot(w.t)
	w.mkdir(dir)
	mounttest.MountTmpfs(w.t, dir)
}

func (w *rcWorld) reconstruct() *Reconstruction {
	w.t.Helper()
	r, err := Reconstruct(w.paths, w.plugins, w.isMountPoint, w.isMountPoint)
	if err != nil {
		w.t.Fatalf("Reconstruct: %v", err)
	}
	return r
}

// rcPod is the expected reconstructed mount of a pod.
func rcPod(uid types.UID, specName, path string, foundMounted bool) *cache.ActualPodMount {
	return &cache.ActualPodMount{
		Pod: volume.PodRef{UID: uid}, SpecName: specName, MountPath: path,
		State: cache.MountUncertain, Reconstructed: true, FoundMounted: foundMounted,
	}
}

// rcVolume is the expected reconstructed volume without a device mount.
func rcVolume(name volume.UniqueName, plugin string, attrs volume.Attributes, pods ...*cache.ActualPodMount) *cache.ActualVolume {
	v := &cache.ActualVolume{Name: name, Plugin: plugin, Attributes: attrs, DeviceState: cache.DeviceNotMounted,
		Pods: map[types.UID]*cache.ActualPodMount{}}
	for _, p := range pods {
		v.Pods[p.Pod.UID] = p
	}
	return v
}

func rcJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

func checkVolumes(t *testing.T, got, want []*cache.ActualVolume) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("reconstructed volumes:\n%s\nwant:\n%s", rcJSON(got), rcJSON(want))
	}
}

func checkNoProblems(t *testing.T, r *Reconstruction) {
	t.Helper()
	if len(r.Problems) > 0 {
		t.Errorf("unexpected problems: %s", rcJSON(r.Problems))
	}
}

func TestReconstructEmptyDir(t *testing.T) {
	w := newRCWorld(t)
	disk, mem := emptyDirSpec("scratch", v1.StorageMediumDefault), emptyDirSpec("cache", v1.StorageMediumMemory)
	diskDir := w.podVolume("pod-a", emptydir.Name, "scratch", false)
	memDir := w.podVolume("pod-a", emptydir.Name, "cache", true)
	// Another pod's volume of the same name is another volume.
	otherDir := w.podVolume("pod-b", emptydir.Name, "scratch", false)
	r := w.reconstruct()
	checkNoProblems(t, r)

	diskName, plugin, attrs := w.populatorName("pod-a", disk)
	memName, _, memAttrs := w.populatorName("pod-a", mem)
	otherName, _, _ := w.populatorName("pod-b", disk)
	want := []*cache.ActualVolume{
		rcVolume(memName, plugin, memAttrs, rcPod("pod-a", "cache", memDir, true)),
		rcVolume(diskName, plugin, attrs, rcPod("pod-a", "scratch", diskDir, false)),
		rcVolume(otherName, plugin, attrs, rcPod("pod-b", "scratch", otherDir, false)),
	}
	slices.SortFunc(want, func(a, b *cache.ActualVolume) int { return strings.Compare(string(a.Name), string(b.Name)) })
	checkVolumes(t, r.Volumes, want)
}

func TestReconstructHostPath(t *testing.T) {
	w := newRCWorld(t)
	dir := w.podVolume("pod-a", hostpath.Name, "host", true)
	// A hostPath of a file, socket or device is mounted on a file.
	file := w.paths.PodVolumeDir("pod-a", hostpath.Name, "sock")
	w.writeFile(file, "")
	w.mounted[file] = true
	r := w.reconstruct()
	checkNoProblems(t, r)

	dirName, plugin, attrs := w.populatorName("pod-a", hostPathSpec("host", w.host))
	hostFile := filepath.Join(w.host, "file")
	w.writeFile(hostFile, "")
	fileName, _, _ := w.populatorName("pod-a", hostPathSpec("sock", hostFile))
	checkVolumes(t, r.Volumes, []*cache.ActualVolume{
		rcVolume(dirName, plugin, attrs, rcPod("pod-a", "host", dir, true)),
		rcVolume(fileName, plugin, attrs, rcPod("pod-a", "sock", file, true)),
	})
}

// A local PV on a directory has no global mount: one shared volume with the
// pods' bind mounts.
func TestReconstructLocalDirectory(t *testing.T) {
	w := newRCWorld(t)
	w.mkdir(filepath.Join(w.host, "data"))
	a := w.podVolume("pod-a", local.Name, "pv-dir", true)
	b := w.podVolume("pod-b", local.Name, "pv-dir", false)
	r := w.reconstruct()
	checkNoProblems(t, r)

	name, plugin, attrs := w.populatorName("pod-a", localSpec("pv-dir", filepath.Join(w.host, "data")))
	if attrs.DeviceMountable {
		t.Fatal("a local directory PV must not be device-mountable")
	}
	checkVolumes(t, r.Volumes, []*cache.ActualVolume{
		rcVolume(name, plugin, attrs, rcPod("pod-a", "pv-dir", a, true), rcPod("pod-b", "pv-dir", b, false)),
	})
}

// A local PV on a block device has a global mount: the device mount is
// reconstructed from <root>/plugins/kubernetes.io~local-volume/mounts/<pv>,
// mounted or not, with or without pods.
func TestReconstructLocalBlock(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		globalMounted        bool
		withPods, podMounted bool
	}{
		{"global mount and pod mount", true, true, true},
		{"global mount, pod mount missing", true, true, false},
		{"global mount without pods", true, false, false},
		{"global mount directory left unmounted", false, true, false},
		{"global mount directory only", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newRCWorld(t)
			global := w.paths.DeviceMountPath(local.Name, "pv-blk")
			if tc.globalMounted {
				w.mountTmpfs(global)
			} else {
				w.mkdir(global)
			}
			var pods []*cache.ActualPodMount
			if tc.withPods {
				dir := w.podVolume("pod-a", local.Name, "pv-blk", tc.podMounted)
				pods = append(pods, rcPod("pod-a", "pv-blk", dir, tc.podMounted))
			}
			r := w.reconstruct()
			checkNoProblems(t, r)

			// The populator names it from the PV on a block device.
			name, plugin := volume.SharedName(local.Name, "pv-blk"), local.Name
			attrs := volume.Attributes{Identity: "pv-blk", DeviceMountable: true}
			want := rcVolume(name, plugin, attrs, pods...)
			want.DeviceState, want.DeviceMountPath = cache.DeviceMountUncertain, global
			want.DeviceReconstructed, want.DeviceFoundMounted = true, tc.globalMounted
			checkVolumes(t, r.Volumes, []*cache.ActualVolume{want})
		})
	}
}

// The attributes a block device gets from the local plugin are what
// reconstruction records (so a pod found before its device is named and
// described the same way).
func TestReconstructLocalBlockMatchesAttributes(t *testing.T) {
	mounttest.RequireRoot(t)
	w := newRCWorld(t)
	loop := mounttest.LoopDevice(t, 16<<20)
	name, _, attrs := w.populatorName("pod-a", localSpec("pv-blk", loop))
	if !attrs.DeviceMountable {
		t.Fatalf("attributes of a local PV on %s: %+v, want device-mountable", loop, attrs)
	}
	w.mountTmpfs(w.paths.DeviceMountPath(local.Name, "pv-blk"))
	w.podVolume("pod-a", local.Name, "pv-blk", true)
	r := w.reconstruct()
	checkNoProblems(t, r)
	if len(r.Volumes) != 1 || r.Volumes[0].Name != name || r.Volumes[0].Attributes != attrs {
		t.Errorf("reconstructed %s, want %s with %+v", rcJSON(r.Volumes), name, attrs)
	}
}

// rcAttachment is the VolumeAttachment of handle-1 on the test node, by the
// name the plugin gives it.
var rcAttachment = csiplugin.AttachmentName("handle-1", rcDriver, rcNode)

// CSI volumes are named from the state files written before publishing and
// staging: the pod's, and the device's with its staging path and
// attachment.
func TestReconstructCSI(t *testing.T) {
	for _, tc := range []struct {
		name string
		// staged: the driver stages (a global mount is expected);
		// stagingMounted: it is in place.
		staged, stagingMounted bool
		attachment             string
		withPod, podMounted    bool
		wantDeviceFound        bool
	}{
		{name: "staged and published", staged: true, stagingMounted: true, attachment: rcAttachment, withPod: true, podMounted: true, wantDeviceFound: true},
		{name: "staged, publish lost", staged: true, stagingMounted: true, withPod: true, podMounted: false, wantDeviceFound: true},
		{name: "staging mount lost", staged: true, stagingMounted: false, withPod: true, podMounted: false, wantDeviceFound: false},
		{name: "staged, pod gone (unpublished before a crash)", staged: true, stagingMounted: true, attachment: rcAttachment, wantDeviceFound: true},
		{name: "driver without staging", staged: false, withPod: true, podMounted: true, wantDeviceFound: true},
		{name: "attached only (unstaged, attachment kept)", staged: false, attachment: rcAttachment, wantDeviceFound: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newRCWorld(t)
			spec := csiSpec("pv-csi", "handle-1")
			name, plugin, specAttrs := w.populatorName("pod-a", spec)
			identity := specAttrs.Identity
			staging := w.paths.DeviceMountPath(csiplugin.Name, identity)
			if tc.stagingMounted {
				w.mountTmpfs(staging)
			}
			w.csiDeviceState(identity, csiplugin.DeviceState{
				VolumeName: name, Driver: rcDriver, VolumeID: "handle-1", PV: "pv-csi",
				StagingPath: staging, Staged: tc.staged, Attachment: tc.attachment, AttachMode: csiplugin.AttachSelf,
			})
			var pods []*cache.ActualPodMount
			if tc.withPod {
				dir := w.podVolume("pod-a", csiplugin.Name, "pv-csi", tc.podMounted)
				w.csiPodState("pod-a", spec, name, staging)
				pods = append(pods, rcPod("pod-a", "pv-csi", dir, tc.podMounted))
			}
			r := w.reconstruct()
			checkNoProblems(t, r)

			attrs := volume.Attributes{Identity: identity, DeviceMountable: true, Attachable: tc.attachment != ""}
			want := rcVolume(name, plugin, attrs, pods...)
			want.DeviceState, want.DeviceMountPath = cache.DeviceMountUncertain, staging
			want.DeviceReconstructed, want.DeviceFoundMounted = true, tc.wantDeviceFound
			if tc.attachment != "" {
				want.AttachState = cache.AttachUncertain
			}
			checkVolumes(t, r.Volumes, []*cache.ActualVolume{want})
			if specAttrs.Identity != identity || !specAttrs.DeviceMountable {
				t.Errorf("populator attributes %+v", specAttrs)
			}
		})
	}
}

// A pod's CSI state file is written before the driver creates the target:
// a crash in between leaves the state file without the volume directory,
// and the volume must still be found (NodePublish may have happened).
func TestReconstructCSIStateWithoutVolumeDir(t *testing.T) {
	w := newRCWorld(t)
	spec := csiSpec("pv-csi", "handle-1")
	name, plugin, attrs := w.populatorName("pod-a", spec)
	w.csiPodState("pod-a", spec, name, "")
	// Leftovers of atomic writes and other files are not volumes.
	stateDir := filepath.Dir(w.paths.PodVolumeStateFile("pod-a", csiplugin.Name, "x"))
	w.writeFile(filepath.Join(stateDir, ".pv-other.json.tmp-123"), "{")
	w.writeFile(filepath.Join(stateDir, ".hidden.json"), "{")
	w.writeFile(filepath.Join(stateDir, "notes.txt"), "")

	inline := csiInlineSpec("eph")
	inlineName, _, inlineAttrs := w.populatorName("pod-b", inline)
	w.csiPodState("pod-b", inline, "", "")
	r := w.reconstruct()
	checkNoProblems(t, r)

	dir := w.paths.PodVolumeDir("pod-a", csiplugin.Name, "pv-csi")
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("reconstruction created %s (%v)", dir, err)
	}
	want := []*cache.ActualVolume{
		rcVolume(name, plugin, volume.Attributes{Identity: attrs.Identity, DeviceMountable: true}, rcPod("pod-a", "pv-csi", dir, false)),
		rcVolume(inlineName, plugin, inlineAttrs, rcPod("pod-b", "eph", w.paths.PodVolumeDir("pod-b", csiplugin.Name, "eph"), false)),
	}
	slices.SortFunc(want, func(a, b *cache.ActualVolume) int { return strings.Compare(string(a.Name), string(b.Name)) })
	checkVolumes(t, r.Volumes, want)
}

// Both the volume directory and the state file: one volume, not two.
func TestReconstructCSIDirAndStateOnce(t *testing.T) {
	w := newRCWorld(t)
	spec := csiSpec("pv-csi", "handle-1")
	name, _, _ := w.populatorName("pod-a", spec)
	w.podVolume("pod-a", csiplugin.Name, "pv-csi", true)
	w.csiPodState("pod-a", spec, name, "")
	r := w.reconstruct()
	checkNoProblems(t, r)
	if len(r.Volumes) != 1 || len(r.Volumes[0].Pods) != 1 || !r.Volumes[0].Pods["pod-a"].FoundMounted {
		t.Errorf("reconstructed %s", rcJSON(r.Volumes))
	}
}

// What cannot be named is a problem, left alone, and does not stop the
// rest from being reconstructed.
func TestReconstructProblems(t *testing.T) {
	w := newRCWorld(t)
	good := w.podVolume("pod-a", emptydir.Name, "scratch", false)

	unknown := w.podVolume("pod-a", "example.com/unknown", "vol", true)
	csiNoState := w.podVolume("pod-b", csiplugin.Name, "pv-x", true)
	// A device directory of CSI without (usable) state, one left empty by a
	// stage that was interrupted before anything was recorded (nothing to
	// undo: it is removed), and one of a plugin that has no device mounts.
	csiDevNoState := w.mkdir(filepath.Join(w.paths.VolumeDir(csiplugin.Name, "drv^gone"), "globalmount"))
	w.writeFile(filepath.Join(csiDevNoState, "data"), "x")
	csiDevNoState = filepath.Dir(csiDevNoState)
	csiDevEmpty := w.mkdir(filepath.Join(w.paths.VolumeDir(csiplugin.Name, "drv^interrupted"), "globalmount"))
	w.writeFile(filepath.Join(filepath.Dir(csiDevEmpty), ".state.json.tmp-42"), "{")
	csiDevCorrupt := w.mkdir(w.paths.VolumeDir(csiplugin.Name, "drv^corrupt"))
	w.writeFile(filepath.Join(csiDevCorrupt, "state.json"), "{not json")
	noDevices := w.mkdir(w.paths.VolumeDir(emptydir.Name, "what"))
	unknownDev := w.mkdir(w.paths.VolumeDir("example.com/unknown", "x"))
	// isMountPoint failing for a path.
	failing := w.podVolume("pod-c", emptydir.Name, "broken", false)
	w.failures[failing] = errors.New("stat: input/output error")
	// Not directories: ignored.
	w.writeFile(filepath.Join(w.paths.PodsDir(), "stray-file"), "")
	w.writeFile(filepath.Join(w.paths.PodVolumesDir("pod-d"), "stray-file"), "")
	// A plugin directory without mounts/ (the CSI registry socket dir,
	// say): nothing to reconstruct.
	w.mkdir(filepath.Join(w.paths.PluginDir("example.com/other"), "sockets"))

	r := w.reconstruct()
	got := map[string]Problem{}
	for _, p := range r.Problems {
		got[p.Path] = p
	}
	for _, want := range []struct {
		path   string
		pod    types.UID
		reason string
	}{
		{unknown, "pod-a", `volume plugin "example.com/unknown" is not available on this node`},
		{csiNoState, "pod-b", "no usable CSI state"},
		{csiDevNoState, "", "no usable CSI state"},
		{csiDevCorrupt, "", "corrupt"},
		{noDevices, "", "cannot reconstruct device mounts"},
		{unknownDev, "", "cannot reconstruct device mounts"},
		{failing, "pod-c", "input/output error"},
	} {
		p, ok := got[want.path]
		if !ok {
			t.Errorf("no problem reported for %s", want.path)
			continue
		}
		delete(got, want.path)
		if p.PodUID != want.pod || !strings.Contains(p.Reason, want.reason) {
			t.Errorf("problem %+v, want pod %q and a reason containing %q", p, want.pod, want.reason)
		}
	}
	for path, p := range got {
		t.Errorf("unexpected problem for %s: %+v", path, p)
	}
	name, _, attrs := w.populatorName("pod-a", emptyDirSpec("scratch", ""))
	checkVolumes(t, r.Volumes, []*cache.ActualVolume{rcVolume(name, emptydir.Name, attrs, rcPod("pod-a", "scratch", good, false))})

	if _, err := os.Lstat(filepath.Dir(csiDevEmpty)); err == nil {
		t.Errorf("%s (an interrupted first stage) was not removed", filepath.Dir(csiDevEmpty))
	}
	// Reconstruction left everything else in place.
	for _, p := range []string{unknown, csiNoState, csiDevNoState, csiDevCorrupt, noDevices, unknownDev, failing, good} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func TestReconstructEmptyRoot(t *testing.T) {
	w := newRCWorld(t)
	r := w.reconstruct()
	if len(r.Volumes) != 0 || len(r.Problems) != 0 {
		t.Errorf("empty root: %s", rcJSON(r))
	}
	w.mkdir(w.paths.PodsDir())
	w.mkdir(filepath.Join(w.paths.Root, "plugins"))
	if r := w.reconstruct(); len(r.Volumes) != 0 || len(r.Problems) != 0 {
		t.Errorf("empty pods and plugins directories: %s", rcJSON(r))
	}
}

// The agent uses the real mount table for pod directories too: tmpfs and
// bind mounts are found, directories are not.
func TestReconstructRealMountTable(t *testing.T) {
	mounttest.RequireRoot(t)
	w := newRCWorld(t)
	tmpfs := w.podVolume("pod-a", emptydir.Name, "mem", false)
	mounttest.MountTmpfs(t, tmpfs)
	dir := w.podVolume("pod-a", emptydir.Name, "disk", false)
	r, err := Reconstruct(w.paths, w.plugins, w.mounter.IsMountPoint, w.mounter.IsMountPoint)
	if err != nil {
		t.Fatal(err)
	}
	checkNoProblems(t, r)
	found := map[string]bool{}
	for _, v := range r.Volumes {
		for _, m := range v.Pods {
			found[m.MountPath] = m.FoundMounted
		}
	}
	if !reflect.DeepEqual(found, map[string]bool{tmpfs: true, dir: false}) {
		t.Errorf("found mounted: %v", found)
	}
}

// --- Adoptions ---

func rcDesired(vols ...*cache.DesiredVolume) *cache.DesiredSnapshot {
	s := &cache.DesiredSnapshot{Volumes: map[volume.UniqueName]*cache.DesiredVolume{}, Pods: map[types.UID]*cache.DesiredPod{}}
	for _, v := range vols {
		s.Volumes[v.Name] = v
		for uid, p := range v.Pods {
			dp := s.Pods[uid]
			if dp == nil {
				dp = &cache.DesiredPod{Pod: p.Pod}
				s.Pods[uid] = dp
			}
			dp.Volumes = append(dp.Volumes, v.Name)
		}
	}
	return s
}

func rcActual(vols ...*cache.ActualVolume) *cache.ActualSnapshot {
	s := &cache.ActualSnapshot{Volumes: map[volume.UniqueName]*cache.ActualVolume{}}
	for _, v := range vols {
		s.Volumes[v.Name] = v
	}
	return s
}

// rcWant is a desired volume of plugin wanted by pods with spec.
func rcWant(name volume.UniqueName, plugin string, attrs volume.Attributes, spec *volume.Spec, uids ...types.UID) *cache.DesiredVolume {
	v := &cache.DesiredVolume{Name: name, Plugin: plugin, Attributes: attrs, SpecName: spec.Name, Spec: spec,
		Pods: map[types.UID]*cache.DesiredPodVolume{}}
	for _, uid := range uids {
		v.Pods[uid] = &cache.DesiredPodVolume{
			Pod: volume.PodInfo{PodRef: volume.PodRef{UID: uid, Namespace: "ns", Name: "name-" + string(uid)}}, Spec: spec,
		}
	}
	return v
}

// rcFound is a reconstructed volume with reconstructed pod mounts; found
// maps each pod to whether its mount was in place.
func rcFound(name volume.UniqueName, plugin string, attrs volume.Attributes, found map[types.UID]bool) *cache.ActualVolume {
	v := rcVolume(name, plugin, attrs)
	for uid, mounted := range found {
		v.Pods[uid] = rcPod(uid, "spec", "/root/pods/"+string(uid), mounted)
	}
	return v
}

func withDevice(v *cache.ActualVolume, found bool) *cache.ActualVolume {
	v.DeviceState, v.DeviceMountPath, v.DeviceReconstructed, v.DeviceFoundMounted = cache.DeviceMountUncertain, "/global", true, found
	return v
}

// setUpWithoutMount is the agent's: it asks the plugin.
func rcSetUpWithoutMount(plugin string, spec *volume.Spec) bool {
	if plugin != emptydir.Name || spec == nil {
		return false
	}
	return (&emptydir.Plugin{}).SetUpWithoutMount(spec)
}

func rcRef(uid types.UID) volume.PodRef {
	return volume.PodRef{UID: uid, Namespace: "ns", Name: "name-" + string(uid)}
}

func TestAdoptions(t *testing.T) {
	var (
		diskSpec  = emptyDirSpec("disk", v1.StorageMediumDefault)
		memSpec   = emptyDirSpec("mem", v1.StorageMediumMemory)
		localSpec = localSpec("pv", "/data")
		shared    = volume.Attributes{Identity: "pv"}
		device    = volume.Attributes{Identity: "pv", DeviceMountable: true}
		memName   = volume.PodScopedName(emptydir.Name, "p1", "mem")
		diskName  = volume.PodScopedName(emptydir.Name, "p1", "disk")
		localName = volume.SharedName(local.Name, "pv")
	)
	tests := []struct {
		name   string
		dsw    *cache.DesiredSnapshot
		asw    *cache.ActualSnapshot
		noSUWM bool // no setUpWithoutMount function
		want   []Adoption
	}{
		{
			name: "found mounted and wanted: adopted",
			dsw:  rcDesired(rcWant(memName, emptydir.Name, volume.Attributes{}, memSpec, "p1")),
			asw:  rcActual(rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true})),
			want: []Adoption{{Volume: memName, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}}},
		},
		{
			name: "not found mounted but wanted: mounted again, not adopted",
			dsw:  rcDesired(rcWant(memName, emptydir.Name, volume.Attributes{}, memSpec, "p1")),
			asw:  rcActual(rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false})),
		},
		{
			name: "disk emptyDir (set up without a mount) found: adopted",
			dsw:  rcDesired(rcWant(diskName, emptydir.Name, volume.Attributes{}, diskSpec, "p1")),
			asw:  rcActual(rcFound(diskName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false})),
			want: []Adoption{{Volume: diskName, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}}},
		},
		{
			name:   "disk emptyDir without a setUpWithoutMount function: not adopted",
			dsw:    rcDesired(rcWant(diskName, emptydir.Name, volume.Attributes{}, diskSpec, "p1")),
			asw:    rcActual(rcFound(diskName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false})),
			noSUWM: true,
		},
		{
			name: "not wanted: not adopted",
			dsw:  rcDesired(),
			asw: rcActual(
				rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true}),
				rcFound(diskName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false}),
				withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), true),
			),
		},
		{
			name: "wanted by another pod only: the found pod is not adopted",
			dsw:  rcDesired(rcWant(localName, local.Name, shared, localSpec, "p2")),
			asw:  rcActual(rcFound(localName, local.Name, shared, map[types.UID]bool{"p1": true})),
		},
		{
			name: "shared volume: only the wanted pods whose mounts are in place",
			dsw:  rcDesired(rcWant(localName, local.Name, shared, localSpec, "p1", "p2", "p4")),
			asw: rcActual(func() *cache.ActualVolume {
				v := rcFound(localName, local.Name, shared, map[types.UID]bool{"p1": true, "p2": false, "p3": true})
				// p4's mount is known to this agent (not reconstructed).
				v.Pods["p4"] = &cache.ActualPodMount{Pod: rcRef("p4"), State: cache.MountUncertain, MountPath: "/p4"}
				return v
			}()),
			want: []Adoption{{Volume: localName, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}}},
		},
		{
			name: "device found mounted and wanted: device and pod adopted",
			dsw:  rcDesired(rcWant(localName, local.Name, device, localSpec, "p1")),
			asw:  rcActual(withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), true)),
			want: []Adoption{{Volume: localName, Device: true, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}}},
		},
		{
			name: "device found mounted, pod mount missing: device adopted alone",
			dsw:  rcDesired(rcWant(localName, local.Name, device, localSpec, "p1")),
			asw:  rcActual(withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": false}), true)),
			want: []Adoption{{Volume: localName, Device: true}},
		},
		{
			name: "device found mounted without pods, wanted by a new pod: device adopted",
			dsw:  rcDesired(rcWant(localName, local.Name, device, localSpec, "p9")),
			asw:  rcActual(withDevice(rcFound(localName, local.Name, device, nil), true)),
			want: []Adoption{{Volume: localName, Device: true}},
		},
		{
			name: "device not found mounted: not adopted (mounted again)",
			dsw:  rcDesired(rcWant(localName, local.Name, device, localSpec, "p1")),
			asw:  rcActual(withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), false)),
			want: []Adoption{{Volume: localName, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}}},
		},
		{
			name: "nothing reconstructed: nothing to adopt",
			dsw:  rcDesired(rcWant(memName, emptydir.Name, volume.Attributes{}, memSpec, "p1")),
			asw: rcActual(&cache.ActualVolume{Name: memName, Plugin: emptydir.Name, DeviceState: cache.DeviceGloballyMounted,
				Pods: map[types.UID]*cache.ActualPodMount{"p1": {Pod: rcRef("p1"), State: cache.MountUncertain, FoundMounted: true}}}),
		},
		{
			name: "several volumes: sorted by name",
			dsw: rcDesired(
				rcWant(memName, emptydir.Name, volume.Attributes{}, memSpec, "p1"),
				rcWant(diskName, emptydir.Name, volume.Attributes{}, diskSpec, "p1"),
				rcWant(localName, local.Name, device, localSpec, "p1"),
			),
			asw: rcActual(
				rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true}),
				rcFound(diskName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false}),
				withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), true),
			),
			want: []Adoption{
				{Volume: diskName, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}},
				{Volume: memName, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}},
				{Volume: localName, Device: true, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			suwm := rcSetUpWithoutMount
			if tc.noSUWM {
				suwm = nil
			}
			before := rcJSON(tc.asw) + rcJSON(tc.dsw)
			got := stripAdoptions(Adoptions(tc.dsw, tc.asw, suwm))
			if len(got) != 0 || len(tc.want) != 0 {
				if !reflect.DeepEqual(got, tc.want) {
					t.Errorf("adoptions:\n%s\nwant:\n%s", rcJSON(got), rcJSON(tc.want))
				}
			}
			if rcJSON(tc.asw)+rcJSON(tc.dsw) != before {
				t.Error("Adoptions modified its inputs")
			}
		})
	}
}

// Adopting (through the ASW, as the agent does) makes found state mounted
// and leaves nothing reconstructed that a pod wants; what is left is what
// must be mounted again or torn down.
func TestAdoptionsApplied(t *testing.T) {
	asw := cache.NewActualStateOfWorld(clock.RealClock{})
	memName := volume.PodScopedName(emptydir.Name, "p1", "mem")
	lostName := volume.PodScopedName(emptydir.Name, "p1", "lost")
	goneName := volume.PodScopedName(emptydir.Name, "gone", "mem")
	localName := volume.SharedName(local.Name, "pv")
	device := volume.Attributes{Identity: "pv", DeviceMountable: true}
	asw.AddReconstructed([]*cache.ActualVolume{
		rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true}),
		rcFound(lostName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false}),
		rcFound(goneName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"gone": true}),
		withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true, "gone": true}), true),
	})
	memSpec := emptyDirSpec("mem", v1.StorageMediumMemory)
	dsw := rcDesired(
		rcWant(memName, emptydir.Name, volume.Attributes{}, memSpec, "p1"),
		rcWant(lostName, emptydir.Name, volume.Attributes{}, emptyDirSpec("lost", v1.StorageMediumMemory), "p1"),
		rcWant(localName, local.Name, device, localSpec("pv", "/dev/x"), "p1"),
	)
	h := &OperatorHandler{Operator: &operations.Operator{ASW: asw, Log: zap.NewNop()}}
	for _, a := range Adoptions(dsw, asw.Snapshot(), rcSetUpWithoutMount) {
		h.Adopt(a)
	}
	s := asw.Snapshot()
	if m := s.Volumes[memName].Pods["p1"]; m.State != cache.Mounted || m.Reconstructed || m.Pod != rcRef("p1") {
		t.Errorf("adopted mount: %+v", m)
	}
	if v := s.Volumes[localName]; v.DeviceState != cache.DeviceGloballyMounted || v.DeviceReconstructed ||
		v.Pods["p1"].State != cache.Mounted || !v.Pods["gone"].Reconstructed {
		t.Errorf("adopted device volume: %s", rcJSON(v))
	}
	if m := s.Volumes[lostName].Pods["p1"]; m.State != cache.MountUncertain || !m.Reconstructed {
		t.Errorf("mount not in place: %+v", m)
	}
	// What was guessed from disk gives way to what the pods want: teardown
	// later knows the spec as if the agent had mounted the volume itself.
	if v := s.Volumes[memName]; v.Spec != memSpec || v.Pods["p1"].Spec != memSpec {
		t.Errorf("adopted volume's spec %p and mount's spec %p, want the desired %p", v.Spec, v.Pods["p1"].Spec, memSpec)
	}
	if v := s.Volumes[localName]; v.Spec != dsw.Volumes[localName].Spec || v.Attributes != device {
		t.Errorf("adopted device volume: spec %+v, attributes %+v", v.Spec, v.Attributes)
	}
	if !HasReconstructed(s) {
		t.Error("HasReconstructed is false with unmatched state left")
	}
	// The plan mounts what was not in place and, once orphans may be
	// cleaned, tears down what no pod wants; adopted state needs nothing.
	acts := rcActs(Plan(dsw, s, PlanOptions{SourcesReady: true, OrphanCleanupAllowed: true}))
	want := []string{
		"unmount_volume " + string(goneName) + " gone",
		"unmount_volume " + string(localName) + " gone",
		"mount_volume " + string(lostName) + " p1",
	}
	if !reflect.DeepEqual(acts, want) {
		t.Errorf("plan after adoption: %q, want %q", acts, want)
	}
}

func rcActs(actions []Action) []string {
	out := []string{}
	for _, a := range actions {
		s := string(a.Op) + " " + string(a.Volume)
		if a.Pod.UID != "" {
			s += " " + string(a.Pod.UID)
		}
		out = append(out, s)
	}
	return out
}

// --- Plan and reconstructed state ---

// Until orphans may be cleaned, nothing reconstructed is torn down while
// state the agent itself recorded is; once allowed, everything unwanted is.
func TestPlanLeavesReconstructedStateUntilOrphanCleanupAllowed(t *testing.T) {
	uncertainMount := func(uid types.UID, reconstructed bool) *cache.ActualPodMount {
		return &cache.ActualPodMount{Pod: volume.PodRef{UID: uid}, SpecName: "v", MountPath: "/pods/" + string(uid),
			State: cache.MountUncertain, Reconstructed: reconstructed, FoundMounted: reconstructed}
	}
	vol := func(name string, attrs volume.Attributes, mounts ...*cache.ActualPodMount) *cache.ActualVolume {
		v := &cache.ActualVolume{Name: volume.UniqueName(name), Plugin: "test", Attributes: attrs, DeviceState: cache.DeviceNotMounted,
			Pods: map[types.UID]*cache.ActualPodMount{}}
		for _, m := range mounts {
			v.Pods[m.Pod.UID] = m
		}
		return v
	}
	dev := volume.Attributes{Identity: "d", DeviceMountable: true, Attachable: true}
	recDevice := vol("test/rec-device", dev)
	recDevice.DeviceState, recDevice.DeviceReconstructed, recDevice.DeviceFoundMounted = cache.DeviceMountUncertain, true, true
	recDevice.AttachState = cache.AttachUncertain
	recAttachOnly := vol("test/rec-attached", dev)
	recAttachOnly.DeviceReconstructed, recAttachOnly.AttachState = true, cache.AttachUncertain
	ownDevice := vol("test/own-device", dev)
	ownDevice.DeviceState = cache.DeviceGloballyMounted
	ownAttached := vol("test/own-attached", dev)
	ownAttached.AttachState = cache.Attached
	mixed := vol("test/shared", volume.Attributes{Identity: "s"}, uncertainMount("rec", true), uncertainMount("own", false))
	mixed.Pods["own"].State = cache.Mounted
	asw := rcActual(
		vol("test/rec-pod", volume.Attributes{}, uncertainMount("rec", true)),
		vol("test/own-pod", volume.Attributes{}, uncertainMount("own", false)),
		mixed, recDevice, recAttachOnly, ownDevice, ownAttached,
	)
	dsw := rcDesired()

	plan := func(opts PlanOptions) []string { return rcActs(Plan(dsw, asw, opts)) }
	if got := plan(PlanOptions{}); len(got) != 0 {
		t.Errorf("sources not ready: %q, want nothing", got)
	}
	got := plan(PlanOptions{SourcesReady: true})
	want := []string{
		"unmount_volume test/own-pod own",
		"unmount_volume test/shared own",
		"detach_volume test/own-attached",
		"unmount_device test/own-device",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("orphan cleanup not allowed:\n got %q\nwant %q", got, want)
	}
	got = plan(PlanOptions{SourcesReady: true, OrphanCleanupAllowed: true})
	want = []string{
		"unmount_volume test/own-pod own",
		"unmount_volume test/rec-pod rec",
		"unmount_volume test/shared own",
		"unmount_volume test/shared rec",
		"detach_volume test/own-attached",
		"unmount_device test/own-device",
		"detach_volume test/rec-attached",
		"unmount_device test/rec-device",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("orphan cleanup allowed:\n got %q\nwant %q", got, want)
	}
}

// Over random worlds: without OrphanCleanupAllowed no action ever tears down
// a reconstructed mount or device, and with it the set of teardown actions
// is exactly the allowed one plus the reconstructed state nobody wants.
func TestPlanNeverTearsDownReconstructedWithoutOrphanCleanup(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for i := range 2000 {
		dsw, asw := rcRandomWorld(r)
		blocked := Plan(dsw, asw, PlanOptions{SourcesReady: true})
		for _, a := range blocked {
			av := asw.Volumes[a.Volume]
			switch a.Op {
			case operations.OpUnmountVolume:
				if m := av.Pods[a.Pod.UID]; m != nil && m.Reconstructed {
					t.Fatalf("world %d: %s of a reconstructed mount: %+v", i, a.Op, m)
				}
			case operations.OpUnmountDevice, operations.OpDetachVolume:
				if av.DeviceReconstructed {
					t.Fatalf("world %d: %s of a reconstructed device", i, a.Op)
				}
			}
		}
		allowed := Plan(dsw, asw, PlanOptions{SourcesReady: true, OrphanCleanupAllowed: true})
		// Mount-side actions never depend on orphan cleanup.
		if mb, ma := rcMountSide(blocked), rcMountSide(allowed); !reflect.DeepEqual(mb, ma) {
			t.Fatalf("world %d: mount-side actions differ: %q vs %q", i, mb, ma)
		}
		if len(allowed) < len(blocked) {
			t.Fatalf("world %d: allowing orphan cleanup removed actions", i)
		}
	}
}

func rcMountSide(actions []Action) []string {
	var out []string
	for _, s := range rcActs(actions) {
		if !strings.HasPrefix(s, "unmount_") && !strings.HasPrefix(s, "detach_") {
			out = append(out, s)
		}
	}
	return out
}

func rcRandomWorld(r *rand.Rand) (*cache.DesiredSnapshot, *cache.ActualSnapshot) {
	dsw := rcDesired()
	asw := rcActual()
	pods := []types.UID{"p0", "p1", "p2", "p3"}
	for i := range 6 {
		name := volume.UniqueName(fmt.Sprintf("test/v%d", i))
		attrs := volume.Attributes{}
		switch r.IntN(3) {
		case 1:
			attrs = volume.Attributes{Identity: string(name), DeviceMountable: true}
		case 2:
			attrs = volume.Attributes{Identity: string(name), DeviceMountable: true, Attachable: true}
		}
		spec := &volume.Spec{Name: fmt.Sprintf("v%d", i)}
		var wanted []types.UID
		for _, p := range pods {
			if r.IntN(3) == 0 {
				wanted = append(wanted, p)
			}
		}
		if len(wanted) > 0 {
			dv := rcWant(name, "test", attrs, spec, wanted...)
			dsw.Volumes[name] = dv
		}
		if r.IntN(4) == 0 {
			continue
		}
		av := rcVolume(name, "test", attrs)
		for _, p := range pods {
			if r.IntN(2) == 0 {
				continue
			}
			m := rcPod(p, spec.Name, "/pods/"+string(p), r.IntN(2) == 0)
			m.Reconstructed = r.IntN(2) == 0
			if !m.Reconstructed && r.IntN(2) == 0 {
				m.State = cache.Mounted
			}
			av.Pods[p] = m
		}
		if attrs.DeviceMountable {
			av.DeviceState = []cache.DeviceMountState{cache.DeviceNotMounted, cache.DeviceMountUncertain, cache.DeviceGloballyMounted}[r.IntN(3)]
			av.DeviceReconstructed = av.DeviceState == cache.DeviceMountUncertain && r.IntN(2) == 0
			av.DeviceFoundMounted = av.DeviceReconstructed && r.IntN(2) == 0
		}
		if attrs.Attachable {
			av.AttachState = []cache.AttachState{cache.NotAttached, cache.AttachUncertain, cache.Attached}[r.IntN(3)]
		}
		asw.Volumes[name] = av
	}
	for _, dv := range dsw.Volumes {
		for uid, p := range dv.Pods {
			if dsw.Pods[uid] == nil {
				dsw.Pods[uid] = &cache.DesiredPod{Pod: p.Pod}
			}
			dsw.Pods[uid].Volumes = append(dsw.Pods[uid].Volumes, dv.Name)
		}
	}
	return dsw, asw
}

// Before the sources are ready, reconstructed state is neither torn down
// nor set up again: a pod already in a partially populated DSW must not get
// a mount operation for a volume the first ready pass will adopt. New
// volumes are mounted as usual.
func TestPlanLeavesReconstructedStateUntilSourcesReady(t *testing.T) {
	memName := volume.PodScopedName(emptydir.Name, "p1", "mem")
	lostName := volume.PodScopedName(emptydir.Name, "p1", "lost")
	newName := volume.PodScopedName(emptydir.Name, "p1", "new")
	localName := volume.SharedName(local.Name, "pv")
	device := volume.Attributes{Identity: "pv", DeviceMountable: true}
	dsw := rcDesired(
		rcWant(memName, emptydir.Name, volume.Attributes{}, emptyDirSpec("mem", v1.StorageMediumMemory), "p1"),
		rcWant(lostName, emptydir.Name, volume.Attributes{}, emptyDirSpec("lost", v1.StorageMediumMemory), "p1"),
		rcWant(newName, emptydir.Name, volume.Attributes{}, emptyDirSpec("new", v1.StorageMediumMemory), "p1"),
		rcWant(localName, local.Name, device, localSpec("pv", "/dev/x"), "p1"),
	)
	asw := rcActual(
		rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true}),
		rcFound(lostName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false}),
		withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), false),
	)
	if got, want := rcActs(Plan(dsw, asw, PlanOptions{})), []string{"mount_volume " + string(newName) + " p1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("sources not ready: %q, want %q", got, want)
	}
	// Once ready (after adoption, which finds nothing to adopt here but
	// the mem mount), what was not in place is mounted again.
	got := rcActs(Plan(dsw, asw, PlanOptions{SourcesReady: true}))
	want := []string{
		"mount_volume " + string(lostName) + " p1",
		"mount_volume " + string(memName) + " p1",
		"mount_volume " + string(newName) + " p1",
		"mount_device " + string(localName),
	}
	slices.Sort(got)
	slices.Sort(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sources ready, nothing adopted: %q, want %q", got, want)
	}
}

// rcHandler records the actions the reconciler dispatches and runs none, and
// adopts through the ASW, as the agent's handler does.
type rcHandler struct {
	asw     *cache.ActualStateOfWorld
	ops     []string
	adopted []Adoption
}

func (h *rcHandler) Operation(a *Action) *operations.Operation {
	h.ops = append(h.ops, rcActs([]Action{*a})[0])
	return nil
}

func (h *rcHandler) Adopt(a Adoption) {
	h.adopted = append(h.adopted, a)
	(&OperatorHandler{Operator: &operations.Operator{ASW: h.asw, Log: zap.NewNop()}}).Adopt(a)
}

// The reconciler's passes after a restart: before the sources are ready
// nothing reconstructed is touched; the first ready pass adopts what pods
// want without dispatching any operation for it; what no pod wants waits for
// complete sources; housekeeping waits until nothing reconstructed is left.
func TestReconcilerAdoptsAtFirstReadyPass(t *testing.T) {
	clk := clock.RealClock{}
	dsw, asw := cache.NewDesiredStateOfWorld(clk), cache.NewActualStateOfWorld(clk)
	memName := volume.PodScopedName(emptydir.Name, "p1", "mem")
	diskName := volume.PodScopedName(emptydir.Name, "p1", "disk")
	goneName := volume.PodScopedName(emptydir.Name, "gone", "mem")
	localName := volume.SharedName(local.Name, "pv")
	device := volume.Attributes{Identity: "pv", DeviceMountable: true}
	asw.AddReconstructed([]*cache.ActualVolume{
		rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true}),
		rcFound(diskName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false}),
		rcFound(goneName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"gone": true}),
		withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), true),
	})
	pod := volume.PodInfo{PodRef: rcRef("p1")}
	dsw.SetPod(pod, []cache.PodVolume{
		{Name: memName, Plugin: emptydir.Name, OuterName: "mem", Spec: emptyDirSpec("mem", v1.StorageMediumMemory)},
		{Name: diskName, Plugin: emptydir.Name, OuterName: "disk", Spec: emptyDirSpec("disk", v1.StorageMediumDefault)},
		{Name: localName, Plugin: local.Name, Attributes: device, OuterName: "pv", Spec: localSpec("pv", "/dev/x")},
	}, nil, nil)

	ready, complete, housekeeping := false, false, 0
	h := &rcHandler{asw: asw}
	r := New(Options{
		DSW: dsw, ASW: asw, Executor: operations.NewExecutor(operations.ExecutorOptions{}),
		Handler: h, SetUpWithoutMount: rcSetUpWithoutMount,
		SourcesReady: func() bool { return ready }, SourcesComplete: func() bool { return complete },
		Housekeeping: func(*cache.DesiredSnapshot, *cache.ActualSnapshot) { housekeeping++ },
		Clock:        clk,
	})

	r.ReconcileOnce()
	if len(h.ops) != 0 || len(h.adopted) != 0 {
		t.Fatalf("before the sources are ready: dispatched %q, adopted %v", h.ops, h.adopted)
	}

	ready = true
	r.ReconcileOnce()
	if len(h.ops) != 0 {
		t.Errorf("first ready pass dispatched %q, want nothing (adopt, and orphans wait for complete sources)", h.ops)
	}
	want := []Adoption{
		{Volume: diskName, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}},
		{Volume: memName, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}},
		{Volume: localName, Device: true, Pods: map[types.UID]AdoptedPod{"p1": {Pod: rcRef("p1")}}},
	}
	if got := stripAdoptions(h.adopted); !reflect.DeepEqual(got, want) {
		t.Errorf("adopted %s, want %s", rcJSON(got), rcJSON(want))
	}
	mounts := asw.PodMounts("p1")
	if len(mounts) != 3 {
		t.Errorf("after adoption, p1 has %d mounts, want 3", len(mounts))
	}
	for _, m := range mounts {
		if m.State != cache.Mounted || m.Reconstructed {
			t.Errorf("after adoption: %+v", m)
		}
	}
	if housekeeping != 0 {
		t.Error("housekeeping ran before the sources were complete")
	}

	complete = true
	r.ReconcileOnce()
	if want := []string{"unmount_volume " + string(goneName) + " gone"}; !reflect.DeepEqual(h.ops, want) {
		t.Errorf("with complete sources: dispatched %q, want %q", h.ops, want)
	}
	if len(h.adopted) != 3 {
		t.Errorf("adopted again: %v", h.adopted)
	}
	if housekeeping != 0 {
		t.Error("housekeeping ran while reconstructed state was left")
	}
	// The orphan torn down (as the operation would record it): the agent
	// is idle and housekeeping runs.
	asw.DeletePodMount(goneName, "gone")
	h.ops = nil
	r.ReconcileOnce()
	if len(h.ops) != 0 || housekeeping != 1 {
		t.Errorf("idle pass: dispatched %q, housekeeping ran %d times", h.ops, housekeeping)
	}
}

// stripAdoptions keeps what the tables compare: which volume, whether the
// device, and which pods (by reference) were adopted.
func stripAdoptions(as []Adoption) []Adoption {
	out := make([]Adoption, 0, len(as))
	for _, a := range as {
		b := Adoption{Volume: a.Volume, Device: a.Device}
		for uid, p := range a.Pods {
			if b.Pods == nil {
				b.Pods = map[types.UID]AdoptedPod{}
			}
			b.Pods[uid] = AdoptedPod{Pod: p.Pod}
		}
		out = append(out, b)
	}
	return out
}

// Raw block access points under <root>/pods/<uid>/volumeDevices are
// reconstructed as Block volumes named as the populator names them; the
// mapping check (a pinned block device) decides whether they were found in
// place. A CSI block volume whose access point is gone but whose state is
// left is reconstructed at its access point path, not a volume directory.
func TestReconstructBlockAccessPoints(t *testing.T) {
	w := newRCWorld(t)
	mapped := w.paths.PodDevicePath("pod-a", local.Name, "pv-blk")
	notMapped := w.paths.PodDevicePath("pod-b", local.Name, "pv-blk")
	for _, ap := range []string{mapped, notMapped} {
		w.writeFile(ap, "")
	}
	w.mounted[mapped] = true

	spec := csiSpec("pv-cblk", "handle-b")
	spec.Mode = v1.PersistentVolumeBlock
	cname, _, cattrs := w.populatorName("pod-c", spec)
	st := csiplugin.PodState{VolumeName: cname, Driver: rcDriver, VolumeID: "handle-b", PV: "pv-cblk",
		TargetPath: w.paths.PodDevicePath("pod-c", csiplugin.Name, "pv-cblk"), SpecName: "pv-cblk", PodUID: "pod-c", Block: true}
	if err := atomicfile.WriteJSON(w.paths.PodVolumeStateFile("pod-c", csiplugin.Name, "pv-cblk"), st); err != nil {
		t.Fatal(err)
	}

	r := w.reconstruct()
	checkNoProblems(t, r)
	if !cattrs.Block {
		t.Fatal("the CSI plugin's attributes of a Block PV lack Block")
	}
	lname, _, lattrs := w.populatorName("pod-a", func() *volume.Spec {
		s := localSpec("pv-blk", "/dev/not-looked-at")
		s.Mode = v1.PersistentVolumeBlock
		return s
	}())
	want := []*cache.ActualVolume{
		rcVolume(cname, csiplugin.Name, volume.Attributes{Identity: cattrs.Identity, DeviceMountable: true, Block: true},
			rcPod("pod-c", "pv-cblk", w.paths.PodDevicePath("pod-c", csiplugin.Name, "pv-cblk"), false)),
		rcVolume(lname, local.Name, lattrs, rcPod("pod-a", "pv-blk", mapped, true), rcPod("pod-b", "pv-blk", notMapped, false)),
	}
	slices.SortFunc(want, func(a, b *cache.ActualVolume) int { return strings.Compare(string(a.Name), string(b.Name)) })
	checkVolumes(t, r.Volumes, want)
}

// A pod volume with sub-paths on disk is found with them outdated: they are
// checked once the mount is adopted (or removed with it).
func TestReconstructSubPaths(t *testing.T) {
	w := newRCWorld(t)
	disk := emptyDirSpec("scratch", v1.StorageMediumDefault)
	dir := w.podVolume("pod-a", emptydir.Name, "scratch", true)
	plainDir := w.podVolume("pod-a", emptydir.Name, "plain", true)
	w.mkdir(w.paths.SubPathTarget("pod-a", emptydir.Name, "scratch", "app", 0))
	r := w.reconstruct()
	checkNoProblems(t, r)
	name, plugin, attrs := w.populatorName("pod-a", disk)
	plainName, _, _ := w.populatorName("pod-a", emptyDirSpec("plain", v1.StorageMediumDefault))
	withSubPaths := rcPod("pod-a", "scratch", dir, true)
	withSubPaths.SubPathsOutdated = true
	want := []*cache.ActualVolume{
		rcVolume(plainName, plugin, attrs, rcPod("pod-a", "plain", plainDir, true)),
		rcVolume(name, plugin, attrs, withSubPaths),
	}
	slices.SortFunc(want, func(a, b *cache.ActualVolume) int { return strings.Compare(string(a.Name), string(b.Name)) })
	checkVolumes(t, r.Volumes, want)
}

// A volumeDevices entry of a plugin that cannot reconstruct block access
// points is left alone and reported.
func TestReconstructBlockEntryOfAPluginWithoutBlock(t *testing.T) {
	w := newRCWorld(t)
	ap := w.paths.PodDevicePath("pod-a", emptydir.Name, "scratch")
	w.writeFile(ap, "")
	r := w.reconstruct()
	if len(r.Volumes) != 0 || len(r.Problems) != 1 || r.Problems[0].Path != ap || !strings.Contains(r.Problems[0].Reason, "cannot reconstruct raw block volumes") {
		t.Errorf("reconstruction: %s", rcJSON(r))
	}
}
