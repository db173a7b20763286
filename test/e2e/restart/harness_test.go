package restart_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

const (
	emptyDirPlugin = "kubernetes.io/empty-dir"
	hostPathPlugin = "kubernetes.io/host-path"
	localPlugin    = "kubernetes.io/local-volume"
	csiPlugin      = "kubernetes.io/csi"
)

// --- processes ---

// spawn runs f on one OS thread that never exits. Children get
// Pdeathsig=SIGKILL so that they die with the test binary even when a panic
// or `go test -timeout` skips every cleanup; Linux sends the signal when the
// thread that forked the child exits, so all forks happen on this thread.
var spawn = func() func(func()) {
	reqs := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives as long as the process
		for f := range reqs {
			f()
		}
	}()
	return func(f func()) {
		done := make(chan struct{})
		reqs <- func() { f(); close(done) }
		<-done
	}
}()

// proc is a child process with its output in a log file.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once reaped
	err     error         // of Wait, valid once done is closed
}

func startProc(name, logPath, bin string, args ...string) (*proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	fmt.Fprintf(logFile, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	p := &proc{name: name, logPath: logPath, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	spawn(func() { err = p.cmd.Start() })
	if err != nil {
		return nil, err
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL to the process (by its PID) and waits for it.
func (p *proc) kill() {
	if !p.exited() {
		_ = syscall.Kill(p.pid(), syscall.SIGKILL)
	}
	<-p.done
}

// term sends SIGTERM and waits up to grace for the exit; then SIGKILL. It
// returns the exit error, or an error if the process had to be killed.
func (p *proc) term(grace time.Duration) error {
	if p.exited() {
		return p.err
	}
	_ = syscall.Kill(p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(grace):
		_ = syscall.Kill(p.pid(), syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s (pid %d) did not exit within %v of SIGTERM", p.name, p.pid(), grace)
	}
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// --- the agent ---

// agent is the volume-agent of one test: the same root directory and
// arguments for every run, a new process (and new ports) each time.
type agent struct {
	t    *testing.T
	root string
	args []string // mode-specific arguments

	runs       int
	raceRun    int // the last run whose log was checked for data races
	proc       *proc
	debugURL   string
	metricsURL string
	client     *http.Client
}

// newAgent prepares an agent on root (whose mounts the caller's cleanup
// unmounts; see tempRoot) with args (--pod-manifest-path or
// --kubeconfig, --node-name, ...). It is stopped when the test ends, before
// the root's mounts are unmounted (register those first).
func newAgent(t *testing.T, root string, args ...string) *agent {
	t.Helper()
	a := &agent{t: t, root: root, args: args, client: &http.Client{Timeout: 10 * time.Second}}
	t.Cleanup(func() {
		if a.proc != nil && !a.proc.exited() {
			if err := a.proc.term(30 * time.Second); err != nil {
				t.Errorf("stopping the agent at the end of the test: %v", err)
			}
		}
		a.checkRaces()
		if t.Failed() && a.proc != nil {
			t.Logf("--- last lines of the agent's log %s ---\n%s", a.proc.logPath, tail(a.proc.logPath, 80))
		}
	})
	return a
}

// launch starts a new agent process without waiting for anything.
func (a *agent) launch() error {
	if a.proc != nil && !a.proc.exited() {
		a.t.Fatalf("agent (pid %d) is still running", a.proc.pid())
	}
	a.checkRaces()
	debugAddr, err := freeAddr()
	if err != nil {
		return err
	}
	metricsAddr, err := freeAddr()
	if err != nil {
		return err
	}
	a.runs++
	args := append([]string{
		"--root-dir=" + a.root,
		"--debug-address=" + debugAddr,
		"--metrics-address=" + metricsAddr,
		"--shutdown-grace-period=20s",
		"--operation-timeout=30s",
		"--log-level=debug",
	}, a.args...)
	logPath := filepath.Join(a.t.TempDir(), fmt.Sprintf("agent-%d.log", a.runs))
	p, err := startProc("volume-agent", logPath, bins.agent, args...)
	if err != nil {
		return err
	}
	a.proc, a.debugURL, a.metricsURL = p, "http://"+debugAddr, "http://"+metricsAddr
	a.t.Logf("agent run %d: pid %d, log %s", a.runs, p.pid(), logPath)
	return nil
}

// start starts the agent and waits until /readyz answers 200.
func (a *agent) start() {
	a.t.Helper()
	for attempt := 1; ; attempt++ {
		if err := a.launch(); err != nil {
			a.t.Fatalf("starting the agent: %v", err)
		}
		err := a.waitReady(90 * time.Second)
		if err == nil {
			return
		}
		// A port picked free may be taken before the agent binds it.
		if attempt < 3 && a.proc.exited() && strings.Contains(tail(a.proc.logPath, 5), "address already in use") {
			continue
		}
		a.t.Fatal(err)
	}
}

// waitReady polls /readyz until it answers 200.
func (a *agent) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		code, body, err := a.readyz()
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("%d %q %v", code, body, err)
		select {
		case <-a.proc.done:
			return fmt.Errorf("the agent exited before becoming ready (%v):\n%s", a.proc.err, tail(a.proc.logPath, 30))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent is not ready after %v (last /readyz: %s):\n%s", timeout, last, tail(a.proc.logPath, 30))
		}
	}
}

func (a *agent) readyz() (int, string, error) {
	resp, err := a.client.Get(a.debugURL + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), nil
}

// kill9 kills the agent with SIGKILL: no cleanup of any kind runs.
func (a *agent) kill9() {
	a.t.Helper()
	a.proc.kill()
	a.t.Logf("agent run %d (pid %d) killed with SIGKILL", a.runs, a.proc.pid())
}

// stop sends SIGTERM; the agent must exit cleanly (exit 0; with -race, a
// data race makes it exit 66).
func (a *agent) stop() {
	a.t.Helper()
	if err := a.proc.term(30 * time.Second); err != nil {
		a.t.Fatalf("agent run %d did not stop cleanly: %v\n%s", a.runs, err, tail(a.proc.logPath, 30))
	}
	a.checkRaces()
}

// checkRaces fails the test if the race detector reported in the last run.
func (a *agent) checkRaces() {
	if a.proc == nil || a.raceRun == a.runs {
		return
	}
	a.raceRun = a.runs
	if log, err := os.ReadFile(a.proc.logPath); err == nil && bytes.Contains(log, []byte("WARNING: DATA RACE")) {
		a.t.Errorf("the race detector found a data race in the agent; log in %s", a.proc.logPath)
	}
}

func (a *agent) getJSON(path string, into any) error {
	resp, err := a.client.Get(a.debugURL + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("GET %s: %v", path, err)
	}
	return nil
}

// The debug documents as the tests read them (their own copy of the field
// names: the wire format is what is tested).

type podRef struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

type dswDoc struct {
	SourcesReady bool `json:"sourcesReady"`
	Pods         []struct {
		podRef
		Volumes      []string `json:"volumes"`
		VolumesReady bool     `json:"volumesReady"`
		Errors       []struct {
			Volume, Reason, Message string
		} `json:"errors"`
	} `json:"pods"`
}

type aswPod struct {
	podRef
	SpecName      string `json:"specName"`
	MountState    string `json:"mountState"`
	MountPath     string `json:"mountPath"`
	Reconstructed bool   `json:"reconstructed"`
}

type aswDoc struct {
	Volumes []struct {
		Name             string   `json:"name"`
		Plugin           string   `json:"plugin"`
		AttachState      string   `json:"attachState"`
		DeviceMountState string   `json:"deviceMountState"`
		DeviceMountPath  string   `json:"deviceMountPath"`
		Pods             []aswPod `json:"pods"`
	} `json:"volumes"`
}

type orphansDoc struct {
	Orphans []struct {
		Path   string `json:"path"`
		PodUID string `json:"podUID"`
		Reason string `json:"reason"`
	} `json:"orphans"`
}

type operationsDoc struct {
	Operations []struct {
		Volume    string `json:"volume"`
		Operation string `json:"operation"`
		State     string `json:"state"`
		LastError string `json:"lastError"`
	} `json:"operations"`
}

type sourcesDoc struct {
	Synced      bool `json:"synced"`
	InputErrors []struct {
		Input string `json:"input"`
		Error string `json:"error"`
	} `json:"inputErrors"`
}

func (a *agent) dsw() (*dswDoc, error) {
	var d dswDoc
	return &d, a.getJSON("/debug/dsw", &d)
}

func (a *agent) asw() (*aswDoc, error) {
	var d aswDoc
	return &d, a.getJSON("/debug/asw", &d)
}

func (a *agent) orphans() (*orphansDoc, error) {
	var d orphansDoc
	return &d, a.getJSON("/debug/orphans", &d)
}

func (a *agent) operations() (*operationsDoc, error) {
	var d operationsDoc
	return &d, a.getJSON("/debug/operations", &d)
}

func (a *agent) sources() (*sourcesDoc, error) {
	var d sourcesDoc
	return &d, a.getJSON("/debug/sources", &d)
}

// metrics returns every sample of /metrics, keyed by the series as
// written ("name{label=\"v\",...}").
func (a *agent) metrics() (map[string]float64, error) {
	resp, err := a.client.Get(a.metricsURL + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// opCounts sums volume_agent_operation_duration_seconds_count by
// operation and plugin (every result: success, failure, uncertain, stale).
func (a *agent) opCounts() (map[string]map[string]float64, error) {
	ms, err := a.metrics()
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]float64{}
	for series, v := range ms {
		labels, ok := strings.CutPrefix(series, "volume_agent_operation_duration_seconds_count{")
		if !ok {
			continue
		}
		l := parseLabels(strings.TrimSuffix(labels, "}"))
		if out[l["operation"]] == nil {
			out[l["operation"]] = map[string]float64{}
		}
		out[l["operation"]][l["plugin"]] += v
	}
	return out, nil
}

func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		k, rest, ok := strings.Cut(s, `="`)
		if !ok {
			break
		}
		v, rest, _ := strings.Cut(rest, `"`)
		out[k] = v
		s = strings.TrimPrefix(rest, ",")
	}
	return out
}

// metric returns an unlabelled sample.
func (a *agent) metric(name string) (float64, error) {
	ms, err := a.metrics()
	if err != nil {
		return 0, err
	}
	v, ok := ms[name]
	if !ok {
		return 0, fmt.Errorf("no metric %s", name)
	}
	return v, nil
}

// --- conditions ---

// eventually polls cond every 50 ms until it returns nil, failing the test
// with its last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not after %v: %v", what, timeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// settled checks the agent has finished: every pod it wants has its
// volumes ready, nothing in the ASW is still reconstructed or uncertain,
// no operation is pending and no orphan is reported. It returns the
// desired pods' UIDs.
func (a *agent) settled() (map[string]bool, error) {
	d, err := a.dsw()
	if err != nil {
		return nil, err
	}
	if !d.SourcesReady {
		return nil, errors.New("sources not ready")
	}
	uids := map[string]bool{}
	for _, p := range d.Pods {
		if !p.VolumesReady {
			return nil, fmt.Errorf("pod %s/%s: volumes not ready (errors %+v)", p.Namespace, p.Name, p.Errors)
		}
		uids[p.UID] = true
	}
	s, err := a.asw()
	if err != nil {
		return nil, err
	}
	for _, v := range s.Volumes {
		if v.DeviceMountState == "Uncertain" || v.AttachState == "Uncertain" {
			return nil, fmt.Errorf("volume %s: device %s, attach %q", v.Name, v.DeviceMountState, v.AttachState)
		}
		for _, m := range v.Pods {
			if m.Reconstructed || m.MountState != "Mounted" {
				return nil, fmt.Errorf("volume %s pod %s: %s (reconstructed %v)", v.Name, m.UID, m.MountState, m.Reconstructed)
			}
			if !uids[m.UID] {
				return nil, fmt.Errorf("volume %s still mounted for pod %s that is not desired", v.Name, m.UID)
			}
		}
	}
	ops, err := a.operations()
	if err != nil {
		return nil, err
	}
	if len(ops.Operations) > 0 {
		return nil, fmt.Errorf("operations pending: %+v", ops.Operations)
	}
	o, err := a.orphans()
	if err != nil {
		return nil, err
	}
	if len(o.Orphans) > 0 {
		return nil, fmt.Errorf("orphans reported: %+v", o.Orphans)
	}
	return uids, nil
}

// waitSettled waits for settled and returns the desired pods' UIDs.
func (a *agent) waitSettled(timeout time.Duration) map[string]bool {
	a.t.Helper()
	var uids map[string]bool
	eventually(a.t, timeout, "the agent to settle", func() error {
		var err error
		uids, err = a.settled()
		return err
	})
	return uids
}

// --- mounts and directories ---

// tempRoot returns a new temporary directory whose mounts are all
// unmounted (deepest first, lazily if busy) before it is removed, even when
// the test fails. Unlike mounttest.TempDir it copes with any number of
// mounts.
func tempRoot(t *testing.T) string {
	t.Helper()
	dir := mounttest.Real(t.TempDir())
	t.Cleanup(func() {
		if err := unmountAllUnder(dir); err != nil {
			t.Errorf("cleaning up mounts: %v", err)
		}
	})
	return dir
}

// unmountAllUnder unmounts everything at or below dir.
func unmountAllUnder(dir string) error {
	for range 16 {
		all, err := mounttest.ReadMounts()
		if err != nil {
			return err
		}
		var ms []mounttest.Mount
		for _, m := range all {
			if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
				ms = append(ms, m)
			}
		}
		if len(ms) == 0 {
			return nil
		}
		sort.SliceStable(ms, func(i, j int) bool {
			di, dj := strings.Count(ms[i].MountPoint, "/"), strings.Count(ms[j].MountPoint, "/")
			if di != dj {
				return di > dj
			}
			return ms[i].ID > ms[j].ID
		})
		for _, m := range ms {
			if err := syscall.Unmount(m.MountPoint, 0); err != nil {
				_ = syscall.Unmount(m.MountPoint, syscall.MNT_DETACH)
			}
		}
	}
	return fmt.Errorf("mounts left under %s", dir)
}

// mountCounts counts the mount table's entries per mount point at or below
// root: more than one is a stacked mount.
func mountCounts(t *testing.T, root string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range mounttest.MountsUnder(t, root) {
		out[m.MountPoint]++
	}
	return out
}

// checkNoStackedMounts fails for every mount point under root with more
// than one entry.
func checkNoStackedMounts(t *testing.T, counts map[string]int) {
	t.Helper()
	var stacked []string
	for p, n := range counts {
		if n > 1 {
			stacked = append(stacked, fmt.Sprintf("%s (%d)", p, n))
		}
	}
	sort.Strings(stacked)
	if len(stacked) > 0 {
		t.Errorf("stacked mounts: %v", stacked)
	}
}

func podDirs(t *testing.T, root string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "pods"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		out[e.Name()] = true
	}
	return out
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func volumeDir(root, uid, plugin, specName string) string {
	return filepath.Join(root, "pods", uid, "volumes", strings.ReplaceAll(plugin, "/", "~"), specName)
}

func globalMount(root, plugin, identity string) string {
	return filepath.Join(root, "plugins", strings.ReplaceAll(plugin, "/", "~"), "mounts", identity, "globalmount")
}

// sameMounts compares two mount tables under a root by mount ID and point:
// equal means nothing was unmounted, remounted or added.
func sameMounts(a, b []mounttest.Mount) bool {
	key := func(ms []mounttest.Mount) []string {
		var out []string
		for _, m := range ms {
			out = append(out, fmt.Sprintf("%d %s", m.ID, m.MountPoint))
		}
		sort.Strings(out)
		return out
	}
	x, y := key(a), key(b)
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

func mountPoints(ms []mounttest.Mount) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.MountPoint)
	}
	sort.Strings(out)
	return out
}

// detachLoopsUnder detaches every loop device whose backing file is below
// dir (after unmounting what is mounted from it): what a CSI driver left.
func detachLoopsUnder(t *testing.T, dir string) {
	t.Helper()
	for _, dev := range loopsUnder(t, dir) {
		t.Logf("detaching %s, left over by the CSI driver", dev)
		mounttest.DetachLoop(t, dev)
	}
}

// loopsUnder lists the loop devices whose backing file is below dir.
func loopsUnder(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		t.Errorf("losetup --list: %v", err)
		return nil
	}
	var devs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.HasPrefix(f[1], dir+"/") {
			devs = append(devs, f[0])
		}
	}
	return devs
}
