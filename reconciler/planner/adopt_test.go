package planner

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/cache/cachetest"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/plugins/local"
	"github.com/volume-agent/volume-agent/volume"
)

// --- Adoptions ---

func rcDesired(vols ...*cache.DesiredVolume) *cache.DesiredSnapshot {
	vm, pods := map[volume.UniqueName]*cache.DesiredVolume{}, map[types.UID]*cache.DesiredPod{}
	for _, v := range vols {
		vm[v.Name] = v
		for uid, p := range v.Pods.All() {
			dp := pods[uid]
			if dp == nil {
				dp = &cache.DesiredPod{Pod: p.Pod}
				pods[uid] = dp
			}
			dp.Volumes = append(dp.Volumes, v.Name)
		}
	}
	return cache.NewDesiredSnapshot(vm, pods, 0)
}

func rcActual(vols ...*cache.ActualVolume) *cache.ActualSnapshot {
	vm := map[volume.UniqueName]*cache.ActualVolume{}
	for _, v := range vols {
		vm[v.Name] = v
	}
	return cache.NewActualSnapshot(vm, 0)
}

// rcWant is a desired volume of plugin wanted by pods with spec.
func rcWant(name volume.UniqueName, plugin string, attrs volume.Attributes, spec *volume.Spec, uids ...types.UID) *cache.DesiredVolume {
	v := &cache.DesiredVolume{Name: name, Plugin: plugin, Attributes: attrs, SpecName: spec.Name, Spec: spec,
		Pods: cache.PodSet[cache.DesiredPodVolume]{}}
	for _, uid := range uids {
		v.Pods = v.Pods.With(uid, &cache.DesiredPodVolume{
			Pod: volume.PodInfo{PodRef: volume.PodRef{UID: uid, Namespace: "ns", Name: "name-" + string(uid)}}, Spec: spec,
		})
	}
	return v
}

// rcFound is a reconstructed volume with reconstructed pod mounts; found
// maps each pod to whether its mount was in place.
func rcFound(name volume.UniqueName, plugin string, attrs volume.Attributes, found map[types.UID]bool) *cache.ActualVolume {
	v := cachetest.ReconstructedVolume(name, plugin, attrs)
	for uid, mounted := range found {
		v.Pods = v.Pods.With(uid, cachetest.ReconstructedPod(uid, "spec", "/root/pods/"+string(uid), mounted))
	}
	return v
}

func withDevice(v *cache.ActualVolume, found bool) *cache.ActualVolume {
	v.DeviceState, v.DeviceMountPath, v.DeviceReconstructed, v.DeviceFoundMounted = cache.DeviceMountUncertain, "/global", true, found
	return v
}

// setUpWithoutMount is the agent's: it asks the plugin.
func rcSetUpWithoutMount(plugin string, spec *volume.Spec) bool {
	if plugin != emptydir.Name || spec == nil {
		return false
	}
	return (&emptydir.Plugin{}).SetUpWithoutMount(spec)
}

func rcRef(uid types.UID) volume.PodRef {
	return volume.PodRef{UID: uid, Namespace: "ns", Name: "name-" + string(uid)}
}

