package emptydir_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/pluginstest"
	"github.com/volume-agent/volume-agent/volume"
)

// The plugin's decisions, with a fake mounter (no root needed); the real
// mounts are tested in emptydir_test.go.

func newFakeMounterPlugin(t *testing.T) (*emptydir.Plugin, *pluginstest.Mounter, volume.Paths) {
	t.Helper()
	m := pluginstest.NewMounter()
	paths := volume.Paths{Root: t.TempDir()}
	return emptydir.New(plugins.Host{Paths: paths, Mounter: m, NodeName: "node", Log: zap.NewNop()}), m, paths
}

// nodeMemory is the fake node's allocatable memory: 2 GiB.
const nodeMemory = 2 << 30

// newFakeMounterPluginWithMemory: mem -1 is a node whose memory is unknown,
// 0 one of nodeMemory.
func newFakeMounterPluginWithMemory(t *testing.T, mem int64) (*emptydir.Plugin, *pluginstest.Mounter, volume.Paths) {
	t.Helper()
	m := pluginstest.NewMounter()
	paths := volume.Paths{Root: t.TempDir()}
	host := plugins.Host{Paths: paths, Mounter: m, NodeName: "node", Log: zap.NewNop()}
	if mem == 0 {
		mem = nodeMemory
	}
	if mem > 0 {
		host.NodeMemory = func() int64 { return mem }
	}
	return emptydir.New(host), m, paths
}

func TestMemorySetUpDecisions(t *testing.T) {
	errBoom := errors.New("boom")
	cases := []struct {
		name      string
		sizeLimit string
		podLimit  string
		// exists: the directory is there already; mounted: with a tmpfs.
		exists, mounted bool
		// nodeMemory: -1 for unknown, else the default below.
		nodeMemory int64
		fault      *pluginstest.Fault
		wantSize   int64 // of the one MountTmpfs; -1: none
		wantErr    error
	}{
		// Like the kubelet: the smallest of the node's allocatable memory,
		// the pod's memory limit and sizeLimit, each where set; never
		// the kernel's default of half the node's memory.
		{name: "no limits", wantSize: nodeMemory},
		{name: "no limits, node memory unknown", nodeMemory: -1, wantSize: 0},
		{name: "pod limit above the node's memory", podLimit: "8Gi", wantSize: nodeMemory},
		{name: "sizeLimit above the node's memory", sizeLimit: "8Gi", wantSize: nodeMemory},
		{name: "sizeLimit", sizeLimit: "64Mi", wantSize: 64 << 20},
		{name: "pod limit", podLimit: "32Mi", wantSize: 32 << 20},
		{name: "pod limit below sizeLimit", sizeLimit: "64Mi", podLimit: "32Mi", wantSize: 32 << 20},
		{name: "sizeLimit below pod limit", sizeLimit: "64Mi", podLimit: "128Mi", wantSize: 64 << 20},
		{name: "zero sizeLimit is no limit", sizeLimit: "0", podLimit: "16Mi", wantSize: 16 << 20},
		{name: "set up before", exists: true, mounted: true, wantSize: -1},
		{name: "directory left without its tmpfs", exists: true, wantSize: nodeMemory},
		{name: "mount fails", fault: &pluginstest.Fault{Op: "MountTmpfs", Err: errBoom}, wantSize: nodeMemory, wantErr: errBoom},
		{name: "mount check fails", exists: true, fault: &pluginstest.Fault{Op: "IsMountPoint", Err: errBoom}, wantSize: -1, wantErr: errBoom},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, m, paths := newFakeMounterPluginWithMemory(t, c.nodeMemory)
			src := v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}
			if c.sizeLimit != "" {
				src.SizeLimit = ptr(resource.MustParse(c.sizeLimit))
			}
			pod := podInfo("p1")
			if c.podLimit != "" {
				pod.MemoryLimit = ptr(resource.MustParse(c.podLimit))
			}
			dir := paths.PodVolumeDir(pod.UID, emptydir.Name, "cache")
			if c.exists {
				if err := os.MkdirAll(dir, 0o750); err != nil {
					t.Fatal(err)
				}
			}
			if c.mounted {
				m.SetMounted("tmpfs", dir)
			}
			if c.fault != nil {
				m.Fail(*c.fault)
			}
			err := p.SetUp(t.Context(), &plugins.SetUpRequest{
				VolumeName: volume.PodScopedName(emptydir.Name, pod.UID, "cache"), Spec: spec("cache", src), Pod: pod, Dir: dir, Log: zap.NewNop(),
			})
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("SetUp: %v, want %v", err, c.wantErr)
			}
			if volume.IsUncertain(err) {
				t.Errorf("SetUp: %v is uncertain; nothing was mounted", err)
			}
			var want []string
			if c.wantSize >= 0 {
				want = []string{fmt.Sprintf("MountTmpfs %s size=%d mode=0777", dir, c.wantSize)}
			}
			if got := m.CallStrings(); !slices.Equal(got, want) {
				t.Errorf("mounter calls %q, want %q", got, want)
			}
			// A directory made just now cannot be a mount point: the
			// check is spared on the hot path.
			checked := slices.ContainsFunc(m.Calls(), func(c pluginstest.Call) bool { return c.Op == "IsMountPoint" })
			if checked != c.exists {
				t.Errorf("mount point checked: %v, want %v (the directory existed: %v)", checked, c.exists, c.exists)
			}
			wantMounted := (c.mounted || c.wantSize >= 0) && err == nil
			if got := slices.Contains(m.Mounted(), dir); got != wantMounted {
				t.Errorf("tmpfs mounted: %v, want %v", got, wantMounted)
			}
		})
	}
}

