package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/runtimeapi/client"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// withEnv gives the pod's first container an environment variable from a
// fieldRef.
func withFieldEnv(pod *corev1.Pod, name, fieldPath string) *corev1.Pod {
	c := &pod.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: fieldPath}}})
	return pod
}

// mountOf returns the pod's first container's mount at path.
func mountOf(t *testing.T, p *runtimeapi.Pod, container, path string) runtimeapi.Mount {
	t.Helper()
	for _, c := range p.Containers {
		if c.Name != container {
			continue
		}
		for _, m := range c.Mounts {
			if m.ContainerPath == path {
				return m
			}
		}
	}
	t.Fatalf("pod %s: container %s has no mount at %s: %+v", p.Name, container, path, p.Containers)
	return runtimeapi.Mount{}
}

func deviceOf(t *testing.T, p *runtimeapi.Pod, container, path string) runtimeapi.Device {
	t.Helper()
	for _, c := range p.Containers {
		if c.Name != container {
			continue
		}
		for _, d := range c.Devices {
			if d.ContainerPath == path {
				return d
			}
		}
	}
	t.Fatalf("pod %s: container %s has no device at %s: %+v", p.Name, container, path, p.Containers)
	return runtimeapi.Device{}
}

func volumeOf(t *testing.T, p *runtimeapi.Pod, name string) runtimeapi.Volume {
	t.Helper()
	for _, v := range p.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("pod %s has no volume %s: %+v", p.Name, name, p.Volumes)
	return runtimeapi.Volume{}
}