func TestAdoptions(t *testing.T) {
	var (
		diskSpec  = emptyDirSpec("disk", v1.StorageMediumDefault)
		memSpec   = emptyDirSpec("mem", v1.StorageMediumMemory)
		localSpec = localSpec("pv", "/data")
		shared    = volume.Attributes{Identity: "pv"}
		device    = volume.Attributes{Identity: "pv", DeviceMountable: true}
		memName   = volume.PodScopedName(emptydir.Name, "p1", "mem")
		diskName  = volume.PodScopedName(emptydir.Name, "p1", "disk")
		localName = volume.SharedName(local.Name, "pv")
	)
	tests := []struct {
		name   string
		dsw    *cache.DesiredSnapshot
		asw    *cache.ActualSnapshot
		noSUWM bool // no setUpWithoutMount function
		want   []Adoption
	}{
		{
			name: "found mounted and wanted: adopted",
			dsw:  rcDesired(rcWant(memName, emptydir.Name, volume.Attributes{}, memSpec, "p1")),
			asw:  rcActual(rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true})),
			want: []Adoption{{ID: cache.VolumeIdentity{Name: memName}, Pods: map[types.UID]cache.ActualPodMount{"p1": {Pod: rcRef("p1")}}}},
		},
		{
			name: "not found mounted but wanted: mounted again, not adopted",
			dsw:  rcDesired(rcWant(memName, emptydir.Name, volume.Attributes{}, memSpec, "p1")),
			asw:  rcActual(rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false})),
		},
		{
			name: "disk emptyDir (set up without a mount) found: adopted",
			dsw:  rcDesired(rcWant(diskName, emptydir.Name, volume.Attributes{}, diskSpec, "p1")),
			asw:  rcActual(rcFound(diskName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false})),
			want: []Adoption{{ID: cache.VolumeIdentity{Name: diskName}, Pods: map[types.UID]cache.ActualPodMount{"p1": {Pod: rcRef("p1")}}}},
		},
		{
			name:   "disk emptyDir without a setUpWithoutMount function: not adopted",
			dsw:    rcDesired(rcWant(diskName, emptydir.Name, volume.Attributes{}, diskSpec, "p1")),
			asw:    rcActual(rcFound(diskName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false})),
			noSUWM: true,
		},
		{
			name: "not wanted: not adopted",
			dsw:  rcDesired(),
			asw: rcActual(
				rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true}),
				rcFound(diskName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false}),
				withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), true),
			),
		},
		{
			name: "wanted by another pod only: the found pod is not adopted",
			dsw:  rcDesired(rcWant(localName, local.Name, shared, localSpec, "p2")),
			asw:  rcActual(rcFound(localName, local.Name, shared, map[types.UID]bool{"p1": true})),
		},
		{
			name: "shared volume: only the wanted pods whose mounts are in place",
			dsw:  rcDesired(rcWant(localName, local.Name, shared, localSpec, "p1", "p2", "p4")),
			asw: rcActual(func() *cache.ActualVolume {
				v := rcFound(localName, local.Name, shared, map[types.UID]bool{"p1": true, "p2": false, "p3": true})
				// p4's mount is known to this agent (not reconstructed).
				v.Pods = v.Pods.With("p4", &cache.ActualPodMount{Pod: rcRef("p4"), State: cache.MountUncertain, MountPath: "/p4"})
				return v
			}()),
			want: []Adoption{{ID: cache.VolumeIdentity{Name: localName}, Pods: map[types.UID]cache.ActualPodMount{"p1": {Pod: rcRef("p1")}}}},
		},
		{
			name: "device found mounted and wanted: device and pod adopted",
			dsw:  rcDesired(rcWant(localName, local.Name, device, localSpec, "p1")),
			asw:  rcActual(withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), true)),
			want: []Adoption{{ID: cache.VolumeIdentity{Name: localName}, Device: true, Pods: map[types.UID]cache.ActualPodMount{"p1": {Pod: rcRef("p1")}}}},
		},
		{
			name: "device found mounted, pod mount missing: device adopted alone",
			dsw:  rcDesired(rcWant(localName, local.Name, device, localSpec, "p1")),
			asw:  rcActual(withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": false}), true)),
			want: []Adoption{{ID: cache.VolumeIdentity{Name: localName}, Device: true}},
		},
		{
			name: "device found mounted without pods, wanted by a new pod: device adopted",
			dsw:  rcDesired(rcWant(localName, local.Name, device, localSpec, "p9")),
			asw:  rcActual(withDevice(rcFound(localName, local.Name, device, nil), true)),
			want: []Adoption{{ID: cache.VolumeIdentity{Name: localName}, Device: true}},
		},
		{
			name: "device not found mounted: not adopted (mounted again)",
			dsw:  rcDesired(rcWant(localName, local.Name, device, localSpec, "p1")),
			asw:  rcActual(withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), false)),
			want: []Adoption{{ID: cache.VolumeIdentity{Name: localName}, Pods: map[types.UID]cache.ActualPodMount{"p1": {Pod: rcRef("p1")}}}},
		},
		{
			name: "nothing reconstructed: nothing to adopt",
			dsw:  rcDesired(rcWant(memName, emptydir.Name, volume.Attributes{}, memSpec, "p1")),
			asw: rcActual(&cache.ActualVolume{Name: memName, Plugin: emptydir.Name, DeviceState: cache.DeviceGloballyMounted,
				Pods: cache.PodSetOf(map[types.UID]*cache.ActualPodMount{"p1": {Pod: rcRef("p1"), State: cache.MountUncertain, FoundMounted: true}})}),
		},
		{
			name: "several volumes: sorted by name",
			dsw: rcDesired(
				rcWant(memName, emptydir.Name, volume.Attributes{}, memSpec, "p1"),
				rcWant(diskName, emptydir.Name, volume.Attributes{}, diskSpec, "p1"),
				rcWant(localName, local.Name, device, localSpec, "p1"),
			),
			asw: rcActual(
				rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true}),
				rcFound(diskName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false}),
				withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), true),
			),
			want: []Adoption{
				{ID: cache.VolumeIdentity{Name: diskName}, Pods: map[types.UID]cache.ActualPodMount{"p1": {Pod: rcRef("p1")}}},
				{ID: cache.VolumeIdentity{Name: memName}, Pods: map[types.UID]cache.ActualPodMount{"p1": {Pod: rcRef("p1")}}},
				{ID: cache.VolumeIdentity{Name: localName}, Device: true, Pods: map[types.UID]cache.ActualPodMount{"p1": {Pod: rcRef("p1")}}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			suwm := rcSetUpWithoutMount
			if tc.noSUWM {
				suwm = nil
			}
			before := cachetest.JSON(tc.asw) + cachetest.JSON(tc.dsw)
			got := stripAdoptions(Adoptions(tc.dsw, tc.asw, suwm))
			if len(got) != 0 || len(tc.want) != 0 {
				if !reflect.DeepEqual(got, tc.want) {
					t.Errorf("adoptions:\n%s\nwant:\n%s", cachetest.JSON(got), cachetest.JSON(tc.want))
				}
			}
			if cachetest.JSON(tc.asw)+cachetest.JSON(tc.dsw) != before {
				t.Error("Adoptions modified its inputs")
			}
		})
	}
}

