package main

// The API volumes scenario (-scenario api-volumes): cluster mode against a
// real etcd, kube-apiserver and kube-controller-manager (test/cluster), the
// agent as the deploy/ ServiceAccount. N pods, each with the injected
// kube-api-access volume (a TokenRequest, the kube-root-ca.crt ConfigMap, the
// namespace), one configMap and one secret volume, are created at once; the
// benchmark reports when the agent had every volume ready and when the API
// showed every pod's VolumesReady condition, the agent's API requests per
// pod from the audit log, then the latency of ConfigMap updates reaching
// the files of 100 pods that share it, and the agent's CPU and RSS.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

const (
	benchNode = "bench-node"
	benchNS   = "bench"
	// hotPods share the ConfigMap whose updates are timed.
	hotPods = 100
)

func runAPIVolumes(o options, work, root string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cp, err := e2eutil.StartControlPlane(ctx, e2eutil.ControlPlaneOptions{Dir: filepath.Join(work, "cluster"), Nodes: []string{benchNode}})
	if err != nil {
		return err
	}
	defer cp.Cluster.Stop()
	admin := cp.Admin
	if err := prepareNamespace(ctx, cp); err != nil {
		return err
	}

	debugAddr, metricsAddr := freeAddr(), freeAddr()
	args := []string{"--node-name", benchNode, "--root-dir", root, "--kubeconfig", cp.Kubeconfig,
		"--debug-address", debugAddr, "--metrics-address", metricsAddr, "--log-level", "warn"}
	if o.kubeQPS > 0 {
		args = append(args, "--kube-api-qps", strconv.Itoa(o.kubeQPS), "--kube-api-burst", strconv.Itoa(2*o.kubeQPS))
	}
	if o.nodeCredentials {
		args = append(args, "--node-kubeconfig", cp.Cluster.NodeKubeconfig(benchNode))
	}
	cmd := exec.Command(o.agent, args...)
	logFile, err := os.Create(filepath.Join(work, "agent.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	if err := waitFor(o.timeout, func() bool { return httpOK("http://" + debugAddr + "/readyz") }); err != nil {
		return fmt.Errorf("agent not ready: %w", err)
	}
	pid := cmd.Process.Pid

	credentials := "its ServiceAccount"
	if o.nodeCredentials {
		credentials = "the node's identity (--node-kubeconfig)"
	}
	fmt.Printf("volume-agent cluster mode: %d pods x (kube-api-access + configMap + secret), root dir on %s, client QPS %s, secrets and tokens as %s\n",
		o.pods, o.rootFS, qpsString(o.kubeQPS), credentials)
	apiReadyAt, err := watchReady(ctx, admin, o.pods)
	if err != nil {
		return err
	}
	cpu0, _ := cpuSeconds(pid)
	start := time.Now()
	uids, err := createPods(ctx, admin, o.pods)
	if err != nil {
		return err
	}
	created := time.Now()
	// The agent's own count, from a metric polled every 100 ms: cheap
	// enough not to take much of the agent's CPU (scraping it every few
	// milliseconds, or a JSON document of every pod, would).
	readyCount := func() int { return int(metricValue(metricsAddr, "volume_agent_pod_volumes_ready_seconds_count")) }
	if err := waitForEvery(o.timeout, 100*time.Millisecond, func() bool { return readyCount() >= o.pods }); err != nil {
		return fmt.Errorf("waiting for the agent to have every volume ready (%d of %d): %w", readyCount(), o.pods, err)
	}
	agentReady := time.Now()
	var apiReady time.Time
	select {
	case apiReady = <-apiReadyAt:
	case <-time.After(o.timeout):
		return fmt.Errorf("waiting for every pod's VolumesReady condition: timed out (watch ended with %d)", readyWatched)
	}
	cpu1, _ := cpuSeconds(pid)
	fmt.Printf("  pods created in %.2f s\n", created.Sub(start).Seconds())
	fmt.Printf("  all volumes ready in the agent: %.2f s after the first pod was created (%.2f s after the last)\n",
		agentReady.Sub(start).Seconds(), agentReady.Sub(created).Seconds())
	fmt.Printf("  all VolumesReady conditions True in the API: %.2f s after the first pod was created\n", apiReady.Sub(start).Seconds())
	fmt.Printf("  agent CPU from the first pod to all ready: %.2f s\n", cpu1-cpu0)

	user := cp.User
	if o.nodeCredentials {
		user = "system:node:" + benchNode
	}
	if err := reportRequests(cp, user, o.pods); err != nil {
		return err
	}

	if err := updateLatency(ctx, admin, root, uids[:min(hotPods, len(uids))], o.updates); err != nil {
		return err
	}

	cpu2, _ := cpuSeconds(pid)
	time.Sleep(o.idle) // measuring idle cost: the wait is the measurement
	cpu3, _ := cpuSeconds(pid)
	rss, _ := rssKiB(pid)
	fmt.Printf("  idle CPU:  %.3f s over %s with everything mounted\n", cpu3-cpu2, o.idle)
	fmt.Printf("  RSS:       %.1f MiB\n", float64(rss)/1024)
	if o.dumpMetrics != "" {
		if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			_ = os.WriteFile(o.dumpMetrics, b, 0o644)
		}
	}
	return nil
}

