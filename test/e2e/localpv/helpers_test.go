package localpv_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// env is one test's world: a Node (whose hostname label differs from its
// name, as on clouds), a namespace, a data directory for discovery
// directories and a configuration file laid out like a ConfigMap volume.
type env struct {
	t        *testing.T
	name     string
	node     string
	hostname string
	ns       string
	data     string
	cfgDir   string
	cfgGen   int
}

// newEnv skips the test if the suite is not set up, and creates the Node
// <name>-node (hostname <name>-host) and the namespace <name>; <name>-2...
// when the test runs again (-count).
func newEnv(t *testing.T, name string) *env {
	t.Helper()
	suite.Require(t)
	name = e2eutil.UniqueName(name)
	e := &env{t: t, name: name, node: name + "-node", hostname: name + "-host", ns: name, data: mounttest.TempDir(t), cfgDir: t.TempDir()}
	suite.CreateNodeAndNamespace(t, e.node, e.ns, map[string]string{corev1.LabelHostname: e.hostname})
	return e
}

// startAgent runs the volume-agent binary for the test's node (cluster
// mode, as the deploy/ ServiceAccount) on a new root directory and waits
// until it is ready. It is stopped with SIGTERM when the test ends, before
// its root directory is unmounted.
func (e *env) startAgent() *e2eutil.Agent {
	e.t.Helper()
	return suite.StartAgent(e.t, e.node, mounttest.TempDir(e.t))
}

// volumePath is where the agent mounts a pod's local volume.
func volumePath(a *e2eutil.Agent, podUID, pv string) string {
	return e2eutil.VolumeDir(a.Root(), podUID, e2eutil.LocalPlugin, pv)
}

// class returns a cluster-wide unique StorageClass name for the test.
func (e *env) class(suffix string) string { return e.name + "-" + suffix }

// storageClass creates a StorageClass for static local volumes. Immediate
// binding: there is no scheduler to wait for.
func (e *env) storageClass(name string, policy corev1.PersistentVolumeReclaimPolicy) {
	e.t.Helper()
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name},
		Provisioner:       "kubernetes.io/no-provisioner",
		ReclaimPolicy:     &policy,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	}
	if _, err := suite.Admin.StorageV1().StorageClasses().Create(e.t.Context(), sc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create StorageClass %s: %v", name, err)
	}
}

func (e *env) configFile() string { return filepath.Join(e.cfgDir, "config.yaml") }

// writeConfig replaces the configuration as the kubelet updates a
// ConfigMap volume: a new timestamped directory, then an atomic swap of
// the ..data link that config.yaml points through.
func (e *env) writeConfig(content string) {
	e.t.Helper()
	e.cfgGen++
	ts := filepath.Join(e.cfgDir, fmt.Sprintf("..2030_01_01_00_00_%02d", e.cfgGen))
	must(e.t, os.Mkdir(ts, 0o755))
	must(e.t, os.WriteFile(filepath.Join(ts, "config.yaml"), []byte(content), 0o644))
	tmp := filepath.Join(e.cfgDir, "..data_tmp")
	must(e.t, os.Symlink(filepath.Base(ts), tmp))
	must(e.t, os.Rename(tmp, filepath.Join(e.cfgDir, "..data")))
	if e.cfgGen == 1 {
		must(e.t, os.Symlink("..data/config.yaml", e.configFile()))
	}
}

// dir makes a directory below the test's data directory.
func (e *env) dir(rel string) string {
	e.t.Helper()
	p := filepath.Join(e.data, rel)
	must(e.t, os.MkdirAll(p, 0o755))
	return p
}

// tmpfs mounts a tmpfs of the given size at dir (unmounted at the end
// with everything below the data directory).
func (e *env) tmpfs(dir string, size string) {
	e.t.Helper()
	must(e.t, os.MkdirAll(dir, 0o755))
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		e.t.Fatalf("mount tmpfs at %s: %v", dir, err)
	}
}

