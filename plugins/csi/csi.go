// Package csi implements CSI volumes: persistent volumes (pv.spec.csi),
// staged once per node at a global path when the driver stages
// (NodeStageVolume) and published into each pod (NodePublishVolume), and
// inline ephemeral volumes (pod volume.csi), published per pod. Attach-required
// drivers wait for (or, in self-attach mode, perform) the attachment first.
//
// Everything teardown needs (driver, volume handle, paths, attachment) is
// written to a state file next to the mount before the driver is asked to
// mount anything, so unpublish, unstage and detach work after a restart even
// when the pod and its objects are gone.
package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Name is the plugin's name (the kubelet's, so directories look familiar).
const Name = "kubernetes.io/csi"

// Keys of the volume context the CO adds.
const (
	keyPodName        = "csi.storage.k8s.io/pod.name"
	keyPodNamespace   = "csi.storage.k8s.io/pod.namespace"
	keyPodUID         = "csi.storage.k8s.io/pod.uid"
	keyServiceAccount = "csi.storage.k8s.io/serviceAccount.name"
	keyEphemeral      = "csi.storage.k8s.io/ephemeral"
	// keyServiceAccountTokens carries the tokens a CSIDriver's
	// tokenRequests ask for, in the volume context or (with
	// serviceAccountTokenInSecrets) in the secrets of NodePublishVolume.
	keyServiceAccountTokens = "csi.storage.k8s.io/serviceAccount.tokens"
)

// Attach modes.
const (
	// AttachController: an attach/detach controller in the cluster owns
	// VolumeAttachments; the agent waits for status.attached.
	AttachController = "controller"
	// AttachSelf: the agent creates the VolumeAttachment, attaches through
	// the driver's ControllerPublishVolume, and deletes it after unstaging.
	AttachSelf = "self"
	// AttachLocal: no API server (standalone mode); the agent calls
	// ControllerPublishVolume itself when the driver has it.
	AttachLocal = "local"
)

// Config wires the plugin to the rest of the agent.
type Config struct {
	Host    plugins.Host
	Drivers *registry.Registry
	// CSIDriver looks up a CSIDriver object (NotFound if there is none).
	CSIDriver func(name string) (*storagev1.CSIDriver, error)
	// Secrets reads a secret's data; nil when secrets cannot be read.
	Secrets SecretGetter
	// AttachMode is one of AttachController, AttachSelf, AttachLocal.
	AttachMode string
	// Attachments is the VolumeAttachment API (nil in standalone mode).
	Attachments Attachments
	// Tokens issues the service-account tokens of CSIDrivers with
	// tokenRequests; nil without an API server, when NoTokensReason says
	// why in the error of every volume that needs one.
	Tokens         TokenIssuer
	NoTokensReason string
	// OutOfAttachSlots, if set, is told the driver whose attachment failed
	// with ResourceExhausted: its allocatable count is out of date (the
	// node-info manager asks the driver again, as the kubelet does).
	OutOfAttachSlots func(driver string)
}

// Plugin is the CSI volume plugin.
type Plugin struct{ cfg Config }

// The agent finds a plugin's capabilities by type assertion: these make a
// changed signature fail the build instead of a volume at run time.
var (
	_ plugins.Plugin              = (*Plugin)(nil)
	_ plugins.DeviceMounter       = (*Plugin)(nil)
	_ plugins.Attacher            = (*Plugin)(nil)
	_ plugins.Expander            = (*Plugin)(nil)
	_ plugins.Reconstructor       = (*Plugin)(nil)
	_ plugins.DeviceReconstructor = (*Plugin)(nil)
	_ plugins.BlockMapper         = (*Plugin)(nil)
	_ plugins.BlockReconstructor  = (*Plugin)(nil)
)

// New returns the plugin.
func New(cfg Config) *Plugin {
	if cfg.CSIDriver == nil {
		cfg.CSIDriver = func(name string) (*storagev1.CSIDriver, error) {
			return nil, apierrors.NewNotFound(storagev1.Resource("csidrivers"), name)
		}
	}
	if cfg.AttachMode == "" {
		cfg.AttachMode = AttachController
	}
	return &Plugin{cfg: cfg}
}

func (p *Plugin) Name() string { return Name }

func (p *Plugin) CanSupport(spec *volume.Spec) bool {
	return (spec.PV != nil && spec.PV.Spec.CSI != nil) || (spec.Volume != nil && spec.Volume.CSI != nil)
}