// Nothing of the volume is deleted while it may still be mounted: the data
// would be gone from under the pod, or the tmpfs leaked.
func TestTearDownDecisions(t *testing.T) {
	errBusy := errors.New("device or resource busy")
	cases := []struct {
		name     string
		fault    *pluginstest.Fault
		wantErr  error
		wantGone bool
	}{
		{name: "unmounted and removed", wantGone: true},
		{name: "unmount fails", fault: &pluginstest.Fault{Op: "Unmount", Err: errBusy}, wantErr: errBusy},
		{name: "unmount reports an error after unmounting", fault: &pluginstest.Fault{Op: "Unmount", Err: errBusy, Applied: true}, wantErr: errBusy},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, m, paths := newFakeMounterPlugin(t)
			pod := podInfo("p1")
			dir := paths.PodVolumeDir(pod.UID, emptydir.Name, "cache")
			data := filepath.Join(dir, "data")
			if err := os.MkdirAll(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(data, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			m.SetMounted("tmpfs", dir)
			if c.fault != nil {
				m.Fail(*c.fault)
			}
			err := p.TearDown(t.Context(), &plugins.TearDownRequest{
				VolumeName: volume.PodScopedName(emptydir.Name, pod.UID, "cache"), Pod: pod.PodRef, Dir: dir, Log: zap.NewNop(),
			})
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("TearDown: %v, want %v", err, c.wantErr)
			}
			// One unmount: a second mount stacked on the directory
			// shows as EBUSY from rmdir (TestTearDownStackedTmpfs, on
			// real mounts), not by a failing umount2 for every volume.
			if got := m.CallStrings(); !slices.Equal(got, []string{"Unmount " + dir}) {
				t.Errorf("mounter calls %q, want one Unmount", got)
			}
			_, statErr := os.Stat(data)
			if gone := errors.Is(statErr, os.ErrNotExist); gone != c.wantGone {
				t.Errorf("volume data removed: %v, want %v (%s)", gone, c.wantGone, strings.TrimSpace(fmt.Sprint(statErr)))
			}
		})
	}
}

// A disk emptyDir is a directory: setting it up never asks the mounter.
func TestDiskMediumNeedsNoMounts(t *testing.T) {
	p, m, paths := newFakeMounterPlugin(t)
	pod := podInfo("p1")
	dir := paths.PodVolumeDir(pod.UID, emptydir.Name, "scratch")
	if err := p.SetUp(t.Context(), &plugins.SetUpRequest{Spec: spec("scratch", v1.EmptyDirVolumeSource{}), Pod: pod, Dir: dir, Log: zap.NewNop()}); err != nil {
		t.Fatal(err)
	}
	if calls := m.Calls(); len(calls) != 0 {
		t.Errorf("SetUp of a disk emptyDir asked the mounter: %v", calls)
	}
}
