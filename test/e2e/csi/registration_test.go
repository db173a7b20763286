package csi_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/utils/ptr"
)

// A driver found through its kubelet-style registration socket in the
// agent's --plugin-registry-dir: a pod whose volume waits with "driver ...
// is not registered" (retried with a growing backoff) mounts as soon as the
// driver registers, without waiting for its backoff to expire, and the
// driver is listed on /debug/drivers with its registration socket.
func TestDriverRegistrationSocket(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "registration")
	regDir := filepath.Join(e.sock, "registry")
	if err := os.MkdirAll(regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	d := e.newDriver("drv", driverOptions{registrationDir: regDir, deferStart: true})
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{
		AttachRequired:       ptr.To(false),
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral},
	})
	a := e.startAgent(agentOptions{args: []string{"--plugin-registry-dir=" + regDir}})

	pod := e.createPod(e.pod("app", corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: d.name}}}))
	volName := e2eutil.CSIPlugin + "/" + string(pod.UID) + "-scratch"
	e.waitEvent("app", "FailedMount", `CSI driver "`+d.name+`" is not registered`)
	// Let the backoff grow, so that "mounts at once" can be told apart from
	// "mounts when the backoff expires".
	var retryAt time.Time
	e2eutil.Poll(t, 30*time.Second, "the mount in backoff for 4s or more", func(context.Context) (bool, string) {
		op, ok := e2eutil.Must(t, a.Operations).Find(volName, "mount_volume")
		if !ok || op.State != "backoff" || op.RetryAt == nil {
			return false, fmt.Sprintf("%+v", op)
		}
		if !strings.Contains(op.LastError, "is not registered") {
			t.Fatalf("mount_volume failed with %q, want the driver not registered", op.LastError)
		}
		retryAt = *op.RetryAt
		return op.RetryAt.Sub(op.Since) >= 4*time.Second && time.Until(*op.RetryAt) > 2*time.Second, fmt.Sprintf("backoff until %v", op.RetryAt)
	})

	d.start()
	start := time.Now()
	target := e.publishPath(pod.UID, "scratch")
	e.waitMounted(target)
	took := time.Since(start)
	if now := time.Now(); now.After(retryAt) {
		t.Errorf("mounted %v after the driver started, only once the backoff expired (%v): registering did not retry at once", took, retryAt)
	}
	t.Logf("mounted %v after the driver started (backoff was until %v from now)", took.Round(time.Millisecond), time.Until(retryAt).Round(time.Millisecond))

	var listed bool
	for _, drv := range e2eutil.Must(t, a.Drivers).Drivers {
		if drv.Name == d.name {
			listed = true
			if drv.Source != "registration" || drv.RegistrationSocket != d.regSock() || drv.Endpoint != d.endpoint() && drv.Endpoint != d.Socket() {
				t.Errorf("/debug/drivers: %+v; want source registration, socket %s, endpoint %s", drv, d.regSock(), d.Socket())
			}
		}
	}
	if !listed {
		t.Errorf("/debug/drivers does not list %s", d.name)
	}
	c := d.CallCounts(t)
	if c["GetInfo"] < 1 || c["NotifyRegistrationStatus"] < 1 {
		t.Errorf("the registration socket was not used as the kubelet uses it: calls %v", c)
	}

	e.deletePod("app")
	e.waitGone(target, e.podDir(pod.UID))
	d.waitNoLoopDevices()
}
