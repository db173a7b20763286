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

// --node-ip is checked as the kubelet checks it, in standalone mode only.
func TestNodeIPs(t *testing.T) {
	for _, tc := range []struct {
		name       string
		raw        []string
		standalone bool
		want       string
		wantErr    string
	}{
		{name: "none", standalone: true},
		{name: "one", raw: []string{"192.0.2.1"}, standalone: true, want: "192.0.2.1"},
		{name: "dual stack, canonical", raw: []string{"2001:DB8:0::1", " 192.0.2.1"}, standalone: true, want: "2001:db8::1,192.0.2.1"},
		{name: "same family", raw: []string{"192.0.2.1", "192.0.2.2"}, standalone: true, wantErr: "one IPv4 and one IPv6"},
		{name: "three", raw: []string{"192.0.2.1", "2001:db8::1", "192.0.2.2"}, standalone: true, wantErr: "at most two"},
		{name: "not an IP", raw: []string{"node-a"}, standalone: true, wantErr: `"node-a" is not a node IP`},
		{name: "unspecified", raw: []string{"0.0.0.0"}, standalone: true, wantErr: "is not a node IP"},
		{name: "empty", raw: []string{""}, standalone: true, wantErr: "is not a node IP"},
		{name: "cluster mode", raw: []string{"192.0.2.1"}, wantErr: "--node-ip needs standalone mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{NodeName: "node-a", RootDir: "/var/lib/volume-agent", NodeIPs: tc.raw}
			if tc.standalone {
				cfg.PodManifestPath = "/m"
			}
			got, err := cfg.complete()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := strings.Join(got.NodeIPs, ","); s != tc.want {
				t.Errorf("node IPs %q, want %q", s, tc.want)
			}
		})
	}
}
