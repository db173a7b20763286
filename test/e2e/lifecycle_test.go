package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// Removing a pod's manifest unmounts all of its volumes, removes its
// directory (nothing is left under <root>/pods once every pod is gone) and
// unmounts a local block PV's global mount, without deleting any data of the
// host or of the PV.
func TestPodDeletion(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	host := mounttest.TempDir(t)
	loop := mounttest.LoopDevice(t, 64<<20)
	a := newAgent(t)

	hostDir := filepath.Join(host, "shared")
	mounttest.WriteFile(t, filepath.Join(hostDir, "host.txt"), "host data")
	// The host directory has a mount of its own, which the recursive bind
	// brings into the pod.
	hostSub := filepath.Join(hostDir, "sub")
	if err := os.Mkdir(hostSub, 0o755); err != nil {
		t.Fatal(err)
	}
	mounttest.MountTmpfs(t, hostSub)
	mounttest.WriteFile(t, filepath.Join(hostSub, "sub.txt"), "host submount data")
	a.Write("storage.yaml",
		e2eutil.LocalPV("local-block", loop, "claim-block", "kubernetes.io/hostname", nodeName),
		e2eutil.PVC("claim-block", "local-block"),
	)
	a.Write("gone.yaml", newPod("gone",
		e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "2Mi"),
		e2eutil.EmptyDirVolume("disk", "", ""),
		e2eutil.HostPathVolume("host", hostDir, hostPathType(corev1.HostPathDirectory)),
		claim("block", "claim-block", false),
	))
	a.Write("stays.yaml", newPod("stays", e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "2Mi")))
	a.Start()
	uids := a.waitReady("gone", "stays")
	gone, stays := uids["gone"], uids["stays"]

	// Data the pod leaves behind in each kind of volume.
	mounttest.WriteFile(t, filepath.Join(a.volumeDir(gone, e2eutil.EmptyDirPlugin, "disk"), "sub", "f.txt"), "x")
	mounttest.WriteFile(t, filepath.Join(a.volumeDir(gone, e2eutil.EmptyDirPlugin, "mem"), "f.txt"), "x")
	mounttest.WriteFile(t, filepath.Join(a.volumeDir(gone, e2eutil.HostPathPlugin, "host"), "from-pod.txt"), "pod data")
	mounttest.WriteFile(t, filepath.Join(a.volumeDir(gone, e2eutil.LocalPlugin, "local-block"), "from-pod.txt"), "block data")
	global := a.globalMount(e2eutil.LocalPlugin, "local-block")
	if _, err := mountAt(t, global); err != nil {
		t.Fatal(err)
	}

	a.Remove("gone.yaml")
	e2eutil.PollErr(t, settleTimeout, "pod gone to be torn down", func() error {
		if err := noMountsUnder(t, filepath.Join(a.Root(), "pods", gone)); err != nil {
			return err
		}
		if err := noMountsUnder(t, global); err != nil {
			return fmt.Errorf("global mount: %v", err)
		}
		if _, err := os.Lstat(global); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("global mount point still there (%v)", err)
		}
		if _, err := os.Lstat(filepath.Join(a.Root(), "pods", gone)); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pod directory still there (%v)", err)
		}
		return nil
	})
	if _, err := mountAt(t, a.volumeDir(stays, e2eutil.EmptyDirPlugin, "mem")); err != nil {
		t.Errorf("the other pod lost its volume: %v", err)
	}
	if d, err := a.DSW(); err != nil || d.Pod("default", "gone") != nil {
		t.Errorf("pod gone still desired (%v)", err)
	}

	a.Remove("stays.yaml")
	e2eutil.PollErr(t, settleTimeout, "every pod to be torn down", func() error {
		if err := noMountsUnder(t, a.Root()); err != nil {
			return err
		}
		dirs, err := a.podDirs()
		if err != nil {
			return err
		}
		if len(dirs) > 0 {
			return fmt.Errorf("left under <root>/pods: %v", dirs)
		}
		return nil
	})

	// Nothing of the host's or the PV's data was deleted.
	if _, err := mountAt(t, hostSub); err != nil {
		t.Errorf("the host's own mount: %v", err)
	}
	for _, f := range []string{"host.txt", "from-pod.txt", "sub/sub.txt"} {
		if _, err := os.Stat(filepath.Join(hostDir, f)); err != nil {
			t.Errorf("hostPath data %s deleted: %v", f, err)
		}
	}
	probe := filepath.Join(host, "probe")
	if err := os.Mkdir(probe, 0o755); err != nil {
		t.Fatal(err)
	}
	mounttest.MountDevice(t, loop, probe, "ext4")
	if got := mounttest.ReadFile(t, filepath.Join(probe, "from-pod.txt")); got != "block data" {
		t.Errorf("local PV data after the pod's deletion: %q", got)
	}
}

