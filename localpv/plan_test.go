package localpv

import (
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
)

const gib = int64(1) << 30

var (
	fsClass    = &Class{Name: "fast", DiscoveryDir: "/mnt/fast", VolumeMode: v1.PersistentVolumeFilesystem, NamePattern: DefaultNamePattern, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, Labels: map[string]string{"tier": "fast"}, Cleanup: BlockCleanup{Method: CleanupWipefs}}
	fsTypeCls  = &Class{Name: "dev", DiscoveryDir: "/mnt/dev", VolumeMode: v1.PersistentVolumeFilesystem, FSType: "ext4", NamePattern: DefaultNamePattern, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, Cleanup: BlockCleanup{Method: CleanupWipefs}}
	blockClass = &Class{Name: "raw", DiscoveryDir: "/mnt/raw", VolumeMode: v1.PersistentVolumeBlock, NamePattern: DefaultNamePattern, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, Cleanup: BlockCleanup{Method: CleanupBlkdiscard}}
)

func mountedFS(capacity int64) probe {
	return probe{Kind: KindDirectory, MountPoint: true, Capacity: capacity, Identity: "fs"}
}

func blockDev(capacity int64) probe {
	return probe{Kind: KindBlockDevice, Device: "/dev/x", Capacity: capacity, Identity: "dev"}
}

func TestDecideEntry(t *testing.T) {
	for _, tc := range []struct {
		name   string
		class  *Class
		probe  probe
		mode   v1.PersistentVolumeMode
		fsType string
		skip   string
	}{
		{"mount point", fsClass, mountedFS(gib), v1.PersistentVolumeFilesystem, "", ""},
		{"plain directory", fsClass, probe{Kind: KindDirectory}, "", "", "not a mount point"},
		{"symlink to a directory", fsClass, probe{Kind: KindDirectory, Symlink: true}, "", "", "a symbolic link to a directory"},
		{"directory in a Block class", blockClass, mountedFS(gib), "", "", "a directory in a Block class"},
		{"device in a Block class", blockClass, blockDev(gib), v1.PersistentVolumeBlock, "", ""},
		{"linked device in a Block class", blockClass, probe{Kind: KindBlockDevice, Symlink: true, Capacity: gib}, v1.PersistentVolumeBlock, "", ""},
		{"device with fsType", fsTypeCls, blockDev(gib), v1.PersistentVolumeFilesystem, "ext4", ""},
		{"mount point in an fsType class", fsTypeCls, mountedFS(gib), v1.PersistentVolumeFilesystem, "", ""},
		{"device without fsType", fsClass, blockDev(gib), "", "", "a block device in a Filesystem class without fsType"},
		{"regular file", blockClass, probe{Kind: KindOther, Detail: "regular file"}, "", "", "neither a directory nor a block device (a regular file)"},
		{"dangling link", blockClass, probe{Kind: KindMissing, Symlink: true, Detail: "dangling symbolic link"}, "", "", "dangling symbolic link"},
		{"gone", fsClass, probe{Kind: KindMissing}, "", "", "it no longer exists"},
		{"cannot inspect", fsClass, probe{Err: errors.New("permission denied")}, "", "", "cannot inspect it: permission denied"},
		{"too small", fsClass, mountedFS(1000), "", "", "capacity 1000 bytes is below 1Mi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode, fsType, skip := decideEntry(tc.class, tc.probe)
			if mode != tc.mode || fsType != tc.fsType || !strings.HasPrefix(skip, tc.skip) || (tc.skip == "") != (skip == "") {
				t.Fatalf("got (%q, %q, %q), want (%q, %q, %q...)", mode, fsType, skip, tc.mode, tc.fsType, tc.skip)
			}
		})
	}
}

func TestRoundCapacity(t *testing.T) {
	const mi = int64(1) << 20
	for in, want := range map[int64]int64{
		mi:                   mi,
		mi + 1:               mi,
		64*mi - 1:            63 * mi,
		9*gib + 999*mi + 123: 9*gib + 999*mi,
		10*gib + 5*mi:        10 * gib,
		1000*gib + gib - 1:   1000 * gib,
	} {
		if got := roundCapacity(in); got != want {
			t.Errorf("roundCapacity(%d) = %d, want %d", in, got, want)
		}
	}
	q := quantity(roundCapacity(64 * mi))
	if q.String() != "64Mi" {
		t.Errorf("quantity %s", q.String())
	}
}

