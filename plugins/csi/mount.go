package csi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/csi/csiclient"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/internal/atomicfile"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// SecretGetter reads a secret's data.
type SecretGetter func(ctx context.Context, namespace, name string) (map[string][]byte, error)

// DeviceState is persisted next to a staged volume: what unstaging and
// detaching need when the volume's objects are gone.
type DeviceState struct {
	VolumeName  volume.UniqueName `json:"volumeName"`
	Driver      string            `json:"driver"`
	VolumeID    string            `json:"volumeHandle"`
	PV          string            `json:"persistentVolume,omitempty"`
	StagingPath string            `json:"stagingPath"`
	Staged      bool              `json:"staged"`
	Attachment  string            `json:"attachment,omitempty"`
	AttachMode  string            `json:"attachMode,omitempty"`
	// Attachable: attached before staging (by a controller or the agent).
	Attachable bool `json:"attachable,omitempty"`
	// Block: a raw block volume, staged with the block capability.
	// BlockStaged records that NodeStageVolume succeeded (nothing is
	// mounted to show it).
	Block       bool `json:"block,omitempty"`
	BlockStaged bool `json:"blockStaged,omitempty"`
}

// PodState is persisted for each pod's publish.
type PodState struct {
	VolumeName  volume.UniqueName `json:"volumeName"`
	Driver      string            `json:"driver"`
	VolumeID    string            `json:"volumeHandle"`
	PV          string            `json:"persistentVolume,omitempty"`
	TargetPath  string            `json:"targetPath"`
	StagingPath string            `json:"stagingPath,omitempty"`
	Inline      bool              `json:"inline,omitempty"`
	SpecName    string            `json:"specName"`
	PodUID      string            `json:"podUID"`
	// Block: TargetPath is a raw block volume's access point (a file).
	Block bool `json:"block,omitempty"`
}

// ErrStateMismatch: a state file disagrees with what the volume's identity
// says (its driver and handle, the paths and names computed from them).
// State files are hints: nothing is unstaged, unpublished, removed or
// detached on the word of one that disagrees, and the volume is reported.
var ErrStateMismatch = errors.New("state file disagrees with the volume's identity")

// checkDeviceState checks a staged volume's state against the layout:
// identity (driver^handle, "" when only the file knows it) names the
// directory, the staging path is computed from it, and an attachment has
// the name the agent gives it.
func (p *Plugin) checkDeviceState(st *DeviceState, identity, file string) error {
	var why []string
	own := st.Driver + "^" + st.VolumeID
	if st.Driver == "" || st.VolumeID == "" {
		why = append(why, "no driver or volume handle")
	}
	if identity != "" && own != identity {
		why = append(why, fmt.Sprintf("it is for %q, not %q", own, identity))
	}
	if want := p.deviceStateFile(own); file != "" && filepath.Clean(file) != want {
		why = append(why, fmt.Sprintf("its volume's state belongs in %s", want))
	}
	if want := p.cfg.Host.Paths.DeviceMountPath(Name, own); st.StagingPath != "" && st.StagingPath != want {
		why = append(why, fmt.Sprintf("staging path %q is not %q", st.StagingPath, want))
	}
	if want := volume.SharedName(Name, own); st.VolumeName != "" && st.VolumeName != want {
		why = append(why, fmt.Sprintf("volume name %q is not %q", st.VolumeName, want))
	}
	if want := AttachmentName(st.VolumeID, st.Driver, p.cfg.Host.NodeName); st.Attachment != "" && st.Attachment != AttachLocal && st.Attachment != want {
		why = append(why, fmt.Sprintf("attachment %q is not %q", st.Attachment, want))
	}
	return mismatch(file, why)
}

