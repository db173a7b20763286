package podstatus_test

import (
	"errors"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/explain"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/populator"
	"github.com/volume-agent/volume-agent/status/podstatus"
	"github.com/volume-agent/volume-agent/volume"
)

const plugin = "test/plugin"

var (
	pod      = volume.PodInfo{PodRef: volume.PodRef{UID: "uid-1", Namespace: "ns", Name: "web"}}
	otherPod = volume.PodRef{UID: "uid-2", Namespace: "ns", Name: "db"}
	// The pod's two volumes, with the names the populator gives them.
	volA = volume.PodScopedName(plugin, pod.UID, "cache")
	volB = volume.PodScopedName(plugin, pod.UID, "data")
)

// lastErrors is the executor's backoff, as Compute sees it.
type lastErrors map[operations.Key]error

func (l lastErrors) LastError(k operations.Key) error { return l[k] }

// mount is a pod's mount of a volume in the ASW.
type mount struct {
	vol   volume.UniqueName
	pod   volume.PodRef
	state cache.MountState
}

func specName(v volume.UniqueName) string {
	if v == volA {
		return "cache"
	}
	return "data"
}

var logsSubPath = []volume.SubPath{{Container: "app", Index: 0, MountPath: "/logs", Path: "logs"}}

func TestCompute(t *testing.T) {
	boom := errors.New("mount: permission denied")
	stuck := errors.New("NodeStageVolume: driver not registered")
	cases := []struct {
		name      string
		volumes   []volume.UniqueName
		podErrors []*volume.PodVolumeError
		mounts    []mount
		// subPaths are the pod's containers' sub-paths of volA;
		// prepared those recorded as prepared.
		subPaths, prepared []volume.SubPath
		errs               podstatus.Errors
		want               podstatus.Condition
	}{
		{
			name: "no volumes",
			want: podstatus.Condition{Status: v1.ConditionTrue, Reason: podstatus.ReasonMounted, Message: "all volumes are mounted"},
		},
		{
			name:    "all mounted",
			volumes: []volume.UniqueName{volA, volB},
			mounts:  []mount{{volA, pod.PodRef, cache.Mounted}, {volB, pod.PodRef, cache.Mounted}},
			want:    podstatus.Condition{Status: v1.ConditionTrue, Reason: podstatus.ReasonMounted, Message: "all volumes are mounted"},
		},
		{
			name:    "an old error of a mounted volume does not count",
			volumes: []volume.UniqueName{volA},
			mounts:  []mount{{volA, pod.PodRef, cache.Mounted}},
			errs:    lastErrors{{Volume: volA, Pod: pod.UID}: boom},
			want:    podstatus.Condition{Status: v1.ConditionTrue, Reason: podstatus.ReasonMounted, Message: "all volumes are mounted"},
		},
		{
			// Problems resolving the pod's volumes come first, sorted,
			// whatever is mounted.
			name:    "volume errors",
			volumes: []volume.UniqueName{volA},
			podErrors: []*volume.PodVolumeError{
				{Pod: pod.PodRef, Volume: "logs", Reason: "ClaimNotFound", Err: errors.New(`claim "logs" not found`)},
				{Pod: pod.PodRef, Volume: "config", Reason: "Unsupported", Err: errors.New("no plugin supports gitRepo volumes")},
			},
			mounts: []mount{{volA, pod.PodRef, cache.Mounted}},
			errs:   lastErrors{{Volume: volA, Pod: pod.UID}: boom},
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonVolumeErrors,
				Message: `volume "config": no plugin supports gitRepo volumes; volume "logs": claim "logs" not found`},
		},
		{
			// A claim or volume not read from the API server yet is a
			// wait, not an error.
			name:      "claim not read yet",
			volumes:   []volume.UniqueName{volA},
			podErrors: []*volume.PodVolumeError{{Pod: pod.PodRef, Volume: "logs", Reason: populator.ReasonNotRead, Err: volume.Waitingf("PVC ns/logs is not read from the API server yet"), Transient: true}},
			mounts:    []mount{{volA, pod.PodRef, cache.Mounted}},
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonWaiting,
				Message: "waiting for volumes to be mounted: logs"},
		},
		{
			name: "errors before waits",
			podErrors: []*volume.PodVolumeError{
				{Pod: pod.PodRef, Volume: "logs", Reason: populator.ReasonNotRead, Err: volume.Waitingf("not read yet"), Transient: true},
				{Pod: pod.PodRef, Volume: "config", Reason: "Unsupported", Err: errors.New("no plugin supports gitRepo volumes")},
			},
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonVolumeErrors,
				Message: `volume "config": no plugin supports gitRepo volumes`},
		},
		{
			// Volumes are named by the pod's names for them.
			name:    "waiting",
			volumes: []volume.UniqueName{volA, volB},
			mounts:  []mount{{volA, otherPod, cache.Mounted}, {volB, pod.PodRef, cache.MountUncertain}},
			errs:    lastErrors{},
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonWaiting,
				Message: "waiting for volumes to be mounted: cache, data"},
		},
		{
			name:    "waiting, no backoff known",
			volumes: []volume.UniqueName{volA, volB},
			mounts:  []mount{{volA, pod.PodRef, cache.Mounted}},
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonWaiting,
				Message: "waiting for volumes to be mounted: data"},
		},
		{
			// Failed volumes are reported, without the ones still
			// waiting.
			name:    "the pod's mount failed",
			volumes: []volume.UniqueName{volA, volB},
			mounts:  []mount{{volA, pod.PodRef, cache.MountUncertain}},
			errs:    lastErrors{{Volume: volA, Pod: pod.UID}: boom},
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonMountFailed,
				Message: "cache: mount: permission denied"},
		},
		{
			name:    "the volume's device operation failed",
			volumes: []volume.UniqueName{volB},
			errs:    lastErrors{{Volume: volB}: stuck, {Volume: volB, Pod: otherPod.UID}: boom},
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonMountFailed,
				Message: "data: NodeStageVolume: driver not registered"},
		},
		{
			name:    "the pod's own error first",
			volumes: []volume.UniqueName{volB},
			errs:    lastErrors{{Volume: volB}: stuck, {Volume: volB, Pod: pod.UID}: boom},
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonMountFailed,
				Message: "data: mount: permission denied"},
		},
		{
			name:     "sub-paths prepared",
			volumes:  []volume.UniqueName{volA},
			mounts:   []mount{{volA, pod.PodRef, cache.Mounted}},
			subPaths: logsSubPath, prepared: logsSubPath,
			want: podstatus.Condition{Status: v1.ConditionTrue, Reason: podstatus.ReasonMounted, Message: "all volumes are mounted"},
		},
		{
			name:     "mounted, sub-paths not prepared yet",
			volumes:  []volume.UniqueName{volA},
			mounts:   []mount{{volA, pod.PodRef, cache.Mounted}},
			subPaths: logsSubPath,
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonWaiting,
				Message: "waiting for volumes to be mounted: cache (sub-paths)"},
		},
		{
			name:     "preparing the sub-paths failed",
			volumes:  []volume.UniqueName{volA},
			mounts:   []mount{{volA, pod.PodRef, cache.Mounted}},
			subPaths: logsSubPath,
			errs:     lastErrors{{Volume: volA, Pod: pod.UID}: errors.New("symlink leaves the volume")},
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonMountFailed,
				Message: "cache (sub-paths): symlink leaves the volume"},
		},
		{
			name:    "failures sorted",
			volumes: []volume.UniqueName{volA, volB},
			mounts:  []mount{{volB, pod.PodRef, cache.MountUncertain}},
			errs:    lastErrors{{Volume: volA}: stuck, {Volume: volB, Pod: pod.UID}: boom},
			want: podstatus.Condition{Status: v1.ConditionFalse, Reason: podstatus.ReasonMountFailed,
				Message: "cache: NodeStageVolume: driver not registered; data: mount: permission denied"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			dsw := cache.NewDesiredStateOfWorld(clock)
			var vols []cache.PodVolume
			for _, v := range c.volumes {
				spec := &volume.Spec{Name: specName(v), Volume: &v1.Volume{Name: specName(v)}}
				pv := cache.PodVolume{Name: v, Plugin: plugin, OuterName: specName(v), Spec: spec}
				if v == volA {
					pv.SubPaths = c.subPaths
				}
				vols = append(vols, pv)
			}
			dsw.SetPod(pod, vols, c.podErrors, nil)
			asw := cache.NewActualStateOfWorld(clock)
			for _, m := range c.mounts {
				asw.SetPodMount(cache.VolumeIdentity{Name: m.vol, Plugin: plugin},
					cache.ActualPodMount{Pod: m.pod, SpecName: specName(m.vol), MountPath: "/pods/" + string(m.pod.UID) + "/" + specName(m.vol), State: m.state})
			}
			asw.SetSubPaths(volA, pod.UID, c.prepared)
			p := dsw.Snapshot().Pod(pod.UID)
			if p == nil {
				t.Fatal("pod not in the DSW")
			}
			got := podstatus.Compute(p, dsw.Snapshot(), asw.Snapshot(), c.errs)
			if got != c.want {
				t.Errorf("Compute:\n got %+v\nwant %+v", got, c.want)
			}
			if ready := explain.PodReady(p, dsw.Snapshot(), asw.Snapshot()); ready != (got.Status == v1.ConditionTrue) {
				t.Errorf("explain.Ready = %v, but the condition is %s", ready, got.Status)
			}
		})
	}
}
