package nodestatus_test

import (
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/status/nodestatus"
	"github.com/volume-agent/volume-agent/volume"
)

const csiPlugin = "kubernetes.io/csi"

var (
	attachable = volume.Attributes{Identity: "h", DeviceMountable: true, Attachable: true}
	local      = volume.Attributes{Identity: "h", DeviceMountable: true}
)

// A volume the node reports in use is never detached by the attach/detach
// controller: every attachable volume a pod wants, or that may still be
// attached or mounted, must be listed; nothing else need be.
func TestInUse(t *testing.T) {
	type desired struct {
		name  volume.UniqueName
		attrs volume.Attributes
	}
	type actual struct {
		name  volume.UniqueName
		attrs volume.Attributes
		set   func(a *cache.ActualStateOfWorld, id cache.VolumeIdentity)
	}
	attached := func(a *cache.ActualStateOfWorld, id cache.VolumeIdentity) {
		a.SetAttachState(id, cache.Attached, "/dev/sdb", nil)
	}
	attachUncertain := func(a *cache.ActualStateOfWorld, id cache.VolumeIdentity) {
		a.SetAttachState(id, cache.AttachUncertain, "", nil)
	}
	deviceMounted := func(a *cache.ActualStateOfWorld, id cache.VolumeIdentity) {
		a.SetDeviceState(id, cache.DeviceGloballyMounted, "", "/global")
	}
	deviceUncertain := func(a *cache.ActualStateOfWorld, id cache.VolumeIdentity) {
		a.SetDeviceState(id, cache.DeviceMountUncertain, "", "/global")
	}
	podUncertain := func(a *cache.ActualStateOfWorld, id cache.VolumeIdentity) {
		a.SetPodMount(id, cache.ActualPodMount{Pod: volume.PodRef{UID: "gone"}, SpecName: "x", MountPath: "/pods/gone/x", State: cache.MountUncertain})
	}
	detached := func(a *cache.ActualStateOfWorld, id cache.VolumeIdentity) {
		attached(a, id)
		a.SetAttachState(id, cache.NotAttached, "", nil)
	}
	cases := []struct {
		name    string
		desired []desired
		actual  []actual
		want    []v1.UniqueVolumeName
	}{
		{name: "nothing"},
		{
			name:    "wanted before it is attached",
			desired: []desired{{"kubernetes.io/csi/b", attachable}},
			want:    []v1.UniqueVolumeName{"kubernetes.io/csi/b"},
		},
		{
			name: "no longer wanted but still attached, mounted or uncertain",
			actual: []actual{
				{"kubernetes.io/csi/attached", attachable, attached},
				{"kubernetes.io/csi/attach-uncertain", attachable, attachUncertain},
				{"kubernetes.io/csi/device", attachable, deviceMounted},
				{"kubernetes.io/csi/device-uncertain", attachable, deviceUncertain},
				{"kubernetes.io/csi/pod-uncertain", attachable, podUncertain},
			},
			want: []v1.UniqueVolumeName{
				"kubernetes.io/csi/attach-uncertain", "kubernetes.io/csi/attached", "kubernetes.io/csi/device",
				"kubernetes.io/csi/device-uncertain", "kubernetes.io/csi/pod-uncertain",
			},
		},
		{
			name:   "detached and no longer wanted",
			actual: []actual{{"kubernetes.io/csi/done", attachable, detached}},
		},
		{
			name:    "wanted and attached: listed once",
			desired: []desired{{"kubernetes.io/csi/a", attachable}},
			actual:  []actual{{"kubernetes.io/csi/a", attachable, deviceMounted}},
			want:    []v1.UniqueVolumeName{"kubernetes.io/csi/a"},
		},
		{
			name:    "volumes that are not attachable are not listed",
			desired: []desired{{"kubernetes.io/local-volume/pv-1", local}, {"kubernetes.io/csi/c", attachable}},
			actual:  []actual{{"kubernetes.io/local-volume/pv-2", local, deviceMounted}, {"kubernetes.io/csi/a", attachable, attached}},
			want:    []v1.UniqueVolumeName{"kubernetes.io/csi/a", "kubernetes.io/csi/c"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			dsw := cache.NewDesiredStateOfWorld(clock)
			var vols []cache.PodVolume
			for _, d := range c.desired {
				vols = append(vols, cache.PodVolume{Name: d.name, Plugin: csiPlugin, Attributes: d.attrs, OuterName: string(d.name),
					Spec: &volume.Spec{Name: string(d.name)}})
			}
			dsw.SetPod(volume.PodInfo{PodRef: volume.PodRef{UID: "uid-1", Namespace: "ns", Name: "p"}}, vols, nil, nil)
			asw := cache.NewActualStateOfWorld(clock)
			for _, a := range c.actual {
				a.set(asw, cache.VolumeIdentity{Name: a.name, Plugin: csiPlugin, Attributes: a.attrs})
			}
			got := nodestatus.InUse(dsw.Snapshot(), asw.Snapshot())
			if !slices.Equal(got, c.want) {
				t.Errorf("InUse = %q, want %q (sorted)", got, c.want)
			}
		})
	}
}
