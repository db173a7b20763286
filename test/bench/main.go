// Command bench is the end-to-end benchmark of volume-agent. The default
// scenario is standalone mode: it starts the real binary, writes N pod
// manifests with M emptyDir{medium: Memory} volumes each, and reports the
// time until every volume is mounted, the CPU the idle agent uses with them
// mounted, its RSS, and the time until everything is unmounted after the
// manifests are deleted. -scenario api-volumes is cluster mode with API
// volumes (see apivolumes.go); -scenario readiness is how soon pods'
// VolumesReady conditions follow their mounts in cluster mode (see
// readiness.go); -scenario ownership is the fsGroup walk against the
// kubelet's own code (see ownership.go).
//
// Mounts are counted in /proc/self/mountinfo, the kernel's own view. The
// agent's root directory is, by default, on a dedicated ext4 filesystem on a
// loop device (as /var/lib usually is on a node); -root-fs=host puts it on
// the filesystem of the temporary directory instead.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type options struct {
	agent    string
	scenario string
	pods     int
	volumes  int
	idle     time.Duration
	rootFS   string
	timeout  time.Duration
	// profile, if set, is a directory for CPU profiles of the agent during
	// the mount and the unmount phase (profileFor long each).
	profile    string
	profileFor time.Duration
	// trace, if set, is a directory for execution traces of the agent
	// (mount.trace, unmount.trace: profileFor long each), which show what
	// its goroutines wait on.
	trace string
	// floor runs the kernel floor (floor.go) before and after the agent.
	floor bool
	// perf samples the agent's user CPU with perf record (perfcpu.go).
	perf     string
	perfKeep string
	// rate, if set, paces the manifests' arrival (pods per second), as
	// pods bound one after another reach a node, instead of all at once.
	rate float64
	// api-volumes scenario
	kubeQPS         int
	nodeCredentials bool
	updates         int
	dumpMetrics     string
	// readiness scenario
	sizes        string
	modes        string
	runs         int
	agentArgs    string
	baseline     string
	baselineArgs string
	// ownership scenario
	ownershipPeer   string
	ownershipFiles  string
	ownershipDisks  string
	ownershipShapes string
}

