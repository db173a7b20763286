package cluster_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// outage is how long TestAPIServerOutage keeps kube-apiserver down.
const outage = 30 * time.Second

// kube-apiserver is stopped for 30 s while pods are mounted: the agent keeps
// every mount (its caches keep the last known state; a missing API server
// must not look like deleted pods), during the outage and after the API
// server is back and the agent has listed again. Then new work is done.
//
// Not parallel: the outage would break every other test. Sequential tests
// run before the parallel ones start, so none of them runs meanwhile.
func TestAPIServerOutage(t *testing.T) {
	e := newEnv(t, "outage")
	pv, _ := e.createLocalPV("data", "data")
	e.createClaim("data")
	e.waitBound("data", pv.Name)
	a := e.start()

	var paths []string
	uids := map[string]string{}
	for _, name := range []string{"db", "cache"} {
		pod := e.createPod(e.pod(name, e2eutil.ClaimVolume("data", "data"), e2eutil.MemoryVolume("scratch")))
		uids[string(pod.UID)] = name
		paths = append(paths, e.volumePath(pod.UID, e2eutil.LocalPlugin, pv.Name), e.volumePath(pod.UID, e2eutil.EmptyDirPlugin, "scratch"))
	}
	e.waitMounted(paths...)
	for _, name := range uids {
		e.waitCondition(name, corev1.ConditionTrue, "VolumesMounted")
	}
	before := mountPoints(t, e.root)

	t.Logf("stopping kube-apiserver for %v", outage)
	stopped := time.Now()
	suite.Cluster.StopAPIServer()
	up := false
	// Whatever happens, the other tests need the API server back, and the
	// controller manager working again: its informers back off like the
	// agent's, and every other test waits for its serviceaccount
	// controller and PV binder.
	t.Cleanup(func() {
		if !up {
			err := suite.Cluster.StartAPIServer(context.Background())
			recordRestart(stopped, time.Now())
			if err != nil {
				t.Errorf("restarting kube-apiserver: %v", err)
				return
			}
		}
		start := time.Now()
		if err := controllerManagerWorks(); err != nil {
			t.Errorf("kube-controller-manager after the outage: %v", err)
			return
		}
		t.Logf("kube-controller-manager working again %v after the test", time.Since(start).Round(time.Millisecond))
	})
	start := time.Now()
	checks := 0
	tick := time.NewTicker(time.Second)
	for time.Since(start) < outage { // the outage is the subject of the test, not a wait for something
		checks++
		if missing := missingMounts(t, e.root, before); len(missing) > 0 {
			t.Fatalf("%v into the outage: unmounted %q", time.Since(start).Round(time.Second), missing)
		}
		if resp, err := http.Get(a.DebugURL() + "/healthz"); err != nil {
			t.Fatalf("agent /healthz during the outage: %v", err)
		} else {
			resp.Body.Close()
		}
		desired := 0
		for _, p := range e2eutil.Must(t, a.DSW).Pods {
			if _, ok := uids[p.UID]; ok {
				desired++
			}
		}
		if desired != len(uids) {
			t.Fatalf("%v into the outage: %d of the %d pods are still desired", time.Since(start).Round(time.Second), desired, len(uids))
		}
		<-tick.C
	}
	tick.Stop()
	t.Logf("kube-apiserver was down for %v; %d checks of the mount table and the agent found nothing torn down", time.Since(start).Round(time.Millisecond), checks)
	restart := time.Now()
	err := suite.Cluster.StartAPIServer(t.Context())
	up = true // tried: the cleanup must not start it twice
	// Until ready, a restarted API server refuses what its RBAC caches do
	// not know yet: checkRBAC forgives 403s from this period.
	recordRestart(stopped, time.Now())
	if err != nil {
		t.Fatalf("restarting kube-apiserver: %v", err)
	}
	t.Logf("kube-apiserver ready again after %v", time.Since(restart).Round(time.Millisecond))
	if missing := missingMounts(t, e.root, before); len(missing) > 0 {
		t.Fatalf("unmounted right after the outage: %q", missing)
	}

	// Work resumes: a new pod is mounted and its condition written. The
	// informers watch again after client-go's reflector backoff: 0.8 s
	// doubling to 30 s with up to 100% jitter, reset only after 2 minutes
	// without failures. After a 30 s outage it is commonly 30-60 s, and a
	// watch refused by the API server while it starts costs another round:
	// up to about 100 s was seen.
	resumed := time.Now()
	pod := e.createPod(e.pod("late", e2eutil.ClaimVolume("data", "data"), e2eutil.MemoryVolume("scratch")))
	e.waitMountedWithin(3*time.Minute, e.volumePath(pod.UID, e2eutil.LocalPlugin, pv.Name), e.volumePath(pod.UID, e2eutil.EmptyDirPlugin, "scratch"))
	e.waitCondition("late", corev1.ConditionTrue, "VolumesMounted")
	t.Logf("a pod created after the outage was mounted and reported in %v", time.Since(resumed).Round(time.Millisecond))
	// By now the agent has listed again and reconciled: still nothing lost.
	if missing := missingMounts(t, e.root, before); len(missing) > 0 {
		t.Fatalf("unmounted after the agent re-listed: %q", missing)
	}
	for _, name := range uids {
		e.waitCondition(name, corev1.ConditionTrue, "VolumesMounted")
	}
}