// Adopting (through the ASW's Adopt, as the operator does) makes found state mounted
// and leaves nothing reconstructed that a pod wants; what is left is what
// must be mounted again or torn down.
func TestAdoptionsApplied(t *testing.T) {
	asw := cache.NewActualStateOfWorld(clock.RealClock{})
	memName := volume.PodScopedName(emptydir.Name, "p1", "mem")
	lostName := volume.PodScopedName(emptydir.Name, "p1", "lost")
	goneName := volume.PodScopedName(emptydir.Name, "gone", "mem")
	localName := volume.SharedName(local.Name, "pv")
	device := volume.Attributes{Identity: "pv", DeviceMountable: true}
	asw.AddReconstructed([]*cache.ActualVolume{
		rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true}),
		rcFound(lostName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false}),
		rcFound(goneName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"gone": true}),
		withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true, "gone": true}), true),
	})
	memSpec := emptyDirSpec("mem", v1.StorageMediumMemory)
	dsw := rcDesired(
		rcWant(memName, emptydir.Name, volume.Attributes{}, memSpec, "p1"),
		rcWant(lostName, emptydir.Name, volume.Attributes{}, emptyDirSpec("lost", v1.StorageMediumMemory), "p1"),
		rcWant(localName, local.Name, device, localSpec("pv", "/dev/x"), "p1"),
	)
	for _, a := range Adoptions(dsw, asw.Snapshot(), rcSetUpWithoutMount) {
		asw.Adopt(a.ID, a.Device, a.Pods)
	}
	s := asw.Snapshot()
	if m := s.Volume(memName).Pods.At("p1"); m.State != cache.Mounted || m.Reconstructed || m.Pod != rcRef("p1") {
		t.Errorf("adopted mount: %+v", m)
	}
	if v := s.Volume(localName); v.DeviceState != cache.DeviceGloballyMounted || v.DeviceReconstructed ||
		v.Pods.At("p1").State != cache.Mounted || !v.Pods.At("gone").Reconstructed {
		t.Errorf("adopted device volume: %s", cachetest.JSON(v))
	}
	if m := s.Volume(lostName).Pods.At("p1"); m.State != cache.MountUncertain || !m.Reconstructed {
		t.Errorf("mount not in place: %+v", m)
	}
	// What was guessed from disk gives way to what the pods want: teardown
	// later knows the spec as if the agent had mounted the volume itself.
	if v := s.Volume(memName); v.Spec != memSpec || v.Pods.At("p1").Spec != memSpec {
		t.Errorf("adopted volume's spec %p and mount's spec %p, want the desired %p", v.Spec, v.Pods.At("p1").Spec, memSpec)
	}
	if v := s.Volume(localName); v.Spec != dsw.Volume(localName).Spec || v.Attributes != device {
		t.Errorf("adopted device volume: spec %+v, attributes %+v", v.Spec, v.Attributes)
	}
	if !s.HasReconstructed() {
		t.Error("HasReconstructed is false with unmatched state left")
	}
	// The plan mounts what was not in place and, once orphans may be
	// cleaned, tears down what no pod wants; adopted state needs nothing.
	acts := rcActs(Plan(dsw, s, Options{SourcesReady: true, OrphanCleanupAllowed: true}))
	want := []string{
		"unmount_volume " + string(goneName) + " gone",
		"unmount_volume " + string(localName) + " gone",
		"mount_volume " + string(lostName) + " p1",
	}
	if !reflect.DeepEqual(acts, want) {
		t.Errorf("plan after adoption: %q, want %q", acts, want)
	}
}