// ourPV is a PV the provisioner of node-1 made.
func ourPV(name, uid, path string, phase v1.PersistentVolumePhase, policy v1.PersistentVolumeReclaimPolicy) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid), Annotations: map[string]string{AnnProvisionedBy: ProvisionerName("node-1")}},
		Spec: v1.PersistentVolumeSpec{
			Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			StorageClassName:              "fast",
			PersistentVolumeReclaimPolicy: policy,
			VolumeMode:                    ptr.To(v1.PersistentVolumeFilesystem),
			PersistentVolumeSource:        v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: path}},
			ClaimRef:                      &v1.ObjectReference{Namespace: "ns", Name: "claim", UID: "claim-1"},
		},
		Status: v1.PersistentVolumeStatus{Phase: phase},
	}
}

func baseInput() *planInput {
	return &planInput{
		Now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), Node: "node-1", Hostname: "host-1",
		Config:   &Config{Classes: map[string]*Class{"fast": fsClass, "raw": blockClass, "dev": fsTypeCls}},
		ClassErr: map[string]string{},
		Classes: map[string]*storagev1.StorageClass{
			"fast": {ObjectMeta: metav1.ObjectMeta{Name: "fast"}, MountOptions: []string{"noatime"}},
			"raw":  {ObjectMeta: metav1.ObjectMeta{Name: "raw"}, ReclaimPolicy: ptr.To(v1.PersistentVolumeReclaimRetain), MountOptions: []string{"noatime"}},
			"dev":  {ObjectMeta: metav1.ObjectMeta{Name: "dev"}},
		},
		Backing: map[types.UID]probe{}, Recent: map[string]recentCreate{}, Seen: map[string]seenEntry{}, CreateErrs: map[string]string{},
	}
}

func volumeAt(t *testing.T, out *planOutput, path string) Volume {
	t.Helper()
	for _, v := range out.Volumes {
		if v.Path == path {
			return v
		}
	}
	t.Fatalf("no volume at %s in %+v", path, out.Volumes)
	return Volume{}
}

func TestPlanCreates(t *testing.T) {
	in := baseInput()
	in.Entries = []entry{
		{Class: fsClass, Name: "a", Path: "/mnt/fast/a", Probe: mountedFS(10*gib + 12345)},
		{Class: fsClass, Name: "plain", Path: "/mnt/fast/plain", Probe: probe{Kind: KindDirectory}},
		{Class: blockClass, Name: "sdb", Path: "/mnt/raw/sdb", Probe: blockDev(2 * gib)},
		{Class: fsTypeCls, Name: "sdc", Path: "/mnt/dev/sdc", Probe: blockDev(3 * gib)},
	}
	out := plan(in)
	if len(out.Create) != 3 {
		t.Fatalf("creates %+v", out.Create)
	}
	byName := map[string]*v1.PersistentVolume{}
	for _, c := range out.Create {
		byName[c.PV.Name] = c.PV
	}
	a := byName["local-node-1-fast-a"]
	if a == nil {
		t.Fatalf("no PV for a: %v", byName)
	}
	if a.Spec.Local.Path != "/mnt/fast/a" || a.Spec.Local.FSType != nil || *a.Spec.VolumeMode != v1.PersistentVolumeFilesystem ||
		a.Spec.StorageClassName != "fast" || a.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimDelete ||
		a.Annotations[AnnProvisionedBy] != "volume-agent.io/node-1" || a.Labels["tier"] != "fast" || a.Labels[LabelNode] != "node-1" ||
		strings.Join(a.Spec.MountOptions, ",") != "noatime" || a.Spec.AccessModes[0] != v1.ReadWriteOnce {
		t.Errorf("PV a: %+v", a)
	}
	if q := a.Spec.Capacity[v1.ResourceStorage]; q.String() != "10Gi" {
		t.Errorf("capacity %s", q.String())
	}
	term := a.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0]
	if term.Key != v1.LabelHostname || term.Operator != v1.NodeSelectorOpIn || len(term.Values) != 1 || term.Values[0] != "host-1" {
		t.Errorf("affinity %+v", term)
	}
	raw := byName["local-node-1-raw-sdb"]
	if *raw.Spec.VolumeMode != v1.PersistentVolumeBlock || raw.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimRetain || len(raw.Spec.MountOptions) != 0 {
		t.Errorf("PV raw: %+v", raw.Spec)
	}
	dev := byName["local-node-1-dev-sdc"]
	if *dev.Spec.VolumeMode != v1.PersistentVolumeFilesystem || dev.Spec.Local.FSType == nil || *dev.Spec.Local.FSType != "ext4" {
		t.Errorf("PV dev: %+v", dev.Spec)
	}
	if v := volumeAt(t, out, "/mnt/fast/plain"); v.State != StateSkipped || !strings.Contains(v.Reason, "not a mount point") {
		t.Errorf("plain: %+v", v)
	}
	if v := volumeAt(t, out, "/mnt/fast/a"); v.State != StatePending || v.PV != "local-node-1-fast-a" {
		t.Errorf("a: %+v", v)
	}
	// Where an earlier version's unlabelled PV may be: both names.
	for _, c := range out.Create {
		if c.Path == "/mnt/fast/a" && strings.Join(c.Names, " ") != "local-node-1-fast-a "+FallbackName(DefaultNamePattern, "node-1", "fast", "a") {
			t.Errorf("names to look up for a: %v", c.Names)
		}
	}
}

