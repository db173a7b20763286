package tenant_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// localVolume makes a directory for a local PV (a tenant's earlier pod
// filled it) and writes the PV and its claim default/claim.
func localVolume(t *testing.T, a *agent) string {
	t.Helper()
	dir := filepath.Join(mounttest.TempDir(t), "local")
	must(t, os.MkdirAll(dir, 0o755))
	a.Write("storage.yaml",
		e2eutil.LocalPV("local", dir, "claim", "kubernetes.io/hostname", nodeName),
		e2eutil.PVC("claim", "local"))
	return dir
}

// gidOf returns the group of path (not following a link).
func gidOf(t *testing.T, path string) uint32 {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(path, &st))
	return st.Gid
}

// A local volume holding links out of it, a FIFO, device nodes, a socket
// and a directory with mode 0 gets a pod with an fsGroup: the agent gives
// the group to what is in the volume, and to nothing the links point to;
// it neither blocks on the FIFO nor writes to the device.
func TestFSGroupSetupOfPlantedVolume(t *testing.T) {
	t.Parallel()
	d := newDecoy(t)
	disk := mounttest.LoopDevice(t, 8<<20)
	diskSum := deviceSum(t, disk)
	a := newAgent(t)
	dir := localVolume(t, a)
	d.plantLinks(t, dir)
	plantSpecial(t, dir, disk)
	must(t, os.WriteFile(filepath.Join(dir, "data"), []byte("mine"), 0o600))

	a.Write("app.yaml", pod("app", ptr.To[int64](fsGroup), e2eutil.ClaimVolume("data", "claim")))
	a.Start()
	a.waitReady("app")
	d.check(t)
	if got := deviceSum(t, disk); got != diskSum {
		t.Error("the disk behind a planted device node changed")
	}
	for _, name := range []string{"data", "dir", "fifo"} {
		if gid := gidOf(t, filepath.Join(dir, name)); gid != fsGroup {
			t.Errorf("%s has group %d, want the fsGroup %d", name, gid, fsGroup)
		}
	}
	must(t, os.Chmod(filepath.Join(dir, "locked"), 0o755))
}

// The tenant swaps a directory of its volume with a link to the decoy tree
// (renameat2 RENAME_EXCHANGE, over and over) while the agent applies the
// fsGroup of pod after pod. A walk that goes by path changes the decoy's
// owners and modes as soon as it loses the race; a walk on file
// descriptors never does.
func TestFSGroupSymlinkSwapRace(t *testing.T) {
	t.Parallel()
	d := newDecoy(t)
	a := newAgent(t)
	dir := localVolume(t, a)
	sw := filepath.Join(dir, "sw")
	must(t, os.MkdirAll(sw, 0o755))
	// The same names as in the decoy's etc/, so that a lost race hits them.
	for _, name := range []string{"passwd", "shadow", "link"} {
		must(t, os.WriteFile(filepath.Join(sw, name), []byte("tenant"), 0o644))
	}
	for i := range 200 {
		must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("filler-%03d", i)), nil, 0o644))
	}
	must(t, os.Symlink(filepath.Join(d.dir, "etc"), filepath.Join(dir, "sw-link")))

	stop := make(chan struct{})
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, sw, unix.AT_FDCWD, filepath.Join(dir, "sw-link"), unix.RENAME_EXCHANGE); err == nil {
				swaps.Add(1)
			}
		}
	})
	a.Start()
	for i := range 10 {
		name := fmt.Sprintf("app-%d", i)
		a.Write(name+".yaml", pod(name, ptr.To[int64](fsGroup+int64(i)), e2eutil.ClaimVolume("data", "claim")))
		a.waitReady(name)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d swaps during 10 setups", swaps.Load())
	d.check(t)
}

// A tree 1,600 directories deep with 255-byte names, and 100,000 files in
// one directory, in a local volume that gets a pod with an fsGroup: the
// walk reaches the bottom (a walk by path fails beyond PATH_MAX) in bounded
// memory.
func TestFSGroupSetupDeepAndWide(t *testing.T) {
	t.Parallel()
	a := newAgent(t)
	dir := localVolume(t, a)
	deepTree(t, dir, 1600)
	wide := filepath.Join(dir, "wide")
	must(t, os.Mkdir(wide, 0o755))
	wideTree(t, wide, 100000)
	a.Write("app.yaml", pod("app", ptr.To[int64](fsGroup), e2eutil.ClaimVolume("data", "claim")))
	a.Start()
	before := a.peakRSS()
	a.waitReady("app")
	after := a.peakRSS()
	t.Logf("peak RSS %.1f MiB before the setup, %.1f MiB after", float64(before)/(1<<20), float64(after)/(1<<20))
	if grew := after - before; grew > 16<<20 {
		t.Errorf("the fsGroup walk raised the agent's peak RSS by %.1f MiB", float64(grew)/(1<<20))
	}
	if gid := gidOf(t, filepath.Join(wide, wideName(99999))); gid != fsGroup {
		t.Errorf("the last wide file has group %d, want %d", gid, fsGroup)
	}
	if gid := deepBottomGID(t, dir, 1600); gid != fsGroup {
		t.Errorf("the bottom of the deep tree has group %d, want %d", gid, fsGroup)
	}
}