// A pod that terminated (phase Succeeded or Failed) has its volumes torn
// down although its manifest is still there; one that is terminated from the
// start never gets any.
func TestTerminatedPod(t *testing.T) {
	t.Parallel()
	a := newAgent(t)
	done := newPod("done-already", e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "1Mi"))
	done.Status.Phase = corev1.PodSucceeded
	a.Write("done.yaml", done)
	for _, name := range []string{"job-succeeds", "job-fails"} {
		a.Write(name+".yaml", newPod(name, e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "1Mi"), e2eutil.EmptyDirVolume("disk", "", "")))
	}
	a.Start()
	uids := a.waitReady("job-succeeds", "job-fails")

	dirs, err := a.podDirs()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(dirs)
	want := []string{uids["job-succeeds"], uids["job-fails"]}
	slices.Sort(want)
	if !slices.Equal(dirs, want) {
		t.Errorf("pod directories %v, want only the running pods' %v", dirs, want)
	}
	if d, err := a.DSW(); err != nil || d.Pod("default", "done-already") != nil {
		t.Errorf("a Succeeded pod is desired (%v)", err)
	}

	for name, phase := range map[string]corev1.PodPhase{"job-succeeds": corev1.PodSucceeded, "job-fails": corev1.PodFailed} {
		p := newPod(name, e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "1Mi"), e2eutil.EmptyDirVolume("disk", "", ""))
		p.Status.Phase = phase
		a.Write(name+".yaml", p)
	}
	e2eutil.PollErr(t, settleTimeout, "the terminated pods' volumes to be torn down", func() error {
		if err := noMountsUnder(t, a.Root()); err != nil {
			return err
		}
		dirs, err := a.podDirs()
		if err != nil {
			return err
		}
		if len(dirs) > 0 {
			return fmt.Errorf("left under <root>/pods: %v", dirs)
		}
		return nil
	})
}