func rcActs(actions []Action) []string {
	out := []string{}
	for _, a := range actions {
		s := string(a.Op) + " " + string(a.Volume)
		if a.Pod.UID != "" {
			s += " " + string(a.Pod.UID)
		}
		out = append(out, s)
	}
	return out
}

// --- Plan and reconstructed state ---

// Until orphans may be cleaned, nothing reconstructed is torn down while
// state the agent itself recorded is; once allowed, everything unwanted is.
func TestPlanLeavesReconstructedStateUntilOrphanCleanupAllowed(t *testing.T) {
	uncertainMount := func(uid types.UID, reconstructed bool) *cache.ActualPodMount {
		return &cache.ActualPodMount{Pod: volume.PodRef{UID: uid}, SpecName: "v", MountPath: "/pods/" + string(uid),
			State: cache.MountUncertain, Reconstructed: reconstructed, FoundMounted: reconstructed}
	}
	vol := func(name string, attrs volume.Attributes, mounts ...*cache.ActualPodMount) *cache.ActualVolume {
		v := &cache.ActualVolume{Name: volume.UniqueName(name), Plugin: "test", Attributes: attrs, DeviceState: cache.DeviceNotMounted,
			Pods: cache.PodSet[cache.ActualPodMount]{}}
		for _, m := range mounts {
			v.Pods = v.Pods.With(m.Pod.UID, m)
		}
		return v
	}
	dev := volume.Attributes{Identity: "d", DeviceMountable: true, Attachable: true}
	recDevice := vol("test/rec-device", dev)
	recDevice.DeviceState, recDevice.DeviceReconstructed, recDevice.DeviceFoundMounted = cache.DeviceMountUncertain, true, true
	recDevice.AttachState = cache.AttachUncertain
	recAttachOnly := vol("test/rec-attached", dev)
	recAttachOnly.DeviceReconstructed, recAttachOnly.AttachState = true, cache.AttachUncertain
	ownDevice := vol("test/own-device", dev)
	ownDevice.DeviceState = cache.DeviceGloballyMounted
	ownAttached := vol("test/own-attached", dev)
	ownAttached.AttachState = cache.Attached
	mixed := vol("test/shared", volume.Attributes{Identity: "s"}, uncertainMount("rec", true), uncertainMount("own", false))
	mixed.Pods.At("own").State = cache.Mounted
	asw := rcActual(
		vol("test/rec-pod", volume.Attributes{}, uncertainMount("rec", true)),
		vol("test/own-pod", volume.Attributes{}, uncertainMount("own", false)),
		mixed, recDevice, recAttachOnly, ownDevice, ownAttached,
	)
	dsw := rcDesired()

	plan := func(opts Options) []string { return rcActs(Plan(dsw, asw, opts)) }
	if got := plan(Options{}); len(got) != 0 {
		t.Errorf("sources not ready: %q, want nothing", got)
	}
	got := plan(Options{SourcesReady: true})
	want := []string{
		"unmount_volume test/own-pod own",
		"unmount_volume test/shared own",
		"detach_volume test/own-attached",
		"unmount_device test/own-device",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("orphan cleanup not allowed:\n got %q\nwant %q", got, want)
	}
	got = plan(Options{SourcesReady: true, OrphanCleanupAllowed: true})
	want = []string{
		"unmount_volume test/own-pod own",
		"unmount_volume test/rec-pod rec",
		"unmount_volume test/shared own",
		"unmount_volume test/shared rec",
		"detach_volume test/own-attached",
		"unmount_device test/own-device",
		"detach_volume test/rec-attached",
		"unmount_device test/rec-device",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("orphan cleanup allowed:\n got %q\nwant %q", got, want)
	}
}