// checkPodState checks a pod's publish state against the pod, the volume's
// directory and (when known) the volume's unique name.
func (p *Plugin) checkPodState(st *PodState, pod types.UID, specName string, name volume.UniqueName, file string) error {
	var why []string
	if st.Driver == "" || st.VolumeID == "" {
		why = append(why, "no driver or volume handle")
	}
	if st.PodUID != string(pod) {
		why = append(why, fmt.Sprintf("it is for pod %q, not %q", st.PodUID, pod))
	}
	if st.SpecName != specName {
		why = append(why, fmt.Sprintf("it is for volume %q, not %q", st.SpecName, specName))
	}
	want := p.cfg.Host.Paths.PodVolumeDir(pod, Name, specName)
	if st.Block {
		want = p.cfg.Host.Paths.PodDevicePath(pod, Name, specName)
	}
	if st.TargetPath != want {
		why = append(why, fmt.Sprintf("target path %q is not %q", st.TargetPath, want))
	}
	own := volume.SharedName(Name, st.Driver+"^"+st.VolumeID)
	if st.Inline {
		own = volume.PodScopedName(Name, pod, specName)
		if want := inlineHandle(volume.PodRef{UID: pod}, specName); st.VolumeID != want {
			why = append(why, fmt.Sprintf("inline volume handle %q is not %q", st.VolumeID, want))
		}
	} else if want := p.cfg.Host.Paths.DeviceMountPath(Name, st.Driver+"^"+st.VolumeID); st.StagingPath != "" && st.StagingPath != want {
		why = append(why, fmt.Sprintf("staging path %q is not %q", st.StagingPath, want))
	}
	if st.VolumeName != own {
		why = append(why, fmt.Sprintf("volume name %q is not %q", st.VolumeName, own))
	}
	if name != "" && name != own {
		why = append(why, fmt.Sprintf("it describes %q, not %q", own, name))
	}
	return mismatch(file, why)
}

func mismatch(file string, why []string) error {
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: %s", ErrStateMismatch, file, strings.Join(why, "; "))
}

func (p *Plugin) deviceStateFile(identity string) string {
	return p.cfg.Host.Paths.VolumeStateFile(Name, identity)
}

func (p *Plugin) podStateFile(pod volume.PodRef, specName string) string {
	return p.cfg.Host.Paths.PodVolumeStateFile(pod.UID, Name, specName)
}

