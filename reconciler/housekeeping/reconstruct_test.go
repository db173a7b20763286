package housekeeping

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
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

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/cache/cachetest"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/internal/atomicfile"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/mountutil"
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

func checkVolumes(t *testing.T, got, want []*cache.ActualVolume) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("reconstructed volumes:\n%s\nwant:\n%s", cachetest.JSON(got), cachetest.JSON(want))
	}
}

func checkNoProblems(t *testing.T, r *Reconstruction) {
	t.Helper()
	if len(r.Problems) > 0 {
		t.Errorf("unexpected problems: %s", cachetest.JSON(r.Problems))
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
	// Without a spec there is no size-limit hint: teardown checks.
	attrs.NoSizeLimit, memAttrs.NoSizeLimit = false, false
	want := []*cache.ActualVolume{
		cachetest.ReconstructedVolume(memName, plugin, memAttrs, cachetest.ReconstructedPod("pod-a", "cache", memDir, true)),
		cachetest.ReconstructedVolume(diskName, plugin, attrs, cachetest.ReconstructedPod("pod-a", "scratch", diskDir, false)),
		cachetest.ReconstructedVolume(otherName, plugin, attrs, cachetest.ReconstructedPod("pod-b", "scratch", otherDir, false)),
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
		cachetest.ReconstructedVolume(dirName, plugin, attrs, cachetest.ReconstructedPod("pod-a", "host", dir, true)),
		cachetest.ReconstructedVolume(fileName, plugin, attrs, cachetest.ReconstructedPod("pod-a", "sock", file, true)),
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
		cachetest.ReconstructedVolume(name, plugin, attrs, cachetest.ReconstructedPod("pod-a", "pv-dir", a, true), cachetest.ReconstructedPod("pod-b", "pv-dir", b, false)),
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
				pods = append(pods, cachetest.ReconstructedPod("pod-a", "pv-blk", dir, tc.podMounted))
			}
			r := w.reconstruct()
			checkNoProblems(t, r)

			// The populator names it from the PV on a block device.
			name, plugin := volume.SharedName(local.Name, "pv-blk"), local.Name
			attrs := volume.Attributes{Identity: "pv-blk", DeviceMountable: true}
			want := cachetest.ReconstructedVolume(name, plugin, attrs, pods...)
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
		t.Errorf("reconstructed %s, want %s with %+v", cachetest.JSON(r.Volumes), name, attrs)
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
				pods = append(pods, cachetest.ReconstructedPod("pod-a", "pv-csi", dir, tc.podMounted))
			}
			r := w.reconstruct()
			checkNoProblems(t, r)

			attrs := volume.Attributes{Identity: identity, DeviceMountable: true, Attachable: tc.attachment != ""}
			want := cachetest.ReconstructedVolume(name, plugin, attrs, pods...)
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
		cachetest.ReconstructedVolume(name, plugin, volume.Attributes{Identity: attrs.Identity, DeviceMountable: true}, cachetest.ReconstructedPod("pod-a", "pv-csi", dir, false)),
		cachetest.ReconstructedVolume(inlineName, plugin, inlineAttrs, cachetest.ReconstructedPod("pod-b", "eph", w.paths.PodVolumeDir("pod-b", csiplugin.Name, "eph"), false)),
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
	if len(r.Volumes) != 1 || r.Volumes[0].Pods.Len() != 1 || !r.Volumes[0].Pods.At("pod-a").FoundMounted {
		t.Errorf("reconstructed %s", cachetest.JSON(r.Volumes))
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
	attrs.NoSizeLimit = false // no spec, no size-limit hint
	checkVolumes(t, r.Volumes, []*cache.ActualVolume{cachetest.ReconstructedVolume(name, emptydir.Name, attrs, cachetest.ReconstructedPod("pod-a", "scratch", good, false))})

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
		t.Errorf("empty root: %s", cachetest.JSON(r))
	}
	w.mkdir(w.paths.PodsDir())
	w.mkdir(filepath.Join(w.paths.Root, "plugins"))
	if r := w.reconstruct(); len(r.Volumes) != 0 || len(r.Problems) != 0 {
		t.Errorf("empty pods and plugins directories: %s", cachetest.JSON(r))
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
		for _, m := range v.Pods.All() {
			found[m.MountPath] = m.FoundMounted
		}
	}
	if !reflect.DeepEqual(found, map[string]bool{tmpfs: true, dir: false}) {
		t.Errorf("found mounted: %v", found)
	}
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
		cachetest.ReconstructedVolume(cname, csiplugin.Name, volume.Attributes{Identity: cattrs.Identity, DeviceMountable: true, Block: true},
			cachetest.ReconstructedPod("pod-c", "pv-cblk", w.paths.PodDevicePath("pod-c", csiplugin.Name, "pv-cblk"), false)),
		cachetest.ReconstructedVolume(lname, local.Name, lattrs, cachetest.ReconstructedPod("pod-a", "pv-blk", mapped, true), cachetest.ReconstructedPod("pod-b", "pv-blk", notMapped, false)),
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
	attrs.NoSizeLimit = false // no spec, no size-limit hint
	withSubPaths := cachetest.ReconstructedPod("pod-a", "scratch", dir, true)
	withSubPaths.SubPathsOutdated = true
	want := []*cache.ActualVolume{
		cachetest.ReconstructedVolume(plainName, plugin, attrs, cachetest.ReconstructedPod("pod-a", "plain", plainDir, true)),
		cachetest.ReconstructedVolume(name, plugin, attrs, withSubPaths),
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
		t.Errorf("reconstruction: %s", cachetest.JSON(r))
	}
}