// The runtime API end to end, with every kind of volume standalone mode
// supports (emptyDir on disk and in memory, hostPath, local PVs on a
// directory and on a block device, a raw block local PV, configMap, secret,
// downwardAPI): a pod
// that waits (and says why), a ready pod's volumes and container mounts with
// sub-paths prepared (missing directories created, subPathExpr expanded, a
// file sub-path read-only, a configMap key through its links), and
// everything gone with the pod.
func TestRuntimeAPI(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	host := mounttest.TempDir(t)
	loop := mounttest.LoopDevice(t, 64<<20)
	rawLoop := mounttest.LoopDevice(t, 16<<20)
	a := newAgent(t)
	logsDir := filepath.Join(host, "logs")
	sharedDir := filepath.Join(host, "shared")
	mounttest.WriteFile(t, filepath.Join(host, "etc", "conf", "app.conf"), "setting=1")
	mounttest.WriteFile(t, filepath.Join(sharedDir, "index.html"), "shared")
	// A claim consumed as a raw block device (volumeDevices).
	rawPV, rawPVC := e2eutil.LocalPV("raw", rawLoop, "raw", corev1.LabelHostname, nodeName), e2eutil.PVC("raw", "raw")
	e2eutil.AsBlock(rawPV, rawPVC)
	a.Write("storage.yaml",
		e2eutil.LocalPV("shared", sharedDir, "shared", corev1.LabelHostname, nodeName), e2eutil.PVC("shared", "shared"),
		e2eutil.LocalPV("block", loop, "block", corev1.LabelHostname, nodeName), e2eutil.PVC("block", "block"),
		rawPV, rawPVC,
		&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "default"},
			Data: map[string]string{"app.conf": "from the configMap"}},
		&corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "default"},
			StringData: map[string]string{"password": "p"}},
	)
	web := newPod("web",
		e2eutil.EmptyDirVolume("scratch", "", ""),
		e2eutil.MemoryVolume("cache"),
		e2eutil.HostPathVolume("logs", logsDir, hostPathType(corev1.HostPathDirectoryOrCreate)),
		e2eutil.HostPathVolume("etc", filepath.Join(host, "etc"), nil),
		claim("shared", "shared", false),
		claim("data", "block", false),
		corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
		corev1.Volume{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
		}}}},
	)
	web.Spec.Volumes = append(web.Spec.Volumes, claim("raw", "raw", false))
	withFieldEnv(web, "POD_NAME", "metadata.name")
	app := &web.Spec.Containers[0]
	app.Name = "app"
	app.VolumeDevices = append(app.VolumeDevices, corev1.VolumeDevice{Name: "raw", DevicePath: "/dev/xvdb"})
	app.VolumeMounts = append(app.VolumeMounts,
		corev1.VolumeMount{Name: "logs", MountPath: "/var/log/app", SubPathExpr: "$(POD_NAME)/logs"},
		corev1.VolumeMount{Name: "etc", MountPath: "/etc/app.conf", SubPath: "conf/app.conf", ReadOnly: true},
		corev1.VolumeMount{Name: "shared", MountPath: "/www", SubPath: "index.html", ReadOnly: true},
		corev1.VolumeMount{Name: "config", MountPath: "/etc/app/app.conf", SubPath: "app.conf"},
	)
	web.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", VolumeMounts: []corev1.VolumeMount{
		{Name: "scratch", MountPath: "/out", SubPath: "from-init/out"},
	}}}
	a.Write("web.yaml", web)
	a.Write("other.yaml", newPod("other", claim("shared", "shared", true)))
	a.Write("waiting.yaml", newPod("waiting", claim("data", "does-not-exist", false), e2eutil.EmptyDirVolume("scratch", "", "")))
	a.Start()
	c := a.RuntimeClient()
	ctx := t.Context()
	uids := map[string]string{}
	l, err := c.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Pods {
		uids[p.Name] = p.UID
	}
	if len(uids) != 3 {
		t.Fatalf("pods %+v, want web, other and waiting", l.Pods)
	}

	// A pod that cannot get its volumes: after the timeout, which volumes
	// and why, like the kubelet's WaitForAttachAndMount error.
	_, err = c.Wait(ctx, uids["waiting"], time.Second)
	var nr *client.NotReadyError
	if !errors.As(err, &nr) {
		t.Fatalf("wait for the waiting pod: %v, want a NotReadyError", err)
	}
	if bad := nr.NotReady(); len(bad) != 1 || bad[0].Name != "data" || bad[0].Reason != "PVCNotFound" || !strings.Contains(bad[0].Message, "does-not-exist") {
		t.Errorf("not ready: %+v, want only data, PVCNotFound", bad)
	}
	if !strings.Contains(err.Error(), "pod default/waiting: timed out after 1s: volumes not ready: data (PVCNotFound: ") {
		t.Errorf("error %q", err)
	}
	if v := volumeOf(t, nr.Pod, "scratch"); !v.Ready || v.HostPath == "" {
		t.Errorf("the pod's other volume: %+v, want ready", v)
	}

	p, err := c.Wait(ctx, uids["web"], settleTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if err := e2eutil.CheckReadyPaths(p); err != nil {
		t.Error(err)
	}
	uid := uids["web"]
	root := a.Root()
	for name, plugin := range map[string]string{"scratch": e2eutil.EmptyDirPlugin, "cache": e2eutil.EmptyDirPlugin, "logs": e2eutil.HostPathPlugin, "etc": e2eutil.HostPathPlugin, "shared": e2eutil.LocalPlugin, "data": e2eutil.LocalPlugin,
		"config": e2eutil.ConfigMapPlugin, "creds": e2eutil.SecretPlugin, "podinfo": e2eutil.DownwardAPIPlugin} {
		spec := name
		if plugin == e2eutil.LocalPlugin {
			spec = map[string]string{"shared": "shared", "data": "block"}[name]
		}
		v := volumeOf(t, p, name)
		if v.HostPath != a.volumeDir(uid, plugin, spec) || v.Plugin != plugin || v.VolumeMode != runtimeapi.Filesystem {
			t.Errorf("volume %+v, want %s at %s", v, plugin, a.volumeDir(uid, plugin, spec))
		}
		if v.SELinuxRelabel != (plugin != e2eutil.HostPathPlugin) {
			t.Errorf("volume %s: selinuxRelabel %v", name, v.SELinuxRelabel)
		}
		if api := plugin == e2eutil.ConfigMapPlugin || plugin == e2eutil.SecretPlugin || plugin == e2eutil.DownwardAPIPlugin; v.ReadOnly != api {
			t.Errorf("volume %s: readOnly %v, want %v (API data volumes go to containers read-only)", name, v.ReadOnly, api)
		}
	}
	// The raw block volume: its access point, a block device that is the
	// claim's device, passed to the container where volumeDevices says.
	raw := volumeOf(t, p, "raw")
	if want := e2eutil.DevicePath(root, uid, e2eutil.LocalPlugin, "raw"); raw.VolumeMode != runtimeapi.Block || raw.DevicePath != want || raw.HostPath != "" {
		t.Errorf("raw block volume %+v, want Block at %s", raw, want)
	}
	if got, err := e2eutil.Rdev(raw.DevicePath); err != nil {
		t.Error(err)
	} else if want, err := e2eutil.Rdev(rawLoop); err != nil || got != want {
		t.Errorf("access point %s is device %d, want %s's %d (%v)", raw.DevicePath, got, rawLoop, want, err)
	}
	if d := deviceOf(t, p, "app", "/dev/xvdb"); d.HostPath != raw.DevicePath || d.ReadOnly || d.Permissions != "mrw" {
		t.Errorf("container device %+v, want %s with mrw", d, raw.DevicePath)
	}
	// A configMap key through a sub-path: resolved through the atomic
	// writer's links (inside the volume), bound read-only.
	cm := mountOf(t, p, "app", "/etc/app/app.conf")
	if got := mounttest.ReadFile(t, cm.HostPath); got != "from the configMap" || !cm.ReadOnly {
		t.Errorf("configMap sub-path %+v reads %q", cm, got)
	}
	if ms := mounttest.MountsAt(t, cm.HostPath); len(ms) != 1 || !ms[0].HasOption("ro") {
		t.Errorf("configMap sub-path target: %+v, want one read-only bind mount", ms)
	}
	logs := mountOf(t, p, "app", "/var/log/app")
	if want := e2eutil.SubPathTarget(root, uid, e2eutil.HostPathPlugin, "logs", "app", 9); logs.HostPath != want || logs.SubPath != "web/logs" {
		t.Errorf("subPathExpr mount %+v, want %s (web/logs)", logs, want)
	}
	if fi, err := os.Stat(filepath.Join(logsDir, "web", "logs")); err != nil || !fi.IsDir() {
		t.Errorf("the sub-path's missing directories were not created: %v", err)
	}
	mounttest.WriteFile(t, filepath.Join(logs.HostPath, "app.log"), "line")
	if got := mounttest.ReadFile(t, filepath.Join(logsDir, "web", "logs", "app.log")); got != "line" {
		t.Errorf("written through the sub-path, the host sees %q", got)
	}
	conf := mountOf(t, p, "app", "/etc/app.conf")
	if got := mounttest.ReadFile(t, conf.HostPath); got != "setting=1" || !conf.ReadOnly {
		t.Errorf("file sub-path %+v reads %q", conf, got)
	}
	if err := os.WriteFile(conf.HostPath, []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("writing the read-only file sub-path: %v, want EROFS", err)
	}
	if m := mountOf(t, p, "init", "/out"); m.HostPath != e2eutil.SubPathTarget(root, uid, e2eutil.EmptyDirPlugin, "scratch", "init", 0) {
		t.Errorf("init container's sub-path %+v", m)
	}
	if m := mountOf(t, p, "app", "/mnt/scratch"); m.HostPath != a.volumeDir(uid, e2eutil.EmptyDirPlugin, "scratch") || m.SubPath != "" {
		t.Errorf("whole-volume mount %+v", m)
	}
	other, err := c.Pod(ctx, uids["other"])
	if err != nil {
		t.Fatal(err)
	}
	if m := mountOf(t, other, "main", "/mnt/shared"); !other.Ready || !m.ReadOnly {
		t.Errorf("other: %+v, want ready with the claim read-only", other)
	}
	subPathMounts := mounttest.MountsUnder(t, filepath.Join(e2eutil.PodDir(root, uid), "volume-subpaths"))
	if len(subPathMounts) != 5 {
		t.Errorf("sub-path mounts %v, want 5", mounttest.MountPoints(subPathMounts))
	}

	// With the pod gone, everything of it goes, sub-paths first; the
	// data stays on the host.
	a.Remove("web.yaml")
	e2eutil.PollErr(t, settleTimeout, "web's mounts gone", func() error {
		if err := noMountsUnder(t, e2eutil.PodDir(root, uid)); err != nil {
			return err
		}
		if mounttest.Exists(t, e2eutil.PodDir(root, uid)) {
			return errors.New("the pod directory is still there")
		}
		return nil
	})
	if _, err := c.Pod(ctx, uid); !client.IsNotFound(err) {
		t.Errorf("the API still answers about a deleted pod: %v", err)
	}
	if got := mounttest.ReadFile(t, filepath.Join(logsDir, "web", "logs", "app.log")); got != "line" {
		t.Errorf("host data after the pod went: %q", got)
	}
}