// ext4 formats a new loop device and mounts it at dir; it returns the
// device.
func (e *env) ext4(dir string, size int64) string {
	e.t.Helper()
	dev := mounttest.LoopDevice(e.t, size)
	mounttest.Mkfs(e.t, "ext4", dev)
	must(e.t, os.MkdirAll(dir, 0o755))
	mounttest.MountDevice(e.t, dev, dir, "ext4")
	return dev
}

// provisioner is one in-process provisioner of a test.
type provisioner struct {
	p        *localpv.Provisioner
	registry *prometheus.Registry
	cancel   context.CancelFunc
	done     chan error
	bc       record.EventBroadcaster
	once     sync.Once
	t        *testing.T
}

// startProvisioner runs a provisioner as the provisioner's
// ServiceAccount, with events going to the API server as in the agent.
func (e *env) startProvisioner(mods ...func(*localpv.Options)) *provisioner {
	e.t.Helper()
	cfg, err := kubeclient.LoadConfig(kubeclient.Options{Kubeconfig: suite.provKubeconfig, UserAgent: "localpv-test/" + e.node})
	if err != nil {
		e.t.Fatal(err)
	}
	client, err := kubeclient.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	log := zaptest.NewLogger(e.t, zaptest.Level(zap.InfoLevel)).Named("localpv")
	bc := record.NewBroadcaster(record.WithContext(context.Background()))
	bc.StartRecordingToSink(kubeclient.EventSink{Client: client.Core})
	rec := bc.NewRecorder(kubeclient.Scheme(), corev1.EventSource{Component: "volume-agent", Host: e.node})
	opts := localpv.Options{
		Client: client, NodeName: e.node, ConfigFile: e.configFile(), HostRoot: "/",
		Recorder: events.NewLog(log, 100, sink{rec}), Log: log,
		SettlePeriod:   200 * time.Millisecond,
		CleanupBackoff: 200 * time.Millisecond, CleanupMaxBackoff: 2 * time.Second,
	}
	for _, m := range mods {
		m(&opts)
	}
	p, err := localpv.New(opts)
	if err != nil {
		e.t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collectors()...)
	ctx, cancel := context.WithCancel(context.Background())
	pr := &provisioner{p: p, registry: reg, cancel: cancel, done: make(chan error, 1), bc: bc, t: e.t}
	go func() { pr.done <- p.Run(ctx) }()
	e.t.Cleanup(pr.stop)
	return pr
}

// stop stops the provisioner and waits for Run to return.
func (pr *provisioner) stop() {
	pr.once.Do(func() {
		pr.cancel()
		select {
		case err := <-pr.done:
			if err != nil {
				pr.t.Errorf("provisioner: %v", err)
			}
		case <-time.After(30 * time.Second):
			pr.t.Errorf("the provisioner did not stop within 30s")
		}
		pr.bc.Shutdown()
	})
}

type sink struct{ rec record.EventRecorder }

func (s sink) Event(obj events.Object, eventType, reason, message string) {
	s.rec.Event(&corev1.ObjectReference{Kind: obj.Kind, APIVersion: "v1", Namespace: obj.Namespace, Name: obj.Name, UID: types.UID(obj.UID)}, eventType, reason, message)
}

// volume returns the provisioner's status of the entry or PV at path.
func (pr *provisioner) volume(path string) (localpv.Volume, bool) {
	for _, v := range pr.p.Status().Volumes {
		if v.Path == path {
			return v, true
		}
	}
	return localpv.Volume{}, false
}

// waitState waits until the entry at path is in the state.
func (pr *provisioner) waitState(path string, state localpv.State) localpv.Volume {
	pr.t.Helper()
	var got localpv.Volume
	e2eutil.Poll(pr.t, 60*time.Second, fmt.Sprintf("%s %s", path, state), func(context.Context) (bool, string) {
		v, ok := pr.volume(path)
		got = v
		return ok && v.State == state, fmt.Sprintf("%+v", v)
	})
	return got
}

