// Command manynodes simulates many nodes against one API server: N agents,
// each with its own --node-name, root directory and mount namespace, and
// a cluster of PV/PVC pairs spread over the nodes, some used by pods on
// their node and the rest idle. It measures what the design of the
// agents' reads costs: the API server's watches, CPU and memory, every
// agent's RSS and CPU, the watch events a burst of claim changes sends,
// and how fast a claim bound while its pod waits is mounted. Given two
// binaries (-agent and -baseline), it runs both on the same cluster, one
// after the other, and prints them side by side.
//
// The control plane is test/cluster's (etcd, kube-apiserver,
// kube-controller-manager without the PV binder, the protection
// controllers and the garbage collector, which would spend minutes on the
// pairs on a small machine): the pairs are made in their bound state, as
// the binder leaves them. Needs root (the agents mount) and unshare(1).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

type options struct {
	agent, baseline  string
	nodes, pairs     int
	podsPerNode      int
	claimsPerPod     int
	churn            int
	binds            int
	idle, timeout    time.Duration
	keep             bool
	profiles         string
	verbose          bool
	agentArgs        string
	designA, designB string
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "manynodes:", err)
		os.Exit(1)
	}
}

func run() error {
	var o options
	flag.StringVar(&o.agent, "agent", "bin/volume-agent", "volume-agent binary")
	flag.StringVar(&o.baseline, "baseline", "", "another volume-agent binary (e.g. an earlier version) to measure on the same cluster first")
	flag.StringVar(&o.designA, "baseline-name", "baseline", "what to call -baseline in the report")
	flag.StringVar(&o.designB, "agent-name", "agent", "what to call -agent in the report")
	flag.IntVar(&o.nodes, "nodes", 20, "agents, each with a node of its own")
	flag.IntVar(&o.pairs, "pairs", 20000, "PV/PVC pairs in the cluster, spread evenly over the nodes (node affinity)")
	flag.IntVar(&o.podsPerNode, "pods-per-node", 50, "pods on each node")
	flag.IntVar(&o.claimsPerPod, "claims-per-pod", 1, "claims each pod mounts (from its node's pairs)")
	flag.IntVar(&o.churn, "churn", 1000, "idle claims changed at once (an annotation), to measure the watch events they cause")
	flag.IntVar(&o.binds, "binds", 10, "claims bound while their pod waits, on the first node, to time bound → mounted")
	flag.DurationVar(&o.idle, "idle", 20*time.Second, "how long to measure idle CPU with everything mounted")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up after this long in any phase")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, audit log)")
	flag.BoolVar(&o.verbose, "v", false, "print the agents' watches of claims and volumes every 2 s while they start")
	flag.StringVar(&o.profiles, "profiles", "", "write the first agent's heap and goroutine profiles, once idle, into this directory")
	flag.StringVar(&o.agentArgs, "agent-args", "", "more flags for every agent, space separated")
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("must run as root (the agents mount)")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		return errors.New("unshare(1) is needed: every agent runs in a mount namespace of its own")
	}
	used := o.podsPerNode * o.claimsPerPod
	if used*o.nodes > o.pairs {
		return fmt.Errorf("%d nodes × %d pods × %d claims need more than %d pairs", o.nodes, o.podsPerNode, o.claimsPerPod, o.pairs)
	}
	work, err := os.MkdirTemp("", "volume-agent-manynodes-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("work directory:", work)
	} else {
		defer os.RemoveAll(work)
	}

	// Interrupted, it stops its agents and control plane before exiting.
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(sigCtx, 2*time.Hour)
	defer cancel()
	cp, err := e2eutil.StartControlPlane(ctx, e2eutil.ControlPlaneOptions{Dir: filepath.Join(work, "cluster"), Controllers: []string{
		"serviceaccount-controller", "serviceaccount-token-controller", "namespace-controller", "root-ca-certificate-publisher-controller",
	}})
	if err != nil {
		return err
	}
	defer cp.Cluster.Stop()
	c := &clusterState{o: o, cp: cp, admin: cp.Admin, data: filepath.Join(work, "data")}
	if err := c.populate(ctx); err != nil {
		return err
	}

	var results []*result
	designs := []struct{ name, bin string }{{o.designA, o.baseline}, {o.designB, o.agent}}
	for i, d := range designs {
		if d.bin == "" {
			continue
		}
		r, err := c.measure(ctx, d.name, d.bin, fmt.Sprintf("run%d", i), filepath.Join(work, fmt.Sprintf("run%d", i)))
		if err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
		results = append(results, r)
	}
	report(o, c, results)
	return nil
}