// Whenever the API says a pod is ready, every path it gives is mounted:
// pods come and go while waits are answered, and each answer is checked
// against the mount table the moment it arrives.
func TestRuntimeAPIReadyMeansMounted(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	host := mounttest.TempDir(t)
	a := newAgent(t)
	shared := filepath.Join(host, "shared")
	mounttest.WriteFile(t, filepath.Join(shared, "f"), "x")
	a.Write("storage.yaml", e2eutil.LocalPV("shared", shared, "shared", corev1.LabelHostname, nodeName), e2eutil.PVC("shared", "shared"))
	a.Start()
	c := a.RuntimeClient()

	const pods = 24
	var wg sync.WaitGroup
	errs := make(chan error, pods)
	checked := make([]chan struct{}, pods)
	for i := range pods {
		checked[i] = make(chan struct{})
		name := fmt.Sprintf("p%02d", i)
		pod := newPod(name,
			e2eutil.MemoryVolume("mem"),
			e2eutil.HostPathVolume("logs", filepath.Join(host, "logs"), hostPathType(corev1.HostPathDirectoryOrCreate)),
			claim("shared", "shared", false),
		)
		pod.UID = types.UID("uid-" + name)
		withFieldEnv(pod, "POD_NAME", "metadata.name")
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: "mem", MountPath: "/sub", SubPath: "a/b"},
			corev1.VolumeMount{Name: "logs", MountPath: "/logs", SubPathExpr: "$(POD_NAME)"},
			corev1.VolumeMount{Name: "shared", MountPath: "/f", SubPath: "f"},
		)
		// The wait starts before the agent can know the pod.
		wg.Go(func() {
			defer close(checked[i])
			p, err := c.Wait(t.Context(), string(pod.UID), settleTimeout)
			if err == nil {
				err = e2eutil.CheckReadyPaths(p)
			}
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		})
		a.Write(name+".yaml", pod)
		if i >= 4 && i%2 == 0 {
			// Churn: an earlier pod goes (once checked) while others
			// come.
			<-checked[i-4]
			a.Remove(fmt.Sprintf("p%02d.yaml", i-4))
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A pod that swaps a component of its sub-path for a link out of the
// volume gets nothing mounted from outside: the sub-path fails with a
// reason the API and an event give, the other volumes are fine, and once
// the link is a directory again the pod gets its sub-path.
func TestSubPathLinkOutOfVolume(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	host := mounttest.TempDir(t)
	vol := filepath.Join(host, "vol")
	secret := filepath.Join(host, "secret")
	mounttest.WriteFile(t, filepath.Join(secret, "key"), "not for pods")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(vol, "data")); err != nil {
		t.Fatal(err)
	}
	a := newAgent(t)
	pod := newPod("attacker", e2eutil.HostPathVolume("vol", vol, nil), e2eutil.EmptyDirVolume("scratch", "", ""))
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "vol", MountPath: "/data", SubPath: "data"})
	a.Write("attacker.yaml", pod)
	a.Start()
	uid := a.podUID("attacker")
	c := a.RuntimeClient()
	_, err := c.Wait(t.Context(), uid, 2*time.Second)
	var nr *client.NotReadyError
	if !errors.As(err, &nr) {
		t.Fatalf("wait: %v, want NotReadyError", err)
	}
	bad := nr.NotReady()
	if len(bad) != 1 || bad[0].Name != "vol" || bad[0].Reason != runtimeapi.ReasonSubPathFailed || !strings.Contains(bad[0].Message, "leaves the volume") {
		t.Errorf("not ready: %+v, want vol failing because the sub-path leaves the volume", bad)
	}
	for _, m := range mounttest.MountsUnder(t, a.Root()) {
		if strings.Contains(m.Root, "secret") {
			t.Errorf("%s mounts %s from outside the volume", m.MountPoint, m.Root)
		}
	}
	e2eutil.PollErr(t, settleTimeout, "an event about the sub-path", func() error {
		ev, err := a.Events()
		if err != nil {
			return err
		}
		for _, e := range ev.Events {
			if e.Reason == "FailedMount" && strings.Contains(e.Message, "prepare_subpaths") && strings.Contains(e.Message, `failed to prepare subPath "data" for the volumeMount at /data of container "main"`) {
				return nil
			}
		}
		return fmt.Errorf("no such event in %+v", ev.Events)
	})

	if err := os.Remove(filepath.Join(vol, "data")); err != nil {
		t.Fatal(err)
	}
	mounttest.WriteFile(t, filepath.Join(vol, "data", "key"), "the pod's own")
	p, err := c.Wait(t.Context(), uid, settleTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if got := mounttest.ReadFile(t, filepath.Join(mountOf(t, p, "main", "/data").HostPath, "key")); got != "the pod's own" {
		t.Errorf("sub-path shows %q", got)
	}
}

