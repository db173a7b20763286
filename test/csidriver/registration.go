package csidriver

import (
	"context"
	"time"

	"go.uber.org/zap"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// RegistrationStatus is one NotifyRegistrationStatus call of the kubelet (or
// of whatever plays its part).
type RegistrationStatus struct {
	Registered bool
	Error      string
	Time       time.Time
}

// RegistrationStatuses returns every registration status received, oldest
// first.
func (d *Driver) RegistrationStatuses() []RegistrationStatus {
	d.regMu.Lock()
	defer d.regMu.Unlock()
	return append([]RegistrationStatus(nil), d.regHistory...)
}

// registrationServer implements the kubelet plugin registration API v1 the
// way node-driver-registrar does for a CSI driver.
type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	d *Driver
}

func (s *registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.d.cfg.Name,
		Endpoint:          s.d.socketPath,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (s *registrationServer) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		s.d.log.Info("registered with the plugin watcher")
	} else {
		s.d.log.Warn("registration failed", zap.String("error", st.GetError()))
	}
	s.d.regMu.Lock()
	s.d.regHistory = append(s.d.regHistory, RegistrationStatus{
		Registered: st.GetPluginRegistered(), Error: st.GetError(), Time: time.Now(),
	})
	s.d.regMu.Unlock()
	return &registerapi.RegistrationStatusResponse{}, nil
}
