package tenant_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// Everything a tenant can put in its volumes, planted before teardown:
// links out of the volume (to the decoy tree, /, climbing ..), a FIFO, a
// character and a block device node (of a disk with data), a socket, a
// directory with mode 0, odd names. Deleting the pod removes its emptyDirs
// (on disk and in memory) without touching anything they point to, and
// leaves the data of its local volume (which belongs to the volume, not the
// pod) where it is; nothing stays mounted.
func TestTeardownOfPlantedVolumes(t *testing.T) {
	t.Parallel()
	d := newDecoy(t)
	disk := mounttest.LoopDevice(t, 8<<20)
	f, err := os.OpenFile(disk, os.O_WRONLY, 0)
	must(t, err)
	_, err = f.Write([]byte(strings.Repeat("disk data ", 100000)))
	must(t, err)
	must(t, f.Close())
	diskSum := deviceSum(t, disk)
	localDir := filepath.Join(mounttest.TempDir(t), "local")
	must(t, os.MkdirAll(localDir, 0o755))

	a := newAgent(t)
	a.Write("storage.yaml",
		e2eutil.LocalPV("local", localDir, "claim", "kubernetes.io/hostname", nodeName),
		e2eutil.PVC("claim", "local"))
	a.Write("victim.yaml", pod("victim", nil,
		e2eutil.EmptyDirVolume("scratch", "", ""),
		e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "16Mi"),
		e2eutil.ClaimVolume("data", "claim")))
	a.Start()
	uid := a.waitReady("victim")
	dirs := map[string]string{
		"scratch": a.volumeDir(uid, e2eutil.EmptyDirPlugin, "scratch"),
		"mem":     a.volumeDir(uid, e2eutil.EmptyDirPlugin, "mem"),
		"data":    a.volumeDir(uid, e2eutil.LocalPlugin, "local"),
	}
	for name, dir := range dirs {
		d.plantLinks(t, dir)
		plantSpecial(t, dir, disk)
		t.Logf("planted in %s (%s)", name, dir)
	}

	a.Remove("victim.yaml")
	a.waitGone(uid, settle)
	d.check(t)
	if got := deviceSum(t, disk); got != diskSum {
		t.Errorf("the disk behind a planted device node changed")
	}
	// The local volume's data is the volume's: only unmounted.
	for _, name := range []string{"to-decoy", "fifo", "disk", "locked"} {
		if _, err := os.Lstat(filepath.Join(localDir, name)); err != nil {
			t.Errorf("the local volume lost %s: %v", name, err)
		}
	}
	if ms := mounttest.MountsUnder(t, a.Root()); len(ms) > 0 {
		t.Errorf("mounts left under the root: %v", mounttest.MountPoints(ms))
	}
	must(t, os.Chmod(filepath.Join(localDir, "locked"), 0o755))
}

// A tree 1,600 directories deep with 255-byte names (a path of 400 KiB,
// far beyond PATH_MAX) in an emptyDir on disk and one in memory: teardown
// removes it, in bounded memory.
func TestTeardownDeepTree(t *testing.T) {
	// Before it, removal peaks at about 350 MiB for this tree.
	t.Parallel()
	a := newAgent(t)
	a.Write("deep.yaml", pod("deep", nil,
		e2eutil.EmptyDirVolume("scratch", "", ""),
		e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "64Mi")))
	a.Start()
	uid := a.waitReady("deep")
	for _, name := range []string{"scratch", "mem"} {
		deepTree(t, a.volumeDir(uid, e2eutil.EmptyDirPlugin, name), 1600)
	}
	before := a.peakRSS()
	a.Remove("deep.yaml")
	a.waitGone(uid, 2*time.Minute)
	t.Logf("peak RSS %.1f MiB before the teardown, %.1f MiB after", float64(before)/(1<<20), float64(a.peakRSS())/(1<<20))
}

// 100,000 files with 250-byte names (25 MB of names) in one directory:
// teardown removes them without holding every name at once.
func TestTeardownWideTree(t *testing.T) {
	// Before it, removal adds about 43 MiB for these names.
	t.Parallel()
	a := newAgent(t)
	a.Write("wide.yaml", pod("wide", nil, e2eutil.EmptyDirVolume("scratch", "", "")))
	a.Start()
	uid := a.waitReady("wide")
	wideTree(t, a.volumeDir(uid, e2eutil.EmptyDirPlugin, "scratch"), 100000)
	before := a.peakRSS()
	a.Remove("wide.yaml")
	a.waitGone(uid, 3*time.Minute)
	after := a.peakRSS()
	t.Logf("peak RSS %.1f MiB before the teardown, %.1f MiB after", float64(before)/(1<<20), float64(after)/(1<<20))
	if grew := after - before; grew > 16<<20 {
		t.Errorf("removing 100,000 entries raised the agent's peak RSS by %.1f MiB: names are held in memory", float64(grew)/(1<<20))
	}
}

