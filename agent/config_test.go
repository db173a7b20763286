package agent

import (
	"strings"
	"testing"
)

// The node's identity comes from one place, in cluster mode only.
func TestNodeIdentityFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
		certDir string
	}{
		{name: "bootstrap", cfg: Config{BootstrapKubeconfig: "/b"}, certDir: "/var/lib/volume-agent/pki"},
		{name: "bootstrap, own directory", cfg: Config{BootstrapKubeconfig: "/b", NodeCertDir: "/pki"}, certDir: "/pki"},
		{name: "both", cfg: Config{BootstrapKubeconfig: "/b", NodeKubeconfig: "/n"}, wantErr: "set one"},
		{name: "standalone", cfg: Config{BootstrapKubeconfig: "/b", PodManifestPath: "/m"}, wantErr: "--bootstrap-kubeconfig needs cluster mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.NodeName, tc.cfg.RootDir = "node-a", "/var/lib/volume-agent"
			got, err := tc.cfg.complete()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.NodeCertDir != tc.certDir {
				t.Errorf("certificate directory %q, want %q", got.NodeCertDir, tc.certDir)
			}
		})
	}
}
