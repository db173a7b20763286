package expansion_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
)

// spawn runs f on one OS thread that never exits. Agents and drivers are
// started with Pdeathsig=SIGKILL so that they die with the test binary even
// when a panic or `go test -timeout` skips every cleanup; Linux sends the
// signal when the thread that forked the child exits, so all forks happen on
// this thread.
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

// proc is a child process of a test (agent or driver) whose output goes to
// a log file.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has been reaped
	waitErr error
	once    sync.Once
}

func startProc(name, logPath, bin string, args ...string) (*proc, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	p := &proc{name: name, logPath: logPath, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	spawn(func() { err = p.cmd.Start() })
	if err != nil {
		return nil, err
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process (by its PID) and waits for it to exit,
// SIGKILL after 30 s. It reports a failure to exit cleanly.
func (p *proc) stop(t *testing.T) {
	p.once.Do(func() {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.done
				t.Errorf("%s did not stop within 30s of SIGTERM", p.name)
			}
		}
		if p.waitErr != nil {
			t.Errorf("%s exited with %v", p.name, p.waitErr)
		}
		if log, err := os.ReadFile(p.logPath); err == nil && bytes.Contains(log, []byte("WARNING: DATA RACE")) {
			t.Errorf("the race detector found a data race in %s; log in %s", p.name, p.logPath)
		}
		if t.Failed() {
			t.Logf("--- last lines of the log of %s ---\n%s", p.name, tail(p.logPath, 60))
		}
		if dir := os.Getenv("VOLUME_AGENT_E2E_LOG_DIR"); dir != "" {
			if data, err := os.ReadFile(p.logPath); err == nil {
				_ = os.MkdirAll(dir, 0o755)
				_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", strings.ReplaceAll(p.name, " ", "-"), p.cmd.Process.Pid)), data, 0o644)
			}
		}
	})
}

// agent is one volume-agent process of a test.
type agent struct {
	*proc
	node     string
	debugURL string
}

// startAgent starts an agent for node on root (cluster mode, as the deploy/
// ServiceAccount) and waits until it is ready. SIGTERM stops it when the
// test ends; register the unmount of root before (newEnv does).
func startAgent(t *testing.T, node, root string, extraArgs ...string) *agent {
	t.Helper()
	var lastErr error
	for range 3 { // the ports are free when chosen, but may be taken before the agent binds them
		a, err := tryStartAgent(t, node, root, extraArgs)
		if err == nil {
			return a
		}
		lastErr = err
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	t.Fatalf("starting the agent: %v", lastErr)
	return nil
}

func tryStartAgent(t *testing.T, node, root string, extraArgs []string) (*agent, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	debugAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	args := append([]string{
		"--kubeconfig=" + suite.kubeconfig,
		"--node-name=" + node,
		"--root-dir=" + root,
		"--debug-address=" + debugAddr,
		fmt.Sprintf("--metrics-address=127.0.0.1:%d", ports[1]),
		"--shutdown-grace-period=10s",
	}, extraArgs...)
	p, err := startProc("agent "+node, filepath.Join(t.TempDir(), "agent.log"), suite.agentBin, args...)
	if err != nil {
		return nil, err
	}
	a := &agent{proc: p, node: node, debugURL: "http://" + debugAddr}
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if a.exited() {
			return nil, fmt.Errorf("agent exited during start-up (%v):\n%s", a.waitErr, tail(a.logPath, 20))
		}
		if resp, err := client.Get(a.debugURL + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("agent for node %s ready (pid %d, root %s, log %s)", node, a.cmd.Process.Pid, root, a.logPath)
				t.Cleanup(func() { a.stop(t) })
				return a, nil
			}
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
			<-a.done
			return nil, fmt.Errorf("agent not ready after 60s:\n%s", tail(a.logPath, 20))
		}
		select {
		case <-a.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// getJSON decodes one of the agent's debug documents.
func (a *agent) getJSON(path string, into any) error {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(a.debugURL + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

// aswVolume is the part of a /debug/asw volume the tests read.
type aswVolume struct {
	Name             string `json:"name"`
	DeviceMountState string `json:"deviceMountState"`
	DeviceMountPath  string `json:"deviceMountPath"`
	Size             string `json:"size"`
	ResizeBlocked    string `json:"resizeBlocked"`
	Pods             []struct {
		UID        string `json:"uid"`
		MountState string `json:"mountState"`
		MountPath  string `json:"mountPath"`
	} `json:"pods"`
}

// volume returns the volume's entry in /debug/asw, nil if there is none.
func (a *agent) volume(t *testing.T, name string) *aswVolume {
	t.Helper()
	var doc struct {
		Volumes []aswVolume `json:"volumes"`
	}
	if err := a.getJSON("/debug/asw", &doc); err != nil {
		t.Fatalf("agent for node %s: %v", a.node, err)
	}
	for i := range doc.Volumes {
		if doc.Volumes[i].Name == name {
			return &doc.Volumes[i]
		}
	}
	return nil
}

// desiredSize returns the volume's desiredSize in /debug/dsw ("" if none
// or if the volume is not desired).
func (a *agent) desiredSize(t *testing.T, name string) string {
	t.Helper()
	var doc struct {
		Volumes []struct {
			Name        string `json:"name"`
			DesiredSize string `json:"desiredSize"`
		} `json:"volumes"`
	}
	if err := a.getJSON("/debug/dsw", &doc); err != nil {
		t.Fatalf("agent for node %s: %v", a.node, err)
	}
	for _, v := range doc.Volumes {
		if v.Name == name {
			return v.DesiredSize
		}
	}
	return ""
}

// podMountPath waits until the pod has the volume mounted (per the agent
// and per the mount table) and returns the mount's path.
func (e *env) podMountPath(volName string, uid types.UID) string {
	e.t.Helper()
	var path string
	eventually(e.t, 60*time.Second, fmt.Sprintf("volume %s mounted for pod %s", volName, uid), func(context.Context) (bool, string) {
		v := e.agent.volume(e.t, volName)
		if v == nil {
			return false, "volume not in /debug/asw"
		}
		for _, p := range v.Pods {
			if p.UID == string(uid) && p.MountState == "Mounted" {
				if len(mounttest.MountsAt(e.t, p.MountPath)) == 0 {
					return false, p.MountPath + " is not a mount point"
				}
				path = p.MountPath
				return true, ""
			}
		}
		return false, fmt.Sprintf("pods: %+v", v.Pods)
	})
	return path
}

func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // only after all are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
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

// eventually calls cond every 100 ms until it reports done, failing the test
// after timeout with cond's last explanation.
func eventually(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	last := ""
	for {
		done, why := cond(ctx)
		if done {
			return
		}
		last = why
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not after %v: %s", what, timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// consistently calls cond every 100 ms for the whole period and fails the
// test the first time it does not hold. It is for what must not happen:
// the period is how long the test watches for it, never a wait for
// something to be done.
func consistently(t *testing.T, period time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), period)
	defer cancel()
	for {
		if ok, why := cond(ctx); !ok {
			t.Fatalf("%s: broken: %s", what, why)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// env is one test's world: a Node, a namespace, a root directory, a data
// directory and, once started, an agent.
type env struct {
	t     *testing.T
	node  string
	ns    string
	root  string
	data  string
	agent *agent
}

// newEnv skips the test if the suite is not set up, and creates the Node
// <name>-node (labelled kubernetes.io/hostname) and the namespace <name>,
// waiting for its default ServiceAccount (Pods cannot be created before).
func newEnv(t *testing.T, name string) *env {
	t.Helper()
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	// data first: cleanups run in reverse, so it is removed only after the
	// agent has stopped and everything under the root is unmounted.
	data := t.TempDir()
	e := &env{t: t, node: name + "-node", ns: name, data: data, root: mounttest.TempDir(t)}
	ctx := t.Context()
	if _, err := suite.cluster.CreateNode(ctx, e.node, nil); err != nil {
		t.Fatalf("create node: %v", err)
	}
	if _, err := suite.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	eventually(t, 30*time.Second, "the namespace's default ServiceAccount", func(ctx context.Context) (bool, string) {
		_, err := suite.admin.CoreV1().ServiceAccounts(e.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	return e
}

// start starts the test's agent.
func (e *env) start(extraArgs ...string) *agent {
	e.t.Helper()
	e.agent = startAgent(e.t, e.node, e.root, extraArgs...)
	return e.agent
}

// pod returns a pod on the test's node whose one container mounts the claim
// at /data (the agent only mounts volumes some container uses).
func (e *env) pod(name, claim string, readOnly bool) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{
			NodeName:                     e.node,
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data", ReadOnly: readOnly}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: readOnly},
			}}},
		},
	}
}

func (e *env) createPod(name, claim string, readOnly bool) *corev1.Pod {
	e.t.Helper()
	got, err := suite.admin.CoreV1().Pods(e.ns).Create(e.t.Context(), e.pod(name, claim, readOnly), metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create pod %s: %v", name, err)
	}
	return got
}

// deletePod deletes the pod at once (grace period 0: the object is gone)
// and waits until the agent has torn it down.
func (e *env) deletePod(pod *corev1.Pod) {
	e.t.Helper()
	if err := suite.admin.CoreV1().Pods(e.ns).Delete(e.t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		e.t.Fatalf("delete pod %s: %v", pod.Name, err)
	}
	dir := filepath.Join(e.root, "pods", string(pod.UID))
	eventually(e.t, 60*time.Second, "pod "+pod.Name+" torn down", func(context.Context) (bool, string) {
		if n := len(mounttest.MountsUnder(e.t, dir)); n > 0 {
			return false, fmt.Sprintf("%d mounts left under %s", n, dir)
		}
		if _, err := os.Lstat(dir); err == nil {
			return false, dir + " still exists"
		}
		return true, ""
	})
}

// pvName is a cluster-wide unique PV name for this test.
func (e *env) pvName(name string) string { return e.ns + "-" + name }

// createPV creates the PV with the test's class, pre-bound to the claim
// ns/claim (so that no other test's claim gets it; the binder still binds).
func (e *env) createPV(pv *corev1.PersistentVolume, claim string) *corev1.PersistentVolume {
	e.t.Helper()
	pv.Spec.StorageClassName = storageClass
	pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: e.ns, Name: claim}
	got, err := suite.admin.CoreV1().PersistentVolumes().Create(e.t.Context(), pv, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create PV %s: %v", pv.Name, err)
	}
	return got
}

// createLocalPV creates a local PV on the block device dev (formatted with
// fsType by the agent) with node affinity to the test's node.
func (e *env) createLocalPV(name, claim, dev, fsType, size string) *corev1.PersistentVolume {
	e.t.Helper()
	return e.createPV(&corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: e.pvName(name)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dev, FSType: ptr.To(fsType)}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{e.node}}},
			}}}},
		},
	}, claim)
}

