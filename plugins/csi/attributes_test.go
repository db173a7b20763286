package csi_test

import (
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/volume"
)

func TestAttributes(t *testing.T) {
	persistent, ephemeral := storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral
	driverSpec := func(mutate func(*storagev1.CSIDriverSpec)) *storagev1.CSIDriver {
		d := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: testDriver}}
		if mutate != nil {
			mutate(&d.Spec)
		}
		return d
	}
	shared := func(attachable, remount bool) volume.Attributes {
		return volume.Attributes{Identity: testDriver + "^vol-1", DeviceMountable: true, Attachable: attachable, RequiresRemount: remount}
	}
	cases := []struct {
		name       string
		attachMode string
		csiDriver  *storagev1.CSIDriver // nil: none
		lookupErr  error
		spec       *volume.Spec
		want       volume.Attributes
		wantErr    string
	}{
		{name: "PV without CSIDriver, cluster: attach required (the kubelet's default)",
			spec: pvSpec("pv-1", "vol-1"), want: shared(true, false)},
		{name: "PV without CSIDriver, standalone: nothing to attach", attachMode: csiplugin.AttachLocal,
			spec: pvSpec("pv-1", "vol-1"), want: shared(false, false)},
		{name: "PV, CSIDriver without attachRequired: required", csiDriver: driverSpec(nil),
			spec: pvSpec("pv-1", "vol-1"), want: shared(true, false)},
		{name: "PV, attachRequired false", csiDriver: driverSpec(func(s *storagev1.CSIDriverSpec) { s.AttachRequired = ptr.To(false) }),
			spec: pvSpec("pv-1", "vol-1"), want: shared(false, false)},
		{name: "PV, attachRequired true", csiDriver: driverSpec(func(s *storagev1.CSIDriverSpec) { s.AttachRequired = ptr.To(true) }),
			spec: pvSpec("pv-1", "vol-1"), want: shared(true, false)},
		{name: "PV, requiresRepublish", csiDriver: driverSpec(func(s *storagev1.CSIDriverSpec) {
			s.AttachRequired, s.RequiresRepublish = ptr.To(false), ptr.To(true)
		}), spec: pvSpec("pv-1", "vol-1"), want: shared(false, true)},
		{name: "PV, Persistent and Ephemeral", csiDriver: driverSpec(func(s *storagev1.CSIDriverSpec) {
			s.AttachRequired, s.VolumeLifecycleModes = ptr.To(false), []storagev1.VolumeLifecycleMode{ephemeral, persistent}
		}), spec: pvSpec("pv-1", "vol-1"), want: shared(false, false)},
		{name: "PV, Ephemeral only: refused", csiDriver: driverSpec(func(s *storagev1.CSIDriverSpec) {
			s.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{ephemeral}
		}), spec: pvSpec("pv-1", "vol-1"), wantErr: "does not allow the Persistent lifecycle mode"},
		{name: "PV without a handle", spec: pvSpec("pv-1", ""), wantErr: "no CSI driver or volume handle"},
		{name: "raw block: staged and published like any PV, with Block set", csiDriver: driverSpec(nil),
			spec: func() *volume.Spec { s := pvSpec("pv-1", "vol-1"); s.Mode = v1.PersistentVolumeBlock; return s }(),
			want: func() volume.Attributes { a := shared(true, false); a.Block = true; return a }()},
		{name: "CSIDriver lookup fails", lookupErr: errors.New("informer broken"), spec: pvSpec("pv-1", "vol-1"), wantErr: "informer broken"},
		{name: "inline without CSIDriver: refused", spec: inlineSpec("scratch", nil),
			wantErr: "needs a CSIDriver object listing the Ephemeral lifecycle mode"},
		{name: "inline, CSIDriver without modes (Persistent only): refused", csiDriver: driverSpec(nil),
			spec: inlineSpec("scratch", nil), wantErr: "does not allow inline (Ephemeral lifecycle mode) volumes"},
		{name: "inline, Persistent only: refused", csiDriver: driverSpec(func(s *storagev1.CSIDriverSpec) {
			s.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{persistent}
		}), spec: inlineSpec("scratch", nil), wantErr: "does not allow inline"},
		{name: "inline, Ephemeral: per pod, never attached or staged", csiDriver: driverSpec(func(s *storagev1.CSIDriverSpec) {
			s.AttachRequired, s.VolumeLifecycleModes = ptr.To(true), []storagev1.VolumeLifecycleMode{ephemeral}
		}), spec: inlineSpec("scratch", nil), want: volume.Attributes{}},
		{name: "inline, requiresRepublish", csiDriver: driverSpec(func(s *storagev1.CSIDriverSpec) {
			s.RequiresRepublish, s.VolumeLifecycleModes = ptr.To(true), []storagev1.VolumeLifecycleMode{ephemeral}
		}), spec: inlineSpec("scratch", nil), want: volume.Attributes{RequiresRemount: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			if c.attachMode != "" {
				f.attachMode = c.attachMode
			}
			if c.csiDriver != nil {
				f.setCSIDriver(c.csiDriver)
			}
			p := f.plugin()
			if c.lookupErr != nil {
				p = csiplugin.New(csiplugin.Config{CSIDriver: func(string) (*storagev1.CSIDriver, error) { return nil, c.lookupErr }})
			}
			if !p.CanSupport(c.spec) {
				t.Fatalf("CanSupport is false")
			}
			got, err := p.Attributes(c.spec)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("Attributes = %+v, %v; want an error containing %q", got, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Attributes: %v", err)
			}
			if got != c.want {
				t.Errorf("Attributes = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestCanSupport(t *testing.T) {
	p := newFixture(t).plugin()
	if p.CanSupport(&volume.Spec{Volume: &v1.Volume{VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}) {
		t.Errorf("supports emptyDir")
	}
	if p.CanSupport(&volume.Spec{PV: &v1.PersistentVolume{Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
		Local: &v1.LocalVolumeSource{Path: "/x"},
	}}}}) {
		t.Errorf("supports a local PV")
	}
	if p.Name() != "kubernetes.io/csi" {
		t.Errorf("name %q", p.Name())
	}
}