const namespace = "bench"

// clusterState is the cluster both designs run against.
type clusterState struct {
	o     options
	cp    *e2eutil.ControlPlane
	admin kubernetes.Interface
	data  string
	// pods are the pods of each node: their names and claims.
	pods     [][]podSpec
	setup    time.Duration
	nodeName func(i int) string
}

type podSpec struct {
	name   string
	claims []string
}

// populate makes the nodes, the pairs (pair i on node i % nodes) and the
// pods; the claims pods use are on directories that exist.
func (c *clusterState) populate(ctx context.Context) error {
	o := c.o
	c.nodeName = func(i int) string { return fmt.Sprintf("node-%02d", i) }
	start := time.Now()
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for i := range o.nodes {
		if _, err := c.cp.Cluster.CreateNode(ctx, c.nodeName(i), nil); err != nil {
			return err
		}
	}
	if err := waitFor(ctx, time.Minute, func() bool {
		_, err := c.admin.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	}); err != nil {
		return fmt.Errorf("the namespace's default ServiceAccount: %w", err)
	}
	usedPerNode := o.podsPerNode * o.claimsPerPod
	pairs := make([]e2eutil.Pair, o.pairs)
	c.pods = make([][]podSpec, o.nodes)
	for i := range pairs {
		node := i % o.nodes
		k := i / o.nodes // the pair's index on its node
		p := e2eutil.Pair{Namespace: namespace, Claim: fmt.Sprintf("claim-%06d", i), Volume: fmt.Sprintf("pv-%06d", i),
			Node: c.nodeName(node), Status: true}
		path := filepath.Join(c.data, fmt.Sprintf("%06d", i))
		if k < usedPerNode {
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
			pod := k / o.claimsPerPod
			if k%o.claimsPerPod == 0 {
				c.pods[node] = append(c.pods[node], podSpec{name: fmt.Sprintf("pod-%s-%03d", c.nodeName(node), pod)})
			}
			c.pods[node][pod].claims = append(c.pods[node][pod].claims, p.Claim)
		}
		p.Source = corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: path}}
		pairs[i] = p
	}
	fmt.Printf("making %d bound PV/PVC pairs on %d nodes...\n", len(pairs), o.nodes)
	if err := e2eutil.BindPairs(ctx, c.cp.Cluster.RESTConfig(), pairs, 32, func(n int) {
		if n%5000 == 0 {
			fmt.Printf("  %d pairs (%.0f s)\n", n, time.Since(start).Seconds())
		}
	}); err != nil {
		return err
	}
	for node := range c.pods {
		for _, p := range c.pods[node] {
			var vols []corev1.Volume
			for j, claim := range p.claims {
				vols = append(vols, e2eutil.ClaimVolume(fmt.Sprintf("data-%d", j), claim))
			}
			if _, err := c.admin.CoreV1().Pods(namespace).Create(ctx, e2eutil.Pod(namespace, c.nodeName(node), p.name, vols...), metav1.CreateOptions{}); err != nil {
				return err
			}
		}
	}
	c.setup = time.Since(start)
	fmt.Printf("cluster ready in %.0f s: %d pairs, %d pods\n", c.setup.Seconds(), len(pairs), o.nodes*o.podsPerNode)
	return nil
}