// createClaim creates a claim of the test's class and waits until the
// binder has bound it to pv.
func (e *env) createClaim(name, size, pv string) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(storageClass),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if _, err := suite.admin.CoreV1().PersistentVolumeClaims(e.ns).Create(e.t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PVC %s: %v", name, err)
	}
	var got *corev1.PersistentVolumeClaim
	eventually(e.t, 60*time.Second, "PVC "+name+" bound to "+pv, func(ctx context.Context) (bool, string) {
		var err error
		got, err = suite.admin.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == corev1.ClaimBound && got.Spec.VolumeName == pv,
			fmt.Sprintf("phase %s, volume %q", got.Status.Phase, got.Spec.VolumeName)
	})
	return got
}

func (e *env) claim(name string) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	pvc, err := suite.admin.CoreV1().PersistentVolumeClaims(e.ns).Get(e.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get PVC %s: %v", name, err)
	}
	return pvc
}

// patchPVCapacity sets the PV's capacity, as the resize controller does
// once the storage grew (or as an administrator might, wrongly, to shrink).
func (e *env) patchPVCapacity(pv, size string) {
	e.t.Helper()
	patch := fmt.Sprintf(`{"spec":{"capacity":{"storage":%q}}}`, size)
	if _, err := suite.admin.CoreV1().PersistentVolumes().Patch(e.t.Context(), pv, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("patch capacity of PV %s: %v", pv, err)
	}
}