// Over random worlds: without OrphanCleanupAllowed no action ever tears down
// a reconstructed mount or device, and with it the set of teardown actions
// is exactly the allowed one plus the reconstructed state nobody wants.
func TestPlanNeverTearsDownReconstructedWithoutOrphanCleanup(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for i := range 2000 {
		dsw, asw := rcRandomWorld(r)
		blocked := Plan(dsw, asw, Options{SourcesReady: true})
		for _, a := range blocked {
			av := asw.Volume(a.Volume)
			switch a.Op {
			case operations.OpUnmountVolume:
				if m := av.Pods.At(a.Pod.UID); m != nil && m.Reconstructed {
					t.Fatalf("world %d: %s of a reconstructed mount: %+v", i, a.Op, m)
				}
			case operations.OpUnmountDevice, operations.OpDetachVolume:
				if av.DeviceReconstructed {
					t.Fatalf("world %d: %s of a reconstructed device", i, a.Op)
				}
			}
		}
		allowed := Plan(dsw, asw, Options{SourcesReady: true, OrphanCleanupAllowed: true})
		// Mount-side actions never depend on orphan cleanup.
		if mb, ma := rcMountSide(blocked), rcMountSide(allowed); !reflect.DeepEqual(mb, ma) {
			t.Fatalf("world %d: mount-side actions differ: %q vs %q", i, mb, ma)
		}
		if len(allowed) < len(blocked) {
			t.Fatalf("world %d: allowing orphan cleanup removed actions", i)
		}
	}
}

func rcMountSide(actions []Action) []string {
	var out []string
	for _, s := range rcActs(actions) {
		if !strings.HasPrefix(s, "unmount_") && !strings.HasPrefix(s, "detach_") {
			out = append(out, s)
		}
	}
	return out
}

func rcRandomWorld(r *rand.Rand) (*cache.DesiredSnapshot, *cache.ActualSnapshot) {
	var dvs []*cache.DesiredVolume
	var avs []*cache.ActualVolume
	pods := []types.UID{"p0", "p1", "p2", "p3"}
	for i := range 6 {
		name := volume.UniqueName(fmt.Sprintf("test/v%d", i))
		attrs := volume.Attributes{}
		switch r.IntN(3) {
		case 1:
			attrs = volume.Attributes{Identity: string(name), DeviceMountable: true}
		case 2:
			attrs = volume.Attributes{Identity: string(name), DeviceMountable: true, Attachable: true}
		}
		spec := &volume.Spec{Name: fmt.Sprintf("v%d", i)}
		var wanted []types.UID
		for _, p := range pods {
			if r.IntN(3) == 0 {
				wanted = append(wanted, p)
			}
		}
		if len(wanted) > 0 {
			dv := rcWant(name, "test", attrs, spec, wanted...)
			dvs = append(dvs, dv)
		}
		if r.IntN(4) == 0 {
			continue
		}
		av := cachetest.ReconstructedVolume(name, "test", attrs)
		for _, p := range pods {
			if r.IntN(2) == 0 {
				continue
			}
			m := cachetest.ReconstructedPod(p, spec.Name, "/pods/"+string(p), r.IntN(2) == 0)
			m.Reconstructed = r.IntN(2) == 0
			if !m.Reconstructed && r.IntN(2) == 0 {
				m.State = cache.Mounted
			}
			av.Pods = av.Pods.With(p, m)
		}
		if attrs.DeviceMountable {
			av.DeviceState = []cache.DeviceMountState{cache.DeviceNotMounted, cache.DeviceMountUncertain, cache.DeviceGloballyMounted}[r.IntN(3)]
			av.DeviceReconstructed = av.DeviceState == cache.DeviceMountUncertain && r.IntN(2) == 0
			av.DeviceFoundMounted = av.DeviceReconstructed && r.IntN(2) == 0
		}
		if attrs.Attachable {
			av.AttachState = []cache.AttachState{cache.NotAttached, cache.AttachUncertain, cache.Attached}[r.IntN(3)]
		}
		avs = append(avs, av)
	}
	return rcDesired(dvs...), rcActual(avs...)
}

