package localpv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

const identityMetric = "volume_agent_local_volume_identity_checks_total"

// The disks re-enumerate between a PV's creation and its cleanup: two loop
// devices are detached and their images attached again in swapped order,
// so that the PV of image A now leads to image B. Releasing the PV does not
// wipe B: the provisioner refuses, with a Warning event naming both
// identities and the mismatch metric, and keeps the PV. Once the images are
// back where they were, the retry cleans A, and the PV is made again.
func TestDisksReEnumerated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "lpv-enum")
	class := e.class("raw")
	e.storageClass(class, corev1.PersistentVolumeReclaimDelete)
	disc := e.dir("raw")
	devA, devB := mounttest.LoopDevice(t, 16<<20), mounttest.LoopDevice(t, 16<<20)
	fileA, fileB := backingFile(t, devA), backingFile(t, devB)
	mounttest.Mkfs(t, "ext4", devA)
	mounttest.Mkfs(t, "ext4", devB)
	uuidA, uuidB := fsUUID(t, devA), fsUUID(t, devB)
	// Linked by kernel name, as /dev/disk/by-id would not be.
	linkA, linkB := filepath.Join(disc, "disk-a"), filepath.Join(disc, "disk-b")
	must(t, os.Symlink(devA, linkA))
	must(t, os.Symlink(devB, linkB))
	e.writeConfig(fmt.Sprintf("storageClasses:\n  %s:\n    discoveryDir: %s\n    volumeMode: Block\n    blockCleanup: {method: wipefs}\n", class, disc))
	pr := e.startProvisioner()

	pv := e.waitAvailable(linkA, "")
	e.waitAvailable(linkB, "")
	if got := pv.Annotations[localpv.AnnDiskSerial]; got != "loop:"+fileA {
		t.Fatalf("PV %s records serial %q, want loop:%s (annotations %v)", pv.Name, got, fileA, pv.Annotations)
	}
	if pv.Annotations[localpv.AnnDiskDevice] == "" {
		t.Fatalf("PV %s records no device number: %v", pv.Name, pv.Annotations)
	}
	e.claim("claim", pv)
	pr.waitState(linkA, localpv.StateBound)

	swap(t, devA, devB, fileB, fileA)
	e.deleteClaim("claim")
	ev := e.waitPVEvent(pv.Name, localpv.ReasonDiskMismatch, "loop:"+fileA, "loop:"+fileB, "not cleaning")
	t.Logf("event: %s %s: %s", ev.Type, ev.Reason, ev.Message)
	if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.UID != pv.UID {
		t.Errorf("event %+v", ev)
	}
	if n := pr.gauge(identityMetric, map[string]string{"class": class, "result": "mismatch"}); n < 1 {
		t.Errorf("%s{result=mismatch} = %v", identityMetric, n)
	}
	// A few more passes and retries: B is never touched, the PV is kept.
	pr.waitPasses(3)
	if got := fsUUID(t, devA); got != uuidB {
		t.Fatalf("image B (at %s now) was wiped: filesystem UUID %q, was %s", devA, got, uuidB)
	}
	if got, err := suite.Admin.CoreV1().PersistentVolumes().Get(t.Context(), pv.Name, metav1.GetOptions{}); err != nil || got.UID != pv.UID {
		t.Fatalf("the PV of the other disk was not kept: %v %v", got, err)
	}

	// The images back in their places: A is cleaned, the PV made again.
	swap(t, devA, devB, fileA, fileB)
	again := e.waitAvailable(linkA, pv.UID)
	if got := fsUUID(t, devA); got != "" {
		t.Errorf("image A still has filesystem %s (was %s) after its cleanup", got, uuidA)
	}
	if got := fsUUID(t, devB); got != uuidB {
		t.Errorf("image B was wiped: filesystem UUID %q, was %s", got, uuidB)
	}
	if n := pr.gauge(identityMetric, map[string]string{"class": class, "result": "match"}); n < 1 {
		t.Errorf("%s{result=match} = %v", identityMetric, n)
	}
	t.Logf("PV %s made again as %s", pv.Name, again.UID)
}

// swap detaches both loop devices and attaches file1 to dev1 and file2 to
// dev2, as disks that come back in another order after a reboot.
func swap(t *testing.T, dev1, dev2, file1, file2 string) {
	t.Helper()
	for _, dev := range []string{dev1, dev2} {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Fatalf("losetup -d %s: %v: %s", dev, err, out)
		}
	}
	// losetup -d returns before the device is free for a new file.
	for _, p := range [][2]string{{dev1, file1}, {dev2, file2}} {
		var out []byte
		var err error
		e2eutil.Poll(t, 10*time.Second, "attaching "+p[1]+" to "+p[0], func(context.Context) (bool, string) {
			out, err = exec.Command("losetup", p[0], p[1]).CombinedOutput()
			return err == nil || !strings.Contains(string(out), "busy"), fmt.Sprintf("%v: %s", err, out)
		})
		if err != nil {
			t.Skipf("skipping: another process took %s (%v: %s)", p[0], err, out)
		}
	}
}

func backingFile(t *testing.T, dev string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--noheadings", "--output", "BACK-FILE", dev).Output()
	if err != nil {
		t.Fatalf("losetup %s: %v", dev, err)
	}
	return strings.TrimSpace(string(out))
}

// fsUUID is the UUID of the filesystem on dev, "" if none.
func fsUUID(t *testing.T, dev string) string {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-s", "UUID", "-o", "value", dev).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return ""
	}
	if err != nil {
		t.Fatalf("blkid %s: %v", dev, err)
	}
	return strings.TrimSpace(string(out))
}
