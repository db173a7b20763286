package csi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/csi/csiclient"
	"github.com/volume-agent/volume-agent/internal/atomicfile"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// Attachments is the VolumeAttachment API the plugin uses in cluster mode.
type Attachments interface {
	// Get reads a VolumeAttachment from the informer cache.
	Get(name string) (*storagev1.VolumeAttachment, bool)
	Create(ctx context.Context, va *storagev1.VolumeAttachment) error
	PatchStatus(ctx context.Context, name string, status storagev1.VolumeAttachmentStatus) error
	Delete(ctx context.Context, name string) error
	// ReportedInUse tells whether the node's status lists the volume in
	// volumesInUse: the attach/detach controller must know a volume is in
	// use before the agent relies on its attachment, or it could detach it
	// under a mount.
	ReportedInUse(name volume.UniqueName) bool
}

// Attach implements plugins.Attacher.
func (p *Plugin) Attach(ctx context.Context, req *plugins.AttachRequest) (*plugins.AttachResult, error) {
	if req.Spec == nil || req.Spec.PV == nil {
		return nil, fmt.Errorf("cannot attach %s: no persistent volume spec", req.VolumeName)
	}
	src := sourceOf(req.Spec, volume.PodRef{})
	name := AttachmentName(src.handle, src.driver, p.cfg.Host.NodeName)
	switch p.cfg.AttachMode {
	case AttachController:
		return p.waitForController(req.VolumeName, name, src)
	case AttachSelf:
		return p.attachSelf(ctx, req, name, src)
	default:
		return p.attachLocal(ctx, req, src)
	}
}

// waitForController checks whether the attach/detach controller has
// attached the volume. Until it has, the operation waits (volume.Waiting):
// the node's status has to list the volume in use first, then the
// controller creates the VolumeAttachment and an attacher attaches it, all
// of which normally takes seconds and is no failure. An attach error the
// VolumeAttachment reports is one.
func (p *Plugin) waitForController(volName volume.UniqueName, name string, src source) (*plugins.AttachResult, error) {
	if p.cfg.Attachments == nil {
		return nil, errors.New("attach-required volume, but the agent has no API server connection")
	}
	if !p.cfg.Attachments.ReportedInUse(volName) {
		return nil, volume.Waitingf("waiting for volume %s to be reported in use in the node's status", volName)
	}
	va, ok := p.cfg.Attachments.Get(name)
	if !ok {
		return nil, volume.Waitingf("waiting for VolumeAttachment %s (driver %s, volume %s) to be created", name, src.driver, src.handle)
	}
	if e := va.Status.AttachError; e != nil {
		if e.ErrorCode != nil && codes.Code(*e.ErrorCode) == codes.ResourceExhausted && p.cfg.OutOfAttachSlots != nil {
			p.cfg.OutOfAttachSlots(src.driver)
		}
		return nil, fmt.Errorf("VolumeAttachment %s: attach failed: %s", name, e.Message)
	}
	if !va.Status.Attached {
		return nil, volume.Waitingf("waiting for VolumeAttachment %s (driver %s, volume %s) to be attached", name, src.driver, src.handle)
	}
	return &plugins.AttachResult{PublishContext: va.Status.AttachmentMetadata}, nil
}

// recordAttachment writes the attachment into the volume's state before it
// exists, so a restart at any point knows there may be one to release.
func (p *Plugin) recordAttachment(req *plugins.AttachRequest, src source, attachment string) error {
	identity := src.driver + "^" + src.handle
	state, err := ReadDeviceState(p.deviceStateFile(identity))
	if errors.Is(err, fs.ErrNotExist) {
		state, err = &DeviceState{VolumeName: req.VolumeName, Driver: src.driver, VolumeID: src.handle, PV: src.pvName}, nil
	}
	if err != nil {
		return err
	}
	if err := p.checkDeviceState(state, identity, p.deviceStateFile(identity)); err != nil {
		return fmt.Errorf("not recording the attachment of %s: %w", req.VolumeName, err)
	}
	if state.Attachment == attachment && state.AttachMode == p.cfg.AttachMode {
		return nil
	}
	state.Attachment, state.AttachMode = attachment, p.cfg.AttachMode
	return atomicfile.WriteJSON(p.deviceStateFile(identity), state)
}