// A name found taken by someone else's PV (which the provisioner does not
// watch) is not used again.
func TestPlanForeignNames(t *testing.T) {
	in := baseInput()
	in.Entries = []entry{{Class: fsClass, Name: "a", Path: "/mnt/fast/a", Probe: mountedFS(gib)}}
	in.Foreign = map[string]bool{"local-node-1-fast-a": true}
	out := plan(in)
	if len(out.Create) != 1 || out.Create[0].PV.Name != FallbackName(DefaultNamePattern, "node-1", "fast", "a") {
		t.Fatalf("creates %+v, want the fallback name", out.Create)
	}
}

func TestNodeLabelValue(t *testing.T) {
	long := strings.Repeat("n", 64)
	for _, node := range []string{"node-1", "a.b.c", strings.Repeat("n", 63), long} {
		v := NodeLabelValue(node)
		if len(validation.IsValidLabelValue(v)) != 0 {
			t.Errorf("NodeLabelValue(%q) = %q: not a label value", node, v)
		}
		if (len(node) <= 63) != (v == node) {
			t.Errorf("NodeLabelValue(%q) = %q", node, v)
		}
	}
	if NodeLabelValue(long) == NodeLabelValue(long+"x") {
		t.Error("long names collide")
	}
	if NodeSelector("node-1") != LabelNode+"=node-1" {
		t.Errorf("selector %q", NodeSelector("node-1"))
	}
}

func TestPlanNeverTwice(t *testing.T) {
	in := baseInput()
	in.Entries = []entry{
		{Class: fsClass, Name: "a", Path: "/mnt/fast/a", Probe: mountedFS(gib)},
		{Class: fsClass, Name: "b", Path: "/mnt/fast/b", Probe: mountedFS(gib)},
		{Class: fsClass, Name: "c", Path: "/mnt/fast/c", Probe: mountedFS(gib)},
		{Class: fsClass, Name: "d", Path: "/mnt/fast/d", Probe: mountedFS(gib)},
		{Class: fsClass, Name: "e", Path: "/mnt/fast/e", Probe: mountedFS(gib)},
	}
	// a: our PV exists, found by path whatever its name.
	mine := ourPV("renamed", "u-a", "/mnt/fast/a", v1.VolumeAvailable, v1.PersistentVolumeReclaimDelete)
	in.Backing["u-a"] = mountedFS(gib)
	// b: someone else's PV uses the path on this node.
	other := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "admin-pv", UID: "u-o"},
		Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/fast/b/"}}}}
	// c: a PV with the same path pinned to another node is not in the way.
	elsewhere := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "other-node-pv", UID: "u-e"},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/fast/c"}},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{"host-2"}}},
			}}}},
		}}
	// d: its pattern name is taken by a PV of another path: fallback name.
	squatter := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "local-node-1-fast-d", UID: "u-s"},
		Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/elsewhere"}}}}
	// e: created a moment ago, not in the cache yet.
	in.Recent["/mnt/fast/e"] = recentCreate{Name: "local-node-1-fast-e", At: in.Now.Add(-time.Second)}
	in.PVs = []*v1.PersistentVolume{mine, other, elsewhere, squatter}

	out := plan(in)
	var created []string
	for _, c := range out.Create {
		created = append(created, c.PV.Name)
	}
	want := []string{"local-node-1-fast-c", FallbackName(DefaultNamePattern, "node-1", "fast", "d")}
	if strings.Join(created, " ") != strings.Join(want, " ") {
		t.Fatalf("created %v, want %v", created, want)
	}
	if v := volumeAt(t, out, "/mnt/fast/a"); v.PV != "renamed" || v.Entry != "a" || v.State != StateAvailable {
		t.Errorf("a: %+v", v)
	}
	if v := volumeAt(t, out, "/mnt/fast/b"); v.State != StateSkipped || !strings.Contains(v.Reason, "used by PV admin-pv") {
		t.Errorf("b: %+v", v)
	}
	if v := volumeAt(t, out, "/mnt/fast/e"); v.State != StatePending || v.PV != "local-node-1-fast-e" {
		t.Errorf("e: %+v", v)
	}
	if out.Wake.IsZero() {
		t.Error("no wake-up for the recent creation's expiry")
	}

	// After the TTL the entry is created again (AlreadyExists is fine).
	in.Now = in.Now.Add(recentTTL)
	out = plan(in)
	if len(out.Create) != 3 {
		t.Errorf("after the TTL: %d creates", len(out.Create))
	}

	// Both names taken: skipped with the reason.
	in.PVs = append(in.PVs, &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: want[1], UID: "u-s2"}})
	out = plan(in)
	if v := volumeAt(t, out, "/mnt/fast/d"); v.State != StateSkipped || !strings.Contains(v.Reason, "name collision") {
		t.Errorf("d: %+v", v)
	}
}