// controllerManagerWorks waits until the serviceaccount controller gives a
// new namespace its default ServiceAccount.
func controllerManagerWorks() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := e2eutil.UniqueName("outage-probe")
	if _, err := suite.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for {
		if _, err := suite.Admin.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no default ServiceAccount in a new namespace: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func mountPoints(t *testing.T, root string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, m := range mounttest.MountsUnder(t, root) {
		out[m.MountPoint] = true
	}
	return out
}

func missingMounts(t *testing.T, root string, want map[string]bool) []string {
	t.Helper()
	have := mountPoints(t, root)
	var missing []string
	for p := range want {
		if !have[p] {
			missing = append(missing, p)
		}
	}
	sort.Strings(missing)
	return missing
}

// The agent starts with 100 pods × 2 volumes (a Memory emptyDir each, and a
// local PV claim shared by 10 pods) already there: everything is mounted
// and every condition True, and the agent's API traffic is bounded. Reads
// are its informers' lists and watches, a constant independent of pods ×
// volumes (no per-pod or per-volume GET); writes are about one pod-status
// patch per pod, plus events (none when nothing fails). Counted from the
// API server's audit log by the agent's user agent.
func TestManyPodsAtStartup(t *testing.T) {
	t.Parallel()
	const pods, claims = 100, 10
	e := newEnv(t, "many")
	pvNames := make([]string, claims)
	for i := range claims {
		claim := fmt.Sprintf("data-%d", i)
		pv, _ := e.createLocalPV(claim, claim)
		pvNames[i] = pv.Name
		e.createClaim(claim)
	}
	for i := range claims {
		e.waitBound(fmt.Sprintf("data-%d", i), pvNames[i])
	}
	var paths []string
	for i := range pods {
		pod := e.createPod(e.pod(fmt.Sprintf("pod-%03d", i), e2eutil.MemoryVolume("cache"), e2eutil.ClaimVolume("data", fmt.Sprintf("data-%d", i%claims))))
		paths = append(paths, e.volumePath(pod.UID, e2eutil.EmptyDirPlugin, "cache"), e.volumePath(pod.UID, e2eutil.LocalPlugin, pvNames[i%claims]))
	}

	start := time.Now()
	e.start()
	e2eutil.Poll(t, 3*time.Minute, fmt.Sprintf("%d volumes mounted", len(paths)), func(context.Context) (bool, string) {
		have := mountPoints(t, e.root)
		n := 0
		for _, p := range paths {
			if have[mounttest.Real(p)] {
				n++
			}
		}
		return n == len(paths), fmt.Sprintf("%d of %d mounted", n, len(paths))
	})
	mountedIn := time.Since(start)
	e2eutil.Poll(t, 3*time.Minute, "every pod's condition True", func(ctx context.Context) (bool, string) {
		list, err := suite.Admin.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for i := range list.Items {
			if c := condition(&list.Items[i]); c != nil && c.Status == corev1.ConditionTrue && c.Reason == "VolumesMounted" {
				ready++
			}
		}
		return ready == pods && len(list.Items) == pods, fmt.Sprintf("%d of %d pods ready", ready, len(list.Items))
	})
	t.Logf("agent start to %d volumes mounted: %v; to %d conditions True: %v", len(paths), mountedIn.Round(time.Millisecond), pods, time.Since(start).Round(time.Millisecond))
	if n := mountsUnder(t, e.root); n != len(paths) {
		t.Errorf("%d mounts under the root, want exactly %d", n, len(paths))
	}

	// Audit events are written just after the response: wait until the
	// patches that made the conditions visible are logged.
	userAgent := "volume-agent/" + e.node
	var counts map[string]int
	e2eutil.Poll(t, 30*time.Second, "the agent's status patches in the audit log", func(context.Context) (bool, string) {
		var err error
		if counts, err = countRequests(userAgent); err != nil {
			return false, err.Error()
		}
		return counts["patch pods/status"] >= pods, fmt.Sprintf("%d status patches logged", counts["patch pods/status"])
	})

	var keys []string
	reads, writes := 0, 0
	for k, n := range counts {
		keys = append(keys, k)
		switch verb, _, _ := strings.Cut(k, " "); verb {
		case "get", "list", "watch":
			reads += n
		default:
			writes += n
		}
	}
	sort.Strings(keys)
	var table strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&table, "\n  %-40s %5d", k, counts[k])
	}
	t.Logf("API requests of %s for %d pods × 2 volumes (%d claims): %d reads, %d writes:%s", userAgent, pods, claims, reads, writes, table.String())

	// Informers for what is scoped to the node or small; one watch per
	// claim and per volume the pods use (by name: see checkRBAC), shared
	// by the pods that use it.
	informers := []string{"pods", "nodes", "storageclasses.storage.k8s.io", "csidrivers.storage.k8s.io"}
	perObject := map[string]int{"persistentvolumeclaims": claims, "persistentvolumes": claims}
	// What the node says of its CSI drivers (csi/nodeinfo), once at start
	// whatever the pods: the Node and its CSINode read, the CSINode
	// created, the attach/detach annotation set.
	atStart := []string{"get nodes", "get csinodes.storage.k8s.io", "create csinodes.storage.k8s.io", "patch nodes"}
	for _, k := range keys {
		verb, res, _ := strings.Cut(k, " ")
		switch {
		case slices.Contains(atStart, k):
			if counts[k] > 1 {
				t.Errorf("%d requests %s: the node's CSI information is read and written once at start", counts[k], k)
			}
		case verb == "get":
			t.Errorf("%d GETs of %s: lookups must be served from watch caches", counts[k], res)
		case (verb == "list" || verb == "watch") && perObject[res] > 0:
			if counts[k] > 3*perObject[res] {
				t.Errorf("%d %s requests of %s for %d objects: more than a list and watch (with a retry) per object", counts[k], verb, res, perObject[res])
			}
		case verb == "list" || verb == "watch":
			if !slices.Contains(informers, res) {
				t.Errorf("%s of %s: not one of the agent's informers", verb, res)
			}
			if counts[k] > 3 {
				t.Errorf("%d %s requests of %s: more than an informer's list and watch (with a retry)", counts[k], verb, res)
			}
		case k == "patch pods/status":
			if counts[k] > 2*pods {
				t.Errorf("%d pod status patches for %d pods: more than two per pod", counts[k], pods)
			}
		case k == "patch nodes/status":
			// The node's volumesInUse (for the attach/detach controller),
			// written when it changes: no attachable volume here.
			if counts[k] > 2 {
				t.Errorf("%d node status patches without any attachable volume", counts[k])
			}
		case res == "events":
			if counts[k] > 10 {
				t.Errorf("%d event writes (%s) though no volume failed", counts[k], verb)
			}
		default:
			t.Errorf("unexpected request: %s (%d)", k, counts[k])
		}
	}
	if reads > 3*(len(informers)+2*claims) {
		t.Errorf("%d reads: more than a constant per informer and per claim and volume", reads)
	}
	if writes > 2*pods+12 {
		t.Errorf("%d writes for %d pods: more than about one status patch per pod plus events", writes, pods)
	}
}

// countRequests counts the requests of one user agent (exactly: another
// agent's node name may have this one's as a prefix) by "verb resource".
func countRequests(userAgent string) (map[string]int, error) {
	events, err := suite.Cluster.AuditEvents()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	counts := map[string]int{}
	for _, e := range events {
		if e.UserAgent != userAgent || seen[e.AuditID] {
			continue
		}
		if e.Stage != cluster.StageResponseComplete && e.Stage != cluster.StageResponseStarted {
			continue
		}
		seen[e.AuditID] = true // a watch has two events
		counts[e2eutil.RequestKey(e)]++
	}
	return counts, nil
}