func (p *Plugin) attachSelf(ctx context.Context, req *plugins.AttachRequest, name string, src source) (*plugins.AttachResult, error) {
	if p.cfg.Attachments == nil {
		return nil, errors.New("self-attach needs an API server connection")
	}
	if err := p.recordAttachment(req, src, name); err != nil {
		return nil, fmt.Errorf("recording attachment: %w", err)
	}
	va, ok := p.cfg.Attachments.Get(name)
	if ok && va.Status.Attached {
		return &plugins.AttachResult{PublishContext: va.Status.AttachmentMetadata}, nil
	}
	if !ok {
		pv := src.pvName
		err := p.cfg.Attachments.Create(ctx, &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: storagev1.VolumeAttachmentSpec{
				Attacher: src.driver, NodeName: p.cfg.Host.NodeName,
				Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
			},
		})
		if err != nil {
			return nil, volume.Uncertain(fmt.Errorf("creating VolumeAttachment %s: %w", name, err))
		}
	}
	publishContext, err := p.controllerPublish(ctx, src)
	if err != nil {
		return nil, err
	}
	status := storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: publishContext}
	if err := p.cfg.Attachments.PatchStatus(ctx, name, status); err != nil {
		return nil, volume.Uncertain(fmt.Errorf("marking VolumeAttachment %s attached: %w", name, err))
	}
	return &plugins.AttachResult{PublishContext: publishContext}, nil
}

func (p *Plugin) attachLocal(ctx context.Context, req *plugins.AttachRequest, src source) (*plugins.AttachResult, error) {
	if err := p.recordAttachment(req, src, AttachLocal); err != nil {
		return nil, fmt.Errorf("recording attachment: %w", err)
	}
	publishContext, err := p.controllerPublish(ctx, src)
	if err != nil {
		return nil, err
	}
	return &plugins.AttachResult{PublishContext: publishContext}, nil
}

// controllerPublish attaches through the driver's controller service when it
// has one that publishes; otherwise there is nothing to do.
func (p *Plugin) controllerPublish(ctx context.Context, src source) (map[string]string, error) {
	d, err := p.driver(src.driver)
	if err != nil {
		return nil, err
	}
	if !d.ControllerPublish {
		return nil, nil
	}
	mode, err := controllerAccessMode(src, d)
	if err != nil {
		return nil, err
	}
	secrets, err := p.secrets(ctx, src.controllerPub)
	if err != nil {
		return nil, err
	}
	resp, err := d.Client.Controller.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId: src.handle, NodeId: d.NodeID, VolumeCapability: capability(src, "", mode), Readonly: src.readOnly,
		Secrets: secrets, VolumeContext: src.context,
	})
	if err != nil {
		return nil, fmt.Errorf("ControllerPublishVolume of %s (driver %s): %w", src.handle, src.driver, csiclient.Classify(err))
	}
	return resp.GetPublishContext(), nil
}

// Detach implements plugins.Attacher. In controller mode the attach/detach
// controller detaches once the node no longer reports the volume in use;
// in self mode the agent unpublishes and deletes its VolumeAttachment.
func (p *Plugin) Detach(ctx context.Context, req *plugins.AttachRequest) error {
	var identity string
	var src source
	if req.Spec != nil && req.Spec.PV != nil {
		src = sourceOf(req.Spec, volume.PodRef{})
		identity = src.driver + "^" + src.handle
	}
	stateFile := ""
	state := &DeviceState{Driver: src.driver, VolumeID: src.handle, AttachMode: p.cfg.AttachMode}
	if identity == "" {
		identity = identityOf(req.VolumeName)
	}
	if identity != "" {
		stateFile = p.deviceStateFile(identity)
		if s, err := ReadDeviceState(stateFile); err == nil {
			// Its attachment name is what gets deleted: only on the word
			// of a file that agrees with the volume.
			if err := p.checkDeviceState(s, identity, stateFile); err != nil {
				return fmt.Errorf("not detaching %s: %w", req.VolumeName, err)
			}
			state = s
		}
	}
	if state.Driver == "" {
		return fmt.Errorf("cannot detach %s: driver unknown", req.VolumeName)
	}
	switch state.AttachMode {
	case AttachSelf, AttachLocal:
		d, err := p.driver(state.Driver)
		if err != nil {
			return err
		}
		if d.ControllerPublish {
			_, err := d.Client.Controller.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: state.VolumeID, NodeId: d.NodeID})
			if err != nil {
				return fmt.Errorf("ControllerUnpublishVolume of %s (driver %s): %w", state.VolumeID, state.Driver, csiclient.Classify(err))
			}
		}
		if state.AttachMode == AttachSelf && p.cfg.Attachments != nil {
			name := state.Attachment
			if name == "" {
				name = AttachmentName(state.VolumeID, state.Driver, p.cfg.Host.NodeName)
			}
			if err := p.cfg.Attachments.Delete(ctx, name); err != nil {
				return fmt.Errorf("deleting VolumeAttachment %s: %w", name, err)
			}
		}
	}
	if stateFile != "" {
		return atomicfile.Remove(stateFile)
	}
	return nil
}

// identityOf recovers "driver^handle" from a CSI unique volume name.
func identityOf(name volume.UniqueName) string {
	prefix := Name + "/"
	s := string(name)
	if len(s) > len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):]
	}
	return ""
}
