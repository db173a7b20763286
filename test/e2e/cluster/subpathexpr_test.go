package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// subPathExpr with every source of a container's variables reaches a
// prepared sub-path: configMapKeyRef, secretKeyRef, envFrom with a prefix,
// resourceFieldRef, the pod's IP (a wait until its status has one) and the
// node's. A required ConfigMap that is missing is an error naming the pod,
// volume, container and object until it is created; a value changed after
// the sub-path was prepared does not move it.
func TestSubPathExprVariableSources(t *testing.T) {
	e := newEnv(t, "subpathexpr")
	e.createConfigMap("paths", map[string]string{"dir": "from-cm"}, false)
	e.createConfigMap("bulk", map[string]string{"sub": "from-envfrom"}, false)
	e.createSecret("creds", map[string]string{"user": "alice"})
	if _, err := suite.Admin.CoreV1().Nodes().Patch(t.Context(), e.node, types.StrategicMergePatchType,
		[]byte(`{"status":{"addresses":[{"type":"Hostname","address":"h"},{"type":"InternalIP","address":"192.0.2.10"}]}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	e.start()

	keyRef := func(name, key string) *corev1.ConfigMapKeySelector {
		return &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}
	}
	pod := e.pod("app", e2eutil.EmptyDirVolume("scratch", "", ""))
	c := &pod.Spec.Containers[0]
	c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
	c.EnvFrom = []corev1.EnvFromSource{{Prefix: "EF_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "bulk"}}}}
	c.Env = []corev1.EnvVar{
		{Name: "CM", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: keyRef("paths", "dir")}},
		{Name: "SEC", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "user"}}},
		{Name: "OPT", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nowhere"}, Key: "k", Optional: ptr.To(true)}}},
		{Name: "MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
		{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "HOST", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
	}
	want := []string{"cm/from-cm", "sec/alice", "ef/from-envfrom", "opt/x", "mem/64", "ip/10.1.2.3", "host/192.0.2.10"}
	for i, expr := range []string{"cm/$(CM)", "sec/$(SEC)", "ef/$(EF_sub)", "opt/x$(OPT)", "mem/$(MEM)", "ip/$(IP)", "host/$(HOST)"} {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "scratch", MountPath: fmt.Sprintf("/s%d", i), SubPathExpr: expr})
	}
	pod = e.createPod(pod)

	// The optional ConfigMap is missing: $(OPT) is unset, so "opt/x$(OPT)"
	// is missing a value, as for the kubelet.
	e.waitEvent("app", "FailedMount", nil, `container "main" volumeMount at /s3`, "missing value for OPT")
	// The optional ConfigMap appears; what is left is a wait for the
	// pod's IP, with the reason.
	e.createConfigMap("nowhere", map[string]string{"k": "y"}, false)
	e2eutil.Poll(t, time.Minute, "the pod waits for its IP", func(ctx context.Context) (bool, string) {
		dsw, err := e.agent.GetRaw("/debug/dsw")
		if err != nil {
			return false, err.Error()
		}
		if strings.Contains(dsw, "missing value for OPT") {
			return false, "still missing OPT"
		}
		return strings.Contains(dsw, "SubPathExprWaiting") && strings.Contains(dsw, "status.podIP, and the pod's status has no IP yet"), "no wait for the pod's IP in /debug/dsw"
	})
	e.waitCondition("app", corev1.ConditionFalse, "WaitingForVolumes")
	e.patchStatus("app", `{"status":{"podIP":"10.1.2.3","podIPs":[{"ip":"10.1.2.3"}]}}`)
	e.waitCondition("app", corev1.ConditionTrue, "VolumesMounted")

	want[3] = "opt/xy"
	vol := e.volumePath(pod.UID, e2eutil.EmptyDirPlugin, "scratch")
	for i, sub := range want {
		target := e2eutil.SubPathTarget(e.root, string(pod.UID), e2eutil.EmptyDirPlugin, "scratch", "main", i+1) // index 0: the whole volume at /mnt/scratch
		e.waitMounted(target)
		if st, err := os.Stat(filepath.Join(vol, sub)); err != nil || !st.IsDir() {
			t.Errorf("sub-path %s of mount %d was not prepared in the volume: %v", sub, i, err)
		}
	}

	// The ConfigMap changes after the sub-path was prepared: a new pod
	// reading it sees the new value (so the agent has it), the running
	// pod's mount stays where it is even when the pod is resolved again.
	if _, err := suite.Admin.CoreV1().ConfigMaps(e.ns).Update(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "paths", Namespace: e.ns}, Data: map[string]string{"dir": "changed"}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	witness := e.pod("witness", e2eutil.EmptyDirVolume("scratch", "", ""))
	witness.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "CM", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: keyRef("paths", "dir")}}}
	witness.Spec.Containers[0].VolumeMounts[0].SubPathExpr = "cm/$(CM)"
	witness = e.createPod(witness)
	e.waitCondition("witness", corev1.ConditionTrue, "VolumesMounted")
	if _, err := os.Stat(filepath.Join(e.volumePath(witness.UID, e2eutil.EmptyDirPlugin, "scratch"), "cm", "changed")); err != nil {
		t.Fatalf("the witness did not get the new value: %v", err)
	}
	if _, err := suite.Admin.CoreV1().Pods(e.ns).Patch(t.Context(), "app", types.StrategicMergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.barrier("after-touch")
	if _, err := os.Stat(filepath.Join(vol, "cm", "changed")); !os.IsNotExist(err) {
		t.Errorf("a changed value moved the running pod's sub-path (cm/changed: %v)", err)
	}
	e.waitCondition("app", corev1.ConditionTrue, "VolumesMounted")

	// A required ConfigMap that is missing names the pod, volume,
	// container and object, and the pod gets its sub-path once it exists.
	late := e.pod("late", e2eutil.EmptyDirVolume("scratch", "", ""))
	late.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "CM", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: keyRef("later", "dir")}}}
	late.Spec.Containers[0].VolumeMounts[0].SubPathExpr = "$(CM)"
	late = e.createPod(late)
	e.waitEvent("late", "FailedMount", nil, fmt.Sprintf(`pod %s/late volume "scratch": container "main" volumeMount at /mnt/scratch`, e.ns), fmt.Sprintf("ConfigMap %s/later not found", e.ns))
	e.waitCondition("late", corev1.ConditionFalse, "VolumeErrors")
	e.createConfigMap("later", map[string]string{"dir": "arrived"}, false)
	e.waitCondition("late", corev1.ConditionTrue, "VolumesMounted")
	if _, err := os.Stat(filepath.Join(e.volumePath(late.UID, e2eutil.EmptyDirPlugin, "scratch"), "arrived")); err != nil {
		t.Errorf("late sub-path: %v", err)
	}
	checkNoBroadReads(t, suite.User)
}
