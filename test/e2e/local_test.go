package e2e

import (
	"path/filepath"
	"testing"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// Local PersistentVolumes reached through bound claims: a directory is
// bind-mounted into each pod; a blank block device is formatted ext4,
// mounted once under <root>/plugins/kubernetes.io~local-volume/mounts/<pv>/
// globalmount and bind-mounted from there into each pod. Node affinity is
// checked against --node-name and --node-labels.
func TestLocalPersistentVolumes(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	host := mounttest.TempDir(t)
	loop := mounttest.LoopDevice(t, 64<<20)
	a := newAgent(t, withNodeLabels("topology.example.com/rack=r1"))

	dataDir := filepath.Join(host, "local-dir")
	mounttest.WriteFile(t, filepath.Join(dataDir, "existing.txt"), "existing")
	a.Write("storage.yaml",
		e2eutil.LocalPV("local-dir", dataDir, "claim-dir", "kubernetes.io/hostname", nodeName),
		e2eutil.PVC("claim-dir", "local-dir"),
		e2eutil.LocalPV("local-block", loop, "claim-block", "topology.example.com/rack", "r1"),
		e2eutil.PVC("claim-block", "local-block"),
		e2eutil.LocalPV("elsewhere", dataDir, "claim-elsewhere", "kubernetes.io/hostname", "another-node"),
		e2eutil.PVC("claim-elsewhere", "elsewhere"),
	)
	a.Write("db.yaml", newPod("db", claim("data", "claim-dir", false), claim("block", "claim-block", false)))
	a.Write("reader.yaml", newPod("reader", claim("data", "claim-dir", false), claim("block", "claim-block", true)))
	a.Write("misplaced.yaml", newPod("misplaced", claim("data", "claim-elsewhere", false)))
	a.Start()
	uids := a.waitReady("db", "reader")

	if got := mounttest.DiskFormat(t, loop); got != "ext4" {
		t.Errorf("block device formatted as %q, want ext4", got)
	}
	global := a.globalMount(e2eutil.LocalPlugin, "local-block")
	gm, err := mountAt(t, global)
	if err != nil {
		t.Fatal(err)
	}
	maj, min := devNumbers(t, loop)
	if gm.FSType != "ext4" || gm.Major != maj || gm.Minor != min || gm.Root != "/" {
		t.Errorf("global mount %+v, want ext4 from %s", gm, loop)
	}
	for name, uid := range uids {
		blk := a.volumeDir(uid, e2eutil.LocalPlugin, "local-block")
		m, err := mountAt(t, blk)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if m.Major != maj || m.Minor != min || m.Root != "/" {
			t.Errorf("%s: block volume mount %+v is not the device's root", name, m)
		}
		if ro := name == "reader"; m.HasOption("ro") != ro {
			t.Errorf("%s: block volume options %v, want ro=%v", name, m.Options, ro)
		}
		dir := a.volumeDir(uid, e2eutil.LocalPlugin, "local-dir")
		if _, err := mountAt(t, dir); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if same, err := sameFile(dir, dataDir); err != nil || !same {
			t.Errorf("%s: %s is not the local directory %s (%v)", name, dir, dataDir, err)
		}
	}
	// Data flows between the pods and the global mount.
	mounttest.WriteFile(t, filepath.Join(a.volumeDir(uids["db"], e2eutil.LocalPlugin, "local-block"), "db.txt"), "written by db")
	if got := mounttest.ReadFile(t, filepath.Join(global, "db.txt")); got != "written by db" {
		t.Errorf("global mount sees %q", got)
	}
	if got := mounttest.ReadFile(t, filepath.Join(a.volumeDir(uids["reader"], e2eutil.LocalPlugin, "local-block"), "db.txt")); got != "written by db" {
		t.Errorf("reader sees %q", got)
	}
	if got := mounttest.ReadFile(t, filepath.Join(a.volumeDir(uids["reader"], e2eutil.LocalPlugin, "local-dir"), "existing.txt")); got != "existing" {
		t.Errorf("reader sees %q in the directory volume", got)
	}

	asw, err := a.ASW()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range asw.Volumes {
		if v.Name == e2eutil.LocalPlugin+"/local-block" {
			found = true
			if v.DeviceMountState != "GloballyMounted" || v.DeviceMountPath != global || len(v.Pods) != 2 {
				t.Errorf("asw local-block: %+v", v)
			}
		}
	}
	if !found {
		t.Errorf("asw has no %s/local-block", e2eutil.LocalPlugin)
	}

	// The PV of another node is refused for its pod, nothing else.
	d, err := a.DSW()
	if err != nil {
		t.Fatal(err)
	}
	p := d.Pod("default", "misplaced")
	if p == nil || len(p.Errors) != 1 || p.Errors[0].Reason != "NodeAffinityMismatch" || p.Errors[0].Volume != "data" {
		t.Errorf("pod misplaced: %+v, want a NodeAffinityMismatch error on volume data", p)
	}
	if p != nil {
		if ms := mounttest.MountsUnder(t, filepath.Join(a.Root(), "pods", p.UID)); len(ms) != 0 {
			t.Errorf("misplaced pod has mounts: %v", mounttest.MountPoints(ms))
		}
	}
	if ms := mounttest.MountsUnder(t, a.Root()); len(ms) != 5 {
		t.Errorf("mounts under the root: %v, want the global mount and 2x2 pod mounts", mounttest.MountPoints(ms))
	}
}