// A client that is not root gets nothing: the example consumer run as uid
// 65534 is refused.
func TestRuntimeAPIRefusesNonRoot(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	a := newAgent(t)
	a.Write("web.yaml", newPod("web", e2eutil.EmptyDirVolume("scratch", "", "")))
	a.Start()
	socket := runtimeapi.Socket(a.Root())
	// Even with the way to the socket open (the test's root directory is
	// not), the socket's mode refuses the connection.
	for dir := filepath.Dir(socket); dir != "/" && dir != "/tmp"; dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := func() (string, error) {
		cmd := exec.CommandContext(t.Context(), consumerBinary, "-socket", socket, "-list")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run()
	if err == nil || !strings.Contains(out, "permission denied") || strings.Contains(out, "web") {
		t.Errorf("uid 65534: %v\n%s\nwant permission denied and no pod", err, out)
	}
	// As root, the same program lists the pod.
	out2, err := exec.CommandContext(t.Context(), consumerBinary, "-socket", socket, "-list").CombinedOutput()
	if err != nil || !strings.Contains(string(out2), "default/web uid=") {
		t.Errorf("as root: %v\n%s", err, out2)
	}
}

// The example consumer (what `make run` shows): containers run with their
// volumes where volumeMounts say, read-only where asked, sub-paths
// included; an init container's output is there for the next one; a pod
// whose volumes are not ready does not start and the consumer says why.
func TestRuntimeConsumer(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	host := mounttest.TempDir(t)
	a := newAgent(t)
	mounttest.WriteFile(t, filepath.Join(host, "content", "index.html"), "hello from the host\n")
	a.Write("storage.yaml", e2eutil.LocalPV("content", filepath.Join(host, "content"), "content", corev1.LabelHostname, nodeName), e2eutil.PVC("content", "content"))
	pod := newPod("app", e2eutil.EmptyDirVolume("scratch", "", ""), e2eutil.MemoryVolume("mem"), claim("content", "content", true))
	c := &pod.Spec.Containers[0]
	c.Command = []string{"sh", "-c", `cat /mnt/content/index.html; cat /from-init/msg; ` +
		`touch /mnt/content/x 2>/dev/null && echo content-writable || echo content-read-only; ` +
		`echo written > /mnt/scratch/out && awk '$2 == "/mnt/mem" {print "mem is " $3}' /proc/mounts`}
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "scratch", MountPath: "/from-init", SubPath: "init"})
	pod.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", Command: []string{"sh", "-c", "echo from init > /out/msg"},
		VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/out", SubPath: "init"}}}}
	a.Write("app.yaml", pod)
	a.Start()

	consumed := e2eutil.NewManifests(t) // what the consumer reads
	consumed.Write("app.yaml", pod)
	manifests := consumed.Dir
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, consumerBinary, "-socket", runtimeapi.Socket(a.Root()), "-manifests", manifests, "-timeout", "20s").CombinedOutput()
	if err != nil {
		t.Fatalf("consumer: %v\n%s", err, out)
	}
	for _, want := range []string{
		"[default/app/main] hello from the host",
		"[default/app/main] from init",
		"[default/app/main] content-read-only",
		"[default/app/main] mem is tmpfs",
		"[default/app] all containers exited 0",
	} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	uid := a.podUID("app")
	if got := mounttest.ReadFile(t, filepath.Join(a.volumeDir(uid, e2eutil.EmptyDirPlugin, "scratch"), "out")); got != "written\n" {
		t.Errorf("the container's write to its emptyDir: the node sees %q", got)
	}
	for _, m := range mounttest.Mounts(t) {
		if strings.Contains(m.MountPoint, "/runtime-consumer-") {
			t.Errorf("the consumer's mount %s is visible outside its containers", m.MountPoint)
		}
	}

	// A pod that cannot start.
	waiting := newPod("waiting", claim("data", "missing", false))
	waiting.Spec.Containers[0].Command = []string{"echo", "never"}
	consumed.Write("waiting.yaml", waiting)
	a.Write("waiting.yaml", waiting)
	out, err = exec.CommandContext(ctx, consumerBinary, "-socket", runtimeapi.Socket(a.Root()), "-manifests", manifests, "-timeout", "2s").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "[default/waiting] not started: timed out after 2s: volumes not ready: data (PVCNotFound") ||
		strings.Contains(string(out), "never") {
		t.Errorf("consumer with a pod that cannot start: %v\n%s", err, out)
	}
}