func run() error {
	var o options
	flag.StringVar(&o.agent, "agent", "bin/volume-agent", "volume-agent binary")
	flag.StringVar(&o.scenario, "scenario", "emptydir", "emptydir (standalone mode, Memory emptyDirs), api-volumes (cluster mode, kube-api-access + configMap + secret per pod), readiness (cluster mode, pod conditions; see readiness.go) or ownership (fsGroup walks against the kubelet's code; see ownership.go)")
	flag.IntVar(&o.kubeQPS, "kube-qps", 0, "api-volumes: the agent's --kube-api-qps (burst twice that); 0: its default")
	flag.BoolVar(&o.nodeCredentials, "node-credentials", false, "api-volumes: run the agent with --node-kubeconfig")
	flag.IntVar(&o.updates, "updates", 10, "api-volumes: ConfigMap updates timed")
	flag.StringVar(&o.dumpMetrics, "dump-metrics", "", "api-volumes: write the agent's /metrics here at the end")
	flag.StringVar(&o.sizes, "sizes", "100,200", "readiness: numbers of pods, comma-separated")
	flag.StringVar(&o.modes, "modes", "before,running", "readiness: pods created before the agent starts, or at once while it runs")
	flag.IntVar(&o.runs, "runs", 1, "readiness: rounds of each size, mode and agent; emptydir: rounds of each agent, alternating, summarised at the end (profiles and traces are the last round's)")
	flag.StringVar(&o.agentArgs, "agent-args", "", "readiness: more flags for the agent")
	flag.StringVar(&o.baseline, "baseline", "", "readiness and emptydir: a second agent binary, run alternately with -agent")
	flag.StringVar(&o.baselineArgs, "baseline-args", "", "readiness: more flags for the baseline agent")
	flag.IntVar(&o.pods, "pods", 500, "pods")
	flag.IntVar(&o.volumes, "volumes", 4, "volumes per pod: Memory emptyDirs (emptydir) or PVCs bound to local PVs (readiness)")
	flag.DurationVar(&o.idle, "idle", 20*time.Second, "how long to measure idle CPU with everything mounted")
	flag.StringVar(&o.rootFS, "root-fs", "loop", "where the agent's root dir lives: loop (own ext4 on a loop device) or host")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up after this long in any phase")
	flag.StringVar(&o.profile, "profile", "", "emptydir: write CPU profiles of the agent (mount.pprof, unmount.pprof, idle.pprof) and what it allocated (mount.allocs.pprof, unmount.allocs.pprof) to this directory")
	flag.StringVar(&o.trace, "trace", "", "emptydir: write execution traces of the agent (mount.trace, unmount.trace; go tool trace) to this directory")
	flag.DurationVar(&o.profileFor, "profile-for", 10*time.Second, "emptydir: length of each CPU profile")
	flag.Float64Var(&o.rate, "rate", 0, "emptydir: pods arriving per second (manifests renamed into place one by one at this pace); 0: all at once")
	flag.BoolVar(&o.floor, "floor", true, "emptydir: also time the kernel floor (the same directories and mounts with bare syscalls) on the same filesystem, just before and just after the agent, and report the agent's ratio to it")
	flag.StringVar(&o.perfKeep, "perf-keep", "", "emptydir: with -perf, record call graphs and keep each phase's perf.data here (setup-N.data, teardown-N.data; N counts phases) for perf report")
	flag.StringVar(&o.perf, "perf", "auto", "emptydir: the agent's user CPU per volume also by perf record's cpu-clock samples (auto: if perf works here; off), used in the summary over the tick-sampled utime")
	flag.StringVar(&o.ownershipPeer, "ownership-peer", "", "ownership: the kubelet peer binary (default: ownership-peer in $VOLUME_AGENT_TOOLS_BIN)")
	flag.StringVar(&o.ownershipFiles, "ownership-files", "100000", "ownership: numbers of files per tree, comma-separated")
	flag.StringVar(&o.ownershipDisks, "ownership-disks", "root,loop", "ownership: where the trees live: root (the root disk), loop (an ext4 on a loop device)")
	flag.StringVar(&o.ownershipShapes, "ownership-shapes", "wide,deep", "ownership: tree shapes, comma-separated")
	flag.Parse()
	if os.Geteuid() != 0 {
		return fmt.Errorf("must run as root (it mounts)")
	}
	if o.scenario == "ownership" {
		return runOwnership(o)
	}

	work, err := os.MkdirTemp("", "volume-agent-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "root")
	manifests := filepath.Join(work, "manifests")
	for _, d := range []string{root, manifests} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if o.rootFS == "loop" {
		img := filepath.Join(work, "root.img")
		cleanup, err := loopFS(img, root)
		if err != nil {
			return err
		}
		defer cleanup()
	}
	defer unmountBelow(root)
	switch o.scenario {
	case "api-volumes":
		return runAPIVolumes(o, work, root)
	case "readiness":
		return runReadiness(o, work, root)
	}

	return emptyDirRounds(o, work, root)
}

// emptyDirResult is one round of the emptydir scenario: the agent's times
// by its own log, its CPU (user + kernel seconds) in each phase, idle CPU,
// RSS, and the floor before and after (setup, teardown), if measured.
type emptyDirResult struct {
	setup, teardown       time.Duration
	setupCPU, teardownCPU float64
	// setupUser and teardownUser are the agent's user-space CPU per
	// volume in each phase, in µs: its own work, which the kernel's
	// (the floor) does not include.
	setupUser, teardownUser float64
	idleCPU, rssMiB         float64
	// peakRSSMiB is the agent's peak RSS over the setup (VmHWM).
	peakRSSMiB float64
	floors     [2][2]time.Duration
	// setupUserPerf and teardownUserPerf are the same by perf's samples
	// (perfcpu.go), 0 without perf.
	setupUserPerf, teardownUserPerf float64
}

// emptyDirRound runs the emptydir scenario once with the agent binary
// agent; tag names its log.
func emptyDirRound(o options, agent, work, root, tag string, perf *perfSampler, res *emptyDirResult) error {
	manifests := filepath.Join(work, "manifests")
	var floors [][2]time.Duration
	var floorCPU [][2]string
	runFloor := func() error {
		if !o.floor {
			return nil
		}
		setup, teardown, cpu, err := floor(root, o.pods, o.volumes)
		if err != nil {
			return err
		}
		floors = append(floors, [2]time.Duration{setup, teardown})
		floorCPU = append(floorCPU, cpu)
		return nil
	}
	if err := runFloor(); err != nil {
		return err
	}

	debugAddr, metricsAddr := freeAddr(), freeAddr()
	cmd := exec.Command(agent, "--node-name", "bench-node", "--root-dir", root, "--pod-manifest-path", manifests,
		"--debug-address", debugAddr, "--metrics-address", metricsAddr)
	// At the default level, as deployed: its lines also time the
	// operations without watching mountinfo (see agentTimes).
	logPath := filepath.Join(work, "agent"+tag+".log")
	logFile, err := os.Create(logPath)
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
	if err := waitFor(o.timeout, func() bool {
		resp, err := http.Get("http://" + debugAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); err != nil {
		return fmt.Errorf("agent not ready: %w", err)
	}

	want := o.pods * o.volumes
	files := make(map[string][]byte, o.pods)
	for i := 0; i < o.pods; i++ {
		files[fmt.Sprintf("pod-%04d.yaml", i)] = podManifest(i, o.volumes)
	}

	fmt.Printf("volume-agent standalone: %d pods x %d emptyDir{medium: Memory} = %d mounts, root dir on %s\n", o.pods, o.volumes, want, o.rootFS)
	profile := func(name string, d time.Duration) func() {
		var paths, kinds []string
		if o.profile != "" {
			paths, kinds = append(paths, filepath.Join(o.profile, name+".pprof")), append(kinds, "profile")
			if name != "idle" {
				// What the phase allocated (a delta of the allocs profile).
				paths, kinds = append(paths, filepath.Join(o.profile, name+".allocs.pprof")), append(kinds, "allocs")
			}
		}
		if o.trace != "" && name != "idle" {
			paths, kinds = append(paths, filepath.Join(o.trace, name+".trace")), append(kinds, "trace")
		}
		done := make(chan struct{}, len(paths))
		for i := range paths {
			go func() {
				defer func() { done <- struct{}{} }()
				if err := saveProfile(debugAddr, kinds[i], d, paths[i]); err != nil {
					fmt.Fprintln(os.Stderr, "bench:", kinds[i]+":", err)
				}
			}()
		}
		return func() {
			for range paths {
				<-done
			}
		}
	}
	waitProfile := profile("mount", o.profileFor)
	// Written beforehand (hidden names, which the agent ignores) and
	// renamed into place in one go, as a deployment tool would: the time
	// is the agent's, not that of writing 500 files to disk.
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(manifests, "."+name), data, 0o644); err != nil {
			return err
		}
	}
	perfStart := func() {
		if err := perf.start(cmd.Process.Pid); err != nil {
			fmt.Fprintln(os.Stderr, "bench: perf:", err)
		}
	}
	perfStop := func(phase string) float64 {
		if perf == nil {
			return 0
		}
		c, err := perf.stop(phase)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: perf:", err)
			return 0
		}
		fmt.Printf("  per volume (perf, %d Hz cpu-clock samples): %s to %s\n", perfHz, c.perVolume(want), phase)
		return c.user * 1e6 / float64(want)
	}
	// The scrape comes before the sampling: with every volume mounted it
	// costs the agent as much as a tenth of a teardown's user CPU, and is
	// no part of the storm.
	counters0 := readCounters(metricsAddr)
	perfStart()
	user0, system0, _ := cpuSplit(cmd.Process.Pid)
	cpuBefore := user0 + system0
	start := time.Now()
	arrived := 0
	for name := range files {
		if o.rate > 0 {
			// Paced, not synchronised: the sleep is the arrival rate.
			time.Sleep(time.Until(start.Add(time.Duration(float64(arrived) / o.rate * float64(time.Second)))))
			arrived++
		}
		if err := os.Rename(filepath.Join(manifests, "."+name), filepath.Join(manifests, name)); err != nil {
			return err
		}
	}
	written := time.Now()
	if err := waitFor(o.timeout, func() bool { return countMounts(root) >= want }); err != nil {
		return fmt.Errorf("waiting for %d mounts (have %d): %w", want, countMounts(root), err)
	}
	mounted := time.Now()
	fmt.Printf("  mounted:   %.3f s after the manifests were written (%.3f s from the first write), %s\n",
		mounted.Sub(written).Seconds(), mounted.Sub(start).Seconds(), cpuSince(cmd.Process.Pid, user0, system0))
	mountTimes, err := agentTimes(logPath, "mount_volume", start, want, o.timeout)
	if err != nil {
		return err
	}
	fmt.Printf("  mounted:   %.3f s from the first write by the agent's log (its last mount_volume; %s)\n", mountTimes.last().Sub(start).Seconds(), mountTimes.spread(start))
	res.setup = mountTimes.last().Sub(start)
	res.setupUserPerf = perfStop("set up")
	if user, system, err := cpuSplit(cmd.Process.Pid); err == nil {
		res.setupCPU = user + system - cpuBefore
		res.setupUser = (user - user0) * 1e6 / float64(want)
		fmt.Printf("  per volume: %.1f µs user + %.1f µs kernel to set up\n", res.setupUser, (system-system0)*1e6/float64(want))
		fmt.Printf("             %s\n", readCounters(metricsAddr).since(counters0, want))
	}

	waitProfile()
	waitProfile = profile("idle", o.idle)
	cpu0, err := cpuSeconds(cmd.Process.Pid)
	if err != nil {
		return err
	}
	time.Sleep(o.idle) // measuring idle cost: the wait is the measurement
	waitProfile()
	if os.Getenv("BENCH_DUMP_METRICS") != "" {
		if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			_ = os.WriteFile(os.Getenv("BENCH_DUMP_METRICS"), b, 0o644)
		}
	}
	cpu1, err := cpuSeconds(cmd.Process.Pid)
	if err != nil {
		return err
	}
	rss, err := rssKiB(cmd.Process.Pid)
	if err != nil {
		return err
	}
	fmt.Printf("  idle CPU:  %.3f s over %s with everything mounted\n", cpu1-cpu0, o.idle)
	peak, err := peakRSSKiB(cmd.Process.Pid)
	if err != nil {
		return err
	}
	fmt.Printf("  RSS:       %.1f MiB (peak %.1f MiB)\n", float64(rss)/1024, float64(peak)/1024)
	res.peakRSSMiB = float64(peak) / 1024
	res.idleCPU, res.rssMiB = cpu1-cpu0, float64(rss)/1024

	waitProfile = profile("unmount", o.profileFor)
	defer waitProfile()
	counters0 = readCounters(metricsAddr)
	perfStart()
	user0, system0, _ = cpuSplit(cmd.Process.Pid)
	cpuBefore = user0 + system0
	deleteStart := time.Now()
	for name := range files {
		if err := os.Remove(filepath.Join(manifests, name)); err != nil {
			return err
		}
	}
	deleted := time.Now()
	if err := waitFor(o.timeout, func() bool { return countMounts(root) == 0 }); err != nil {
		return fmt.Errorf("waiting for unmounts (%d left): %w", countMounts(root), err)
	}
	unmountedAt := time.Now()
	fmt.Printf("  unmounted: %.3f s after the manifests were deleted, %s\n", unmountedAt.Sub(deleted).Seconds(), cpuSince(cmd.Process.Pid, user0, system0))
	unmountTimes, err := agentTimes(logPath, "unmount_volume", deleteStart, want, o.timeout)
	if err != nil {
		return err
	}
	fmt.Printf("  unmounted: %.3f s from the first removal by the agent's log (its last unmount_volume; %s)\n", unmountTimes.last().Sub(deleteStart).Seconds(), unmountTimes.spread(deleteStart))
	res.teardown = unmountTimes.last().Sub(deleteStart)
	res.teardownUserPerf = perfStop("tear down")
	if user, system, err := cpuSplit(cmd.Process.Pid); err == nil {
		res.teardownCPU = user + system - cpuBefore
		res.teardownUser = (user - user0) * 1e6 / float64(want)
		fmt.Printf("  per volume: %.1f µs user + %.1f µs kernel to tear down\n", res.teardownUser, (system-system0)*1e6/float64(want))
		fmt.Printf("             %s\n", readCounters(metricsAddr).since(counters0, want))
	}
	if err := waitFor(o.timeout, func() bool {
		entries, _ := os.ReadDir(filepath.Join(root, "pods"))
		return len(entries) == 0
	}); err != nil {
		return fmt.Errorf("pod directories left behind: %w", err)
	}
	if o.floor {
		if err := runFloor(); err != nil {
			return err
		}
		res.floors = [2][2]time.Duration{floors[0], floors[1]}
		agentSetup, agentTeardown := mounted.Sub(start), unmountedAt.Sub(deleteStart)
		fmt.Printf("  floor:     setup %s, teardown %s (before) and %s, %s (after): bare mkdir/mount/umount2/rmdir from %d goroutines on the same filesystem\n",
			ms(floors[0][0])+" ms", ms(floors[0][1])+" ms", ms(floors[1][0])+" ms", ms(floors[1][1])+" ms", floorWorkers)
		fmt.Printf("  floor CPU: setup %s, teardown %s (before); %s, %s (after)\n", floorCPU[0][0], floorCPU[0][1], floorCPU[1][0], floorCPU[1][1])
		fmt.Printf("  agent ÷ floor: setup %s, teardown %s (from the first manifest written / removed, seen in mountinfo; the goal is ≤ 1.5×)\n",
			ratios(agentSetup, floors[0][0], floors[1][0]), ratios(agentTeardown, floors[0][1], floors[1][1]))
		fmt.Printf("  agent ÷ floor: setup %s, teardown %s (by the agent's log: timed from inside, as the floor times itself)\n",
			ratios(mountTimes.last().Sub(start), floors[0][0], floors[1][0]), ratios(unmountTimes.last().Sub(deleteStart), floors[0][1], floors[1][1]))
	}
	return nil
}

