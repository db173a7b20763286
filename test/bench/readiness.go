package main

// The readiness scenario (-scenario readiness): how soon after its volumes
// are mounted a pod's volume-agent.io/VolumesReady condition is True in the
// API, in cluster mode against a real etcd, kube-apiserver and
// kube-controller-manager (test/cluster), the agent as the deploy/
// ServiceAccount.
//
// Each pod has -volumes PersistentVolumeClaim volumes (default 4), each
// claim bound to a local PersistentVolume of its own (a directory, bind-mounted into the
// pod): no API request is needed to mount, so what the benchmark sees is the
// agent's status reporting. For each size and each way of starting —
// "before" (the pods exist when the agent starts, as after a node or agent
// restart; times are from the agent's start) and "running" (the agent runs
// and the pods are created at once, 32 clients; times are from each pod's
// creation) — it reports:
//
//   - when every volume was mounted and every condition True;
//   - per pod, created (or agent started) → condition True, and volumes
//     mounted → condition True, p50 / p99 / max. "Mounted" is when the
//     pod's last mount appeared in /proc/self/mountinfo (the kernel's
//     view, watched with poll(2), no polling); "True" is when the
//     benchmark's own watch of the pods saw it (lastTransitionTime has
//     whole seconds only);
//   - the agent's requests (the API server's audit log, by its user agent),
//     per pod;
//   - the CPU the agent and kube-apiserver used until every condition was
//     True, and the agent's RSS.
//
// -baseline runs a second agent binary (or the same one with other
// -baseline-args) in the same control plane, alternating with the first,
// so that both see the same machine load.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mountwatch"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

const (
	readyNode      = "bench-node"
	readyNS        = "ready"
	readyClass     = "bench-local"
	conditionType  = "volume-agent.io/VolumesReady"
	agentUserAgent = "volume-agent/" + readyNode
)

// variant is one agent configuration under test.
type variant struct {
	label string
	bin   string
	args  []string
}

// roundResult is what one round measured.
type roundResult struct {
	variant, mode string
	pods          int
	// allMounted and allReady are from the round's start (the agent's
	// start, or the first pod's creation).
	allMounted, allReady time.Duration
	// Per pod, sorted.
	createdToReady, mountedToReady []time.Duration
	requests, patches              int
	agentCPU, apiCPU               float64
	rssKiB                         int
}

func runReadiness(o options, work, root string) error {
	sizes, err := parseSizes(o.sizes)
	if err != nil {
		return err
	}
	modes := strings.Split(o.modes, ",")
	for _, m := range modes {
		if m != "before" && m != "running" {
			return fmt.Errorf("-modes: %q is neither before nor running", m)
		}
	}
	variants := []variant{{label: "agent", bin: o.agent, args: strings.Fields(o.agentArgs)}}
	if o.baseline != "" {
		variants = append(variants, variant{label: "baseline", bin: o.baseline, args: strings.Fields(o.baselineArgs)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()

	// No PV binder: the benchmark binds its claims itself (see
	// createClaims); the binder would resync thousands of them every
	// second (test/cluster's sync period) on the CPUs being measured.
	var controllers []string
	for _, c := range cluster.DefaultControllers {
		if c != "persistentvolume-binder-controller" {
			controllers = append(controllers, c)
		}
	}
	cp, err := e2eutil.StartControlPlane(ctx, e2eutil.ControlPlaneOptions{Dir: filepath.Join(work, "cluster"), Controllers: controllers})
	if err != nil {
		return err
	}
	defer cp.Cluster.Stop()
	admin := cp.Admin
	if _, err := cp.Cluster.CreateNode(ctx, readyNode, nil); err != nil {
		return err
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: readyNS}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	maxPods := slices.Max(sizes)
	setupStart := time.Now()
	claimsPerPod := o.volumes
	if claimsPerPod <= 0 {
		return fmt.Errorf("-volumes: a pod needs at least one volume")
	}
	if err := createClaims(ctx, admin, filepath.Join(work, "pvs"), maxPods*claimsPerPod); err != nil {
		return err
	}
	fmt.Printf("volume-agent readiness, cluster mode: pods x %d PVC volumes (local PVs, bind mounts), root dir on %s; %d claims created and bound in %.1f s\n",
		claimsPerPod, o.rootFS, maxPods*claimsPerPod, time.Since(setupStart).Seconds())
	for _, v := range variants {
		fmt.Printf("  %s: %s %s\n", v.label, v.bin, strings.Join(v.args, " "))
	}

	tr, err := startTracker(ctx, admin, root, claimsPerPod)
	if err != nil {
		return err
	}
	var results []roundResult
	round := 0
	for run := 0; run < o.runs; run++ {
		for _, n := range sizes {
			for _, mode := range modes {
				for _, v := range variants {
					round++
					r, err := readinessRound(ctx, o, cp, tr, v, mode, n, filepath.Join(root, strconv.Itoa(round)), round)
					if err != nil {
						return fmt.Errorf("%s, %d pods, %s: %w", v.label, n, mode, err)
					}
					r.print()
					results = append(results, r)
				}
			}
		}
	}
	if o.runs > 1 {
		summarize(results)
	}
	return nil
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-sizes: %q is not a number of pods", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func claimName(i int) string { return fmt.Sprintf("claim-%04d", i) }
func pvName(i int) string    { return fmt.Sprintf("bench-pv-%04d", i) }

// createClaims creates n claims and n local PVs (directories under dir),
// bound to each other as the PV binder would bind them: the claim names its
// volume and is marked bind-completed, the volume's claimRef has the
// claim's UID, both are Bound.
func createClaims(ctx context.Context, admin kubernetes.Interface, dir string, n int) error {
	size := resource.MustParse("1Gi")
	rwo := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	err := parallel(n, 32, func(i int) error {
		path := filepath.Join(dir, strconv.Itoa(i))
		if err := os.MkdirAll(path, 0o755); err != nil {
			return err
		}
		claims := admin.CoreV1().PersistentVolumeClaims(readyNS)
		pvc, err := claims.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: claimName(i), Namespace: readyNS,
				Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes"}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      rwo,
				StorageClassName: ptr.To(readyClass),
				VolumeName:       pvName(i),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		pv := e2eutil.PreBoundPV(pvName(i), "1Gi", readyClass, readyNS, claimName(i), corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: path}})
		pv.Spec.ClaimRef.UID = pvc.UID
		pv.Spec.NodeAffinity = e2eutil.NodeAffinity(corev1.LabelHostname, readyNode)
		if pv, err = admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			return err
		}
		pv.Status.Phase = corev1.VolumeBound
		if _, err := admin.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return err
		}
		pvc.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: rwo, Capacity: corev1.ResourceList{corev1.ResourceStorage: size}}
		_, err = claims.UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("creating claims: %w", err)
	}
	return nil
}