func qpsString(q int) string {
	if q == 0 {
		return "default (50)"
	}
	return strconv.Itoa(q)
}

func httpOK(u string) bool {
	resp, err := http.Get(u)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// prepareNamespace creates the node, the namespace and the shared objects,
// and waits for the default ServiceAccount and the kube-root-ca.crt
// ConfigMap the controller manager publishes.
func prepareNamespace(ctx context.Context, cp *e2eutil.ControlPlane) error {
	admin := cp.Admin
	if _, err := cp.Cluster.CreateNode(ctx, benchNode, nil); err != nil {
		return err
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := waitFor(2*time.Minute, func() bool {
		_, err1 := admin.CoreV1().ServiceAccounts(benchNS).Get(ctx, "default", metav1.GetOptions{})
		_, err2 := admin.CoreV1().ConfigMaps(benchNS).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err1 == nil && err2 == nil
	}); err != nil {
		return fmt.Errorf("waiting for the namespace's ServiceAccount and kube-root-ca.crt: %w", err)
	}
	for _, name := range []string{"app-config", "hot-config"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNS}, Data: map[string]string{"value": "0"}}
		if _, err := admin.CoreV1().ConfigMaps(benchNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-secret", Namespace: benchNS}, StringData: map[string]string{"password": "hunter2"}}
	_, err := admin.CoreV1().Secrets(benchNS).Create(ctx, s, metav1.CreateOptions{})
	return err
}

// createPods creates the pods with 16 clients at a time and returns their
// UIDs in order; the first hotPods use hot-config.
func createPods(ctx context.Context, admin kubernetes.Interface, n int) ([]types.UID, error) {
	uids := make([]types.UID, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			cm := "app-config"
			if i < hotPods {
				cm = "hot-config"
			}
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%04d", i), Namespace: benchNS},
				Spec: corev1.PodSpec{
					NodeName: benchNode,
					Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10", VolumeMounts: []corev1.VolumeMount{
						{Name: "config", MountPath: "/etc/config"}, {Name: "secret", MountPath: "/etc/secret"},
					}}},
					Volumes: []corev1.Volume{
						{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm}}}},
						{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "app-secret"}}},
					},
				},
			}
			got, err := admin.CoreV1().Pods(benchNS).Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				errs <- err
				return
			}
			uids[i] = got.UID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, fmt.Errorf("creating pods: %w", err)
	}
	return uids, nil
}

