package e2e

import (
	"bufio"
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
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

// agentBinary is the volume-agent built by TestMain.
var agentBinary string

// skipReason, when set, makes every test skip.
var skipReason string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		skipReason = "the e2e tests build and run the agent; not in -short mode"
		return m.Run()
	}
	if os.Geteuid() != 0 {
		skipReason = "the e2e tests mount file systems and need root"
		return m.Run()
	}
	if bin := os.Getenv("VOLUME_AGENT_BINARY"); bin != "" {
		agentBinary = bin
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "volume-agent-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agentBinary = filepath.Join(dir, "volume-agent")
	cmd := exec.Command("go", "build", "-o", agentBinary, "github.com/volume-agent/volume-agent/cmd/volume-agent")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building volume-agent:", err)
		return 1
	}
	return m.Run()
}

const (
	// nodeName is the node every agent runs as.
	nodeName = "e2e-node"
	// startTimeout bounds how long an agent may take to become ready.
	startTimeout = 15 * time.Second
	// settleTimeout bounds how long a change may take to be reflected in
	// mounts and the debug endpoint.
	settleTimeout = 20 * time.Second
)

// requireE2E skips the test, saying why, when the e2e tests cannot run.
// Tests that prepare host paths or loop devices before newAgent call it
// first.
func requireE2E(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip("skipping: " + skipReason)
	}
}

// agent is a volume-agent process with its own root and manifest
// directories.
type agent struct {
	t *testing.T
	// Root is the agent's --root-dir, Manifests its --pod-manifest-path.
	Root, Manifests string
	labels          string
	logPath         string

	cmd        *exec.Cmd
	done       chan struct{}
	exitErr    error
	debugURL   string
	metricsURL string
	client     *http.Client
}

type agentOption func(*agent)

// withNodeLabels passes --node-labels.
func withNodeLabels(l string) agentOption { return func(a *agent) { a.labels = l } }

// newAgent prepares the directories of an agent without starting it, so
// that manifests can be written first. Whatever is mounted under the root
// directory is unmounted when the test ends, after the agent is stopped,
// even if the test fails. Create loop devices before calling it (their
// detaching must come after the agent stopped).
func newAgent(t *testing.T, opts ...agentOption) *agent {
	t.Helper()
	requireE2E(t)
	a := &agent{
		t:         t,
		Root:      mounttest.TempDir(t),
		Manifests: t.TempDir(),
		logPath:   filepath.Join(t.TempDir(), "agent.log"),
		client:    &http.Client{Timeout: 5 * time.Second},
	}
	for _, o := range opts {
		o(a)
	}
	t.Cleanup(func() {
		if t.Failed() {
			a.dumpLog()
		}
	})
	return a
}

// start runs the agent and waits for /readyz. It may be called again after
// stop (a restart on the same directories).
func (a *agent) start() {
	a.t.Helper()
	const attempts = 5
	for i := 1; ; i++ {
		err := a.launch()
		if err == nil {
			return
		}
		// Another process may take a port between picking and binding.
		if i < attempts && strings.Contains(err.Error(), "address already in use") {
			a.t.Logf("retrying start: %v", err)
			continue
		}
		a.t.Fatalf("starting volume-agent: %v", err)
	}
}

func (a *agent) launch() error {
	debugAddr, err := freeAddress()
	if err != nil {
		return err
	}
	metricsAddr, err := freeAddress()
	if err != nil {
		return err
	}
	log, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	fmt.Fprintf(log, "=== starting volume-agent (debug %s, metrics %s)\n", debugAddr, metricsAddr)
	args := []string{
		"--node-name", nodeName,
		"--root-dir", a.Root,
		"--pod-manifest-path", a.Manifests,
		"--debug-address", debugAddr,
		"--metrics-address", metricsAddr,
		"--operation-timeout", "30s",
		"--shutdown-grace-period", "10s",
		"--log-level", "debug",
	}
	if a.labels != "" {
		args = append(args, "--node-labels", a.labels)
	}
	cmd := exec.Command(agentBinary, args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Should the test binary die without running its cleanups (a -timeout
	// panic), the agent must not outlive it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return err
	}
	a.cmd, a.done, a.exitErr = cmd, make(chan struct{}), nil
	a.debugURL, a.metricsURL = "http://"+debugAddr, "http://"+metricsAddr
	done := a.done
	go func() {
		a.exitErr = cmd.Wait()
		close(done)
	}()
	a.t.Cleanup(func() {
		if err := a.stop(); err != nil {
			a.t.Errorf("stopping volume-agent: %v", err)
		}
	})

	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := a.client.Get(a.debugURL + "/readyz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return fmt.Errorf("volume-agent exited before becoming ready (%v): %s", a.exitErr, a.tail(20))
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("volume-agent not ready after %v: %s", startTimeout, a.tail(20))
		}
	}
}

