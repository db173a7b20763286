package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

func configMap(name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Data: data}
}

func secret(name string, data map[string]string) *corev1.Secret {
	return &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, StringData: data}
}

// apiPod uses a configMap (items, nested path, mode), a secret, a
// downwardAPI volume and a projected volume of all three.
func apiPod() *corev1.Pod {
	p := newPod("app",
		corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"},
			Items:                []corev1.KeyToPath{{Key: "app.conf", Path: "conf/app.conf", Mode: ptr.To[int32](0o600)}, {Key: "extra", Path: "extra"}},
			Optional:             ptr.To(true),
		}}},
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "app-secret", DefaultMode: ptr.To[int32](0o400)}}},
		corev1.Volume{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
		}}}},
		corev1.Volume{Name: "all", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}, Items: []corev1.KeyToPath{{Key: "app.conf", Path: "app.conf"}}}},
			{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "app-secret"}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
		}}}},
	)
	p.Labels = map[string]string{"tier": "web"}
	// A volume mounted beneath the configMap's mount point: its mount
	// point must exist in the (read-only) configMap volume.
	p.Spec.Volumes = append(p.Spec.Volumes, e2eutil.MemoryVolume("nested"))
	p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "nested", MountPath: "/mnt/config/cache"})
	return p
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}

// waitContent waits until every file under dir has its content.
func waitContent(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	e2eutil.PollErr(t, settleTimeout, fmt.Sprintf("the files of %s to be %v", dir, want), func() error {
		for name, content := range want {
			got, err := readFile(filepath.Join(dir, name))
			if content == "<absent>" {
				if !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("%s still there (%v)", name, err)
				}
				continue
			}
			if err != nil {
				return err
			}
			if got != content {
				return fmt.Errorf("%s = %q, want %q", name, got, content)
			}
		}
		return nil
	})
}

// Standalone mode: configMap, secret, downwardAPI and projected volumes
// from the manifest directory, with edits followed.
func TestAPIVolumesStandalone(t *testing.T) {
	t.Parallel()
	a := newAgent(t)
	a.Write("objects.yaml", configMap("app-config", map[string]string{"app.conf": "greeting=hello", "extra": "x"}),
		secret("app-secret", map[string]string{"password": "hunter2"}))
	a.Write("app.yaml", apiPod())
	plain := newPod("plain", e2eutil.MemoryVolume("scratch"))
	a.Write("plain.yaml", plain)
	a.Start()
	uids := a.waitReady("app", "plain")
	uid := uids["app"]
	config := a.volumeDir(uid, e2eutil.ConfigMapPlugin, "config")
	creds := a.volumeDir(uid, e2eutil.SecretPlugin, "creds")
	info := a.volumeDir(uid, e2eutil.DownwardAPIPlugin, "info")
	all := a.volumeDir(uid, e2eutil.ProjectedPlugin, "all")

	waitContent(t, config, map[string]string{"conf/app.conf": "greeting=hello", "extra": "x"})
	waitContent(t, creds, map[string]string{"password": "hunter2"})
	waitContent(t, info, map[string]string{"labels": `tier="web"`, "name": "app"})
	waitContent(t, all, map[string]string{"app.conf": "greeting=hello", "password": "hunter2", "namespace": "default"})

	if st, err := os.Lstat(filepath.Join(config, "cache")); err != nil || !st.IsDir() {
		t.Errorf("the mount point of the volume mounted beneath the configMap: %v, %v; want a directory", st, err)
	}
	// The kubelet's layout: names are links into ..data.
	if target, err := os.Readlink(filepath.Join(config, "conf")); err != nil || target != "..data/conf" {
		t.Errorf("conf -> %q, %v; want ..data/conf", target, err)
	}
	for path, mode := range map[string]os.FileMode{filepath.Join(config, "conf/app.conf"): 0o600, filepath.Join(creds, "password"): 0o400, filepath.Join(info, "name"): 0o644} {
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, %v; want %v", path, st.Mode(), err, mode)
		}
	}
	// Secrets, downward and projected content on their own tmpfs, never
	// swapped; configMaps on the node's disk, as in the kubelet.
	for _, dir := range []string{creds, info, all} {
		m, err := mountAt(t, dir)
		if err != nil || m.FSType != "tmpfs" {
			t.Errorf("%s: %+v, %v; want a tmpfs", dir, m, err)
			continue
		}
		if !slices.Contains(m.SuperOptions, "noswap") {
			t.Logf("%s: no noswap (needs Linux 6.4+): %v", dir, m.SuperOptions)
		}
	}
	if _, err := mountAt(t, config); err == nil {
		t.Errorf("configMap volume %s is a mount; want a directory on disk", config)
	}

	// Edits are followed: a changed key, a removed key, a new key.
	a.Write("objects.yaml", configMap("app-config", map[string]string{"app.conf": "greeting=bonjour"}),
		secret("app-secret", map[string]string{"password": "correct horse", "user": "admin"}))
	waitContent(t, config, map[string]string{"conf/app.conf": "greeting=bonjour", "extra": "<absent>"})
	waitContent(t, creds, map[string]string{"password": "correct horse", "user": "admin"})
	waitContent(t, all, map[string]string{"app.conf": "greeting=bonjour", "password": "correct horse", "user": "admin"})

	// A label change reaches the downwardAPI volume.
	relabelled := apiPod()
	relabelled.Labels["tier"] = "db"
	a.Write("app.yaml", relabelled)
	waitContent(t, info, map[string]string{"labels": `tier="db"`})

	// Removing the optional configMap empties the volume that names it
	// optional; the projected volume (not optional) keeps its last content
	// and the failure is reported.
	a.Write("objects.yaml", secret("app-secret", map[string]string{"password": "correct horse", "user": "admin"}))
	waitContent(t, config, map[string]string{"conf/app.conf": "<absent>"})
	e2eutil.PollErr(t, settleTimeout, "a FailedMount event naming the missing configMap", func() error {
		evs, err := a.Events()
		if err != nil {
			return err
		}
		for _, e := range evs.Events {
			if e.Reason == "FailedMount" && strings.Contains(e.Message, `configMap "app-config" not found`) {
				return nil
			}
		}
		return fmt.Errorf("events: %+v", evs.Events)
	})
	waitContent(t, all, map[string]string{"app.conf": "greeting=bonjour"})

	// The debug endpoint says what each volume was built from, never the
	// data.
	doc, err := a.APIVolumes()
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Volumes) != 4 {
		t.Errorf("/debug/api-volumes lists %d volumes, want 4", len(doc.Volumes))
	}
	raw, _ := a.GetRaw("/debug/api-volumes")
	for _, secretValue := range []string{"hunter2", "correct horse", "bonjour"} {
		if strings.Contains(raw, secretValue) {
			t.Errorf("/debug/api-volumes shows content %q", secretValue)
		}
	}

	// The pod goes: everything is unmounted and removed.
	a.Remove("app.yaml")
	e2eutil.PollErr(t, settleTimeout, "the pod's volumes gone", func() error {
		if err := noMountsUnder(t, e2eutil.PodDir(a.Root(), uid)); err != nil {
			return err
		}
		if mounttest.Exists(t, e2eutil.PodDir(a.Root(), uid)) {
			return errors.New("pod directory still there")
		}
		return nil
	})
}