// passes is how many passes the provisioner has made.
func (pr *provisioner) passes() uint64 { return pr.p.Status().Passes }

// waitPasses waits until n more passes have run, so that what the
// provisioner did not do by then it decided not to do.
func (pr *provisioner) waitPasses(n uint64) {
	pr.t.Helper()
	want := pr.passes() + n
	e2eutil.Poll(pr.t, 60*time.Second, fmt.Sprintf("%d passes", n), func(context.Context) (bool, string) {
		return pr.passes() >= want, fmt.Sprintf("%d passes", pr.passes())
	})
}

// gauge sums the series of a gauge or counter of the provisioner's
// collectors that have the labels.
func (pr *provisioner) gauge(name string, labels map[string]string) float64 {
	pr.t.Helper()
	mfs, err := pr.registry.Gather()
	if err != nil {
		pr.t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			matched := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					matched++
				}
			}
			if matched == len(labels) {
				sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// pvAt returns the test node's PV at path, if any.
func (e *env) pvAt(ctx context.Context, path string) (*corev1.PersistentVolume, error) {
	list, err := suite.Admin.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		pv := &list.Items[i]
		if pv.Annotations[localpv.AnnProvisionedBy] == localpv.ProvisionerName(e.node) && pv.Spec.Local != nil && pv.Spec.Local.Path == path {
			return pv, nil
		}
	}
	return nil, nil
}

// waitAvailable waits for an Available PV at path other than the one with
// UID not (the PV the provisioner deleted).
func (e *env) waitAvailable(path string, not types.UID) *corev1.PersistentVolume {
	e.t.Helper()
	var got *corev1.PersistentVolume
	e2eutil.Poll(e.t, 60*time.Second, "an Available PV at "+path, func(ctx context.Context) (bool, string) {
		pv, err := e.pvAt(ctx, path)
		if err != nil || pv == nil {
			return false, fmt.Sprint("no PV ", err)
		}
		got = pv
		return pv.Status.Phase == corev1.VolumeAvailable && pv.UID != not, fmt.Sprintf("PV %s (%s) %s", pv.Name, pv.UID, pv.Status.Phase)
	})
	return got
}

// waitPhase waits until the PV has the phase.
func (e *env) waitPhase(name string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
	e.t.Helper()
	var got *corev1.PersistentVolume
	e2eutil.Poll(e.t, 60*time.Second, "PV "+name+" "+string(phase), func(ctx context.Context) (bool, string) {
		pv, err := suite.Admin.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got = pv
		return pv.Status.Phase == phase, string(pv.Status.Phase)
	})
	return got
}

// claim creates a claim for the PV (spec.volumeName: the binder binds it
// to that PV, and to no other test's).
func (e *env) claim(name string, pv *corev1.PersistentVolume) {
	e.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(pv.Spec.StorageClassName),
			VolumeName:       pv.Name,
			VolumeMode:       pv.Spec.VolumeMode,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
	if _, err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Create(e.t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PVC %s: %v", name, err)
	}
	suite.WaitBound(e.t, e.ns, name, pv.Name)
}

func (e *env) deleteClaim(name string) {
	e.t.Helper()
	if err := suite.Admin.CoreV1().PersistentVolumeClaims(e.ns).Delete(e.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("delete PVC %s: %v", name, err)
	}
}

// waitPVEvent waits for an event on the PV with the reason whose message
// contains the strings. Events about cluster-scoped objects are in
// "default".
func (e *env) waitPVEvent(pv, reason string, contains ...string) *corev1.Event {
	e.t.Helper()
	return suite.WaitEvent(e.t, metav1.NamespaceDefault, fields.Set{"involvedObject.name": pv, "reason": reason}, nil, contains...)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func affinityHostname(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == corev1.LabelHostname && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}
