package csi_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/atomicfile"
	"github.com/volume-agent/volume-agent/plugins"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/volume"
)

// tamper rewrites a state file's JSON fields.
func tamper(t *testing.T, file string, fields map[string]any) {
	t.Helper()
	var m map[string]any
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range fields {
		m[k] = v
	}
	if err := atomicfile.WriteJSON(file, m); err != nil {
		t.Fatal(err)
	}
}

// State files are hints: a staged volume's file that names another staging
// path (someone else's mount, a directory of the node), another volume or
// another attachment is refused, before the driver is asked anything or
// anything is removed, and the volume is reported instead of reconstructed.
func TestTamperedDeviceState(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fields func(victim string) map[string]any
	}{
		{"staging path elsewhere", func(victim string) map[string]any { return map[string]any{"stagingPath": victim} }},
		{"another volume's handle", func(string) map[string]any { return map[string]any{"volumeHandle": "vol-2"} }},
		{"another volume's name", func(string) map[string]any {
			return map[string]any{"volumeName": string(volume.SharedName(csiplugin.Name, testDriver+"^vol-2"))}
		}},
		{"another attachment", func(string) map[string]any { return map[string]any{"attachment": "csi-someone-elses"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			m := f.startRegistered(testDriver, caps{stage: true})
			spec := pvSpec("pv-1", "vol-1")
			req := f.deviceRequest(spec, nil)
			m.node.EXPECT().NodeStageVolume(gomock.Any(), gomock.Any()).Return(&csi.NodeStageVolumeResponse{}, nil)
			// Never NodeUnstageVolume: gomock fails the test on a call
			// nobody expects.
			if err := f.plugin().MountDevice(ctx(t), req); err != nil {
				t.Fatal(err)
			}
			victim := filepath.Join(t.TempDir(), "someone-elses-mount")
			if err := os.Mkdir(victim, 0o755); err != nil {
				t.Fatal(err)
			}
			stateFile := f.deviceStateFile(identityOf(spec))
			tamper(t, stateFile, tc.fields(victim))

			_, rerr := f.plugin().ReconstructDevice(filepath.Dir(stateFile))
			if !errors.Is(rerr, csiplugin.ErrStateMismatch) {
				t.Errorf("ReconstructDevice = %v, want ErrStateMismatch", rerr)
			}
			req.Spec = nil
			if err := f.plugin().UnmountDevice(ctx(t), req); !errors.Is(err, csiplugin.ErrStateMismatch) {
				t.Errorf("UnmountDevice = %v, want ErrStateMismatch", err)
			}
			if !exists(t, victim) {
				t.Error("the directory the state file named was removed")
			}
			if !exists(t, stateFile) {
				t.Error("the state file was removed: the volume would be forgotten")
			}
		})
	}
}

// A tampered attachment name is never deleted.
func TestTamperedAttachmentIsNotDetached(t *testing.T) {
	f := newFixture(t)
	f.attachMode = csiplugin.AttachSelf
	f.startRegistered(testDriver, caps{stage: true})
	spec := pvSpec("pv-1", "vol-1")
	other := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "csi-someone-elses"}}
	f.attachments.put(other)
	id := identityOf(spec)
	if err := atomicfile.WriteJSON(f.deviceStateFile(id), &csiplugin.DeviceState{
		VolumeName: uniqueName(spec), Driver: testDriver, VolumeID: "vol-1", Attachment: other.Name, AttachMode: csiplugin.AttachSelf,
	}); err != nil {
		t.Fatal(err)
	}
	err := f.plugin().Detach(ctx(t), &plugins.AttachRequest{VolumeName: uniqueName(spec)})
	if !errors.Is(err, csiplugin.ErrStateMismatch) {
		t.Errorf("Detach = %v, want ErrStateMismatch", err)
	}
	if _, ok := f.attachments.Get(other.Name); !ok {
		t.Error("the VolumeAttachment the state file named was deleted")
	}
}

// A pod's publish state that names another pod, target or staging path,
// or whose volume handle and name disagree, is refused: the volume is
// reported, not reconstructed, and the driver is never asked to unpublish
// on its word. (The target is never read from the file: it is the pod's
// volume directory.)
func TestTamperedPodState(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fields map[string]any
	}{
		{"another volume's handle", map[string]any{"volumeHandle": "vol-2"}},
		{"another volume's name", map[string]any{"volumeName": string(volume.SharedName(csiplugin.Name, testDriver+"^vol-2"))}},
		{"another pod", map[string]any{"podUID": "uid-b"}},
		{"another target", map[string]any{"targetPath": "/var/lib/kubelet/pods/x/volumes/y"}},
		{"another staging path", map[string]any{"stagingPath": "/mnt/elsewhere"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			m := f.startRegistered(testDriver, caps{})
			f.setCSIDriver(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: testDriver}, Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)}})
			spec := pvSpec("pv-1", "vol-1")
			p := pod("uid-a")
			m.node.EXPECT().NodePublishVolume(gomock.Any(), gomock.Any()).Return(&csi.NodePublishVolumeResponse{}, nil)
			if err := f.plugin().SetUp(ctx(t), f.setUpRequest(spec, p, nil)); err != nil {
				t.Fatal(err)
			}
			stateFile := f.podStateFile(p, spec.Name)
			tamper(t, stateFile, tc.fields)

			if _, _, err := f.plugin().ReconstructPodVolume(p.UID, spec.Name, ""); !errors.Is(err, csiplugin.ErrStateMismatch) {
				t.Errorf("ReconstructPodVolume = %v, want ErrStateMismatch", err)
			}
			err := f.plugin().TearDown(ctx(t), f.tearDownRequest(uniqueName(spec), nil, p, spec.Name))
			if !errors.Is(err, csiplugin.ErrStateMismatch) {
				t.Errorf("TearDown = %v, want ErrStateMismatch", err)
			}
			if !exists(t, stateFile) {
				t.Error("the state file was removed: the volume would be forgotten")
			}
		})
	}
}