// A Secret created after the pod: the volume is set up as soon as it
// appears (not after a backoff), and a token projection is a clear per-pod
// error in standalone mode that affects no other volume or pod.
func TestAPIVolumesStandaloneLateSecretAndTokens(t *testing.T) {
	t.Parallel()
	a := newAgent(t)
	late := newPod("late", corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "late-secret"}}})
	token := newPod("token",
		corev1.Volume{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
		}}}},
		e2eutil.MemoryVolume("scratch"))
	a.Write("late.yaml", late)
	a.Write("token.yaml", token)
	a.Start()

	e2eutil.PollErr(t, settleTimeout, "the token pod's error", func() error {
		d, err := a.DSW()
		if err != nil {
			return err
		}
		p := d.Pod("default", "token")
		if p == nil || len(p.Errors) != 1 {
			return fmt.Errorf("pod: %+v", p)
		}
		e := p.Errors[0]
		if e.Volume != "kube-api-access-abcde" || e.Reason != "InvalidVolume" || !strings.Contains(e.Message, "standalone mode") {
			return fmt.Errorf("error %+v", e)
		}
		return nil
	})
	uid := a.podUID("token")
	e2eutil.PollErr(t, settleTimeout, "the token pod's other volume mounted", func() error {
		_, err := mountAt(t, a.volumeDir(uid, e2eutil.EmptyDirPlugin, "scratch"))
		return err
	})

	e2eutil.PollErr(t, settleTimeout, "a failed mount of the missing secret", func() error {
		ops, err := a.Operations()
		if err != nil {
			return err
		}
		for _, op := range ops.Operations {
			if op.Operation == "mount_volume" && strings.Contains(op.LastError, `secret "late-secret" not found`) {
				return nil
			}
		}
		return fmt.Errorf("operations %+v", ops.Operations)
	})
	// The failed mount waits in backoff; the secret's arrival ends it.
	a.Write("secret.yaml", secret("late-secret", map[string]string{"k": "v"}))
	uids := a.waitReady("late")
	waitContent(t, a.volumeDir(uids["late"], e2eutil.SecretPlugin, "creds"), map[string]string{"k": "v"})
}
