package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/runtimeapi/client"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// subPathExprPod is a pod whose container mounts sub-paths of one emptyDir
// named by exprs, at /s0, /s1...
func subPathExprPod(name string, env []corev1.EnvVar, envFrom []corev1.EnvFromSource, exprs ...string) *corev1.Pod {
	pod := newPod(name, e2eutil.EmptyDirVolume("scratch", "", ""))
	c := &pod.Spec.Containers[0]
	c.Env, c.EnvFrom = env, envFrom
	for i, e := range exprs {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "scratch", MountPath: fmt.Sprintf("/s%d", i), SubPathExpr: e})
	}
	return pod
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

// checkSubPaths waits for the pod to be ready through the runtime API and
// checks that its mount at /s<i> is the sub-path want[i] of its emptyDir,
// a directory the agent prepared.
func (a *agent) checkSubPaths(uid string, want ...string) {
	t := a.t
	t.Helper()
	p, err := a.RuntimeClient().Wait(t.Context(), uid, settleTimeout)
	if err != nil {
		t.Fatal(err)
	}
	vol := a.volumeDir(uid, e2eutil.EmptyDirPlugin, "scratch")
	for i, sub := range want {
		m := mountOf(t, p, "main", fmt.Sprintf("/s%d", i))
		if target := e2eutil.SubPathTarget(a.Root(), uid, e2eutil.EmptyDirPlugin, "scratch", "main", i+1); m.HostPath != target || m.SubPath != sub {
			t.Errorf("pod %s mount /s%d: %s (sub-path %q), want %s (%q)", p.Name, i, m.HostPath, m.SubPath, target, sub)
		}
		if st, err := os.Stat(filepath.Join(vol, sub)); err != nil || !st.IsDir() {
			t.Errorf("pod %s: sub-path %s was not prepared in the volume: %v", p.Name, sub, err)
		}
		if same, err := sameFile(m.HostPath, filepath.Join(vol, sub)); err != nil || !same {
			t.Errorf("pod %s mount /s%d is not the volume's %s (%v)", p.Name, i, sub, err)
		}
	}
}

// subPathExpr in standalone mode with each source of a container's
// variables: a ConfigMap and a Secret from the manifests (configMapKeyRef,
// secretKeyRef, envFrom with a prefix) and status.hostIP from the pod's
// status in its manifest; each reaches a prepared sub-path that the
// runtime API gives. A pod reading status.hostIP with no status waits,
// saying why, until --node-ip says what the node's IPs are.
func TestSubPathExprStandalone(t *testing.T) {
	t.Parallel()
	objects := []any{
		&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Name: "paths", Namespace: "default"},
			Data: map[string]string{"dir": "from-cm"}},
		&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Name: "bulk", Namespace: "default"},
			Data: map[string]string{"sub": "from-envfrom"}},
		&corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "default"},
			StringData: map[string]string{"user": "alice"}},
	}
	env := []corev1.EnvVar{
		{Name: "CM", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "paths"}, Key: "dir"}}},
		{Name: "SEC", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "user"}}},
		fieldEnv("HOST", "status.hostIP"),
	}
	envFrom := []corev1.EnvFromSource{{Prefix: "EF_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "bulk"}}}}
	exprs := []string{"cm/$(CM)", "sec/$(SEC)", "ef/$(EF_sub)", "host/$(HOST)"}

	t.Run("from the manifests", func(t *testing.T) {
		t.Parallel()
		a := newAgent(t)
		app := subPathExprPod("app", env, envFrom, exprs...)
		app.Status = corev1.PodStatus{HostIP: "192.0.2.10", HostIPs: []corev1.HostIP{{IP: "192.0.2.10"}}}
		a.Write("objects.yaml", objects...)
		a.Write("app.yaml", app)
		nohost := subPathExprPod("nohost", []corev1.EnvVar{fieldEnv("HOST", "status.hostIP")}, nil, "host/$(HOST)")
		a.Write("nohost.yaml", nohost)
		a.Start()
		a.checkSubPaths(a.podUID("app"), "cm/from-cm", "sec/alice", "ef/from-envfrom", "host/192.0.2.10")

		// No Node, no --node-ip, no status: the pod waits, saying for what.
		_, err := a.RuntimeClient().Wait(t.Context(), a.podUID("nohost"), time.Second)
		var nr *client.NotReadyError
		if !errors.As(err, &nr) {
			t.Fatalf("wait for nohost: %v, want a NotReadyError", err)
		}
		if bad := nr.NotReady(); len(bad) != 1 || bad[0].Name != "scratch" || bad[0].Reason != "SubPathExprWaiting" ||
			!strings.Contains(bad[0].Message, "status.hostIP") {
			t.Errorf("nohost not ready: %+v, want scratch waiting for status.hostIP", bad)
		}
	})

	t.Run("from --node-ip", func(t *testing.T) {
		t.Parallel()
		a := newAgent(t, func(args *[]string) { *args = append(*args, "--node-ip", "192.0.2.20,2001:db8::20") })
		// The node's IPs are what the kubelet would write in the pod's
		// status, so they win over a manifest's.
		stale := subPathExprPod("stale", []corev1.EnvVar{fieldEnv("HOST", "status.hostIP")}, nil, "host/$(HOST)")
		stale.Status.HostIP = "192.0.2.99"
		a.Write("nohost.yaml", subPathExprPod("nohost", []corev1.EnvVar{fieldEnv("HOST", "status.hostIP"), fieldEnv("HOSTS", "status.hostIPs")}, nil,
			"host/$(HOST)", "hosts/$(HOSTS)"), stale)
		a.Start()
		a.checkSubPaths(a.podUID("nohost"), "host/192.0.2.20", "hosts/192.0.2.20,2001:db8::20")
		a.checkSubPaths(a.podUID("stale"), "host/192.0.2.20")
	})
}
