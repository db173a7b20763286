package csi_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// storageClass is set on every PV and PVC; no StorageClass object exists,
// so the binder binds statically and never provisions.
const storageClass = "manual"

// env is one test's world: a Node, a namespace, directories and, once
// started, an agent and drivers.
type env struct {
	t     *testing.T
	node  string
	ns    string
	root  string // the agent's --root-dir
	data  string // driver state directories (backing files)
	sock  string // sockets: a short path (sun_path holds 108 bytes)
	logs  string
	agent *e2eutil.Agent
}

// newEnv skips the test if the suite is not set up, makes the test's
// directories, and creates the Node <name>-node and the namespace <name>.
//
// Cleanups run in reverse order: processes started later (agent, drivers)
// stop first, and the loop devices of each driver are detached after it
// stopped (a test that ends cleanly has none: that is an error); then
// everything under the root is unmounted.
func newEnv(t *testing.T, name string) *env {
	t.Helper()
	suite.Require(t)
	name = e2eutil.UniqueName(name)
	e := &env{t: t, node: name + "-node", ns: name, logs: t.TempDir(), data: mounttest.Real(t.TempDir())}
	mounttest.CleanupMounts(t, e.data)
	e.root = mounttest.TempDir(t)
	sock, err := os.MkdirTemp("", "csie2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	e.sock = sock
	suite.CreateNodeAndNamespace(t, e.node, e.ns, nil)
	return e
}

// agentOptions are the flags a test varies.
type agentOptions struct {
	kubeconfig string // default: deploy/'s ServiceAccount
	args       []string
}

// startAgent starts an agent for the env's node and root (cluster mode)
// and waits until it is ready. It is stopped with SIGTERM when the test
// ends, before the root is unmounted.
func (e *env) startAgent(o agentOptions) *e2eutil.Agent {
	e.t.Helper()
	kubeconfig := o.kubeconfig
	if kubeconfig == "" {
		kubeconfig = suite.Kubeconfig
	}
	e.agent = e2eutil.StartAgent(e.t, e2eutil.AgentOptions{
		Binary: suite.AgentBin, Kubeconfig: kubeconfig, Node: e.node, Root: e.root, LogDir: e.logs,
		Args: append([]string{"--shutdown-grace-period=10s"}, o.args...),
	})
	return e.agent
}

// --- API objects ---

// pvName is a cluster-wide unique PV name for this test.
func (e *env) pvName(name string) string { return e.ns + "-" + name }

// csiVolume is a CSI volume with a PV and a claim bound to it.
type csiVolume struct {
	driver *csiDriver
	handle string
	pv     string
	claim  string
}

// uniqueName is the agent's name of the volume.
func (v csiVolume) uniqueName() string {
	return e2eutil.CSIPlugin + "/" + v.driver.name + "^" + v.handle
}

// claimPV creates a volume through the driver, a PV with spec.csi for it
// (pre-bound to a claim of the same name, so the binder cannot give it to
// another test) and the claim, and waits until the binder has bound them.
func (e *env) claimPV(d *csiDriver, name string, mutate ...func(*corev1.PersistentVolume)) csiVolume {
	e.t.Helper()
	v := csiVolume{driver: d, handle: d.CreateVolume(e.ns+"-"+name, 32<<20, "ext4"), pv: e.pvName(name), claim: name}
	pv := e2eutil.PreBoundPV(v.pv, "32Mi", storageClass, e.ns, name, corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
		Driver: d.name, VolumeHandle: v.handle, FSType: "ext4",
		VolumeAttributes: map[string]string{"test": e.ns},
	}})
	for _, m := range mutate {
		m(pv)
	}
	ctx := e.t.Context()
	if _, err := suite.Admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PV %s: %v", v.pv, err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(storageClass),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")}},
		},
	}
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PVC %s: %v", name, err)
	}
	suite.WaitBound(e.t, e.ns, name, v.pv)
	return v
}

// pod returns a pod on the test's node whose one container mounts every
// volume.
func (e *env) pod(name string, vols ...corev1.Volume) *corev1.Pod {
	return e2eutil.Pod(e.ns, e.node, name, vols...)
}

func (e *env) createPod(pod *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	return suite.CreatePod(e.t, pod)
}

// deletePod deletes a pod at once (there is no kubelet to wait for).
func (e *env) deletePod(name string) {
	e.t.Helper()
	if err := suite.Admin.CoreV1().Pods(e.ns).Delete(e.t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		e.t.Fatalf("delete pod %s: %v", name, err)
	}
}

// waitEvent waits for an event on the pod with the reason whose message
// contains every one of the given strings, and returns it.
func (e *env) waitEvent(pod, reason string, contains ...string) *corev1.Event {
	e.t.Helper()
	return suite.WaitEvent(e.t, e.ns, fields.Set{"involvedObject.name": pod, "reason": reason}, nil, contains...)
}

// --- paths and mounts ---

// publishPath is where the agent publishes a CSI volume for a pod: the PV
// name for PVs, the pod's volume name for inline volumes.
func (e *env) publishPath(uid types.UID, specName string) string {
	return e2eutil.VolumeDir(e.root, string(uid), e2eutil.CSIPlugin, specName)
}

// stagingPath is where the agent stages a CSI PV (driver^handle is safe as
// one path element for the test driver's names and IDs).
func (e *env) stagingPath(v csiVolume) string {
	return e2eutil.GlobalMount(e.root, e2eutil.CSIPlugin, v.driver.name+"^"+v.handle)
}

func (e *env) podDir(uid types.UID) string { return e2eutil.PodDir(e.root, string(uid)) }

// mountAt returns the mount at path, if there is one.
func mountAt(t *testing.T, path string) (mounttest.Mount, bool) {
	t.Helper()
	ms := mounttest.MountsAt(t, path)
	if len(ms) == 0 {
		return mounttest.Mount{}, false
	}
	return ms[len(ms)-1], true
}

// waitMounted waits until every path is a mount point.
func (e *env) waitMounted(paths ...string) {
	e.t.Helper()
	e2eutil.Poll(e.t, 60*time.Second, "mounted", func(context.Context) (bool, string) {
		for _, p := range paths {
			if _, ok := mountAt(e.t, p); !ok {
				return false, p + " is not a mount point"
			}
		}
		return true, ""
	})
}

// waitGone waits until nothing is mounted at or under any path and the
// paths no longer exist.
func (e *env) waitGone(paths ...string) {
	e.t.Helper()
	e2eutil.WaitGone(e.t, 60*time.Second, paths...)
}

// checkExt4FromLoop checks that path is an ext4 filesystem of a loop
// device and returns the mount.
func checkExt4FromLoop(t *testing.T, path string) mounttest.Mount {
	t.Helper()
	m, ok := mountAt(t, path)
	if !ok {
		t.Fatalf("%s is not mounted", path)
	}
	if m.FSType != "ext4" || !strings.HasPrefix(m.Source, "/dev/loop") {
		t.Fatalf("%s: %s from %s, want ext4 from a loop device", path, m.FSType, m.Source)
	}
	return m
}

// inlineHandle is the volume ID the kubelet (and the agent) gives an inline
// volume: csi-<sha256(pod UID + volume name)>.
func inlineHandle(uid types.UID, specName string) string {
	sum := sha256.Sum256([]byte(string(uid) + specName))
	return "csi-" + hex.EncodeToString(sum[:])
}

// attachmentName is the VolumeAttachment name the kubelet and the
// attach/detach controller use: csi-<sha256(handle + driver + node)>.
func attachmentName(handle, driver, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

func listenUnix(path string) (net.Listener, error) { return net.Listen("unix", path) }
