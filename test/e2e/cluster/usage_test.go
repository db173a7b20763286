package cluster_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// A pod that writes past its emptyDir's sizeLimit (not enforced here,
// --empty-dir-size-limit=off) and its ephemeral-storage limit gets both
// Warning events on the API server, and its condition stays True with the
// reason LocalStorageOverLimit; a neighbour within its limits keeps
// VolumesMounted.
func TestLocalStorageOverLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "overlimit")
	e.start("--volume-usage-period=200ms", "--empty-dir-size-limit=off")
	hog := e.pod("hog", e2eutil.EmptyDirVolume("data", "", "1Mi"), e2eutil.EmptyDirVolume("more", "", ""))
	hog.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("4Mi")}
	hog = e.createPod(hog)
	calm := e.createPod(e.pod("calm", e2eutil.EmptyDirVolume("data", "", "1Mi")))
	e.waitCondition("hog", corev1.ConditionTrue, "VolumesMounted")
	e.waitCondition("calm", corev1.ConditionTrue, "VolumesMounted")

	for vol, size := range map[string]int{"data": 2 << 20, "more": 3 << 20} {
		if err := os.WriteFile(filepath.Join(e.volumePath(hog.UID, e2eutil.EmptyDirPlugin, vol), "blob"), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(e.volumePath(calm.UID, e2eutil.EmptyDirPlugin, "data"), "blob"), make([]byte, 512<<10), 0o644); err != nil {
		t.Fatal(err)
	}

	warning := func(ev *corev1.Event) bool { return ev.Type == corev1.EventTypeWarning }
	ev := e.waitEvent("hog", "EmptyDirOverLimit", warning, `Usage of EmptyDir volume "data" exceeds the limit "1Mi".`)
	t.Logf("event: %s %s: %s (from %s on %s)", ev.Type, ev.Reason, ev.Message, ev.Source.Component, ev.Source.Host)
	e.waitEvent("hog", "EphemeralStorageOverLimit", warning, "exceeds the total limit of containers 4Mi")
	c := e.waitCondition("hog", corev1.ConditionTrue, "LocalStorageOverLimit")
	if !strings.Contains(c.Message, `"data"`) {
		t.Errorf("condition message %q does not name the volume over its limit", c.Message)
	}
	// calm is under its limit: ready, no over-limit event or reason. The
	// usage passes that reported hog measured calm too.
	e.barrier("after-usage")
	e.waitCondition("calm", corev1.ConditionTrue, "VolumesMounted")
	if found, _, err := suite.FindEvents(t.Context(), e.ns, fields.Set{"involvedObject.name": "calm"}, "exceeds"); err != nil || len(found) > 0 {
		t.Errorf("calm got over-limit events: %+v (%v)", found, err)
	}
}