// parallel runs f(0..n-1) with at most width at a time and returns the
// first error.
func parallel(n, width int, f func(i int) error) error {
	errs := make(chan error, n)
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// tracker records, per pod UID, when the pod's volumes were all mounted and
// when its condition was first seen True.
type tracker struct {
	root    string
	volumes int // per pod

	mu      sync.Mutex
	mounted map[types.UID]time.Time
	ready   map[types.UID]time.Time
}

func startTracker(ctx context.Context, admin kubernetes.Interface, root string, volumes int) (*tracker, error) {
	t := &tracker{root: root, volumes: volumes, mounted: map[types.UID]time.Time{}, ready: map[types.UID]time.Time{}}
	changed := notify.New()
	if _, err := mountwatch.Start(ctx, zap.NewNop(), changed.Notify); err != nil {
		return nil, err
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed.C():
				t.readMounts(time.Now())
			}
		}
	}()
	list, err := admin.CoreV1().Pods(readyNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	go t.watchConditions(ctx, admin, list.ResourceVersion)
	return t, nil
}

// readMounts records the pods that have all their volumes mounted below
// root, as of at.
func (t *tracker) readMounts(at time.Time) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	perPod := map[types.UID]int{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := bytes.Fields(s.Bytes())
		if len(fields) < 5 {
			continue
		}
		rest, ok := strings.CutPrefix(string(fields[4]), t.root+"/")
		if !ok {
			continue
		}
		// <round>/pods/<uid>/volumes/<plugin>/<name>
		parts := strings.Split(rest, "/")
		if len(parts) == 6 && parts[1] == "pods" && parts[3] == "volumes" {
			perPod[types.UID(parts[2])]++
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for uid, n := range perPod {
		if _, seen := t.mounted[uid]; !seen && n >= t.volumes {
			t.mounted[uid] = at
		}
	}
}

// watchConditions records when each pod's condition is first seen True,
// watching again from where it was if the API server ends the watch.
func (t *tracker) watchConditions(ctx context.Context, admin kubernetes.Interface, rv string) {
	for ctx.Err() == nil {
		w, err := admin.CoreV1().Pods(readyNS).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
		if err != nil {
			time.Sleep(100 * time.Millisecond) // the API server is busy; not a synchronisation
			continue
		}
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			now := time.Now()
			rv = pod.ResourceVersion
			for _, c := range pod.Status.Conditions {
				if c.Type == conditionType && c.Status == corev1.ConditionTrue {
					t.mu.Lock()
					if _, seen := t.ready[pod.UID]; !seen {
						t.ready[pod.UID] = now
					}
					t.mu.Unlock()
				}
			}
		}
		w.Stop()
	}
}

