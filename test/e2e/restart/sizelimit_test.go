package restart_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// writeAsNobody writes mib MiB into dir/name as uid and gid 65534, as a
// container user would: the directory is handed to the writer open (fd 3),
// the way a runtime's bind mount gives it, so no path above it matters.
func writeAsNobody(t *testing.T, dir, name string, mib int) (string, error) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cmd := exec.Command("dd", "if=/dev/zero", "of=/proc/self/fd/3/"+name, "bs=1M", fmt.Sprintf("count=%d", mib), "conv=fsync")
	cmd.ExtraFiles = []*os.File{d}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// A disk emptyDir with sizeLimit 16Mi, under the image-backed enforcement
// (this kernel has no quotas), refuses an unprivileged writer's 17th MiB
// with ENOSPC while a neighbour pod's emptyDir keeps taking writes; across
// a restart the volume is adopted as it is, and after its pod goes and the
// agent restarts again no loop device, image or mount is left.
func TestEmptyDirSizeLimitImage(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	m := e2eutil.NewManifests(t)
	a, root := newStandaloneAgent(t, m)
	m.Write("limited.yaml", newPod("limited", e2eutil.EmptyDirVolume("scratch", "", "16Mi")))
	m.Write("neighbour.yaml", newPod("neighbour", diskVolume("scratch")))
	a.Start()
	a.waitSettled(time.Minute)
	uids := a.podUIDs("limited", "neighbour")
	limited := e2eutil.VolumeDir(root, uids["limited"], e2eutil.EmptyDirPlugin, "scratch")
	neighbour := e2eutil.VolumeDir(root, uids["neighbour"], e2eutil.EmptyDirPlugin, "scratch")
	images := filepath.Join(root, "plugins", "kubernetes.io~empty-dir", "images")

	if ms := mounttest.MountsAt(t, limited); len(ms) != 1 || ms[0].FSType != "ext4" {
		t.Fatalf("mounts at the limited emptyDir: %+v, want one ext4", ms)
	}
	if fi, err := os.Stat(limited); err != nil || fi.Mode().Perm() != 0o777 {
		t.Errorf("limited emptyDir: %v, %v; want mode 0777", fi, err)
	}
	if loops := mounttest.LoopDevicesUnder(t, root); len(loops) != 1 {
		t.Errorf("loop devices: %v, want one", loops)
	}
	var page struct {
		EmptyDirLimits struct{ Kind string } `json:"emptyDirLimits"`
	}
	if raw, err := a.GetRaw("/debug/status"); err != nil || json.Unmarshal([]byte(raw), &page) != nil || page.EmptyDirLimits.Kind != "image" {
		t.Errorf("/debug/status does not say the image enforcement is in force: %+v, %v", page, err)
	}

	out, err := writeAsNobody(t, limited, "fill", 17)
	if err == nil || !strings.Contains(out, "No space left on device") || !strings.Contains(out, "16+") {
		t.Errorf("writing 17 MiB into the 16Mi emptyDir: %v: %s; want the 16 first written and the 17th refused (ENOSPC)", err, out)
	}
	if out, err := writeAsNobody(t, neighbour, "more", 32); err != nil {
		t.Errorf("the neighbour's emptyDir refuses writes: %v: %s", err, out)
	}
	var before unix.Stat_t
	if err := unix.Stat(filepath.Join(limited, "fill"), &before); err != nil {
		t.Fatal(err)
	}

	// A restart adopts the mount as it is: the pod keeps its data.
	a.stop()
	a.Start()
	a.waitSettled(time.Minute)
	var after unix.Stat_t
	if err := unix.Stat(filepath.Join(limited, "fill"), &after); err != nil || after.Ino != before.Ino || after.Size != before.Size {
		t.Errorf("the limited emptyDir's file after a restart: %+v, %v", after, err)
	}
	if ms := mounttest.MountsAt(t, limited); len(ms) != 1 {
		t.Errorf("mounts at the limited emptyDir after a restart: %d, want 1", len(ms))
	}

	// What a crash leaves in the images directory (an image nothing
	// mounts, a half-made one) goes at the next start.
	for _, name := range []string{"crashed~x.img", "crashed~y.img.tmp"} {
		if err := os.WriteFile(filepath.Join(images, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a.stop()
	m.Remove("limited.yaml")
	a.Start()
	e2eutil.PollErr(t, time.Minute, "the limited emptyDir torn down", func() error {
		if ms := mounttest.MountsUnder(t, filepath.Join(root, "pods", uids["limited"])); len(ms) > 0 {
			return fmt.Errorf("still mounted: %v", mounttest.MountPoints(ms))
		}
		if loops := mounttest.LoopDevicesUnder(t, root); len(loops) > 0 {
			return fmt.Errorf("loop devices left: %v", loops)
		}
		if entries, _ := os.ReadDir(images); len(entries) > 0 {
			return fmt.Errorf("images left: %v", entries)
		}
		if mounttest.Exists(t, filepath.Join(root, "pods", uids["limited"])) {
			return errors.New("the pod directory still exists")
		}
		return nil
	})
	a.waitSettled(time.Minute)
	a.stop()
	a.Start()
	a.waitSettled(time.Minute)
	if loops := mounttest.LoopDevicesUnder(t, root); len(loops) > 0 {
		t.Errorf("loop devices after another restart: %v", loops)
	}
	if entries, _ := os.ReadDir(images); len(entries) > 0 {
		t.Errorf("images after another restart: %v", entries)
	}
	if ms := mounttest.MountsUnder(t, root); len(ms) > 0 {
		t.Errorf("mounts under the root: %v, want none (the neighbour's emptyDir is a directory)", mounttest.MountPoints(ms))
	}
}