// ratios is the agent's time over each floor time, smallest first.
func ratios(agent, a, b time.Duration) string {
	r1, r2 := agent.Seconds()/a.Seconds(), agent.Seconds()/b.Seconds()
	return fmt.Sprintf("%.1f–%.1f×", min(r1, r2), max(r1, r2))
}

func podManifest(i, volumes int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bench-%04d\n  namespace: default\nspec:\n  containers:\n  - name: c\n    image: busybox\n    volumeMounts:\n", i)
	for j := 0; j < volumes; j++ {
		fmt.Fprintf(&b, "    - {name: v%d, mountPath: /v%d}\n", j, j)
	}
	b.WriteString("  volumes:\n")
	for j := 0; j < volumes; j++ {
		fmt.Fprintf(&b, "  - name: v%d\n    emptyDir: {medium: Memory, sizeLimit: 1Mi}\n", j)
	}
	return b.Bytes()
}

// countMounts counts mount points strictly below dir.
func countMounts(dir string) int {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return -1
	}
	defer f.Close()
	prefix := []byte(" " + dir + "/")
	n := 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		if bytes.Contains(s.Bytes(), prefix) {
			n++
		}
	}
	return n
}

// waitFor polls cond every 2 ms, or four times as long as cond took: fine
// enough to time a phase, cheap enough not to slow the agent down. Reading
// mountinfo with thousands of mounts takes milliseconds, during which the
// kernel makes mount(2) wait: polled back to back it slowed the agent it
// timed.
func waitFor(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		start := time.Now()
		if cond() {
			return nil
		}
		if time.Now().After(deadline) {
			return context.DeadlineExceeded
		}
		time.Sleep(max(2*time.Millisecond, 4*time.Since(start)))
	}
}