// Attributes: a CSI persistent volume is shared (identity driver^handle),
// always device-mountable (the device mount is a no-op for drivers that do
// not stage, which keeps the decision independent of whether the driver is
// registered yet) and attachable when its CSIDriver requires attach. An
// inline volume is per pod and needs a CSIDriver that allows the Ephemeral
// lifecycle mode.
func (p *Plugin) Attributes(spec *volume.Spec) (volume.Attributes, error) {
	if spec.PV != nil {
		src := spec.PV.Spec.CSI
		if src.Driver == "" || src.VolumeHandle == "" {
			return volume.Attributes{}, fmt.Errorf("PV %s has no CSI driver or volume handle", spec.PV.Name)
		}
		attrs := volume.Attributes{Identity: src.Driver + "^" + src.VolumeHandle, DeviceMountable: true, Block: spec.IsBlock()}
		drv, err := p.cfg.CSIDriver(src.Driver)
		switch {
		case err == nil:
			attrs.Attachable = p.attachRequired(drv)
			attrs.RequiresRemount = remount(drv)
		case apierrors.IsNotFound(err):
			attrs.Attachable = p.attachRequired(nil)
		default:
			return volume.Attributes{}, err
		}
		if !lifecycleAllowed(drv, storagev1.VolumeLifecyclePersistent) {
			return volume.Attributes{}, fmt.Errorf("CSIDriver %s does not allow the Persistent lifecycle mode", src.Driver)
		}
		return attrs, nil
	}
	src := spec.Volume.CSI
	drv, err := p.cfg.CSIDriver(src.Driver)
	if apierrors.IsNotFound(err) {
		return volume.Attributes{}, fmt.Errorf("inline CSI volume of driver %s needs a CSIDriver object listing the Ephemeral lifecycle mode; there is none", src.Driver)
	}
	if err != nil {
		return volume.Attributes{}, err
	}
	if !lifecycleAllowed(drv, storagev1.VolumeLifecycleEphemeral) {
		return volume.Attributes{}, fmt.Errorf("CSIDriver %s does not allow inline (Ephemeral lifecycle mode) volumes", src.Driver)
	}
	return volume.Attributes{RequiresRemount: drv.Spec.RequiresRepublish != nil && *drv.Spec.RequiresRepublish}, nil
}

// lifecycleAllowed: no modes listed means Persistent only.
func lifecycleAllowed(drv *storagev1.CSIDriver, mode storagev1.VolumeLifecycleMode) bool {
	if drv == nil || len(drv.Spec.VolumeLifecycleModes) == 0 {
		return mode == storagev1.VolumeLifecyclePersistent
	}
	for _, m := range drv.Spec.VolumeLifecycleModes {
		if m == mode {
			return true
		}
	}
	return false
}

// source is what the plugin needs to know of a volume, from its spec.
type source struct {
	driver, handle string
	fsType         string
	readOnly       bool
	context        map[string]string
	stageSecret    *v1.SecretReference
	publishSecret  *v1.SecretReference
	controllerPub  *v1.SecretReference
	expandSecret   *v1.SecretReference
	inline         bool
	accessModes    []v1.PersistentVolumeAccessMode
	mountOptions   []string
	pvName         string
	// block: the pod uses the volume as a raw block device.
	block bool
}

func sourceOf(spec *volume.Spec, pod volume.PodRef) source {
	if spec.PV != nil {
		c := spec.PV.Spec.CSI
		return source{
			driver: c.Driver, handle: c.VolumeHandle, fsType: c.FSType, readOnly: spec.ReadOnly || c.ReadOnly,
			context: c.VolumeAttributes, stageSecret: c.NodeStageSecretRef, publishSecret: c.NodePublishSecretRef,
			controllerPub: c.ControllerPublishSecretRef, expandSecret: c.NodeExpandSecretRef, accessModes: spec.PV.Spec.AccessModes,
			mountOptions: plugins.MountOptions(spec), pvName: spec.PV.Name, block: spec.IsBlock(),
		}
	}
	c := spec.Volume.CSI
	s := source{driver: c.Driver, handle: inlineHandle(pod, spec.Name), context: c.VolumeAttributes, inline: true, readOnly: spec.ReadOnly}
	if c.FSType != nil {
		s.fsType = *c.FSType
	}
	if c.NodePublishSecretRef != nil {
		s.publishSecret = &v1.SecretReference{Namespace: pod.Namespace, Name: c.NodePublishSecretRef.Name}
	}
	return s
}

