package expansion_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// volume returns the volume's entry in /debug/asw, nil if there is none.
func volume(t *testing.T, a *e2eutil.Agent, name string) *e2eutil.ASWVolume {
	t.Helper()
	return e2eutil.Must(t, a.ASW).Volume(name)
}

// desiredSize returns the volume's desiredSize in /debug/dsw ("" if none
// or if the volume is not desired).
func desiredSize(t *testing.T, a *e2eutil.Agent, name string) string {
	t.Helper()
	if v := e2eutil.Must(t, a.DSW).Volume(name); v != nil {
		return v.DesiredSize
	}
	return ""
}

// podMountPath waits until the pod has the volume mounted (per the agent
// and per the mount table) and returns the mount's path.
func (e *env) podMountPath(volName string, uid types.UID) string {
	e.t.Helper()
	var path string
	e2eutil.Poll(e.t, 60*time.Second, fmt.Sprintf("volume %s mounted for pod %s", volName, uid), func(context.Context) (bool, string) {
		v := volume(e.t, e.agent, volName)
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

// env is one test's world: a Node, a namespace, a root directory and, once
// started, an agent.
type env struct {
	t     *testing.T
	node  string
	ns    string
	root  string
	agent *e2eutil.Agent
}

// newEnv skips the test if the suite is not set up, and creates the Node
// <name>-node (labelled kubernetes.io/hostname) and the namespace <name>,
// waiting for its default ServiceAccount (Pods cannot be created before);
// <name>-2... when the test runs again (-count).
func newEnv(t *testing.T, name string) *env {
	t.Helper()
	suite.Require(t)
	name = e2eutil.UniqueName(name)
	e := &env{t: t, node: name + "-node", ns: name, root: mounttest.TempDir(t)}
	suite.CreateNodeAndNamespace(t, e.node, e.ns, nil)
	return e
}

// start starts the test's agent (cluster mode, as the deploy/
// ServiceAccount). It is stopped when the test ends, before the root is
// unmounted.
func (e *env) start(extraArgs ...string) *e2eutil.Agent {
	e.t.Helper()
	e.agent = suite.StartAgent(e.t, e.node, e.root, extraArgs...)
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
	return suite.CreatePod(e.t, e.pod(name, claim, readOnly))
}

// deletePod deletes the pod at once (grace period 0: the object is gone)
// and waits until the agent has torn it down.
func (e *env) deletePod(pod *corev1.Pod) {
	e.t.Helper()
	if err := suite.Admin.CoreV1().Pods(e.ns).Delete(e.t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		e.t.Fatalf("delete pod %s: %v", pod.Name, err)
	}
	dir := e2eutil.PodDir(e.root, string(pod.UID))
	e2eutil.Poll(e.t, 60*time.Second, "pod "+pod.Name+" torn down", func(context.Context) (bool, string) {
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

// createPV creates the PV (e2eutil.PreBoundPV: of the test's class,
// pre-bound to a claim so that no other test's claim gets it; the binder
// still binds).
func (e *env) createPV(pv *corev1.PersistentVolume) *corev1.PersistentVolume {
	e.t.Helper()
	got, err := suite.Admin.CoreV1().PersistentVolumes().Create(e.t.Context(), pv, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create PV %s: %v", pv.Name, err)
	}
	return got
}

// createLocalPV creates a local PV on the block device dev (formatted with
// fsType by the agent) with node affinity to the test's node, pre-bound to
// the claim.
func (e *env) createLocalPV(name, claim, dev, fsType, size string) *corev1.PersistentVolume {
	e.t.Helper()
	pv := e2eutil.PreBoundPV(e.pvName(name), size, storageClass, e.ns, claim,
		corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dev, FSType: ptr.To(fsType)}})
	pv.Spec.NodeAffinity = e2eutil.NodeAffinity(corev1.LabelHostname, e.node)
	return e.createPV(pv)
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
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(e.t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PVC %s: %v", name, err)
	}
	return suite.WaitBound(e.t, e.ns, name, pv)
}

func (e *env) claim(name string) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	pvc, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Get(e.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get PVC %s: %v", name, err)
	}
	return pvc
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
	e2eutil.Poll(e.t, 60*time.Second, fmt.Sprintf("PVC %s status: expanded to %s", claim, size), func(context.Context) (bool, string) {
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

// findEvents returns the events about the object (kind, name) with the
// reason whose message contains every string.
func (e *env) findEvents(ctx context.Context, kind, name, reason string, contains ...string) ([]corev1.Event, []string, error) {
	return suite.FindEvents(ctx, e.ns, fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}, contains...)
}

// waitEvent waits for an event from the agent on the object with the
// reason whose message contains every string, and returns it.
func (e *env) waitEvent(kind, name, eventType, reason string, contains ...string) corev1.Event {
	e.t.Helper()
	ev := suite.WaitEvent(e.t, e.ns, fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}, func(ev *corev1.Event) bool {
		return ev.Type == eventType && ev.Source.Component == "volume-agent" && ev.Source.Host == e.node
	}, contains...)
	e.t.Logf("event on %s %s: %s %s: %s", kind, name, ev.Type, ev.Reason, ev.Message)
	return *ev
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

// grownTo reports whether a filesystem of before bytes on a device of
// oldDevice bytes has grown with its device to newDevice bytes: gained at
// least 85% of what the device gained (metadata takes the rest: ext4 gains
// about 93%, xfs all of it) and is no larger than the device.
func grownTo(now, before, oldDevice, newDevice int64) bool {
	return now-before >= (newDevice-oldDevice)*85/100 && now <= newDevice
}

const mib = 1 << 20

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
		mounttest.GrowLoop(t, dev, 64*mib)
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