// agentTimes waits for n "operation succeeded" lines of op at or after
// since in the agent's JSON log (lines are buffered for up to 100 ms) and
// returns their times.
func agentTimes(path, op string, since time.Time, n int, timeout time.Duration) (opTimes, error) {
	var times opTimes
	err := waitFor(timeout, func() bool {
		times = opTimes{}
		data, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		for line := range bytes.SplitSeq(data, []byte("\n")) {
			if !bytes.Contains(line, []byte(`"operation succeeded"`)) {
				continue
			}
			var e struct {
				Time      string `json:"time"`
				Operation string `json:"operation"`
			}
			if json.Unmarshal(line, &e) != nil || e.Operation != op {
				continue
			}
			t, err := time.Parse("2006-01-02T15:04:05.000Z0700", e.Time)
			// The log's times are in milliseconds.
			if err != nil || t.Before(since.Truncate(time.Millisecond)) {
				continue
			}
			times.all = append(times.all, t)
		}
		return len(times.all) >= n
	})
	if err != nil {
		return times, fmt.Errorf("agent log: %d of %d %s lines: %w", len(times.all), n, op, err)
	}
	slices.SortFunc(times.all, time.Time.Compare)
	return times, nil
}

// opTimes are the times of one operation's successes in the agent's log,
// earliest first.
type opTimes struct{ all []time.Time }