// ReadPodState loads the state of a pod's publish (used after restarts).
func ReadPodState(path string) (*PodState, error) {
	var s PodState
	if err := atomicfile.ReadJSON(path, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ReadDeviceState loads the state of a staged volume.
func ReadDeviceState(path string) (*DeviceState, error) {
	var s DeviceState
	if err := atomicfile.ReadJSON(path, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

func (p *Plugin) driver(name string) (*registry.Driver, error) {
	return p.cfg.Drivers.Client(name)
}

func (p *Plugin) csiDriverObject(name string) *storagev1.CSIDriver {
	if p.cfg.CSIDriver == nil {
		return nil
	}
	d, err := p.cfg.CSIDriver(name)
	if err != nil {
		return nil
	}
	return d
}

func (p *Plugin) secrets(ctx context.Context, ref *v1.SecretReference) (map[string]string, error) {
	if ref == nil {
		return nil, nil
	}
	if p.cfg.Secrets == nil {
		return nil, fmt.Errorf("secret %s/%s is needed, but this agent cannot read secrets", ref.Namespace, ref.Name)
	}
	data, err := p.cfg.Secrets(ctx, ref.Namespace, ref.Name)
	if err != nil {
		return nil, fmt.Errorf("reading secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	out := make(map[string]string, len(data))
	for k, v := range data {
		out[k] = string(v)
	}
	return out, nil
}

// capability describes how the pod uses the volume, in CSI terms.
func capability(src source, mountGroup string, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	if src.block {
		return &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		}
	}
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
			FsType: src.fsType, MountFlags: src.mountOptions, VolumeMountGroup: mountGroup,
		}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// nodeAccessMode is the access mode of the node calls (stage, publish,
// expand), picked as the kubelet picks it: the PV's first access mode, not
// the widest (ReadWriteOnce for inline volumes and PVs that list none),
// mapped for a node service with or without SINGLE_NODE_MULTI_WRITER.
func nodeAccessMode(src source, d *registry.Driver) csi.VolumeCapability_AccessMode_Mode {
	mode := v1.ReadWriteOnce
	if len(src.accessModes) > 0 {
		mode = src.accessModes[0]
	}
	return csiAccessMode(mode, d.SingleNodeMultiWriter)
}

// csiAccessMode maps one Kubernetes access mode the way the kubelet does.
// Without SINGLE_NODE_MULTI_WRITER the driver knows only
// SINGLE_NODE_WRITER for a single node, for ReadWriteOncePod too (the
// scheduler, not the driver, keeps that to one pod).
func csiAccessMode(m v1.PersistentVolumeAccessMode, singleNodeMultiWriter bool) csi.VolumeCapability_AccessMode_Mode {
	switch m {
	case v1.ReadWriteOnce:
		if singleNodeMultiWriter {
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
		}
		return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	case v1.ReadWriteOncePod:
		if singleNodeMultiWriter {
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		}
		return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	case v1.ReadOnlyMany:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	case v1.ReadWriteMany:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	}
	return csi.VolumeCapability_AccessMode_UNKNOWN
}

// controllerAccessMode is the access mode of ControllerPublishVolume, which
// the agent makes in place of the external-attacher (self-attach and
// standalone modes), picked as the attacher picks it: from all the PV's
// access modes, ReadWriteMany first, and refusing the combinations it
// refuses; mapped for a controller service with or without
// SINGLE_NODE_MULTI_WRITER.
func controllerAccessMode(src source, d *registry.Driver) (csi.VolumeCapability_AccessMode_Mode, error) {
	has := map[v1.PersistentVolumeAccessMode]bool{}
	for _, m := range src.accessModes {
		has[m] = true
	}
	switch {
	case has[v1.ReadWriteOncePod] && len(has) > 1:
		return 0, fmt.Errorf("PV %s combines ReadWriteOncePod with other access modes %v, which Kubernetes does not support", src.pvName, src.accessModes)
	case has[v1.ReadWriteOncePod]:
		return csiAccessMode(v1.ReadWriteOncePod, d.ControllerSingleNodeMultiWriter), nil
	case has[v1.ReadWriteMany]:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, nil
	case has[v1.ReadOnlyMany] && has[v1.ReadWriteOnce]:
		return 0, fmt.Errorf("PV %s lists both ReadOnlyMany and ReadWriteOnce, which no CSI access mode expresses", src.pvName)
	case has[v1.ReadOnlyMany]:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, nil
	case has[v1.ReadWriteOnce]:
		return csiAccessMode(v1.ReadWriteOnce, d.ControllerSingleNodeMultiWriter), nil
	}
	return 0, fmt.Errorf("PV %s has no access mode the CSI attacher knows (%v)", src.pvName, src.accessModes)
}

// MountDevice stages the volume at its global path. The state file is
// written first: if the agent dies during NodeStageVolume, the next start
// knows to unstage.
func (p *Plugin) MountDevice(ctx context.Context, req *plugins.DeviceRequest) error {
	src := sourceOf(req.Spec, volume.PodRef{})
	d, err := p.driver(src.driver)
	if err != nil {
		return err
	}
	state := &DeviceState{
		VolumeName: req.VolumeName, Driver: src.driver, VolumeID: src.handle, PV: src.pvName,
		StagingPath: req.DeviceMountPath, Staged: d.StageUnstage, AttachMode: p.cfg.AttachMode, Attachable: req.Attachable,
		Block: src.block,
	}
	if prev, err := ReadDeviceState(p.deviceStateFile(req.Identity)); err == nil && p.checkDeviceState(prev, req.Identity, "") == nil {
		state.Attachment = prev.Attachment
	}
	if err := atomicfile.WriteJSON(p.deviceStateFile(req.Identity), state); err != nil {
		return fmt.Errorf("recording volume state: %w", err)
	}
	if !d.StageUnstage {
		return nil
	}
	if _, err := mountutil.EnsureDir(req.DeviceMountPath, 0o750); err != nil {
		return err
	}
	secrets, err := p.secrets(ctx, src.stageSecret)
	if err != nil {
		return err
	}
	_, err = d.Client.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: src.handle, PublishContext: req.PublishContext, StagingTargetPath: req.DeviceMountPath,
		VolumeCapability: capability(src, "", nodeAccessMode(src, d)), Secrets: secrets, VolumeContext: src.context,
	})
	if err != nil {
		return fmt.Errorf("NodeStageVolume of %s (driver %s): %w", src.handle, src.driver, csiclient.Classify(err))
	}
	if src.block {
		state.BlockStaged = true
		if err := atomicfile.WriteJSON(p.deviceStateFile(req.Identity), state); err != nil {
			return volume.Uncertain(fmt.Errorf("recording that %s is staged: %w", src.handle, err))
		}
	}
	return nil
}

// MapDevice implements plugins.BlockMapper: NodeStageVolume with the block
// capability, into the staging directory (the driver decides what, if
// anything, it puts there).
func (p *Plugin) MapDevice(ctx context.Context, req *plugins.DeviceRequest) error {
	return p.MountDevice(ctx, req)
}

// UnmapDevice implements plugins.BlockMapper: NodeUnstageVolume.
func (p *Plugin) UnmapDevice(ctx context.Context, req *plugins.DeviceRequest) error {
	return p.UnmountDevice(ctx, req)
}

// MapPodDevice implements plugins.BlockMapper: NodePublishVolume with the
// block capability and the access point as target path, which the driver
// creates (the CSI spec has the CO create only its parent). What the driver
// leaves there must be a block device.
func (p *Plugin) MapPodDevice(ctx context.Context, req *plugins.SetUpRequest) error {
	return p.SetUp(ctx, req)
}

// UnmapPodDevice implements plugins.BlockMapper: NodeUnpublishVolume, then
// the access point is removed.
func (p *Plugin) UnmapPodDevice(ctx context.Context, req *plugins.TearDownRequest) error {
	return p.TearDown(ctx, req)
}

// checkBlockTarget verifies that a publish left a block device at target,
// without following a symbolic link.
func checkBlockTarget(target string) error {
	info, err := os.Lstat(target)
	if err != nil {
		return err
	}
	if info.Mode().Type() != fs.ModeDevice {
		return fmt.Errorf("%s is not a block device (%s)", target, info.Mode().Type())
	}
	return nil
}

// UnmountDevice unstages the volume. It works from the state file, so it
// needs nothing but the volume's identity.
//
// The staging path is computed from the volume's identity; the state file
// only says what the identity alone cannot (was it staged, an attachment),
// and is refused when it disagrees with it.
func (p *Plugin) UnmountDevice(ctx context.Context, req *plugins.DeviceRequest) error {
	path := p.deviceStateFile(req.Identity)
	staging := p.cfg.Host.Paths.DeviceMountPath(Name, req.Identity)
	state, err := ReadDeviceState(path)
	if errors.Is(err, fs.ErrNotExist) && req.Spec != nil {
		src := sourceOf(req.Spec, volume.PodRef{})
		state = &DeviceState{Driver: src.driver, VolumeID: src.handle, Staged: true}
		err = nil
	}
	if err != nil {
		return fmt.Errorf("cannot unstage %s: %w", req.VolumeName, err)
	}
	if err := p.checkDeviceState(state, req.Identity, path); err != nil {
		return fmt.Errorf("not unstaging %s: %w", req.VolumeName, err)
	}
	if state.Staged {
		d, err := p.driver(state.Driver)
		if err != nil {
			return err
		}
		if _, err := d.Client.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: state.VolumeID, StagingTargetPath: staging}); err != nil {
			return fmt.Errorf("NodeUnstageVolume of %s (driver %s): %w", state.VolumeID, state.Driver, csiclient.Classify(err))
		}
		if mounted, err := p.cfg.Host.Mounter.IsMountPoint(staging); err != nil || mounted {
			return volume.Uncertainf("driver %s unstaged %s but %s is still mounted", state.Driver, state.VolumeID, staging)
		}
		if err := os.Remove(staging); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	// Keep the state while an attachment remains to be released.
	if state.Attachment == "" {
		return atomicfile.Remove(path)
	}
	state.Staged = false
	return atomicfile.WriteJSON(path, state)
}

// SetUp publishes the volume into the pod's directory.
func (p *Plugin) SetUp(ctx context.Context, req *plugins.SetUpRequest) error {
	src := sourceOf(req.Spec, req.Pod.PodRef)
	d, err := p.driver(src.driver)
	if err != nil {
		return err
	}
	drvObj := p.csiDriverObject(src.driver)
	staging := ""
	if !src.inline && d.StageUnstage {
		staging = req.DeviceMountPath
	}
	state := &PodState{
		VolumeName: req.VolumeName, Driver: src.driver, VolumeID: src.handle, PV: src.pvName, TargetPath: req.Dir,
		StagingPath: staging, Inline: src.inline, SpecName: req.Spec.Name, PodUID: string(req.Pod.UID), Block: src.block,
	}
	stateFile := p.podStateFile(req.Pod.PodRef, req.Spec.Name)
	if err := atomicfile.WriteJSON(stateFile, state); err != nil {
		return fmt.Errorf("recording volume state: %w", err)
	}
	// The driver creates the target itself; its parent must exist.
	if err := os.MkdirAll(filepath.Dir(req.Dir), 0o750); err != nil {
		return err
	}
	if mounted, err := p.cfg.Host.Mounter.IsMountPoint(req.Dir); err != nil {
		return err
	} else if mounted && !req.Spec.InlineEphemeral && !remount(drvObj) {
		if src.block {
			if err := checkBlockTarget(req.Dir); err != nil {
				return volume.Uncertain(err)
			}
		}
		return nil // published before (a restart adopted it)
	}

	context := map[string]string{}
	for k, v := range src.context {
		context[k] = v
	}
	if src.inline {
		context[keyEphemeral] = "true"
	}
	if drvObj != nil && drvObj.Spec.PodInfoOnMount != nil && *drvObj.Spec.PodInfoOnMount {
		context[keyPodName] = req.Pod.Name
		context[keyPodNamespace] = req.Pod.Namespace
		context[keyPodUID] = string(req.Pod.UID)
		context[keyServiceAccount] = req.Pod.ServiceAccount
		context[keyEphemeral] = strconv.FormatBool(src.inline)
	}
	policy := fsGroupPolicy(drvObj)
	mountGroup := ""
	if req.Pod.FSGroup != nil && d.VolumeMountGroup && policy != storagev1.NoneFSGroupPolicy && !src.block {
		mountGroup = strconv.FormatInt(*req.Pod.FSGroup, 10)
	}
	secrets, err := p.secrets(ctx, src.publishSecret)
	if err != nil {
		return err
	}
	var saTokens string
	var tokensDue time.Time
	if !src.block {
		// The kubelet passes tokens to filesystem publishes only: no
		// credential goes where a driver written for it expects none.
		if saTokens, tokensDue, err = p.serviceAccountTokens(ctx, drvObj, req.Pod); err != nil {
			return err
		}
	}
	if saTokens != "" {
		// As the kubelet merges them: the tokens win over a key of the
		// same name.
		if tokensInSecrets(drvObj) {
			if secrets == nil {
				secrets = map[string]string{}
			}
			secrets[keyServiceAccountTokens] = saTokens
		} else {
			context[keyServiceAccountTokens] = saTokens
		}
	}
	_, err = d.Client.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: src.handle, PublishContext: req.PublishContext, StagingTargetPath: staging, TargetPath: req.Dir,
		VolumeCapability: capability(src, mountGroup, nodeAccessMode(src, d)), Readonly: src.readOnly, Secrets: secrets, VolumeContext: context,
	})
	if err != nil {
		err = csiclient.Classify(err)
		if !volume.IsUncertain(err) {
			// Nothing was published: forget it, unless something is
			// mounted there after all.
			if mounted, _ := p.cfg.Host.Mounter.IsMountPoint(req.Dir); mounted {
				err = volume.Uncertain(err)
			} else {
				_ = os.Remove(req.Dir)
				_ = atomicfile.Remove(stateFile)
			}
		}
		return fmt.Errorf("NodePublishVolume of %s (driver %s): %w", src.handle, src.driver, err)
	}
	if src.block {
		if err := checkBlockTarget(req.Dir); err != nil {
			return volume.Uncertain(fmt.Errorf("driver %s published %s, but: %w", src.driver, src.handle, err))
		}
		return nil
	}
	// A driver in a container whose mounts do not reach the agent's mount
	// namespace (its mount of the root directory is not Bidirectional, or
	// the root directory is not a shared mount) reports success with
	// nothing at the target here: the pod would write to the node's disk.
	if mounted, err := p.cfg.Host.Mounter.IsMountPoint(req.Dir); err != nil || !mounted {
		return volume.Uncertain(fmt.Errorf("driver %s published %s at %s, but nothing is mounted there in the agent's mount namespace (%v): "+
			"a driver in a container needs the root directory mounted with Bidirectional propagation, and the root directory must be a shared mount (--shared-root-dir)",
			src.driver, src.handle, req.Dir, err))
	}
	if mountGroup == "" && applyFSGroup(policy, src) {
		if err := plugins.ApplyFSGroup(ctx, req.Dir, req.Pod, src.readOnly); err != nil {
			return volume.Uncertain(fmt.Errorf("applying fsGroup: %w", err))
		}
	}
	if remount(drvObj) {
		req.RefreshAt = republishAt(time.Now(), tokensDue)
	}
	return nil
}

