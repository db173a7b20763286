package nokubelet_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// env is one test's world: a Node, a namespace, the agent's root
// directory, a short directory for sockets, and the logs.
type env struct {
	t    *testing.T
	node string
	ns   string
	root string // the agent's --root-dir
	sock string // sockets: a short path (sun_path holds 108 bytes)
	logs string
}

// newEnv skips the test if the suite is not set up, makes the test's
// directories, and creates the Node <name>-node (labelled
// kubernetes.io/hostname, as cluster.CreateNode does; the attach/detach
// controller needs the Node object) and the namespace <name>.
//
// Cleanups run in reverse order: whatever the test starts later (agent,
// driver, sidecars) stops first, the driver's loop devices are detached
// after it stopped, and last everything under the root is unmounted.
func newEnv(t *testing.T, name string) *env {
	t.Helper()
	suite.Require(t)
	name = e2eutil.UniqueName(name)
	e := &env{t: t, node: name + "-node", ns: name, logs: t.TempDir(), root: mounttest.TempDir(t)}
	sock, err := os.MkdirTemp("", "nokubelet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	e.sock = sock
	suite.CreateNodeAndNamespace(t, e.node, e.ns, nil)
	return e
}

// attachmentName is the VolumeAttachment name the attach/detach controller
// (and the kubelet) use: csi-<sha256(handle + driver + node)>.
func attachmentName(handle, driver, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

// claim returns the claim, failing the test if it cannot be read.
func (e *env) claim(ctx context.Context, name string) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	pvc, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get PVC %s: %v", name, err)
	}
	return pvc
}

// resizeConditions are the claim conditions that say a resize is under
// way or failed; the kubelet's MarkFSResizeFinished removes them all once
// the node has grown the volume.
var resizeConditions = []corev1.PersistentVolumeClaimConditionType{
	corev1.PersistentVolumeClaimResizing,
	corev1.PersistentVolumeClaimFileSystemResizePending,
	corev1.PersistentVolumeClaimControllerResizeError,
	corev1.PersistentVolumeClaimNodeResizeError,
}

// describeClaimStatus is a claim's status in one line, for messages.
func describeClaimStatus(pvc *corev1.PersistentVolumeClaim) string {
	s := pvc.Status
	capacity := s.Capacity[corev1.ResourceStorage]
	var conds []string
	for _, c := range s.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s(%q)", c.Type, c.Status, c.Message))
	}
	return fmt.Sprintf("phase %s, capacity %s, allocatedResourceStatuses %v, conditions %v", s.Phase, capacity.String(), s.AllocatedResourceStatuses, conds)
}

// leftResizeState returns what of a resize the claim's status still
// carries: resize conditions and the storage entry of
// allocatedResourceStatuses.
func leftResizeState(pvc *corev1.PersistentVolumeClaim) []string {
	var left []string
	for _, c := range pvc.Status.Conditions {
		for _, rc := range resizeConditions {
			if c.Type == rc {
				left = append(left, fmt.Sprintf("condition %s=%s", c.Type, c.Status))
			}
		}
	}
	if st, ok := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; ok {
		left = append(left, "allocatedResourceStatuses[storage]="+string(st))
	}
	return left
}

// quantity is a storage size for messages and comparisons.
func quantity(s string) resource.Quantity { return resource.MustParse(s) }

// xfsFromLoop checks that path is an xfs filesystem of a loop device.
func xfsFromLoop(t *testing.T, path string) {
	t.Helper()
	ms := mounttest.MountsAt(t, path)
	if len(ms) == 0 {
		t.Fatalf("%s is not mounted", path)
	}
	if m := ms[len(ms)-1]; m.FSType != "xfs" || !strings.HasPrefix(m.Source, "/dev/loop") {
		t.Fatalf("%s: %s from %s, want xfs from a loop device", path, m.FSType, m.Source)
	}
}

// waitMounted waits until every path is a mount point.
func (e *env) waitMounted(timeout time.Duration, paths ...string) {
	e.t.Helper()
	e2eutil.WaitMounted(e.t, timeout, paths...)
}

// waitGone waits until nothing is mounted at or under any path and the
// paths no longer exist.
func (e *env) waitGone(timeout time.Duration, paths ...string) {
	e.t.Helper()
	e2eutil.WaitGone(e.t, timeout, paths...)
}

// steps times the steps of a flow and logs them as a table when the test
// ends, with the step it failed in, if it did.
type steps struct {
	t       *testing.T
	done    []stepTime
	current string
}

type stepTime struct {
	name string
	took time.Duration
}

func newSteps(t *testing.T) *steps {
	s := &steps{t: t}
	t.Cleanup(s.report)
	return s
}

// run runs one step and records how long it took.
func (s *steps) run(name string, f func()) {
	s.t.Helper()
	s.current = name
	start := time.Now()
	f()
	s.record(name, time.Since(start))
	s.current = ""
}

// record records a duration measured otherwise (across several steps).
func (s *steps) record(name string, took time.Duration) {
	s.done = append(s.done, stepTime{name, took})
}

func (s *steps) report() {
	var b strings.Builder
	width := len("step")
	for _, st := range s.done {
		width = max(width, len(st.name))
	}
	fmt.Fprintf(&b, "%-*s  %10s\n", width, "step", "took")
	for _, st := range s.done {
		fmt.Fprintf(&b, "%-*s  %10s\n", width, st.name, st.took.Round(time.Millisecond))
	}
	if s.current != "" {
		fmt.Fprintf(&b, "%-*s  %10s\n", width, s.current, "FAILED")
	}
	s.t.Logf("step timings:\n%s", b.String())
}

// shortPath keeps a socket path within sun_path's 108 bytes.
func shortPath(t *testing.T, path string) string {
	t.Helper()
	if len(path) >= 108 {
		t.Fatalf("socket path %s is %d bytes, more than a unix socket's 107", path, len(path))
	}
	return filepath.Clean(path)
}

// Who did what, by the API server's audit log: the components' users
// (kube-controller-manager's controllers run as service accounts of their
// own) or, for the sidecars (which run as the administrator), their user
// agent's program name.
const (
	attachDetachController = "system:serviceaccount:kube-system:attachdetach-controller"
)

// waitWrittenBy waits until the audit log shows the API server accepting
// verb on the object (resource, optional subresource, name; any namespace)
// from the component: a user name, or a program in the user agent
// (csi-attacher...). So a step is proven to be the work of the component
// that should do it, not of another (the agent, or a test).
func waitWrittenBy(t *testing.T, verb, resource, subresource, name, component string) {
	t.Helper()
	e2eutil.Poll(t, 10*time.Second, fmt.Sprintf("%s %s/%s %s by %s in the audit log", verb, resource, subresource, name, component), func(context.Context) (bool, string) {
		evs, err := suite.Cluster.AuditEvents()
		if err != nil {
			return false, err.Error()
		}
		var others []string
		for _, e := range evs {
			o := e.ObjectRef
			if e.Stage != cluster.StageResponseComplete || e.Verb != verb || o == nil || o.Resource != resource || o.Subresource != subresource || o.Name != name ||
				e.ResponseStatus == nil || e.ResponseStatus.Code >= 300 {
				continue
			}
			if e.User.Username == component || strings.HasPrefix(e.UserAgent, component+"/") {
				return true, ""
			}
			others = append(others, e.User.Username+" ("+e.UserAgent+")")
		}
		return false, fmt.Sprintf("done by %q", others)
	})
}