// SIGTERM stops the agent without unmounting anything; a new agent on the
// same root directory adopts the mounts without mounting them again.
func TestSIGTERMLeavesMounts(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	host := mounttest.TempDir(t)
	loop := mounttest.LoopDevice(t, 64<<20)
	a := newAgent(t)
	hostDir := filepath.Join(host, "dir")
	if err := os.Mkdir(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	a.Write("storage.yaml",
		e2eutil.LocalPV("local-block", loop, "claim-block", "kubernetes.io/hostname", nodeName),
		e2eutil.PVC("claim-block", "local-block"),
	)
	a.Write("app.yaml", newPod("app",
		e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "1Mi"),
		e2eutil.EmptyDirVolume("disk", "", ""),
		e2eutil.HostPathVolume("host", hostDir, nil),
		claim("block", "claim-block", false),
	))
	a.Start()
	uid := a.waitReady("app")["app"]
	mounttest.WriteFile(t, filepath.Join(a.volumeDir(uid, e2eutil.EmptyDirPlugin, "mem"), "f.txt"), "in memory")
	before := mounttest.MountsUnder(t, a.Root())
	if len(before) != 4 {
		t.Fatalf("mounts before SIGTERM: %v, want 4", mounttest.MountPoints(before))
	}

	if err := a.Stop(); err != nil {
		t.Fatalf("volume-agent did not exit cleanly on SIGTERM: %v", err)
	}
	after := mounttest.MountsUnder(t, a.Root())
	if !slices.EqualFunc(before, after, func(x, y mounttest.Mount) bool { return x.ID == y.ID && x.MountPoint == y.MountPoint }) {
		t.Errorf("mounts changed by SIGTERM:\nbefore %v\nafter  %v", mounttest.MountPoints(before), mounttest.MountPoints(after))
	}
	if got := mounttest.ReadFile(t, filepath.Join(a.volumeDir(uid, e2eutil.EmptyDirPlugin, "mem"), "f.txt")); got != "in memory" {
		t.Errorf("tmpfs content after SIGTERM: %q", got)
	}
	if _, err := os.Stat(a.volumeDir(uid, e2eutil.EmptyDirPlugin, "disk")); err != nil {
		t.Errorf("disk emptyDir after SIGTERM: %v", err)
	}

	// A restart finds the mounts and adds none.
	a.Start()
	a.waitReady("app")
	restarted := mounttest.MountsUnder(t, a.Root())
	if !slices.EqualFunc(before, restarted, func(x, y mounttest.Mount) bool { return x.ID == y.ID && x.MountPoint == y.MountPoint }) {
		t.Errorf("mounts changed by a restart:\nbefore %v\nafter  %v", mounttest.MountPoints(before), mounttest.MountPoints(restarted))
	}
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}

	// The test cleans up itself: the agent was told nothing.
	if err := mounttest.UnmountUnder(a.Root()); err != nil {
		t.Fatal(err)
	}
	if err := noMountsUnder(t, a.Root()); err != nil {
		t.Fatal(err)
	}
}

// Pods bound to another node are ignored; pods bound to this node or to none
// are handled. A pod moved to another node is treated as gone.
func TestOtherNodePod(t *testing.T) {
	t.Parallel()
	a := newAgent(t)
	pinned := func(name, node string) *corev1.Pod {
		p := newPod(name, e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "1Mi"))
		p.Spec.NodeName = node
		return p
	}
	a.Write("pods.yaml", pinned("mine", nodeName), pinned("unpinned", ""), pinned("theirs", "other-node"))
	a.Write("theirs-too.yaml", pinned("theirs-too", "other-node"))
	a.Start()
	uids := a.waitReady("mine", "unpinned")

	d, err := a.DSW()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range d.Pods {
		names = append(names, p.Name)
	}
	if !slices.Equal(names, []string{"mine", "unpinned"}) {
		t.Errorf("desired pods %v, want [mine unpinned]", names)
	}
	dirs, err := a.podDirs()
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != 2 {
		t.Errorf("pod directories %v, want 2", dirs)
	}
	if ms := mounttest.MountsUnder(t, a.Root()); len(ms) != 2 {
		t.Errorf("mounts %v, want 2", mounttest.MountPoints(ms))
	}

	a.Write("pods.yaml", pinned("mine", "other-node"), pinned("unpinned", ""), pinned("theirs", "other-node"))
	e2eutil.PollErr(t, settleTimeout, "the pod moved away to be torn down", func() error {
		if err := noMountsUnder(t, filepath.Join(a.Root(), "pods", uids["mine"])); err != nil {
			return err
		}
		if _, err := os.Lstat(filepath.Join(a.Root(), "pods", uids["mine"])); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pod directory still there (%v)", err)
		}
		return nil
	})
	if _, err := mountAt(t, a.volumeDir(uids["unpinned"], e2eutil.EmptyDirPlugin, "mem")); err != nil {
		t.Error(err)
	}
}