// RepublishPeriod is how often a volume of a driver with requiresRepublish
// is published again (the kubelet does it on every pod sync, 60-90 s), so
// the driver can renew what it provides (credentials, tokens).
const RepublishPeriod = time.Minute

// republishAt is when a volume of a driver with requiresRepublish is
// published again: after RepublishPeriod, or as soon as one of its tokens
// is due for refresh if that is sooner, so a refreshed token reaches the
// driver at once.
func republishAt(now, tokensDue time.Time) time.Time {
	at := now.Add(RepublishPeriod)
	if !tokensDue.IsZero() && tokensDue.Before(at) {
		return tokensDue
	}
	return at
}

func remount(drv *storagev1.CSIDriver) bool {
	return drv != nil && drv.Spec.RequiresRepublish != nil && *drv.Spec.RequiresRepublish
}

func fsGroupPolicy(drv *storagev1.CSIDriver) storagev1.FSGroupPolicy {
	if drv == nil || drv.Spec.FSGroupPolicy == nil {
		return storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy
	}
	return *drv.Spec.FSGroupPolicy
}

// applyFSGroup follows the CSIDriver's fsGroupPolicy: None never, File
// always, ReadWriteOnceWithFSType (the default) only for a volume with an
// fsType used by one node for writing.
func applyFSGroup(policy storagev1.FSGroupPolicy, src source) bool {
	if src.readOnly {
		return false
	}
	switch policy {
	case storagev1.NoneFSGroupPolicy:
		return false
	case storagev1.FileFSGroupPolicy:
		return true
	}
	if src.fsType == "" {
		return false
	}
	if src.inline {
		return true
	}
	for _, m := range src.accessModes {
		if m != v1.ReadWriteOnce && m != v1.ReadWriteOncePod {
			return false
		}
	}
	return true
}