// times returns when each of uids was mounted and ready, and how many are
// each.
func (t *tracker) times(uids []types.UID) (mounted, ready []time.Time, nMounted, nReady int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	mounted, ready = make([]time.Time, len(uids)), make([]time.Time, len(uids))
	for i, uid := range uids {
		if m, ok := t.mounted[uid]; ok {
			mounted[i] = m
			nMounted++
		}
		if r, ok := t.ready[uid]; ok {
			ready[i] = r
			nReady++
		}
	}
	return mounted, ready, nMounted, nReady
}

func readinessRound(ctx context.Context, o options, cp *e2eutil.ControlPlane, tr *tracker, v variant, mode string, n int, root string, round int) (roundResult, error) {
	res := roundResult{variant: v.label, mode: mode, pods: n}
	if err := os.MkdirAll(root, 0o750); err != nil {
		return res, err
	}
	admin := cp.Admin
	debugAddr, metricsAddr := freeAddr(), freeAddr()
	args := append([]string{"--node-name", readyNode, "--root-dir", root, "--kubeconfig", cp.Kubeconfig,
		"--debug-address", debugAddr, "--metrics-address", metricsAddr, "--log-level", "warn"}, v.args...)
	cmd := exec.Command(v.bin, args...)
	logFile, err := os.Create(filepath.Join(filepath.Dir(root), fmt.Sprintf("agent-%d.log", round)))
	if err != nil {
		return res, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	started := false
	stop := func() {
		if started {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			started = false
		}
	}
	defer stop()
	startAgent := func() error {
		if err := cmd.Start(); err != nil {
			return err
		}
		started = true
		return nil
	}

	apiPID := cp.Cluster.PIDs()["kube-apiserver"]
	requests0, patches0, err := agentRequests(cp.Cluster)
	if err != nil {
		return res, err
	}
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("r%d-pod-%04d", round, i)
	}
	created := make([]time.Time, n)
	uids := make([]types.UID, n)
	createPods := func() error {
		return parallel(n, 32, func(i int) error {
			vols := make([]corev1.Volume, o.volumes)
			for j := range vols {
				vols[j] = e2eutil.ClaimVolume(fmt.Sprintf("data-%d", j), claimName(o.volumes*i+j))
			}
			pod := e2eutil.Pod(readyNS, readyNode, names[i], vols...)
			got, err := admin.CoreV1().Pods(readyNS).Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			created[i], uids[i] = time.Now(), got.UID
			return nil
		})
	}

	var start time.Time
	var agentCPU0, apiCPU0 float64
	switch mode {
	case "before":
		if err := createPods(); err != nil {
			return res, err
		}
		apiCPU0, _ = cpuSeconds(apiPID)
		start = time.Now()
		if err := startAgent(); err != nil {
			return res, err
		}
		for i := range created {
			created[i] = start
		}
	case "running":
		if err := startAgent(); err != nil {
			return res, err
		}
		if err := waitFor(o.timeout, func() bool { return httpOK("http://" + debugAddr + "/readyz") }); err != nil {
			return res, fmt.Errorf("agent not ready: %w", err)
		}
		agentCPU0, _ = cpuSeconds(cmd.Process.Pid)
		apiCPU0, _ = cpuSeconds(apiPID)
		start = time.Now()
		if err := createPods(); err != nil {
			return res, err
		}
	}

	var mounted, ready []time.Time
	var nMounted, nReady int
	if err := waitForEvery(o.timeout, 5*time.Millisecond, func() bool {
		mounted, ready, nMounted, nReady = tr.times(uids)
		return nMounted == n && nReady == n
	}); err != nil {
		return res, fmt.Errorf("%d of %d pods mounted, %d conditions True: %w", nMounted, n, nReady, err)
	}
	res.agentCPU, _ = cpuSeconds(cmd.Process.Pid)
	res.agentCPU -= agentCPU0
	res.apiCPU, _ = cpuSeconds(apiPID)
	res.apiCPU -= apiCPU0
	res.rssKiB, _ = rssKiB(cmd.Process.Pid)
	for i := range n {
		res.allMounted = max(res.allMounted, mounted[i].Sub(start))
		res.allReady = max(res.allReady, ready[i].Sub(start))
		res.createdToReady = append(res.createdToReady, ready[i].Sub(created[i]))
		res.mountedToReady = append(res.mountedToReady, ready[i].Sub(mounted[i]))
	}
	slices.Sort(res.createdToReady)
	slices.Sort(res.mountedToReady)

	// The audit log is written just after each response: wait until the
	// patches that made the conditions True are there.
	var requests, patches int
	if err := waitForEvery(time.Minute, 200*time.Millisecond, func() bool { // the log is large: no busy loop
		requests, patches, err = agentRequests(cp.Cluster)
		return err == nil && patches-patches0 >= n
	}); err != nil {
		return res, fmt.Errorf("waiting for %d status patches in the audit log (%d): %w", n, patches-patches0, err)
	}
	res.requests, res.patches = requests-requests0, patches-patches0

	// Clean up: the pods go (no kubelet: at once), the agent unmounts,
	// then it stops.
	if err := parallel(n, 32, func(i int) error {
		return admin.CoreV1().Pods(readyNS).Delete(ctx, names[i], metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}); err != nil {
		return res, err
	}
	if err := waitFor(o.timeout, func() bool { return countMounts(root) == 0 }); err != nil {
		return res, fmt.Errorf("waiting for unmounts (%d left): %w", countMounts(root), err)
	}
	stop()
	return res, nil
}

// agentRequests counts the agent's requests so far, and its pod status
// patches, from the audit log.
func agentRequests(c *cluster.Cluster) (requests, patches int, err error) {
	events, err := c.AuditEvents()
	if err != nil {
		return 0, 0, err
	}
	seen := map[string]bool{}
	for _, e := range events {
		if e.UserAgent != agentUserAgent || seen[e.AuditID] {
			continue
		}
		seen[e.AuditID] = true // a watch has two events
		requests++
		if e.Verb == "patch" && e.ObjectRef != nil && e.ObjectRef.Resource == "pods" && e.ObjectRef.Subresource == "status" {
			patches++
		}
	}
	return requests, patches, nil
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[int(p*float64(len(d)-1)+0.5)]
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func (r roundResult) print() {
	fmt.Printf("  %-8s %4d pods, %-7s  all mounted %5.2f s, all True %5.2f s | created→True p50/p99 %s/%s ms | mounted→True p50/p99/max %s/%s/%s ms | requests %d (%.2f/pod, %.2f patches/pod) | CPU agent %.2f s, apiserver %.2f s | RSS %.1f MiB\n",
		r.variant, r.pods, r.mode, r.allMounted.Seconds(), r.allReady.Seconds(),
		ms(pct(r.createdToReady, .5)), ms(pct(r.createdToReady, .99)),
		ms(pct(r.mountedToReady, .5)), ms(pct(r.mountedToReady, .99)), ms(pct(r.mountedToReady, 1)),
		r.requests, float64(r.requests)/float64(r.pods), float64(r.patches)/float64(r.pods),
		r.agentCPU, r.apiCPU, float64(r.rssKiB)/1024)
}

// summarize prints, per variant, size and mode, the median of each measure
// over the runs and its range.
func summarize(results []roundResult) {
	type key struct {
		variant, mode string
		pods          int
	}
	groups := map[key][]roundResult{}
	var keys []key
	for _, r := range results {
		k := key{r.variant, r.mode, r.pods}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	sort.SliceStable(keys, func(i, j int) bool {
		if keys[i].pods != keys[j].pods {
			return keys[i].pods < keys[j].pods
		}
		if keys[i].mode != keys[j].mode {
			return keys[i].mode < keys[j].mode
		}
		return keys[i].variant < keys[j].variant
	})
	fmt.Println("  medians [ranges] over the runs:")
	for _, k := range keys {
		g := groups[k]
		stat := func(f func(r roundResult) float64, format string) string {
			v := make([]float64, len(g))
			for i, r := range g {
				v[i] = f(r)
			}
			return medianRange(v, format)
		}
		msf := func(d time.Duration) float64 { return float64(d.Milliseconds()) }
		fmt.Printf("  %-8s %4d pods, %-7s all True %s s | mounted→True p50 %s, p99 %s ms | created→True p99 %s ms | %s req/pod | CPU agent %s s, apiserver %s s | RSS %s MiB\n",
			k.variant, k.pods, k.mode,
			stat(func(r roundResult) float64 { return r.allReady.Seconds() }, "%.2f"),
			stat(func(r roundResult) float64 { return msf(pct(r.mountedToReady, .5)) }, "%.0f"),
			stat(func(r roundResult) float64 { return msf(pct(r.mountedToReady, .99)) }, "%.0f"),
			stat(func(r roundResult) float64 { return msf(pct(r.createdToReady, .99)) }, "%.0f"),
			stat(func(r roundResult) float64 { return float64(r.requests) / float64(r.pods) }, "%.2f"),
			stat(func(r roundResult) float64 { return r.agentCPU }, "%.2f"),
			stat(func(r roundResult) float64 { return r.apiCPU }, "%.2f"),
			stat(func(r roundResult) float64 { return float64(r.rssKiB) / 1024 }, "%.1f"))
	}
}