// Before the sources are ready, reconstructed state is neither torn down
// nor set up again: a pod already in a partially populated DSW must not get
// a mount operation for a volume the first ready pass will adopt. New
// volumes are mounted as usual.
func TestPlanLeavesReconstructedStateUntilSourcesReady(t *testing.T) {
	memName := volume.PodScopedName(emptydir.Name, "p1", "mem")
	lostName := volume.PodScopedName(emptydir.Name, "p1", "lost")
	newName := volume.PodScopedName(emptydir.Name, "p1", "new")
	localName := volume.SharedName(local.Name, "pv")
	device := volume.Attributes{Identity: "pv", DeviceMountable: true}
	dsw := rcDesired(
		rcWant(memName, emptydir.Name, volume.Attributes{}, emptyDirSpec("mem", v1.StorageMediumMemory), "p1"),
		rcWant(lostName, emptydir.Name, volume.Attributes{}, emptyDirSpec("lost", v1.StorageMediumMemory), "p1"),
		rcWant(newName, emptydir.Name, volume.Attributes{}, emptyDirSpec("new", v1.StorageMediumMemory), "p1"),
		rcWant(localName, local.Name, device, localSpec("pv", "/dev/x"), "p1"),
	)
	asw := rcActual(
		rcFound(memName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": true}),
		rcFound(lostName, emptydir.Name, volume.Attributes{}, map[types.UID]bool{"p1": false}),
		withDevice(rcFound(localName, local.Name, device, map[types.UID]bool{"p1": true}), false),
	)
	if got, want := rcActs(Plan(dsw, asw, Options{})), []string{"mount_volume " + string(newName) + " p1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("sources not ready: %q, want %q", got, want)
	}
	// Once ready (after adoption, which finds nothing to adopt here but
	// the mem mount), what was not in place is mounted again.
	got := rcActs(Plan(dsw, asw, Options{SourcesReady: true}))
	want := []string{
		"mount_volume " + string(lostName) + " p1",
		"mount_volume " + string(memName) + " p1",
		"mount_volume " + string(newName) + " p1",
		"mount_device " + string(localName),
	}
	slices.Sort(got)
	slices.Sort(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sources ready, nothing adopted: %q, want %q", got, want)
	}
}

// stripAdoptions keeps what the tables compare: which volume, whether the
// device, and which pods (by reference) were adopted.
func stripAdoptions(as []Adoption) []Adoption {
	out := make([]Adoption, 0, len(as))
	for _, a := range as {
		b := Adoption{ID: cache.VolumeIdentity{Name: a.ID.Name}, Device: a.Device}
		for uid, p := range a.Pods {
			if b.Pods == nil {
				b.Pods = map[types.UID]cache.ActualPodMount{}
			}
			b.Pods[uid] = cache.ActualPodMount{Pod: p.Pod}
		}
		out = append(out, b)
	}
	return out
}

func emptyDirSpec(name string, medium v1.StorageMedium) *volume.Spec {
	vol := &v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: medium}}}
	return &volume.Spec{Name: name, Volume: vol, Mode: v1.PersistentVolumeFilesystem}
}

func localSpec(pv, path string) *volume.Spec {
	p := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv}, Spec: v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: path}},
	}}
	return &volume.Spec{Name: pv, PV: p, Mode: v1.PersistentVolumeFilesystem}
}