// TearDown unpublishes the volume from the pod's directory, from the state
// file written when it was published.
func (p *Plugin) TearDown(ctx context.Context, req *plugins.TearDownRequest) error {
	specName := filepath.Base(req.Dir)
	stateFile := p.podStateFile(req.Pod, specName)
	state, err := ReadPodState(stateFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if req.Spec != nil {
			src := sourceOf(req.Spec, req.Pod)
			state, err = &PodState{Driver: src.driver, VolumeID: src.handle, TargetPath: req.Dir}, nil
		} else if mounted, merr := p.cfg.Host.Mounter.IsMountPoint(req.Dir); merr == nil && !mounted {
			// Nothing was ever published here.
			return removeTarget(req.Dir)
		}
	case err == nil:
		// The target is req.Dir, computed from the pod and the volume;
		// the file must agree with it before its handle is used.
		if cerr := p.checkPodState(state, req.Pod.UID, specName, req.VolumeName, stateFile); cerr != nil {
			return fmt.Errorf("not unpublishing %s: %w", req.Dir, cerr)
		}
	}
	if err != nil {
		return fmt.Errorf("cannot unpublish %s: %w", req.Dir, err)
	}
	d, err := p.driver(state.Driver)
	if err != nil {
		return err
	}
	if _, err := d.Client.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: state.VolumeID, TargetPath: req.Dir}); err != nil {
		return fmt.Errorf("NodeUnpublishVolume of %s (driver %s): %w", state.VolumeID, state.Driver, csiclient.Classify(err))
	}
	if mounted, err := p.cfg.Host.Mounter.IsMountPoint(req.Dir); err != nil || mounted {
		return volume.Uncertainf("driver %s unpublished %s but %s is still mounted", state.Driver, state.VolumeID, req.Dir)
	}
	if err := removeTarget(req.Dir); err != nil {
		return err
	}
	return atomicfile.Remove(stateFile)
}

// removeTarget removes an unmounted target left by the driver: only the
// entry itself, never anything below it.
func removeTarget(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s after unpublish: %w", path, err)
	}
	return nil
}