// metricValue reads one unlabelled sample of the agent's /metrics.
func metricValue(addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

var readyWatched int

// watchReady watches the namespace's pods (again from where it was, if the
// API server ends the watch) and sends the time at which n of them had
// their VolumesReady condition True.
func watchReady(ctx context.Context, admin kubernetes.Interface, n int) (<-chan time.Time, error) {
	list, err := admin.CoreV1().Pods(benchNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make(chan time.Time, 1)
	go func() {
		ready := map[types.UID]bool{}
		defer func() { readyWatched = len(ready) }()
		rv := list.ResourceVersion
		for ctx.Err() == nil {
			w, err := admin.CoreV1().Pods(benchNS).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			if err != nil {
				return
			}
			for ev := range w.ResultChan() {
				pod, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				rv = pod.ResourceVersion
				for _, c := range pod.Status.Conditions {
					if c.Type == "volume-agent.io/VolumesReady" && c.Status == corev1.ConditionTrue {
						ready[pod.UID] = true
					}
				}
				if len(ready) >= n {
					w.Stop()
					out <- time.Now()
					return
				}
			}
			w.Stop()
		}
	}()
	return out, nil
}

// reportRequests counts the agent's requests in the audit log by kind.
func reportRequests(cp *e2eutil.ControlPlane, user string, pods int) error {
	var events []struct{ verb, resource, sub, uri string }
	// The audit log is written just after each response: wait until the
	// token requests are all there.
	if err := waitFor(30*time.Second, func() bool {
		evs, err := cp.Cluster.AuditEvents()
		if err != nil {
			return false
		}
		events = events[:0]
		seen := map[string]bool{}
		tokens := 0
		for _, e := range evs {
			if e.User.Username != user || !strings.HasPrefix(e.UserAgent, "volume-agent/") || e.ObjectRef == nil || seen[e.AuditID] {
				continue
			}
			seen[e.AuditID] = true
			events = append(events, struct{ verb, resource, sub, uri string }{e.Verb, e.ObjectRef.Resource, e.ObjectRef.Subresource, e.RequestURI})
			if e.ObjectRef.Subresource == "token" {
				tokens++
			}
		}
		return tokens >= pods
	}); err != nil {
		return fmt.Errorf("waiting for the token requests in the audit log: %w", err)
	}
	counts := map[string]int{}
	broad := 0
	for _, e := range events {
		key := e.verb + " " + e.resource
		if e.sub != "" {
			key += "/" + e.sub
		}
		counts[key]++
		if (e.resource == "secrets" || e.resource == "configmaps") && (e.verb == "list" || e.verb == "watch") {
			u, _ := url.Parse(e.uri)
			if u == nil || !strings.HasPrefix(u.Query().Get("fieldSelector"), "metadata.name=") {
				broad++
			}
		}
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Printf("  API requests of the agent (%s), from the audit log: %d in all, %.2f per pod\n", user, len(events), float64(len(events))/float64(pods))
	for _, k := range keys {
		if strings.Contains(k, "secrets") || strings.Contains(k, "configmaps") || strings.Contains(k, "token") || strings.Contains(k, "pods") || strings.Contains(k, "events") {
			fmt.Printf("    %-40s %6d  (%.2f per pod)\n", k, counts[k], float64(counts[k])/float64(pods))
		}
	}
	fmt.Printf("    lists or watches of secrets or configMaps without a name selector: %d\n", broad)
	return nil
}

// updateLatency updates hot-config `updates` times and, for each update,
// times how long each of the pods sharing it takes to show the new value
// in its file. The swap of ..data is watched with inotify (no polling that
// would take CPU from the agent), then the file is read.
func updateLatency(ctx context.Context, admin kubernetes.Interface, root string, uids []types.UID, updates int) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	index := map[string]int{}
	for i, uid := range uids {
		dir := filepath.Join(root, "pods", string(uid), "volumes", "kubernetes.io~configmap", "config")
		if err := w.Add(dir); err != nil {
			return err
		}
		index[dir] = i
	}
	var samples []time.Duration
	for u := 1; u <= updates; u++ {
		want := strconv.Itoa(u)
		seen := make([]time.Duration, len(uids))
		left := len(uids)
		check := func(dir string) {
			i, ok := index[dir]
			if !ok || seen[i] != 0 {
				return
			}
			if data, err := os.ReadFile(filepath.Join(dir, "value")); err == nil && string(data) == want {
				seen[i] = time.Since(updateStart)
				left--
			}
		}
		updateStart = time.Now()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hot-config", Namespace: benchNS}, Data: map[string]string{"value": want}}
		if _, err := admin.CoreV1().ConfigMaps(benchNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return err
		}
		// An update may have landed before the call returned.
		for dir := range index {
			check(dir)
		}
		timeout := time.After(30 * time.Second)
		for left > 0 {
			select {
			case ev := <-w.Events:
				if filepath.Base(ev.Name) == "..data" {
					check(filepath.Dir(ev.Name))
				}
			case err := <-w.Errors:
				return err
			case <-timeout:
				return fmt.Errorf("update %d: %d of %d pods never saw it", u, left, len(uids))
			}
		}
		samples = append(samples, seen...)
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	pct := func(p float64) time.Duration { return samples[int(p*float64(len(samples)-1))] }
	fmt.Printf("  ConfigMap update (API call) to new content in the file, %d pods sharing it, %d updates (%d samples): p50 %v, p99 %v, max %v\n",
		len(uids), updates, len(samples), pct(0.5).Round(100*time.Microsecond), pct(0.99).Round(100*time.Microsecond), samples[len(samples)-1].Round(100*time.Microsecond))
	return nil
}

// updateStart is when the update being timed was sent.
var updateStart time.Time

// waitForEvery polls cond at the given interval until it holds.
func waitForEvery(timeout, every time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	t := time.NewTicker(every)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