func TestPlanClassErrorsAndSettle(t *testing.T) {
	in := baseInput()
	in.ClassErr["raw"] = `StorageClass "raw" not found`
	in.Settle = 2 * time.Second
	in.Entries = []entry{
		{Class: fsClass, Name: "new", Path: "/mnt/fast/new", Probe: mountedFS(gib)},
		{Class: fsClass, Name: "old", Path: "/mnt/fast/old", Probe: mountedFS(gib)},
		{Class: blockClass, Name: "sdb", Path: "/mnt/raw/sdb", Probe: blockDev(gib)},
	}
	in.Seen["/mnt/fast/new"] = seenEntry{Identity: "fs", Since: in.Now.Add(-time.Second)}
	in.Seen["/mnt/fast/old"] = seenEntry{Identity: "fs", Since: in.Now.Add(-3 * time.Second)}
	out := plan(in)
	if len(out.Create) != 1 || out.Create[0].Path != "/mnt/fast/old" {
		t.Fatalf("creates %+v", out.Create)
	}
	if v := volumeAt(t, out, "/mnt/fast/new"); v.State != StateSkipped || !strings.Contains(v.Reason, "waiting until it has looked the same") {
		t.Errorf("new: %+v", v)
	}
	if !out.Wake.Equal(in.Now.Add(time.Second)) {
		t.Errorf("wake %v", out.Wake.Sub(in.Now))
	}
	// One class's problem does not stop the others.
	if v := volumeAt(t, out, "/mnt/raw/sdb"); v.State != StateSkipped || v.Reason != `StorageClass "raw" not found` {
		t.Errorf("sdb: %+v", v)
	}
}

func TestPlanMissingDisks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pv      *v1.PersistentVolume
		backing probe
		missing string // "" if not missing
	}{
		{"bound, mounted", ourPV("p", "u", "/mnt/fast/a", v1.VolumeBound, v1.PersistentVolumeReclaimDelete), mountedFS(gib), ""},
		{"bound, unmounted", ourPV("p", "u", "/mnt/fast/a", v1.VolumeBound, v1.PersistentVolumeReclaimDelete), probe{Kind: KindDirectory}, "no longer a mount point"},
		{"bound, gone", ourPV("p", "u", "/mnt/fast/a", v1.VolumeBound, v1.PersistentVolumeReclaimDelete), probe{Kind: KindMissing}, "no longer exists"},
		{"released, unmounted: not cleaned", ourPV("p", "u", "/mnt/fast/a", v1.VolumeReleased, v1.PersistentVolumeReclaimDelete), probe{Kind: KindDirectory}, "no longer a mount point"},
		{"available, now a file", ourPV("p", "u", "/mnt/fast/a", v1.VolumeAvailable, v1.PersistentVolumeReclaimDelete), probe{Kind: KindOther, Detail: "regular file"}, "no longer a directory (it is a regular file)"},
		{"cannot inspect", ourPV("p", "u", "/mnt/fast/a", v1.VolumeAvailable, v1.PersistentVolumeReclaimDelete), probe{Err: errors.New("EIO")}, "cannot inspect /mnt/fast/a: EIO"},
		{"block device gone", blockPV("p", "u", "/mnt/raw/sdb", v1.VolumeReleased), probe{Kind: KindMissing, Symlink: true}, "no longer exists"},
		{"block path now a directory", blockPV("p", "u", "/mnt/raw/sdb", v1.VolumeBound), mountedFS(gib), "no longer a block device (it is a directory)"},
		{"block present", blockPV("p", "u", "/mnt/raw/sdb", v1.VolumeBound), blockDev(gib), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput()
			in.PVs = []*v1.PersistentVolume{tc.pv}
			in.Backing["u"] = tc.backing
			// The entry is still listed (an unmounted directory stays).
			if tc.backing.Kind != KindMissing {
				in.Entries = []entry{{Class: fsClass, Name: "a", Path: pvPath(tc.pv), Probe: tc.backing}}
			}
			out := plan(in)
			v := volumeAt(t, out, pvPath(tc.pv))
			if tc.missing == "" {
				if v.State == StateMissing {
					t.Fatalf("missing: %+v", v)
				}
				return
			}
			if v.State != StateMissing || !strings.Contains(v.Reason, tc.missing) {
				t.Fatalf("%+v, want missing because %q", v, tc.missing)
			}
			// Not deleted, not cleaned, not offered again.
			if len(out.Create)+len(out.Clean)+len(out.Delete) != 0 {
				t.Fatalf("acts on a missing disk: %+v", out)
			}
		})
	}
}

