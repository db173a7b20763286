package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// A pod whose claim does not exist gets a PVCNotFound error on /debug/dsw
// (and an event); its other volumes and the other pods mount normally. Once
// the claim and its volume appear, the pod's volume mounts.
func TestMissingPVC(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	host := mounttest.TempDir(t)
	a := newAgent(t)
	a.Write("waiting.yaml", newPod("waiting",
		claim("data", "late-claim", false),
		e2eutil.EmptyDirVolume("scratch", corev1.StorageMediumMemory, "1Mi"),
	))
	a.Write("neighbour.yaml", newPod("neighbour", e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "1Mi")))
	a.Start()
	a.waitReady("neighbour")

	var uid string
	e2eutil.PollErr(t, settleTimeout, "the missing claim to be reported", func() error {
		d, err := a.DSW()
		if err != nil {
			return err
		}
		p := d.Pod("default", "waiting")
		if p == nil {
			return fmt.Errorf("pod waiting not in /debug/dsw")
		}
		uid = p.UID
		if p.VolumesReady {
			return fmt.Errorf("pod waiting is ready without its claim")
		}
		if len(p.Errors) != 1 || p.Errors[0].Volume != "data" || p.Errors[0].Reason != "PVCNotFound" ||
			!e2eutil.ContainsAll(p.Errors[0].Message, "default/waiting", "late-claim") {
			return fmt.Errorf("errors %+v, want one PVCNotFound on volume data", p.Errors)
		}
		if len(p.UnresolvedVolumes) != 1 || p.UnresolvedVolumes[0] != "data" {
			return fmt.Errorf("unresolvedVolumes %v, want [data]", p.UnresolvedVolumes)
		}
		// Its other volume is mounted all the same.
		if _, err := mountAt(t, a.volumeDir(p.UID, e2eutil.EmptyDirPlugin, "scratch")); err != nil {
			return err
		}
		return nil
	})
	evs, err := a.Events()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs.Events {
		if e.Object.Name == "waiting" && e.Reason == "FailedMount" && strings.Contains(e.Message, "late-claim") {
			found = true
		}
	}
	if !found {
		t.Errorf("no FailedMount event for the missing claim: %+v", evs.Events)
	}
	if v, err := a.Metric("volume_agent_pods_with_volume_errors"); err != nil || v != 1 {
		t.Errorf("volume_agent_pods_with_volume_errors = %v, %v; want 1", v, err)
	}

	dataDir := filepath.Join(host, "late")
	mounttest.WriteFile(t, filepath.Join(dataDir, "hello.txt"), "hello")
	a.Write("late.yaml",
		e2eutil.LocalPV("late-pv", dataDir, "late-claim", "kubernetes.io/hostname", nodeName),
		e2eutil.PVC("late-claim", "late-pv"),
	)
	a.waitReady("waiting", "neighbour")
	d, err := a.DSW()
	if err != nil {
		t.Fatal(err)
	}
	if p := d.Pod("default", "waiting"); p == nil || len(p.Errors) != 0 || len(p.UnresolvedVolumes) != 0 {
		t.Errorf("pod waiting after its claim appeared: %+v", p)
	}
	dir := a.volumeDir(uid, e2eutil.LocalPlugin, "late-pv")
	if _, err := mountAt(t, dir); err != nil {
		t.Fatal(err)
	}
	if got := mounttest.ReadFile(t, filepath.Join(dir, "hello.txt")); got != "hello" {
		t.Errorf("content through the late volume: %q", got)
	}
	if v, err := a.Metric("volume_agent_pods_with_volume_errors"); err != nil || v != 0 {
		t.Errorf("volume_agent_pods_with_volume_errors = %v, %v; want 0", v, err)
	}
}

// A malformed manifest file is reported with its name on /debug/sources and
// counted by volume_agent_source_input_errors; nothing else is affected: the
// other pods keep mounting, and a pod whose file becomes malformed keeps its
// volumes (the file's last good version stays in effect).
func TestMalformedManifest(t *testing.T) {
	t.Parallel()
	a := newAgent(t)
	const garbage = "apiVersion: v1\nkind: Pod\nmetadata: [this is not\n  valid: yaml\n"
	a.WriteRaw("broken.yaml", garbage)
	a.Write("alpha.yaml", newPod("alpha", e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "1Mi")))
	a.Write("beta.yaml", newPod("beta", e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "1Mi"), e2eutil.EmptyDirVolume("disk", "", "")))
	a.Start()
	uids := a.waitReady("alpha", "beta")

	inputErrors := func(want ...string) func() error {
		return func() error {
			s, err := a.Sources()
			if err != nil {
				return err
			}
			var got []string
			for _, e := range s.InputErrors {
				if e.Error == "" {
					return fmt.Errorf("input error without a message: %+v", e)
				}
				got = append(got, e.Input)
			}
			var wantPaths []string
			for _, w := range want {
				wantPaths = append(wantPaths, filepath.Join(a.Manifests.Dir, w))
			}
			if strings.Join(got, ",") != strings.Join(wantPaths, ",") {
				return fmt.Errorf("inputErrors %+v, want %v", s.InputErrors, wantPaths)
			}
			n, err := a.Metric("volume_agent_source_input_errors")
			if err != nil {
				return err
			}
			if int(n) != len(want) {
				return fmt.Errorf("volume_agent_source_input_errors = %v, want %d", n, len(want))
			}
			return nil
		}
	}
	e2eutil.PollErr(t, settleTimeout, "broken.yaml to be reported", inputErrors("broken.yaml"))
	s, err := a.Sources()
	if err != nil {
		t.Fatal(err)
	}
	if !s.Synced || !strings.Contains(s.InputErrors[0].Error, "YAML") {
		t.Errorf("sources %+v", s)
	}

	betaMounts := mounttest.MountsUnder(t, filepath.Join(a.Root(), "pods", uids["beta"]))
	if len(betaMounts) != 1 {
		t.Fatalf("beta's mounts: %v", mounttest.MountPoints(betaMounts))
	}

	// beta's file becomes malformed (a half-written edit): beta keeps its
	// volumes.
	a.WriteRaw("beta.yaml", garbage)
	e2eutil.PollErr(t, settleTimeout, "beta.yaml to be reported", inputErrors("beta.yaml", "broken.yaml"))
	// A new pod mounts meanwhile; once it has, the agent has acted on the
	// state that includes the malformed beta.yaml.
	a.Write("gamma.yaml", newPod("gamma", e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "1Mi")))
	a.waitReady("gamma", "alpha", "beta")
	now := mounttest.MountsUnder(t, filepath.Join(a.Root(), "pods", uids["beta"]))
	if len(now) != 1 || now[0].ID != betaMounts[0].ID {
		t.Errorf("beta's mounts changed after its file became malformed: before %+v, now %+v", betaMounts, now)
	}
	if _, err := os.Stat(a.volumeDir(uids["beta"], e2eutil.EmptyDirPlugin, "disk")); err != nil {
		t.Errorf("beta's disk emptyDir after its file became malformed: %v", err)
	}

	// Fixed files clear their errors.
	a.Write("beta.yaml", newPod("beta", e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "1Mi"), e2eutil.EmptyDirVolume("disk", "", "")))
	a.Remove("broken.yaml")
	e2eutil.PollErr(t, settleTimeout, "the input errors to clear", inputErrors())
	a.waitReady("alpha", "beta", "gamma")
}