// playResizer does what a user and the external-resizer (v1.34+, with
// RecoverVolumeExpansionFailure) do to grow a claim once the storage itself
// can be bigger: the user raises the request; the resizer records the new
// size in the claim's status.allocatedResources with
// ControllerResizeInProgress (and a Resizing condition), expands the
// storage (the caller did), sets the PV's capacity, and finally marks the
// claim NodeResizePending with the FileSystemResizePending condition.
//
// The order matters: between the PV's new capacity and NodeResizePending the
// claim must already carry allocatedResources, or the node would take the
// claim for one of an old controller (no allocatedResources: the PV's
// capacity above the claim's capacity means "expand") and race the
// resizer's last patch.
func (e *env) playResizer(claim, pv, size string) {
	e.t.Helper()
	ctx := e.t.Context()
	pvcs := suite.admin.CoreV1().PersistentVolumeClaims(e.ns)
	now := time.Now().UTC().Format(time.RFC3339)
	spec := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, size)
	if _, err := pvcs.Patch(ctx, claim, types.StrategicMergePatchType, []byte(spec), metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("raise the request of PVC %s: %v", claim, err)
	}
	controller := fmt.Sprintf(`{"status":{"allocatedResources":{"storage":%q},"allocatedResourceStatuses":{"storage":"ControllerResizeInProgress"},`+
		`"conditions":[{"type":"Resizing","status":"True","lastTransitionTime":%q}]}}`, size, now)
	if _, err := pvcs.Patch(ctx, claim, types.StrategicMergePatchType, []byte(controller), metav1.PatchOptions{}, "status"); err != nil {
		e.t.Fatalf("mark PVC %s ControllerResizeInProgress: %v", claim, err)
	}
	e.patchPVCapacity(pv, size)
	node := fmt.Sprintf(`{"status":{"allocatedResourceStatuses":{"storage":"NodeResizePending"},`+
		`"conditions":[{"type":"Resizing","$patch":"delete"},{"type":"FileSystemResizePending","status":"True","lastTransitionTime":%q,`+
		`"message":"Waiting for user to (re-)start a pod to finish file system resize of volume on node."}]}}`, now)
	if _, err := pvcs.Patch(ctx, claim, types.StrategicMergePatchType, []byte(node), metav1.PatchOptions{}, "status"); err != nil {
		e.t.Fatalf("mark PVC %s NodeResizePending: %v", claim, err)
	}
	e.t.Logf("played the resizer: PV %s and PVC %s at %s, node expansion pending", pv, claim, size)
}