func (t opTimes) last() time.Time { return t.all[len(t.all)-1] }

// spread says when the first, the middle and the last operation finished,
// after start: a late first one is latency (reading and planning), a long
// way from first to last is throughput.
func (t opTimes) spread(start time.Time) string {
	at := func(i int) string { return ms(t.all[i].Sub(start)) }
	return fmt.Sprintf("first %s ms, half %s ms, last %s ms", at(0), at(len(t.all)/2), at(len(t.all)-1))
}

func cpuSeconds(pid int) (float64, error) {
	user, system, err := cpuSplit(pid)
	return user + system, err
}

// cpuSplit is a process's CPU time in user space and in the kernel.
func cpuSplit(pid int) (user, system float64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command name (which may contain spaces).
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return utime / 100, stime / 100, nil // USER_HZ is 100 on Linux
}

// cpuSince formats the CPU a process used since (user0, system0).
func cpuSince(pid int, user0, system0 float64) string {
	user, system, _ := cpuSplit(pid)
	return cpuString(user-user0, system-system0)
}

func cpuString(user, system float64) string {
	return fmt.Sprintf("CPU %.2f s user + %.2f s kernel", user, system)
}

func rssKiB(pid int) (int, error) { return statusKiB(pid, "VmRSS:") }

// peakRSSKiB is the most a process has had resident since it started
// (VmHWM): a storm's garbage shows here, after the trim it does not.
func peakRSSKiB(pid int) (int, error) { return statusKiB(pid, "VmHWM:") }

