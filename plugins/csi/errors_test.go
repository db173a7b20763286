package csi_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volume-agent/volume-agent/csi/csiclient"
	"github.com/volume-agent/volume-agent/volume"
)

// uncertainCodes are the gRPC codes after which a call may still be in
// progress or may have taken effect (the CSI spec's and the kubelet's rule).
var uncertainCodes = map[codes.Code]bool{
	codes.DeadlineExceeded:  true,
	codes.Unavailable:       true,
	codes.Canceled:          true,
	codes.Aborted:           true,
	codes.ResourceExhausted: true,
}

// Every gRPC code a driver can answer NodeStage, NodePublish, NodeUnpublish
// and NodeUnstage with is classified on the error the plugin returns:
// uncertain for the five codes above, final for the others. A final
// NodePublish failure forgets the pod's state and target; an uncertain one
// keeps the state so the volume is torn down properly.
func TestErrorClassification(t *testing.T) {
	f := newFixture(t)
	m := f.startRegistered(testDriver, caps{stage: true})
	spec := pvSpec("pv-1", "vol-1")
	p := f.plugin()
	podInfo := pod("uid-1")

	// A staged and published volume to unpublish and unstage.
	m.node.EXPECT().NodeStageVolume(gomock.Any(), gomock.Any()).Return(&csi.NodeStageVolumeResponse{}, nil)
	m.node.EXPECT().NodePublishVolume(gomock.Any(), gomock.Any()).Return(&csi.NodePublishVolumeResponse{}, nil)
	devReq := f.deviceRequest(spec, nil)
	if err := p.MountDevice(ctx(t), devReq); err != nil {
		t.Fatal(err)
	}
	published := f.setUpRequest(spec, podInfo, nil)
	if err := p.SetUp(ctx(t), published); err != nil {
		t.Fatal(err)
	}
	other := pod("uid-2") // the pod whose publish fails

	for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
		wantUncertain := uncertainCodes[code]
		injected := status.Errorf(code, "injected %s", code)
		check := func(method string, err error) {
			t.Helper()
			if err == nil {
				t.Errorf("%s answered %s: no error", method, code)
				return
			}
			if got := volume.IsUncertain(err); got != wantUncertain {
				t.Errorf("%s answered %s: uncertain=%v, want %v (%v)", method, code, got, wantUncertain, err)
			}
			if status.Code(err) != code || !strings.Contains(err.Error(), "injected "+code.String()) {
				t.Errorf("%s answered %s: the error %q lost the driver's message", method, code, err)
			}
			if !strings.Contains(err.Error(), method) || !strings.Contains(err.Error(), "vol-1") || !strings.Contains(err.Error(), testDriver) {
				t.Errorf("%s answered %s: %q does not name the call, the volume and the driver", method, code, err)
			}
		}

		m.node.EXPECT().NodeStageVolume(gomock.Any(), gomock.Any()).Return(nil, injected)
		check("NodeStageVolume", p.MountDevice(ctx(t), f.deviceRequest(spec, nil)))

		m.node.EXPECT().NodePublishVolume(gomock.Any(), gomock.Any()).Return(nil, injected)
		req := f.setUpRequest(spec, other, nil)
		req.DeviceMountPath = devReq.DeviceMountPath
		check("NodePublishVolume", p.SetUp(ctx(t), req))
		if kept := exists(t, f.podStateFile(other, spec.Name)); kept != wantUncertain {
			t.Errorf("NodePublishVolume answered %s: pod state kept=%v, want %v", code, kept, wantUncertain)
		}
		if !wantUncertain && exists(t, req.Dir) {
			t.Errorf("NodePublishVolume answered %s: target %s left behind", code, req.Dir)
		}

		m.node.EXPECT().NodeUnpublishVolume(gomock.Any(), gomock.Any()).Return(nil, injected)
		check("NodeUnpublishVolume", p.TearDown(ctx(t), f.tearDownRequest(published.VolumeName, nil, podInfo, spec.Name)))
		if !exists(t, f.podStateFile(podInfo, spec.Name)) {
			t.Fatalf("NodeUnpublishVolume answered %s: pod state removed although nothing was unpublished", code)
		}

		m.node.EXPECT().NodeUnstageVolume(gomock.Any(), gomock.Any()).Return(nil, injected)
		unstage := f.deviceRequest(spec, nil)
		unstage.Spec = nil
		check("NodeUnstageVolume", p.UnmountDevice(ctx(t), unstage))
		if !exists(t, f.deviceStateFile(identityOf(spec))) {
			t.Fatalf("NodeUnstageVolume answered %s: device state removed although nothing was unstaged", code)
		}
	}
}

// Errors that are not an answer from the driver: the call timed out on our
// side, the driver is gone, or the error is not a gRPC status at all.
func TestUncertainWithoutAnswer(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		f := newFixture(t)
		m := f.startRegistered(testDriver, caps{stage: true})
		m.node.EXPECT().NodePublishVolume(gomock.Any(), gomock.Any()).DoAndReturn(
			func(ctx context.Context, _ *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			})
		short, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		podInfo := pod("uid-1")
		err := f.plugin().SetUp(short, f.setUpRequest(pvSpec("pv-1", "vol-1"), podInfo, nil))
		if !volume.IsUncertain(err) || status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("SetUp with a NodePublishVolume that outlives its context: %v, want an uncertain DeadlineExceeded", err)
		}
		if !exists(t, f.podStateFile(podInfo, "pv-1")) {
			t.Errorf("pod state removed after an uncertain publish")
		}
	})
	t.Run("driver gone", func(t *testing.T) {
		f := newFixture(t)
		m := f.startRegistered(testDriver, caps{stage: true})
		m.stop() // still registered: the registry has not probed it yet
		err := f.plugin().MountDevice(ctx(t), f.deviceRequest(pvSpec("pv-1", "vol-1"), nil))
		if !volume.IsUncertain(err) || status.Code(err) != codes.Unavailable {
			t.Errorf("MountDevice with the driver's socket gone: %v, want an uncertain Unavailable", err)
		}
	})
	t.Run("not a gRPC status", func(t *testing.T) {
		for _, err := range []error{
			errors.New("connection reset"),
			fmt.Errorf("wrapped: %w", context.DeadlineExceeded),
			fmt.Errorf("wrapped: %w", context.Canceled),
		} {
			if csiclient.IsFinal(err) || !volume.IsUncertain(csiclient.Classify(err)) {
				t.Errorf("%v: classified final, want uncertain", err)
			}
		}
		if csiclient.Classify(nil) != nil {
			t.Errorf("Classify(nil) is not nil")
		}
	})
}