func pvcCondition(pvc *corev1.PersistentVolumeClaim, typ corev1.PersistentVolumeClaimConditionType) *corev1.PersistentVolumeClaimCondition {
	for i := range pvc.Status.Conditions {
		if pvc.Status.Conditions[i].Type == typ {
			return &pvc.Status.Conditions[i]
		}
	}
	return nil
}

func describeClaimStatus(pvc *corev1.PersistentVolumeClaim) string {
	s := pvc.Status
	capacity := s.Capacity[corev1.ResourceStorage]
	var conds []string
	for _, c := range s.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s(%q)", c.Type, c.Status, c.Message))
	}
	return fmt.Sprintf("capacity %s, allocatedResourceStatuses %v, conditions %v", capacity.String(), s.AllocatedResourceStatuses, conds)
}

// waitClaimExpanded waits until the node has reported the expansion on the
// claim: the capacity is size, the storage status and the resize conditions
// are gone.
func (e *env) waitClaimExpanded(claim, size string) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	var pvc *corev1.PersistentVolumeClaim
	eventually(e.t, 60*time.Second, fmt.Sprintf("PVC %s status: expanded to %s", claim, size), func(context.Context) (bool, string) {
		pvc = e.claim(claim)
		c := pvc.Status.Capacity[corev1.ResourceStorage]
		_, hasStatus := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
		done := c.Cmp(resource.MustParse(size)) == 0 && !hasStatus &&
			pvcCondition(pvc, corev1.PersistentVolumeClaimFileSystemResizePending) == nil &&
			pvcCondition(pvc, corev1.PersistentVolumeClaimNodeResizeError) == nil &&
			pvcCondition(pvc, corev1.PersistentVolumeClaimResizing) == nil
		return done, describeClaimStatus(pvc)
	})
	e.t.Logf("PVC %s: %s", claim, describeClaimStatus(pvc))
	return pvc
}

// findEvent returns the events about the object (kind, name) with the
// reason whose message contains every string.
func (e *env) findEvents(ctx context.Context, kind, name, reason string, contains ...string) ([]corev1.Event, []string, error) {
	list, err := suite.admin.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}.String(),
	})
	if err != nil {
		return nil, nil, err
	}
	var found []corev1.Event
	var seen []string
next:
	for _, ev := range list.Items {
		seen = append(seen, fmt.Sprintf("%s %s (count %d)", ev.Type, ev.Message, ev.Count))
		for _, s := range contains {
			if !strings.Contains(ev.Message, s) {
				continue next
			}
		}
		found = append(found, ev)
	}
	return found, seen, nil
}

// waitEvent waits for an event from the agent on the object with the
// reason whose message contains every string, and returns it.
func (e *env) waitEvent(kind, name, eventType, reason string, contains ...string) corev1.Event {
	e.t.Helper()
	var ev corev1.Event
	eventually(e.t, 60*time.Second, fmt.Sprintf("a %s %s event on %s %s containing %q", eventType, reason, kind, name, contains), func(ctx context.Context) (bool, string) {
		found, seen, err := e.findEvents(ctx, kind, name, reason, contains...)
		if err != nil {
			return false, err.Error()
		}
		for _, f := range found {
			if f.Type == eventType && f.Source.Component == "volume-agent" && f.Source.Host == e.node {
				ev = f
				return true, ""
			}
		}
		return false, fmt.Sprintf("events: %q", seen)
	})
	e.t.Logf("event on %s %s: %s %s: %s", kind, name, ev.Type, ev.Reason, ev.Message)
	return ev
}

