package operations

import (
	"testing"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// A volume the runtime mounts itself (an image volume) is set up and torn
// down with no path: the plugin gets none, the pod's mount records none,
// and not one directory is made for the pod.
func TestOperatorNoHostPathVolume(t *testing.T) {
	w := newOpWorld(t, opPodScoped)
	w.attrs = volume.Attributes{NoHostPath: true, ReadOnlyForContainers: true}
	if err := w.op.MountVolume(t.Context(), w.podTarget()); err != nil {
		t.Fatal(err)
	}
	if req := w.plugin.last(t, "SetUp").(plugins.SetUpRequest); req.Dir != "" {
		t.Errorf("SetUp got Dir %q, want none", req.Dir)
	}
	m, ok := w.asw.Snapshot().PodMount(w.vol, opPod)
	if !ok || m.State != cache.Mounted || m.MountPath != "" {
		t.Fatalf("pod mount %+v (found %v), want Mounted with no path", m, ok)
	}
	if dirExists(w.paths.PodsDir()) {
		t.Errorf("%s made for a volume with no host path", w.paths.PodsDir())
	}

	ut := w.podTarget()
	ut.MountPath = m.MountPath
	if err := w.op.UnmountVolume(t.Context(), ut); err != nil {
		t.Fatal(err)
	}
	if req := w.plugin.last(t, "TearDown").(plugins.TearDownRequest); req.Dir != "" {
		t.Errorf("TearDown got Dir %q, want none", req.Dir)
	}
	if _, ok := w.asw.Snapshot().PodMount(w.vol, opPod); ok {
		t.Error("pod mount still recorded after teardown")
	}
	if dirExists(w.paths.PodsDir()) {
		t.Errorf("%s made by the teardown", w.paths.PodsDir())
	}
}