// result is one design's measurements.
type result struct {
	name             string
	readyIn          time.Duration
	startCPU         float64 // all agents, from start to every pod ready
	idleAgentCPU     float64
	rss              []float64 // MiB, per agent
	apiserver        apiStats
	apiserverIdleCPU float64
	apiserverStartup float64
	churnEvents      float64 // watch events the API server sent for the churn
	usedChurnEvents  float64 // ... for a change of every claim one node uses
	churnAgentCPU    float64
	churnAPICPU      float64
	bindLatency      []time.Duration
}

// apiStats are read from the API server's /metrics.
type apiStats struct {
	watches     map[string]float64 // WATCH requests open, by resource
	longrunning float64            // WATCH requests open
	rssMiB, cpu float64
	watchEvents map[string]float64 // events sent to watchers, by resource
	heapMiB     float64
	goroutines  float64
}

type agentProc struct {
	node        string
	cmd         *exec.Cmd
	exited      chan struct{} // closed once cmd has been waited for
	waitErr     error
	restarts    int
	metricsAddr string
	debugAddr   string
	pods        int
	log         *os.File
}

// measure starts one agent per node, waits for every pod's volumes,
// measures, and stops them (their mount namespaces, with every mount,
// go with them).
func (c *clusterState) measure(ctx context.Context, name, bin, run, dir string) (*result, error) {
	o := c.o
	r := &result{name: name}
	fmt.Printf("\n%s (%s): starting %d agents...\n", name, bin, o.nodes)
	before, err := c.apiStats(ctx)
	if err != nil {
		return nil, err
	}
	var agents []*agentProc
	defer func() {
		for _, a := range agents {
			_ = a.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, a := range agents {
			<-a.exited
			a.log.Close()
		}
	}()
	start := time.Now()
	for i := range o.nodes {
		a, err := startAgent(bin, c.cp.Kubeconfig, c.nodeName(i), filepath.Join(dir, c.nodeName(i)), o.agentArgs)
		if err != nil {
			return nil, err
		}
		a.pods = len(c.pods[i])
		agents = append(agents, a)
	}
	var startProfile sync.WaitGroup
	defer startProfile.Wait()
	if o.profiles != "" {
		// The first agent's CPU profile from its start.
		startProfile.Go(func() {
			_ = waitFor(ctx, 10*time.Second, func() bool {
				return fetch("http://"+agents[0].debugAddr+"/debug/pprof/profile?seconds=60", filepath.Join(o.profiles, run+"-start-cpu.pb.gz")) == nil
			})
		})
	}
	watchesListed := false
	var printed time.Time
	var exitErr error
	if err := waitFor(ctx, o.timeout, func() bool {
		if !watchesListed && o.verbose && time.Since(printed) >= 2*time.Second {
			printed = time.Now()
			listing, watching := 0.0, 0.0
			for _, a := range agents {
				listing += metricSum(a.metricsAddr, `volume_agent_watched_objects{resource="persistentvolume`, `state="listing"`)
				watching += metricSum(a.metricsAddr, `volume_agent_watched_objects{resource="persistentvolume`, `state="watching"`)
			}
			fmt.Printf("  %5.1f s: claims and volumes watched %.0f, listing %.0f\n", time.Since(start).Seconds(), watching, listing)
			watchesListed = listing == 0 && watching >= float64(2*o.nodes*o.podsPerNode*o.claimsPerPod)
		}
		for i := range agents {
			if err := c.restartIfExited(agents, i, bin, dir); err != nil {
				exitErr = err
				return true
			}
			if a := agents[i]; metric(a.metricsAddr, "volume_agent_pod_volumes_ready_seconds_count") < float64(a.pods) {
				return false
			}
		}
		return true
	}); err != nil {
		return nil, fmt.Errorf("waiting for every pod's volumes: %w", err)
	}
	if exitErr != nil {
		return nil, exitErr
	}
	r.readyIn = time.Since(start)
	for _, a := range agents {
		r.startCPU += cpuSeconds(a.cmd.Process.Pid)
	}
	fmt.Printf("  every pod's volumes ready %.1f s after the agents started\n", r.readyIn.Seconds())
	settled, err := c.apiStats(ctx)
	if err != nil {
		return nil, err
	}
	r.apiserverStartup = settled.cpu - before.cpu

	// Idle.
	agentCPU0 := agentsCPU(agents)
	time.Sleep(o.idle) // measuring idle cost: the wait is the measurement
	r.idleAgentCPU = agentsCPU(agents) - agentCPU0
	idle, err := c.apiStats(ctx)
	if err != nil {
		return nil, err
	}
	r.apiserverIdleCPU = idle.cpu - settled.cpu
	r.apiserver = idle
	for _, a := range agents {
		r.rss = append(r.rss, rssMiB(a.cmd.Process.Pid))
	}
	if o.profiles != "" {
		for _, prof := range []string{"heap", "goroutine"} {
			if err := fetch("http://"+agents[0].debugAddr+"/debug/pprof/"+prof, filepath.Join(o.profiles, run+"-"+prof+".pb.gz")); err != nil {
				return nil, err
			}
		}
		if err := fetch("http://"+agents[0].metricsAddr+"/metrics", filepath.Join(o.profiles, run+"-metrics.txt")); err != nil {
			return nil, err
		}
	}

	// Churn: idle claims change (an annotation, as a controller or a user
	// might); which agents hear of it?
	if o.churn > 0 {
		agentCPU0 = agentsCPU(agents)
		if err := c.churn(ctx, run); err != nil {
			return nil, err
		}
		time.Sleep(5 * time.Second) // let the events be delivered and handled: part of the measurement window
		after, err := c.apiStats(ctx)
		if err != nil {
			return nil, err
		}
		r.churnEvents = after.watchEvents["persistentvolumeclaims"] - idle.watchEvents["persistentvolumeclaims"]
		r.churnAgentCPU = agentsCPU(agents) - agentCPU0
		r.churnAPICPU = after.cpu - idle.cpu
	}

	// The claims one node's pods use change: which agents hear of it?
	before, err = c.apiStats(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.annotate(ctx, run, c.usedClaims(0)); err != nil {
		return nil, err
	}
	time.Sleep(5 * time.Second) // let the events be delivered: part of the measurement window
	after, err := c.apiStats(ctx)
	if err != nil {
		return nil, err
	}
	r.usedChurnEvents = after.watchEvents["persistentvolumeclaims"] - before.watchEvents["persistentvolumeclaims"]

	// Bound while waiting → mounted, on the first node.
	if o.binds > 0 {
		lat, err := c.bindLatency(ctx, agents[0], run)
		if err != nil {
			return nil, err
		}
		r.bindLatency = lat
	}
	return r, nil
}

// churn annotates o.churn idle claims, spread over the nodes, in parallel.
func (c *clusterState) churn(ctx context.Context, run string) error {
	o := c.o
	usedPerNode := o.podsPerNode * o.claimsPerPod
	var idle []string
	for i := usedPerNode * o.nodes; i < o.pairs && len(idle) < o.churn; i++ {
		idle = append(idle, fmt.Sprintf("claim-%06d", i))
	}
	return c.annotate(ctx, run, idle)
}

// usedClaims are the claims the pods of a node use.
func (c *clusterState) usedClaims(node int) []string {
	var out []string
	for _, p := range c.pods[node] {
		out = append(out, p.claims...)
	}
	return out
}

// annotate changes an annotation of each claim, in parallel.
func (c *clusterState) annotate(ctx context.Context, run string, claims []string) error {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"bench/churn":%q}}}`, run+time.Now().Format(time.RFC3339Nano))
	return parallel(16, len(claims), func(i int) error {
		_, err := c.admin.CoreV1().PersistentVolumeClaims(namespace).Patch(ctx, claims[i], types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
}

// bindLatency makes o.binds pods with claims that are not bound, waits
// until the agent reports them unbound, binds each claim (volume, then
// claim, then both phases, as the PV binder does) and times each from its
// last write to the agent having the pod's volume mounted.
func (c *clusterState) bindLatency(ctx context.Context, a *agentProc, run string) ([]time.Duration, error) {
	o := c.o
	type late struct {
		claim, pv, pod string
		uid            types.UID
		obj            *corev1.PersistentVolumeClaim
	}
	var lates []*late
	for i := range o.binds {
		l := &late{claim: fmt.Sprintf("late-%s-%d", run, i), pv: fmt.Sprintf("late-%s-%d", run, i), pod: fmt.Sprintf("late-%s-%d", run, i)}
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: l.claim}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: new(string),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: gi()}},
		}}
		var err error
		if l.obj, err = c.admin.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		pod, err := c.admin.CoreV1().Pods(namespace).Create(ctx, e2eutil.Pod(namespace, a.node, l.pod, e2eutil.ClaimVolume("data", l.claim)), metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		l.uid = pod.UID
		lates = append(lates, l)
	}
	if err := waitFor(ctx, time.Minute, func() bool {
		dsw, err := getDSW(a.debugAddr)
		if err != nil {
			return false
		}
		n := 0
		for _, p := range dsw.Pods {
			for _, e := range p.Errors {
				if e.Reason == "PVCNotBound" {
					n++
				}
			}
		}
		return n == len(lates)
	}); err != nil {
		return nil, fmt.Errorf("waiting for the late pods to be reported unbound: %w", err)
	}
	var out []time.Duration
	for _, l := range lates {
		dir := filepath.Join(c.data, l.pv)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		bound, err := bind(ctx, c.admin, l.obj, l.pv, dir, a.node)
		if err != nil {
			return nil, err
		}
		err = waitEvery(ctx, 30*time.Second, 5*time.Millisecond, func() bool {
			dsw, err := getDSW(a.debugAddr)
			if err != nil {
				return false
			}
			for _, p := range dsw.Pods {
				if p.UID == string(l.uid) {
					return p.VolumesReady
				}
			}
			return false
		})
		if err != nil {
			return nil, fmt.Errorf("late pod %s never ready: %w", l.pod, err)
		}
		out = append(out, time.Since(bound))
	}
	for _, l := range lates {
		_ = c.admin.CoreV1().Pods(namespace).Delete(ctx, l.pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	return out, nil
}

func bind(ctx context.Context, c kubernetes.Interface, claim *corev1.PersistentVolumeClaim, pvName, path, node string) (time.Time, error) {
	pv := e2eutil.PreBoundPV(pvName, "1Gi", "", claim.Namespace, claim.Name, corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: path}})
	pv.Spec.ClaimRef.UID = claim.UID
	pv.Spec.NodeAffinity = e2eutil.NodeAffinity(corev1.LabelHostname, node)
	pv, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		return time.Time{}, err
	}
	pv.Status.Phase = corev1.VolumeBound
	if _, err := c.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return time.Time{}, err
	}
	claim.Spec.VolumeName = pvName
	if claim, err = c.CoreV1().PersistentVolumeClaims(claim.Namespace).Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
		return time.Time{}, err
	}
	claim.Status.Phase = corev1.ClaimBound
	claim.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: gi()}
	if _, err := c.CoreV1().PersistentVolumeClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}

// startAgent runs an agent in a mount namespace of its own (private
// propagation): its mounts are its own, and go with it.
func startAgent(bin, kubeconfig, node, root, extra string) (*agentProc, error) {
	if err := os.MkdirAll(root, 0o750); err != nil {
		return nil, err
	}
	a := &agentProc{node: node, metricsAddr: freeAddr(), debugAddr: freeAddr()}
	args := []string{"--mount", "--propagation", "private", bin,
		"--node-name", node, "--root-dir", root, "--kubeconfig", kubeconfig,
		"--debug-address", a.debugAddr, "--metrics-address", a.metricsAddr, "--log-level", "warn",
		"--plugin-registry-dir", filepath.Join(root, "plugins_registry")}
	args = append(args, strings.Fields(extra)...)
	a.cmd = exec.Command("unshare", args...)
	var err error
	if a.log, err = os.Create(root + ".log"); err != nil {
		return nil, err
	}
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	if err := a.cmd.Start(); err != nil {
		a.log.Close()
		return nil, err
	}
	a.exited = make(chan struct{})
	go func() {
		a.waitErr = a.cmd.Wait()
		close(a.exited)
	}()
	return a, nil
}

// restartIfExited fails if agents[i] exited, except when it lost one of
// its ports to another process between freeAddr and its bind (the machine
// is shared): then it starts it again with other ports, a few times.
func (c *clusterState) restartIfExited(agents []*agentProc, i int, bin, dir string) error {
	a := agents[i]
	select {
	case <-a.exited:
	default:
		return nil
	}
	a.log.Close()
	out, _ := os.ReadFile(a.log.Name())
	if !bytes.Contains(out, []byte("address already in use")) || a.restarts >= 3 {
		return fmt.Errorf("agent of %s exited (%v): %s", a.node, a.waitErr, lastLines(out, 5))
	}
	fmt.Printf("  agent of %s lost a port to another process; starting it again\n", a.node)
	b, err := startAgent(bin, c.cp.Kubeconfig, a.node, filepath.Join(dir, a.node), c.o.agentArgs)
	if err != nil {
		return err
	}
	b.pods, b.restarts = a.pods, a.restarts+1
	agents[i] = b
	return nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func agentsCPU(agents []*agentProc) float64 {
	s := 0.0
	for _, a := range agents {
		s += cpuSeconds(a.cmd.Process.Pid)
	}
	return s
}

// apiStats reads the API server's metrics.
func (c *clusterState) apiStats(ctx context.Context) (apiStats, error) {
	raw, err := c.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apiStats{}, fmt.Errorf("API server metrics: %w", err)
	}
	s := apiStats{watches: map[string]float64{}, watchEvents: map[string]float64{}}
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		series := line[:i]
		name, labels, _ := strings.Cut(series, "{")
		switch name {
		case "apiserver_longrunning_requests":
			if label(labels, "verb") == "WATCH" {
				s.longrunning += v
				s.watches[label(labels, "resource")] += v
			}
		case "apiserver_watch_events_total":
			s.watchEvents[label(labels, "resource")] += v
		case "process_resident_memory_bytes":
			s.rssMiB = v / (1 << 20)
		case "process_cpu_seconds_total":
			s.cpu = v
		case "go_memstats_heap_inuse_bytes":
			s.heapMiB = v / (1 << 20)
		case "go_goroutines":
			s.goroutines = v
		}
	}
	return s, nil
}

func label(labels, key string) string {
	for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k == key {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

func report(o options, c *clusterState, rs []*result) {
	fmt.Printf("\n%d agents (one per node), %d PV/PVC pairs (%d per node), %d pods per node × %d claims (%d claims in use, %d idle); cluster made in %.0f s\n",
		o.nodes, o.pairs, o.pairs/o.nodes, o.podsPerNode, o.claimsPerPod, o.nodes*o.podsPerNode*o.claimsPerPod,
		o.pairs-o.nodes*o.podsPerNode*o.claimsPerPod, c.setup.Seconds())
	row := func(what string, f func(r *result) string) {
		fmt.Printf("| %-58s |", what)
		for _, r := range rs {
			fmt.Printf(" %-22s |", f(r))
		}
		fmt.Println()
	}
	fmt.Printf("| %-58s |", "")
	for _, r := range rs {
		fmt.Printf(" %-22s |", r.name)
	}
	fmt.Println()
	fmt.Printf("|%s|", strings.Repeat("-", 60))
	for range rs {
		fmt.Printf("%s|", strings.Repeat("-", 24))
	}
	fmt.Println()
	row("every pod's volumes ready after the agents start", func(r *result) string { return fmt.Sprintf("%.1f s", r.readyIn.Seconds()) })
	row("agents' CPU until then (all agents)", func(r *result) string { return fmt.Sprintf("%.1f s", r.startCPU) })
	row("API server CPU until then", func(r *result) string { return fmt.Sprintf("%.1f s", r.apiserverStartup) })
	row("API server watches open: claims / volumes / all", func(r *result) string {
		return fmt.Sprintf("%.0f / %.0f / %.0f", r.apiserver.watches["persistentvolumeclaims"], r.apiserver.watches["persistentvolumes"], r.apiserver.longrunning)
	})
	row("API server RSS / heap in use", func(r *result) string {
		return fmt.Sprintf("%.0f / %.0f MiB", r.apiserver.rssMiB, r.apiserver.heapMiB)
	})
	row("API server goroutines", func(r *result) string { return fmt.Sprintf("%.0f", r.apiserver.goroutines) })
	row(fmt.Sprintf("idle CPU over %s: agents (all) / API server", o.idle), func(r *result) string {
		return fmt.Sprintf("%.2f / %.2f s", r.idleAgentCPU, r.apiserverIdleCPU)
	})
	row("agent RSS: min / median / max", func(r *result) string {
		s := slices.Clone(r.rss)
		slices.Sort(s)
		if len(s) == 0 {
			return ""
		}
		return fmt.Sprintf("%.1f / %.1f / %.1f MiB", s[0], s[len(s)/2], s[len(s)-1])
	})
	if o.churn > 0 {
		row(fmt.Sprintf("%d idle claims changed: watch events sent", o.churn), func(r *result) string { return fmt.Sprintf("%.0f", r.churnEvents) })
		row("  … CPU: agents (all) / API server", func(r *result) string {
			return fmt.Sprintf("%.2f / %.2f s", r.churnAgentCPU, r.churnAPICPU)
		})
	}
	row(fmt.Sprintf("the %d claims one node uses changed: watch events sent", o.podsPerNode*o.claimsPerPod), func(r *result) string {
		return fmt.Sprintf("%.0f", r.usedChurnEvents)
	})
	if o.binds > 0 {
		row(fmt.Sprintf("claim bound → pod's volume mounted (%d): median / max", o.binds), func(r *result) string {
			s := slices.Clone(r.bindLatency)
			slices.Sort(s)
			if len(s) == 0 {
				return ""
			}
			return fmt.Sprintf("%d / %d ms", s[len(s)/2].Milliseconds(), s[len(s)-1].Milliseconds())
		})
	}
}

// DSW is what the benchmark reads of /debug/dsw.
type DSW struct {
	Pods []struct {
		UID          string `json:"uid"`
		VolumesReady bool   `json:"volumesReady"`
		Errors       []struct {
			Reason string `json:"reason"`
		} `json:"errors"`
	} `json:"pods"`
}

func getDSW(addr string) (*DSW, error) {
	resp, err := http.Get("http://" + addr + "/debug/dsw")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var d DSW
	return &d, json.NewDecoder(resp.Body).Decode(&d)
}

func fetch(url, file string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// metricSum adds the values of the series that start with prefix and
// contain label.
func metricSum(addr, prefix, label string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, prefix) && strings.Contains(line, label) {
			v, _ := strconv.ParseFloat(strings.TrimSpace(line[strings.LastIndexByte(line, ' ')+1:]), 64)
			sum += v
		}
	}
	return sum
}

func metric(addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return -1
}

func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kib / 1024
		}
	}
	return 0
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	return waitEvery(ctx, timeout, 100*time.Millisecond, cond)
}

func waitEvery(ctx context.Context, timeout, every time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
	return nil
}

func parallel(workers, n int, f func(i int) error) error {
	var mu sync.Mutex
	var first error
	next := 0
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := first != nil
				mu.Unlock()
				if i >= n || stop {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return first
}

func gi() resource.Quantity { return resource.MustParse("1Gi") }