// noEvent fails the test if the object has an event with the reason.
func (e *env) noEvent(kind, name, reason string) {
	e.t.Helper()
	found, _, err := e.findEvents(e.t.Context(), kind, name, reason)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, ev := range found {
		e.t.Errorf("unexpected %s event on %s %s: %s", reason, kind, name, ev.Message)
	}
}

// fsBytes is the size statfs reports for the filesystem at path.
func fsBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatalf("statfs %s: %v", path, err)
	}
	return int64(st.Blocks) * st.Bsize
}

// grownTo reports whether a filesystem of before bytes on a device of
// oldDevice bytes has grown with its device to newDevice bytes: gained at
// least 85% of what the device gained (metadata takes the rest: ext4 gains
// about 93%, xfs all of it) and is no larger than the device.
func grownTo(now, before, oldDevice, newDevice int64) bool {
	return now-before >= (newDevice-oldDevice)*85/100 && now <= newDevice
}

const mib = 1 << 20

// newLoop attaches a new sparse file of size bytes in the test's data
// directory to a loop device. When the test ends (after the agent has
// stopped) everything mounted from the device is unmounted and the device is
// detached.
func (e *env) newLoop(size int64) (dev, backing string) {
	e.t.Helper()
	f, err := os.CreateTemp(e.data, "disk-*.img")
	if err != nil {
		e.t.Fatal(err)
	}
	backing = f.Name()
	err = errors.Join(f.Truncate(size), f.Close())
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", backing).CombinedOutput()
	if err != nil {
		e.t.Fatalf("losetup -f --show %s: %v: %s", backing, err, out)
	}
	dev = strings.TrimSpace(string(out))
	e.t.Cleanup(func() { mounttest.DetachLoop(e.t, dev) })
	return dev, backing
}

// growLoop grows the backing file and makes the loop device see it, as a
// storage backend grows a disk.
func growLoop(t *testing.T, dev, backing string, size int64) {
	t.Helper()
	if err := os.Truncate(backing, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "-c", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup -c %s: %v: %s", dev, err, out)
	}
}

// deviceMounted reports whether anything is mounted from the block device.
func deviceMounted(t *testing.T, dev string) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	maj, min := int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev))
	for _, m := range mounttest.Mounts(t) {
		if m.Major == maj && m.Minor == min {
			return true
		}
	}
	return false
}

var onlineExt4 struct {
	once    sync.Once
	refused string // why the kernel refuses to grow a mounted ext4; "" if it does not
}

// onlineExt4Refused finds out, once, by trying on a scratch loop device,
// whether this kernel lets resize2fs grow a mounted ext4 filesystem (it
// needs CAP_SYS_RESOURCE, which sandboxes may lack), and if not, why.
func onlineExt4Refused(t *testing.T) string {
	t.Helper()
	onlineExt4.once.Do(func() {
		dir := mounttest.TempDir(t)
		img := filepath.Join(dir, "scratch.img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, 32*mib); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("losetup", "-f", "--show", img).CombinedOutput()
		if err != nil {
			t.Fatalf("losetup: %v: %s", err, out)
		}
		dev := strings.TrimSpace(string(out))
		defer mounttest.DetachLoop(t, dev)
		mnt := filepath.Join(dir, "mnt")
		if err := os.Mkdir(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		mounttest.Mkfs(t, "ext4", dev)
		if out, err := exec.Command("mount", "-t", "ext4", dev, mnt).CombinedOutput(); err != nil {
			t.Fatalf("mount: %v: %s", err, out)
		}
		defer func() { _ = mounttest.UnmountUnder(mnt) }()
		growLoop(t, dev, img, 64*mib)
		if out, err := exec.Command("resize2fs", dev).CombinedOutput(); err != nil {
			onlineExt4.refused = fmt.Sprintf("resize2fs %s (mounted): %v: %s", dev, err, strings.TrimSpace(string(out)))
		}
	})
	return onlineExt4.refused
}

// requireTools skips the test unless every tool is installed.
func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s is not installed", tool)
		}
	}
}