// stop sends SIGTERM and waits for the agent to exit; it returns the
// process's exit error (nil for a clean exit). Stopping a stopped agent is a
// no-op.
func (a *agent) stop() error {
	if a.cmd == nil {
		return nil
	}
	select {
	case <-a.done:
		return nil
	default:
	}
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-a.done:
		return a.exitErr
	case <-time.After(20 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
		return fmt.Errorf("volume-agent (pid %d) ignored SIGTERM for 20s and was killed", a.cmd.Process.Pid)
	}
}

func (a *agent) tail(n int) string {
	b, _ := os.ReadFile(a.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (a *agent) dumpLog() {
	a.t.Logf("volume-agent log (last 150 lines):\n%s", a.tail(150))
}

func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Manifests.

// write (re)places a manifest file atomically: written under a name the
// agent ignores, then renamed, so that it never reads half a file.
func (a *agent) writeRaw(name, content string) {
	a.t.Helper()
	tmp := filepath.Join(a.Manifests, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		a.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(a.Manifests, name)); err != nil {
		a.t.Fatal(err)
	}
}

// write writes objects as a multi-document YAML manifest.
func (a *agent) write(name string, objs ...any) {
	a.t.Helper()
	var docs []string
	for _, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			a.t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	a.writeRaw(name, strings.Join(docs, "---\n"))
}

func (a *agent) remove(name string) {
	a.t.Helper()
	if err := os.Remove(filepath.Join(a.Manifests, name)); err != nil {
		a.t.Fatal(err)
	}
}

// Objects.

func newPod(name string, vols ...corev1.Volume) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
			Volumes:    vols,
		},
	}
	for _, v := range vols {
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: v.Name, MountPath: "/volumes/" + v.Name})
	}
	return p
}

func emptyDir(name string, medium corev1.StorageMedium, sizeLimit string) corev1.Volume {
	src := &corev1.EmptyDirVolumeSource{Medium: medium}
	if sizeLimit != "" {
		q := resource.MustParse(sizeLimit)
		src.SizeLimit = &q
	}
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: src}}
}

func hostPath(name, path string, typ *corev1.HostPathType) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: typ}}}
}

func claim(name, claimName string, readOnly bool) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName, ReadOnly: readOnly},
	}}
}

// localPV is a local PersistentVolume bound to the claim default/claimName,
// available on the nodes whose label key has value.
func localPV(name, path, claimName, key, value string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: path}},
			ClaimRef:               &corev1.ObjectReference{Namespace: "default", Name: claimName},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{value},
				}}}},
			}},
		},
	}
}

func newPVC(name, volumeName string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
			VolumeName:  volumeName,
		},
	}
}

func hostPathType(t corev1.HostPathType) *corev1.HostPathType { return &t }

// The debug endpoint's documents, as this test reads them: decoding its own
// copy of the JSON field names checks the wire format, not the Go types.

type podRef struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

type dswDoc struct {
	SourcesReady bool `json:"sourcesReady"`
	Volumes      []struct {
		Name     string   `json:"name"`
		Plugin   string   `json:"plugin"`
		SpecName string   `json:"specName"`
		PV       string   `json:"persistentVolume"`
		Pods     []podRef `json:"pods"`
	} `json:"volumes"`
	Pods []dswPod `json:"pods"`
}

