package volumestats

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/csi/registry"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/volume"
)

// What is read, and how: the kubelet's choice of volumes (mounted, through
// a claim, of a plugin with metrics), one job per claim.
func TestPlan(t *testing.T) {
	drivers := map[string]*registry.Driver{
		"stage.csi":     {Name: "stage.csi", VolumeStats: true, StageUnstage: true},
		"publish.csi":   {Name: "publish.csi", VolumeStats: true},
		"condition.csi": {Name: "condition.csi", VolumeStats: true, VolumeCondition: true},
		"nostats.csi":   {Name: "nostats.csi", StageUnstage: true, VolumeCondition: true},
	}
	lookup := func(name string) (*registry.Driver, bool) {
		d, ok := drivers[name]
		return d, ok
	}
	type want struct {
		claim   string
		source  source
		path    string
		driver  string
		handle  string
		staging string
		cond    bool
		pods    []types.UID
	}
	cases := []struct {
		name    string
		volumes []*cache.ActualVolume
		want    []want
	}{
		{
			name:    "CSI, staging driver",
			volumes: []*cache.ActualVolume{csiVolume(claimSpec("stage.csi", "h1", "ns", "c"), "/g/h1", "pod-a", "/p/a/h1", cache.Mounted)},
			want:    []want{{claim: "ns/c", source: fromDriver, path: "/p/a/h1", driver: "stage.csi", handle: "h1", staging: "/g/h1", pods: []types.UID{"pod-a"}}},
		},
		{
			name:    "CSI, publish-only driver: no staging path",
			volumes: []*cache.ActualVolume{csiVolume(claimSpec("publish.csi", "h2", "ns", "c"), "/g/h2", "pod-a", "/p/a/h2", cache.Mounted)},
			want:    []want{{claim: "ns/c", source: fromDriver, path: "/p/a/h2", driver: "publish.csi", handle: "h2", pods: []types.UID{"pod-a"}}},
		},
		{
			name:    "CSI, driver with VOLUME_CONDITION",
			volumes: []*cache.ActualVolume{csiVolume(claimSpec("condition.csi", "h3", "ns", "c"), "", "pod-a", "/p/a/h3", cache.Mounted)},
			want:    []want{{claim: "ns/c", source: fromDriver, path: "/p/a/h3", driver: "condition.csi", handle: "h3", cond: true, pods: []types.UID{"pod-a"}}},
		},
		{
			name: "CSI Block: the access point",
			volumes: []*cache.ActualVolume{func() *cache.ActualVolume {
				spec := claimSpec("stage.csi", "b1", "ns", "blk")
				spec.Mode = v1.PersistentVolumeBlock
				return csiVolume(spec, "/g/b1", "pod-a", "/p/a/volumeDevices/b1", cache.Mounted)
			}()},
			want: []want{{claim: "ns/blk", source: fromDriver, path: "/p/a/volumeDevices/b1", driver: "stage.csi", handle: "b1", staging: "/g/b1", pods: []types.UID{"pod-a"}}},
		},
		{
			name: "CSI not read: no GET_VOLUME_STATS, unregistered driver, uncertain mount, inline volume",
			volumes: []*cache.ActualVolume{
				csiVolume(claimSpec("nostats.csi", "n", "ns", "c1"), "/g/n", "pod-a", "/p/a/n", cache.Mounted),
				csiVolume(claimSpec("gone.csi", "g", "ns", "c2"), "/g/g", "pod-a", "/p/a/g", cache.Mounted),
				csiVolume(claimSpec("stage.csi", "u", "ns", "c3"), "/g/u", "pod-a", "/p/a/u", cache.MountUncertain),
				csiVolume(claimSpec("stage.csi", "i", "", ""), "/g/i", "pod-a", "/p/a/i", cache.Mounted),
			},
		},
		{
			name:    "local, filesystem: statfs of the pod's mount",
			volumes: []*cache.ActualVolume{localVolume("pv-l", "ns", "lc", false, "pod-a", "/p/a/local/pv-l")},
			want:    []want{{claim: "ns/lc", source: fromFilesystem, path: "/p/a/local/pv-l", pods: []types.UID{"pod-a"}}},
		},
		{
			name:    "local, Block: the device at the access point",
			volumes: []*cache.ActualVolume{localVolume("pv-b", "ns", "lb", true, "pod-a", "/p/a/volumeDevices/pv-b")},
			want:    []want{{claim: "ns/lb", source: fromDevice, path: "/p/a/volumeDevices/pv-b", pods: []types.UID{"pod-a"}}},
		},
		{
			name: "two pods: the lowest UID's path, both for events",
			volumes: []*cache.ActualVolume{func() *cache.ActualVolume {
				v := localVolume("pv-s", "ns", "shared", false, "pod-b", "/p/b/pv-s")
				addPod(v, "pod-a", "/p/a/pv-s", cache.Mounted)
				addPod(v, "pod-c", "/p/c/pv-s", cache.MountUncertain)
				return v
			}()},
			want: []want{{claim: "ns/shared", source: fromFilesystem, path: "/p/a/pv-s", pods: []types.UID{"pod-a", "pod-b"}}},
		},
		{
			name: "one job per claim",
			volumes: []*cache.ActualVolume{
				csiVolume(claimSpec("stage.csi", "d1", "ns", "dup"), "/g/d1", "pod-a", "/p/a/d1", cache.Mounted),
				csiVolume(claimSpec("stage.csi", "d2", "ns", "dup"), "/g/d2", "pod-b", "/p/b/d2", cache.Mounted),
			},
			want: []want{{claim: "ns/dup", source: fromDriver, path: "/p/a/d1", driver: "stage.csi", handle: "d1", staging: "/g/d1", pods: []types.UID{"pod-a"}}},
		},
		{
			name: "not read: hostPath persistent volume (the kubelet has no stats for it), reconstructed mount without a spec",
			volumes: []*cache.ActualVolume{
				func() *cache.ActualVolume {
					v := localVolume("pv-h", "ns", "hc", false, "pod-a", "/p/a/hp")
					v.Plugin, v.Name = hostpath.Name, volume.UniqueName(hostpath.Name+"/pv-h")
					v.Spec.PV.Spec.Local, v.Spec.PV.Spec.HostPath = nil, &v1.HostPathVolumeSource{Path: "/srv"}
					return v
				}(),
				func() *cache.ActualVolume {
					v := localVolume("pv-r", "ns", "rc", false, "pod-a", "/p/a/pv-r")
					v.Pods.At("pod-a").Spec = nil
					return v
				}(),
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vols := map[volume.UniqueName]*cache.ActualVolume{}
			for _, v := range c.volumes {
				vols[v.Name] = v
			}
			snap := cache.NewActualSnapshot(vols, 0)
			var got []want
			for _, j := range plan(snap, lookup) {
				w := want{claim: j.key.String(), source: j.source, path: j.path, handle: j.handle, staging: j.staging, cond: j.withCondition}
				if j.driver != nil {
					w.driver = j.driver.Name
				}
				for _, p := range j.pods {
					w.pods = append(w.pods, p.pod.UID)
				}
				got = append(got, w)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("jobs\n%+v\nwant\n%+v", got, c.want)
			}
		})
	}

	// Without a driver registry, CSI volumes are not read; local ones are.
	vols := map[volume.UniqueName]*cache.ActualVolume{}
	for _, v := range []*cache.ActualVolume{
		csiVolume(claimSpec("stage.csi", "h1", "ns", "c"), "/g/h1", "pod-a", "/p/a/h1", cache.Mounted),
		localVolume("pv-l", "ns", "lc", false, "pod-a", "/p/a/local/pv-l"),
	} {
		vols[v.Name] = v
	}
	snap := cache.NewActualSnapshot(vols, 0)
	jobs := plan(snap, nil)
	if len(jobs) != 1 || jobs[0].source != fromFilesystem {
		t.Errorf("without drivers: %+v", jobs)
	}
	if plan(nil, lookup) != nil {
		t.Error("jobs without a snapshot")
	}
}
