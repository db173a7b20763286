package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// emptyDir volumes: a tmpfs per Memory volume, sized by sizeLimit or the
// pod's memory limit (the smaller), and a plain 0777 directory otherwise, at
// <root>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>.
func TestEmptyDir(t *testing.T) {
	t.Parallel()
	a := newAgent(t)
	web := newPod("web",
		e2eutil.EmptyDirVolume("cache", corev1.StorageMediumMemory, "8Mi"),
		e2eutil.EmptyDirVolume("big", corev1.StorageMediumMemory, "64Mi"),
		e2eutil.EmptyDirVolume("scratch", "", ""),
	)
	web.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("16Mi")}
	plain := newPod("plain", e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "3Mi"))
	a.Write("web.yaml", web)
	a.Write("plain.yaml", plain)
	a.Start()
	uids := a.waitReady("web", "plain")

	for _, tc := range []struct {
		pod, volume string
		size        int64
	}{
		{"web", "cache", 8 << 20}, // sizeLimit < memory limit
		{"web", "big", 16 << 20},  // memory limit < sizeLimit
		{"plain", "mem", 3 << 20}, // no memory limit
	} {
		dir := a.volumeDir(uids[tc.pod], e2eutil.EmptyDirPlugin, tc.volume)
		m, err := mountAt(t, dir)
		if err != nil {
			t.Errorf("%s/%s: %v", tc.pod, tc.volume, err)
			continue
		}
		if m.FSType != "tmpfs" || !m.HasOption("nosuid") || !m.HasOption("nodev") {
			t.Errorf("%s/%s: mount %+v, want a nosuid,nodev tmpfs", tc.pod, tc.volume, m)
		}
		if mode, _ := m.SuperOption("mode"); mode != "777" {
			t.Errorf("%s/%s: tmpfs mode=%s, want 777", tc.pod, tc.volume, mode)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		if size := int64(st.Blocks) * st.Bsize; size != tc.size {
			t.Errorf("%s/%s: tmpfs size %d, want %d", tc.pod, tc.volume, size, tc.size)
		}
		if v, _ := m.SuperOption("size"); v != fmt.Sprintf("%dk", tc.size>>10) {
			t.Errorf("%s/%s: mountinfo size=%s", tc.pod, tc.volume, v)
		}
	}

	scratch := a.volumeDir(uids["web"], e2eutil.EmptyDirPlugin, "scratch")
	fi, err := os.Stat(scratch)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o777 {
		t.Errorf("disk emptyDir %s: mode %v, want a 0777 directory", scratch, fi.Mode())
	}
	if m, err := mountAt(t, scratch); err == nil {
		t.Errorf("disk emptyDir is a mount: %+v", m)
	}
	if ms := mounttest.MountsUnder(t, a.Root()); len(ms) != 3 {
		t.Errorf("mounts under the root: %v, want the 3 tmpfs", mounttest.MountPoints(ms))
	}

	// The actual state names the same paths.
	asw, err := a.ASW()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, v := range asw.Volumes {
		for _, p := range v.Pods {
			seen++
			if want := a.volumeDir(p.UID, v.Plugin, p.SpecName); p.MountPath != want || p.MountState != "Mounted" {
				t.Errorf("asw %s: mountPath %s state %s, want %s Mounted", v.Name, p.MountPath, p.MountState, want)
			}
		}
	}
	if seen != 4 {
		t.Errorf("asw has %d pod mounts, want 4", seen)
	}
}