type dswPod struct {
	podRef
	Volumes      []string `json:"volumes"`
	VolumesReady bool     `json:"volumesReady"`
	Errors       []struct {
		Volume  string `json:"volume"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"errors"`
	UnresolvedVolumes []string `json:"unresolvedVolumes"`
}

func (d *dswDoc) pod(name string) *dswPod {
	for i := range d.Pods {
		if d.Pods[i].Namespace == "default" && d.Pods[i].Name == name {
			return &d.Pods[i]
		}
	}
	return nil
}

type aswDoc struct {
	Volumes []struct {
		Name             string `json:"name"`
		Plugin           string `json:"plugin"`
		DeviceMountState string `json:"deviceMountState"`
		DeviceMountPath  string `json:"deviceMountPath"`
		Pods             []struct {
			podRef
			SpecName   string `json:"specName"`
			MountPath  string `json:"mountPath"`
			MountState string `json:"mountState"`
		} `json:"pods"`
	} `json:"volumes"`
}

type operationsDoc struct {
	Operations []struct {
		Volume    string  `json:"volume"`
		Pod       *podRef `json:"pod"`
		Operation string  `json:"operation"`
		Plugin    string  `json:"plugin"`
		State     string  `json:"state"`
		LastError string  `json:"lastError"`
	} `json:"operations"`
}

type sourcesDoc struct {
	Synced      bool `json:"synced"`
	InputErrors []struct {
		Input string `json:"input"`
		Error string `json:"error"`
	} `json:"inputErrors"`
}

type eventsDoc struct {
	Events []struct {
		Object struct {
			Kind      string `json:"kind"`
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
			UID       string `json:"uid"`
		} `json:"object"`
		Type    string `json:"type"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"events"`
}

func (a *agent) getJSON(path string, v any) error {
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
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %v", path, err)
	}
	return nil
}

func (a *agent) dsw() (*dswDoc, error) {
	var d dswDoc
	return &d, a.getJSON("/debug/dsw", &d)
}

func (a *agent) asw() (*aswDoc, error) {
	var d aswDoc
	return &d, a.getJSON("/debug/asw", &d)
}

func (a *agent) operations() (*operationsDoc, error) {
	var d operationsDoc
	return &d, a.getJSON("/debug/operations", &d)
}

func (a *agent) sources() (*sourcesDoc, error) {
	var d sourcesDoc
	return &d, a.getJSON("/debug/sources", &d)
}

func (a *agent) events() (*eventsDoc, error) {
	var d eventsDoc
	return &d, a.getJSON("/debug/events", &d)
}

// metric returns the value of an unlabelled metric.
func (a *agent) metric(name string) (float64, error) {
	resp, err := a.client.Get(a.metricsURL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("metric %s not found", name)
}

// Waiting.

// eventually polls cond until it returns nil, failing the test with cond's
// last error once timeout has passed.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting for %s: %v", timeout, what, err)
		case <-tick.C:
		}
	}
}

// waitReady waits until every named pod has all its volumes mounted and
// returns their UIDs by name.
func (a *agent) waitReady(pods ...string) map[string]string {
	a.t.Helper()
	uids := map[string]string{}
	eventually(a.t, settleTimeout, "pods "+strings.Join(pods, ", ")+" to have their volumes ready", func() error {
		d, err := a.dsw()
		if err != nil {
			return err
		}
		for _, name := range pods {
			p := d.pod(name)
			if p == nil {
				return fmt.Errorf("pod %s is not in /debug/dsw", name)
			}
			if !p.VolumesReady {
				return fmt.Errorf("pod %s: volumes not ready: %+v", name, p)
			}
			uids[name] = p.UID
		}
		return nil
	})
	return uids
}

// podUID waits for the pod to appear in /debug/dsw and returns its UID.
func (a *agent) podUID(name string) string {
	a.t.Helper()
	var uid string
	eventually(a.t, settleTimeout, "pod "+name+" in /debug/dsw", func() error {
		d, err := a.dsw()
		if err != nil {
			return err
		}
		if p := d.pod(name); p != nil {
			uid = p.UID
			return nil
		}
		return errors.New("not there")
	})
	return uid
}

// Paths.

// volumeDir is the documented place of a pod's volume.
func (a *agent) volumeDir(uid, plugin, specName string) string {
	return filepath.Join(a.Root, "pods", uid, "volumes", strings.ReplaceAll(plugin, "/", "~"), specName)
}

func (a *agent) globalMount(plugin, pv string) string {
	return filepath.Join(a.Root, "plugins", strings.ReplaceAll(plugin, "/", "~"), "mounts", pv, "globalmount")
}

const (
	emptyDirPlugin = "kubernetes.io/empty-dir"
	hostPathPlugin = "kubernetes.io/host-path"
	localPlugin    = "kubernetes.io/local-volume"
)

// podDirs lists the entries of <root>/pods.
func (a *agent) podDirs() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(a.Root, "pods"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) ([]mounttest.Mount, error) {
	all, err := mounttest.ReadMounts()
	if err != nil {
		return nil, err
	}
	var out []mounttest.Mount
	for _, m := range all {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			out = append(out, m)
		}
	}
	return out, nil
}

func mountPoints(ms []mounttest.Mount) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.MountPoint)
	}
	return out
}

// noMountsUnder fails (as a condition) while anything is mounted at or
// below dir.
func noMountsUnder(dir string) error {
	ms, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(ms) > 0 {
		return fmt.Errorf("still mounted: %v", mountPoints(ms))
	}
	return nil
}

// mountAt returns the one mount at path, or an error.
func mountAt(path string) (mounttest.Mount, error) {
	all, err := mounttest.ReadMounts()
	if err != nil {
		return mounttest.Mount{}, err
	}
	var found []mounttest.Mount
	for _, m := range all {
		if m.MountPoint == path {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		return mounttest.Mount{}, fmt.Errorf("%d mounts at %s, want 1", len(found), path)
	}
	return found[0], nil
}

// sameFile reports whether two paths are the same inode.
func sameFile(a, b string) (bool, error) {
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := syscall.Stat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// devNumbers returns the major and minor numbers of a device node.
func devNumbers(t *testing.T, dev string) (int, int) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	return int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev))
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