// inlineHandle is the volume ID of an inline volume, unique per pod and
// volume and stable across restarts (the kubelet's scheme).
func inlineHandle(pod volume.PodRef, specName string) string {
	sum := sha256.Sum256([]byte(string(pod.UID) + specName))
	return "csi-" + hex.EncodeToString(sum[:])
}

// AttachmentName is the VolumeAttachment name for a volume on a node, as the
// kubelet and the attach/detach controller name it.
func AttachmentName(handle, driver, node string) string {
	sum := sha256.Sum256([]byte(handle + driver + node))
	return fmt.Sprintf("csi-%x", sum)
}

// ReconstructPodVolume implements plugins.Reconstructor from the state file
// written before the volume was published.
func (p *Plugin) ReconstructPodVolume(pod types.UID, specName, _ string) (volume.UniqueName, volume.Attributes, error) {
	file := p.cfg.Host.Paths.PodVolumeStateFile(pod, Name, specName)
	st, err := ReadPodState(file)
	if err != nil {
		return "", volume.Attributes{}, fmt.Errorf("no usable CSI state for pod %s volume %s: %w", pod, specName, err)
	}
	if err := p.checkPodState(st, pod, specName, "", file); err != nil {
		return "", volume.Attributes{}, err
	}
	if st.Inline {
		return volume.PodScopedName(Name, pod, specName), volume.Attributes{}, nil
	}
	return st.VolumeName, volume.Attributes{Identity: st.Driver + "^" + st.VolumeID, DeviceMountable: true, Block: st.Block}, nil
}

// ReconstructPodDevice implements plugins.BlockReconstructor, from the same
// state file as ReconstructPodVolume.
func (p *Plugin) ReconstructPodDevice(pod types.UID, specName, path string) (volume.UniqueName, volume.Attributes, error) {
	name, attrs, err := p.ReconstructPodVolume(pod, specName, path)
	if err == nil && !attrs.Block {
		return "", volume.Attributes{}, fmt.Errorf("CSI state of pod %s volume %s does not describe a raw block volume", pod, specName)
	}
	return name, attrs, err
}

// ReconstructDevice implements plugins.DeviceReconstructor from the state
// file written before the volume was staged (or attached).
func (p *Plugin) ReconstructDevice(volumeDir string) (*plugins.ReconstructedDevice, error) {
	st, err := ReadDeviceState(filepath.Join(volumeDir, "state.json"))
	if errors.Is(err, fs.ErrNotExist) && p.emptyLeftover(volumeDir) {
		// The agent stopped before it recorded anything (and so before it
		// asked the driver for anything): nothing to undo.
		mountutil.RemoveEmptyDirs(filepath.Join(volumeDir, "globalmount"), filepath.Dir(volumeDir))
		mountutil.RemoveEmptyDirs(volumeDir, filepath.Dir(volumeDir))
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("no usable CSI state in %s: %w", volumeDir, err)
	}
	// The directory is named after the identity, and everything else is
	// computed from it: the file must agree (the volume is reported as an
	// orphan, and nothing is done on its word, if it does not).
	if err := p.checkDeviceState(st, "", filepath.Join(volumeDir, "state.json")); err != nil {
		return nil, err
	}
	identity := st.Driver + "^" + st.VolumeID
	d := &plugins.ReconstructedDevice{
		Name:            volume.SharedName(Name, identity),
		Attributes:      volume.Attributes{Identity: identity, DeviceMountable: true, Attachable: st.Attachable || st.Attachment != "", Block: st.Block},
		DeviceMountPath: p.cfg.Host.Paths.DeviceMountPath(Name, identity),
		Attached:        st.Attachment != "",
	}
	if st.Staged && st.Block {
		// Staging a block volume mounts nothing of ours: it was done if
		// the driver said so (recorded after it did).
		d.Mounted = st.BlockStaged
	} else if st.Staged {
		if d.Mounted, err = p.cfg.Host.Mounter.IsMountPoint(d.DeviceMountPath); err != nil {
			return nil, err
		}
	} else {
		// Nothing is mounted for a driver that does not stage.
		d.Mounted = true
	}
	return d, nil
}

// emptyLeftover: the directory holds at most an empty, unmounted
// globalmount directory.
func (p *Plugin) emptyLeftover(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if e.Name() != "globalmount" || !e.IsDir() {
			return false
		}
		gm := filepath.Join(dir, e.Name())
		if mounted, err := p.cfg.Host.Mounter.IsMountPoint(gm); err != nil || mounted {
			return false
		}
		if inside, err := os.ReadDir(gm); err != nil || len(inside) > 0 {
			return false
		}
	}
	return true
}