func blockPV(name, uid, path string, phase v1.PersistentVolumePhase) *v1.PersistentVolume {
	pv := ourPV(name, uid, path, phase, v1.PersistentVolumeReclaimDelete)
	pv.Spec.StorageClassName = "raw"
	pv.Spec.VolumeMode = ptr.To(v1.PersistentVolumeBlock)
	return pv
}

func TestPlanReleased(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	rel := func(policy v1.PersistentVolumeReclaimPolicy) *v1.PersistentVolume {
		return ourPV("p", "u", "/mnt/fast/a", v1.VolumeReleased, policy)
	}
	cl := func(state CleanupState, claim string) []Cleanup {
		return []Cleanup{{PV: "p", UID: "u", Path: "/mnt/fast/a", ClaimUID: types.UID(claim), State: state, LastError: "boom", NextRetry: now.Add(time.Minute)}}
	}
	for _, tc := range []struct {
		name     string
		pv       *v1.PersistentVolume
		cleanups []Cleanup
		config   bool
		state    State
		clean    bool
		del      bool
		reason   string
	}{
		{"delete: starts a cleanup", rel(v1.PersistentVolumeReclaimDelete), nil, true, StateCleaning, true, false, ""},
		{"delete: running", rel(v1.PersistentVolumeReclaimDelete), cl(CleanupRunning, "claim-1"), true, StateCleaning, false, false, ""},
		{"delete: failed, waiting", rel(v1.PersistentVolumeReclaimDelete), cl(CleanupFailed, "claim-1"), true, StateCleanupFailed, false, false, ""},
		{"delete: succeeded → delete", rel(v1.PersistentVolumeReclaimDelete), cl(CleanupSucceeded, "claim-1"), true, StateCleaning, false, true, "cleaned"},
		{"delete: stale success of another release", rel(v1.PersistentVolumeReclaimDelete), cl(CleanupSucceeded, "claim-0"), true, StateCleaning, true, false, ""},
		{"delete: class not configured", rel(v1.PersistentVolumeReclaimDelete), nil, false, StateReleased, false, false, "not in the configuration"},
		{"retain", rel(v1.PersistentVolumeReclaimRetain), nil, true, StateReleased, false, false, "Retain"},
		{"recycle", rel(v1.PersistentVolumeReclaimRecycle), nil, true, StateReleased, false, false, "Recycle is not supported"},
		{"unknown", rel("Shred"), nil, true, StateReleased, false, false, `unknown reclaim policy "Shred"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput()
			in.Now = now
			if !tc.config {
				in.Config = &Config{Classes: map[string]*Class{}}
			}
			in.PVs = []*v1.PersistentVolume{tc.pv}
			in.Backing["u"] = mountedFS(gib)
			in.Cleanups = tc.cleanups
			out := plan(in)
			v := volumeAt(t, out, "/mnt/fast/a")
			if v.State != tc.state || !strings.Contains(v.Reason, tc.reason) {
				t.Fatalf("%+v, want %s (%q)", v, tc.state, tc.reason)
			}
			if (len(out.Clean) == 1) != tc.clean || (len(out.Delete) == 1) != tc.del || len(out.Create) != 0 {
				t.Fatalf("clean %+v delete %+v create %d", out.Clean, out.Delete, len(out.Create))
			}
			if tc.clean && (out.Clean[0].UID != "u" || out.Clean[0].ClaimUID != "claim-1" || out.Clean[0].Block) {
				t.Fatalf("target %+v", out.Clean[0])
			}
			if tc.del && out.Delete[0].UID != "u" {
				t.Fatalf("delete %+v", out.Delete[0])
			}
			if tc.state == StateCleanupFailed && (v.LastError != "boom" || !out.Wake.Equal(now.Add(time.Minute))) {
				t.Fatalf("failed: %+v wake %v", v, out.Wake)
			}
		})
	}

	// The failed cleanup is retried once due.
	in := baseInput()
	in.Now = now.Add(time.Minute)
	in.PVs = []*v1.PersistentVolume{rel(v1.PersistentVolumeReclaimDelete)}
	in.Backing["u"] = mountedFS(gib)
	in.Cleanups = cl(CleanupFailed, "claim-1")
	if out := plan(in); len(out.Clean) != 1 {
		t.Fatal("not retried when due")
	}
	// A PV being deleted by someone else is cleaned but not deleted again.
	pv := rel(v1.PersistentVolumeReclaimDelete)
	pv.DeletionTimestamp = &metav1.Time{Time: now}
	in.PVs = []*v1.PersistentVolume{pv}
	in.Cleanups = cl(CleanupSucceeded, "claim-1")
	if out := plan(in); len(out.Delete) != 0 {
		t.Fatal("deletes a PV that is being deleted")
	}
}

func TestPlanOwedCleanups(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	in := baseInput()
	in.Now = now
	in.Entries = []entry{
		{Class: fsClass, Name: "a", Path: "/mnt/fast/a", Probe: mountedFS(gib)},
		{Class: fsClass, Name: "b", Path: "/mnt/fast/b", Probe: mountedFS(gib)},
		{Class: fsClass, Name: "c", Path: "/mnt/fast/c", Probe: mountedFS(gib)},
		{Class: fsClass, Name: "d", Path: "/mnt/fast/d", Probe: mountedFS(gib)},
	}
	in.Cleanups = []Cleanup{
		// a: the PV was deleted while its cleanup ran: not offered.
		{PV: "pa", UID: "ua", Path: "/mnt/fast/a", State: CleanupRunning, PVGone: true},
		// b: deleted uncleaned, queued: cleaned now, not offered.
		{PV: "pb", UID: "ub", Path: "/mnt/fast/b", Class: "fast", State: CleanupPending, NextRetry: now, PVGone: true},
		// c: cleaned and deleted by the provisioner: forgotten, offered.
		{PV: "pc", UID: "uc", Path: "/mnt/fast/c", State: CleanupSucceeded},
		// d: failed after its PV went away: retried later, not offered.
		{PV: "pd", UID: "ud", Path: "/mnt/fast/d", State: CleanupFailed, NextRetry: now.Add(time.Hour), LastError: "boom"},
	}
	out := plan(in)
	if len(out.Create) != 1 || out.Create[0].Path != "/mnt/fast/c" {
		t.Fatalf("creates %+v", out.Create)
	}
	if len(out.Clean) != 1 || out.Clean[0].UID != "ub" {
		t.Fatalf("cleans %+v", out.Clean)
	}
	if len(out.Forget) != 1 || out.Forget[0] != "uc" {
		t.Fatalf("forgets %+v", out.Forget)
	}
	if v := volumeAt(t, out, "/mnt/fast/a"); v.State != StateCleaning || v.PV != "pa" {
		t.Errorf("a: %+v", v)
	}
	if v := volumeAt(t, out, "/mnt/fast/d"); v.State != StateCleanupFailed || v.LastError != "boom" {
		t.Errorf("d: %+v", v)
	}
	if !out.Wake.Equal(now.Add(time.Hour)) {
		t.Errorf("wake %v", out.Wake)
	}
}

func TestMayBeOnNode(t *testing.T) {
	pin := func(hosts ...string) *v1.PersistentVolume {
		return &v1.PersistentVolume{Spec: v1.PersistentVolumeSpec{NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{
			NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: hosts}}}},
		}}}}
	}
	if !mayBeOnNode(&v1.PersistentVolume{}, "h") || !mayBeOnNode(pin("h", "x"), "h") || mayBeOnNode(pin("x"), "h") {
		t.Fatal("mayBeOnNode")
	}
}