// statusKiB reads one kB field of a process's /proc status.
func statusKiB(pid int, field string) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, field) {
			return strconv.Atoi(strings.Fields(line)[1])
		}
	}
	return 0, fmt.Errorf("no %s for pid %d", field, pid)
}

// saveProfile writes a CPU profile, an allocation profile or an execution
// trace (kind: profile, allocs or trace) of the agent over d to path.
func saveProfile(debugAddr, kind string, d time.Duration, path string) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%g", debugAddr, kind, d.Seconds()))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// counters are a few of the agent's cumulative metrics: GC cycles,
// reconciler passes, and heap allocations (objects and bytes); and the heap
// in use at the time (live objects and garbage not yet swept).
type counters struct{ gc, passes, mallocs, allocBytes, heapInuse float64 }

var counterNames = []string{"go_gc_duration_seconds_count", "volume_agent_reconcile_duration_seconds_count",
	"go_memstats_mallocs_total", "go_memstats_alloc_bytes_total", "go_memstats_heap_inuse_bytes"}

// readCounters scrapes the agent's counters (NaN for one not found).
func readCounters(metricsAddr string) counters {
	v := []float64{math.NaN(), math.NaN(), math.NaN(), math.NaN(), math.NaN()}
	if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			for i, name := range counterNames {
				if rest, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
					if f, err := strconv.ParseFloat(rest, 64); err == nil {
						v[i] = f
					}
				}
			}
		}
		resp.Body.Close()
	}
	return counters{v[0], v[1], v[2], v[3], v[4]}
}

// since describes what the agent did since c0, for n volumes.
func (c counters) since(c0 counters, n int) string {
	return fmt.Sprintf("%.0f GC cycles, %.0f passes, %.0f allocations and %.1f KB per volume; heap in use %.1f MiB",
		c.gc-c0.gc, c.passes-c0.passes, (c.mallocs-c0.mallocs)/float64(n), (c.allocBytes-c0.allocBytes)/float64(n)/1000, c.heapInuse/(1<<20))
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// loopFS makes a fresh ext4 filesystem in img, mounts it at dir through a
// loop device, and returns how to undo that.
func loopFS(img, dir string) (func(), error) {
	if err := exec.Command("truncate", "-s", "4G", img).Run(); err != nil {
		return nil, err
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mount: %v: %s", err, out)
	}
	return func() {
		// umount of a loop mount set up with -o loop detaches the device.
		_ = exec.Command("umount", dir).Run()
	}, nil
}

// unmountBelow unmounts whatever is left below dir (deepest first), and
// the bind of dir onto itself the agent makes to share its root directory
// (--shared-root-dir, on the host's filesystem), so no run leaks a mount.
func unmountBelow(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && (strings.HasPrefix(fields[4], dir+"/") || fields[4] == dir && fields[3] == dir) {
			points = append(points, fields[4])
		}
	}
	f.Close()
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}
