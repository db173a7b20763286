package cluster_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/volume-agent/volume-agent/test/cluster"
)

// poll calls cond until it reports done, failing the test after timeout.
func poll(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func clientFor(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(cfg)
}

func whoAmI(t *testing.T, client kubernetes.Interface) authenticationv1.UserInfo {
	t.Helper()
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("self subject review: %v", err)
	}
	return review.Status.UserInfo
}

func TestControlPlane(t *testing.T) {
	start := time.Now()
	c := cluster.StartForTest(t, cluster.Options{ControllerManager: true, Nodes: []string{"node-a", "node-b"}})
	t.Logf("control plane with controller manager ready in %v", time.Since(start).Round(time.Millisecond))
	admin := c.AdminClient()
	if pids := c.PIDs(); len(pids) != 3 {
		t.Fatalf("PIDs() = %v, want etcd, kube-apiserver and kube-controller-manager", pids)
	}

	t.Run("AdminKubeconfig", func(t *testing.T) {
		if u := whoAmI(t, clientFor(t, c.AdminKubeconfig())); u.Username != "admin" {
			t.Errorf("admin kubeconfig authenticates as %q", u.Username)
		}
	})

	t.Run("PVCBecomesBound", func(t *testing.T) {
		ctx := t.Context()
		if _, err := c.CreateNode(ctx, "node-a", map[string]string{"topology.example/zone": "z1"}); err != nil {
			t.Fatal(err)
		}
		size := resource.MustParse("1Gi")
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "pv-1"},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName:              "manual",
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				PersistentVolumeSource: corev1.PersistentVolumeSource{
					CSI: &corev1.CSIPersistentVolumeSource{Driver: "test.volume-agent.io", VolumeHandle: "vol-1"},
				},
			},
		}
		if _, err := admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		class := "manual"
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "claim-1"},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &class,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			},
		}
		if _, err := admin.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, 30*time.Second, "PVC bound", func(ctx context.Context) (bool, error) {
			got, err := admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "claim-1", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return got.Status.Phase == corev1.ClaimBound && got.Spec.VolumeName == "pv-1", nil
		})
	})

	t.Run("NodeToken", func(t *testing.T) {
		ctx := t.Context()
		node := clientFor(t, c.NodeKubeconfig("node-a"))
		if u := whoAmI(t, node); u.Username != "system:node:node-a" || len(u.Groups) == 0 || u.Groups[0] != "system:nodes" {
			t.Errorf("node kubeconfig authenticates as %+v", u)
		}
		if _, err := node.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"}); err != nil {
			t.Errorf("list own pods: %v", err)
		}
		// The Node authorizer only allows a node to list its own pods, so the
		// agent must always send the field selector.
		if _, err := node.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-b"}); !apierrors.IsForbidden(err) {
			t.Errorf("list pods of another node: got %v, want Forbidden", err)
		}
		if _, err := node.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("list all secrets: got %v, want Forbidden", err)
		}
	})

	t.Run("ServiceAccountKubeconfig", func(t *testing.T) {
		ctx := t.Context()
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "agent-system"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		path, err := c.ServiceAccountKubeconfig(ctx, "agent-system", "volume-agent")
		if err != nil {
			t.Fatal(err)
		}
		if u := whoAmI(t, clientFor(t, path)); u.Username != "system:serviceaccount:agent-system:volume-agent" {
			t.Errorf("service-account kubeconfig authenticates as %q", u.Username)
		}
	})

	t.Run("RequestCounting", func(t *testing.T) {
		ctx := t.Context()
		cfg := c.RESTConfig()
		cfg.UserAgent = "counting-test/1.0"
		client := kubernetes.NewForConfigOrDie(cfg)
		for range 3 {
			if _, err := client.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		poll(t, 10*time.Second, "3 audited lists", func(context.Context) (bool, error) {
			n, err := c.CountRequests("counting-test/", "list", "configmaps")
			return n == 3, err
		})
		metrics, err := c.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(metrics, `apiserver_request_total{`) {
			t.Error("apiserver_request_total missing from /metrics")
		}
	})

	t.Run("APIServerRestart", func(t *testing.T) {
		ctx := t.Context()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "survivor"}, Data: map[string]string{"k": "v"}}
		if _, err := admin.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		oldPID := c.PIDs()["kube-apiserver"]
		c.StopAPIServer()
		if !processGone(oldPID) {
			t.Errorf("kube-apiserver pid %d still exists after StopAPIServer", oldPID)
		}
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := admin.CoreV1().ConfigMaps("default").Get(short, "survivor", metav1.GetOptions{}); err == nil {
			t.Fatal("apiserver still answers after StopAPIServer")
		}
		if err := c.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		got, err := admin.CoreV1().ConfigMaps("default").Get(ctx, "survivor", metav1.GetOptions{})
		if err != nil || got.Data["k"] != "v" {
			t.Fatalf("configmap after restart: %v, %v", got, err)
		}
		pvc, err := admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "claim-1", metav1.GetOptions{})
		if err != nil || pvc.Status.Phase != corev1.ClaimBound {
			t.Fatalf("PVC after restart: %v, %v", pvc, err)
		}
		// The node kubeconfig keeps working: same port, CA and token file.
		if _, err := clientFor(t, c.NodeKubeconfig("node-b")).CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-b"}); err != nil {
			t.Errorf("node client after restart: %v", err)
		}
	})

	t.Run("StopLeavesNoProcess", func(t *testing.T) {
		pids := c.PIDs()
		c.Stop()
		for name, pid := range pids {
			if !processGone(pid) {
				t.Errorf("%s (pid %d) still exists after Stop", name, pid)
			}
		}
	})
}

// processGone reports whether no process with this PID exists, not even a zombie.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestStartWithoutControllerManager(t *testing.T) {
	start := time.Now()
	c := cluster.StartForTest(t, cluster.Options{})
	t.Logf("etcd and kube-apiserver ready in %v", time.Since(start).Round(time.Millisecond))
	if _, ok := c.PIDs()["kube-controller-manager"]; ok {
		t.Error("kube-controller-manager started without Options.ControllerManager")
	}
	if _, err := c.AdminClient().CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}
