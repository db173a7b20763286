package restart_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

func configMapManifest(value string) *corev1.ConfigMap {
	return &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "app-config", Namespace: "default"}, Data: map[string]string{"app.conf": value}}
}

// API volumes across a crash: a ConfigMap changed while the agent was down
// reaches the pod after the start, debris of an interrupted write is
// removed, and an unchanged Secret's tmpfs is adopted as it is (same
// mount, same data directory: checked, not rewritten).
func TestAPIVolumesAcrossRestart(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	m := e2eutil.NewManifests(t)
	a, root := newStandaloneAgent(t, m)
	secret := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "app-secret", Namespace: "default"}, StringData: map[string]string{"password": "hunter2"}}
	m.Write("objects.yaml", configMapManifest("v=1"), secret)
	m.Write("app.yaml", newPod("app",
		corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}}}},
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "app-secret"}}}))
	a.Start()
	a.waitSettled(time.Minute)
	uid := a.podUIDs("app")["app"]
	config := e2eutil.VolumeDir(root, uid, "kubernetes.io/configmap", "config")
	creds := e2eutil.VolumeDir(root, uid, "kubernetes.io/secret", "creds")
	if got := mounttest.ReadFile(t, filepath.Join(config, "app.conf")); got != "v=1" {
		t.Fatalf("app.conf = %q", got)
	}
	credsMount := mounttest.MountAt(t, creds)
	credsData, err := os.Readlink(filepath.Join(creds, "..data"))
	if err != nil {
		t.Fatal(err)
	}

	a.Kill()
	// While the agent is down: the ConfigMap changes, and a write of the
	// configMap volume is left half done (a data directory ..data does not
	// point at, and the temporary link of the swap).
	m.Write("objects.yaml", configMapManifest("v=2"), secret)
	debris := filepath.Join(config, "..2020_01_01_00_00_00.1")
	if err := os.MkdirAll(filepath.Join(debris, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	mounttest.WriteFile(t, filepath.Join(debris, "app.conf"), "half written")
	if err := os.Symlink(filepath.Base(debris), filepath.Join(config, "..data_tmp")); err != nil {
		t.Fatal(err)
	}

	a.Start()
	a.waitSettled(time.Minute)
	e2eutil.PollErr(t, 30*time.Second, "the ConfigMap changed while the agent was down in the pod's file", func() error {
		if got := mounttest.ReadFile(t, filepath.Join(config, "app.conf")); got != "v=2" {
			return os.ErrNotExist
		}
		return nil
	})
	entries, err := os.ReadDir(config)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		if e.Name() == "..data_tmp" || e.Name() == filepath.Base(debris) {
			t.Errorf("debris of the interrupted write left: %s", e.Name())
		}
	}
	if len(names) != 3 {
		t.Errorf("configMap volume holds %v, want ..data, one data directory and app.conf", names)
	}
	if m := mounttest.MountAt(t, creds); m.ID != credsMount.ID {
		t.Errorf("the secret's tmpfs was mounted again (mount %d, was %d)", m.ID, credsMount.ID)
	}
	if got, _ := os.Readlink(filepath.Join(creds, "..data")); got != credsData {
		t.Errorf("the unchanged secret was rewritten: ..data -> %s, was %s", got, credsData)
	}
	if got := mounttest.ReadFile(t, filepath.Join(creds, "password")); !strings.Contains(got, "hunter2") {
		t.Errorf("password = %q", got)
	}
}