// Something mounted inside an emptyDir (here the decoy tree, as a mount a
// tenant's pod could have had propagated there): teardown must not remove
// through the mount. It fails, says so, and retries; once the mount is
// gone the volume goes too.
func TestTeardownWithMountInside(t *testing.T) {
	t.Parallel()
	d := newDecoy(t)
	a := newAgent(t)
	a.Write("victim.yaml", pod("victim", nil, e2eutil.EmptyDirVolume("scratch", "", "")))
	a.Start()
	uid := a.waitReady("victim")
	inside := filepath.Join(a.volumeDir(uid, e2eutil.EmptyDirPlugin, "scratch"), "sub", "mnt")
	must(t, os.MkdirAll(inside, 0o755))
	must(t, unix.Mount(d.dir, inside, "", unix.MS_BIND|unix.MS_REC, ""))
	t.Cleanup(func() { _ = unix.Unmount(inside, unix.MNT_DETACH) })

	a.Remove("victim.yaml")
	waitOperationError(t, a, "mount point inside")
	d.check(t)
	if _, err := os.Stat(inside); err != nil {
		t.Fatalf("the mount point inside the volume is gone: %v", err)
	}
	must(t, unix.Unmount(inside, 0))
	a.waitGone(uid, settle)
}

// A file kept open in a memory emptyDir: its tmpfs cannot be unmounted.
// The agent retries, and never detaches it lazily (which would hide a mount
// that still holds the tenant's data); once the file is closed the volume
// goes.
func TestTeardownWithOpenFile(t *testing.T) {
	t.Parallel()
	a := newAgent(t)
	a.Write("victim.yaml", pod("victim", nil, e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "8Mi")))
	a.Start()
	uid := a.waitReady("victim")
	dir := a.volumeDir(uid, e2eutil.EmptyDirPlugin, "mem")
	f, err := os.Create(filepath.Join(dir, "held"))
	must(t, err)
	defer f.Close()

	a.Remove("victim.yaml")
	waitOperationError(t, a, "busy")
	if ms := mounttest.MountsAt(t, dir); len(ms) != 1 {
		t.Fatalf("mounts at %s while a file is open: %v; a lazy unmount would hide the tenant's tmpfs", dir, mounttest.MountPoints(ms))
	}
	must(t, f.Close())
	a.waitGone(uid, settle)
}

// waitOperationError waits until an operation of the agent failed with an
// error containing s, and logs it.
func waitOperationError(t *testing.T, a *agent, s string) {
	t.Helper()
	e2eutil.PollErr(t, settle, "an operation failing with "+s, func() error {
		ops, err := a.Operations()
		if err != nil {
			return err
		}
		var seen []string
		for _, op := range ops.Operations {
			if strings.Contains(op.LastError, s) {
				t.Logf("%s of %s: %s", op.Operation, op.Volume, op.LastError)
				return nil
			}
			seen = append(seen, fmt.Sprintf("%s %s: %q", op.Operation, op.State, op.LastError))
		}
		return errors.New(strings.Join(seen, "; "))
	})
}

// The tenant races the teardown: while the agent removes an emptyDir, a
// process of the tenant (another container still running, or a pod sharing
// the directory) keeps swapping a directory of it with a link to the decoy
// tree and planting more. The agent never removes through the link; once
// the racer stops, the volume goes.
func TestTeardownRace(t *testing.T) {
	t.Parallel()
	d := newDecoy(t)
	a := newAgent(t)
	a.Write("victim.yaml", pod("victim", nil, e2eutil.EmptyDirVolume("scratch", "", "")))
	a.Start()
	uid := a.waitReady("victim")
	dir := a.volumeDir(uid, e2eutil.EmptyDirPlugin, "scratch")
	sw := filepath.Join(dir, "sw")
	// The decoy's etc, with the same names: a removal that follows the
	// link would delete passwd and shadow.
	must(t, os.MkdirAll(sw, 0o755))
	for _, name := range []string{"passwd", "shadow", "link"} {
		must(t, os.WriteFile(filepath.Join(sw, name), []byte("tenant"), 0o644))
	}
	must(t, os.Symlink(filepath.Join(d.dir, "etc"), filepath.Join(dir, "sw-link")))

	// The racer works on a descriptor of the volume, as a process inside
	// it would: never through a link, and nothing once the agent removed
	// the volume's directory.
	dirFD, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(dirFD)
	target := filepath.Join(d.dir, "etc")
	stop := make(chan struct{})
	var swaps, planted atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if unix.Renameat2(dirFD, "sw", dirFD, "sw-link", unix.RENAME_EXCHANGE) == nil {
				swaps.Add(1)
			}
			// Plant again what the agent removed.
			_ = unix.Mkdirat(dirFD, "sw", 0o755)
			if swFD, err := unix.Openat(dirFD, "sw", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
				if f, err := unix.Openat(swFD, "passwd", unix.O_CREAT|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644); err == nil {
					unix.Close(f)
					planted.Add(1)
				}
				unix.Close(swFD)
			}
			_ = unix.Symlinkat(target, dirFD, "sw-link")
		}
	})
	a.Remove("victim.yaml")
	// Until the agent has tried at least once (the volume's directory
	// shrinks or an attempt failed), keep racing.
	e2eutil.PollErr(t, settle, "a teardown attempt under the race", func() error {
		if _, err := os.Lstat(filepath.Join(dir, "..")); err != nil {
			return nil // the pod's volumes directory is gone already
		}
		ops, err := a.Operations()
		if err != nil {
			return err
		}
		for _, op := range ops.Operations {
			if op.Operation == "unmount_volume" {
				return nil
			}
		}
		if _, err := os.Lstat(dir); err != nil {
			return nil
		}
		return errors.New("no unmount_volume attempt yet")
	})
	close(stop)
	wg.Wait()
	t.Logf("%d swaps and %d re-plantings during the teardown", swaps.Load(), planted.Load())
	d.check(t)
	a.waitGone(uid, settle)
	d.check(t)
}
