package e2eutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The agent's volume plugins.
const (
	EmptyDirPlugin = "kubernetes.io/empty-dir"
	HostPathPlugin = "kubernetes.io/host-path"
	LocalPlugin    = "kubernetes.io/local-volume"
	CSIPlugin      = "kubernetes.io/csi"
	// API volumes.
	ConfigMapPlugin   = "kubernetes.io/configmap"
	SecretPlugin      = "kubernetes.io/secret"
	DownwardAPIPlugin = "kubernetes.io/downward-api"
	ProjectedPlugin   = "kubernetes.io/projected"
)

// VolumeDir is where the agent mounts a pod's volume under its root
// directory: the PV's name for volumes of a claim, the pod's volume name
// otherwise. plugin is escaped as the kubelet does (/ becomes ~).
func VolumeDir(root, podUID, plugin, specName string) string {
	return filepath.Join(PodDir(root, podUID), "volumes", escape(plugin), specName)
}

// GlobalMount is where the agent mounts (stages) a device once for every
// pod of a volume: identity is the PV's name for local volumes and
// driver^handle for CSI ones.
func GlobalMount(root, plugin, identity string) string {
	return filepath.Join(root, "plugins", escape(plugin), "mounts", identity, "globalmount")
}

// PodDir is a pod's directory under the agent's root directory.
func PodDir(root, podUID string) string { return filepath.Join(root, "pods", podUID) }

func escape(plugin string) string { return strings.ReplaceAll(plugin, "/", "~") }

// Pod is a pod in namespace, on node unless that is "", whose one
// container mounts every volume at /mnt/<name> (the agent only mounts
// volumes some container uses), without a service account token (tests of
// other volumes need no kube-api-access volume; set
// AutomountServiceAccountToken to nil for one). It has its TypeMeta, for
// manifests.
func Pod(namespace, node, name string, vols ...corev1.Volume) *corev1.Pod {
	c := corev1.Container{Name: "main", Image: "registry.k8s.io/pause:3.10"}
	for _, v := range vols {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/mnt/" + v.Name})
	}
	no := false
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: &no,
			Containers:                   []corev1.Container{c},
			Volumes:                      vols,
		},
	}
}

// EmptyDirVolume is an emptyDir volume; sizeLimit may be "".
func EmptyDirVolume(name string, medium corev1.StorageMedium, sizeLimit string) corev1.Volume {
	src := &corev1.EmptyDirVolumeSource{Medium: medium}
	if sizeLimit != "" {
		q := resource.MustParse(sizeLimit)
		src.SizeLimit = &q
	}
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: src}}
}

// MemoryVolume is an emptyDir of medium Memory: a 1 MiB tmpfs.
func MemoryVolume(name string) corev1.Volume {
	return EmptyDirVolume(name, corev1.StorageMediumMemory, "1Mi")
}

// HostPathVolume is a hostPath volume; typ may be nil.
func HostPathVolume(name, path string, typ *corev1.HostPathType) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: typ}}}
}

// ClaimVolume is a volume of the claim.
func ClaimVolume(name, claim string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}}
}

// LocalPV is a 64 MiB local PersistentVolume on path, bound to the claim
// default/claim and available on the nodes whose label key has value: for
// standalone manifests.
func LocalPV(name, path, claim, key, value string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: path}},
			ClaimRef:               &corev1.ObjectReference{Namespace: "default", Name: claim},
			NodeAffinity:           NodeAffinity(key, value),
		},
	}
}

// PreBoundPV is a PersistentVolume of size from source, of the class,
// ReadWriteOnce, with reclaim policy Retain, pre-bound to the claim
// namespace/claim: in a suite where every test uses the same class and
// size, the PV binder (which still binds) gives it to no other test's
// claim.
func PreBoundPV(name, size, class, namespace, claim string, source corev1.PersistentVolumeSource) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              class,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        source,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: namespace, Name: claim},
		},
	}
}

// NodeAffinity makes a (local) PersistentVolume available on the nodes
// whose label key has value, e.g. kubernetes.io/hostname and a node's name.
func NodeAffinity(key, value string) *corev1.VolumeNodeAffinity {
	return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{value}}},
	}}}}
}

// PVC is a 64 MiB claim default/name bound to the volume: for standalone
// manifests.
func PVC(name, volumeName string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
			VolumeName:  volumeName,
		},
	}
}

// Manifests is a standalone agent's --pod-manifest-path.
type Manifests struct {
	t   *testing.T
	Dir string
}

// NewManifests makes an empty manifest directory.
func NewManifests(t *testing.T) *Manifests { return &Manifests{t: t, Dir: t.TempDir()} }

// WriteRaw (re)places a manifest file atomically: written under a name the
// agent ignores, then renamed, so that it never reads half a file.
func (m *Manifests) WriteRaw(name, content string) {
	m.t.Helper()
	tmp := filepath.Join(m.Dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.Dir, name)); err != nil {
		m.t.Fatal(err)
	}
}

// Write writes objects as a multi-document YAML manifest.
func (m *Manifests) Write(name string, objs ...any) {
	m.t.Helper()
	var docs []string
	for _, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			m.t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	m.WriteRaw(name, strings.Join(docs, "---\n"))
}

// Remove removes a manifest file.
func (m *Manifests) Remove(name string) {
	m.t.Helper()
	if err := os.Remove(filepath.Join(m.Dir, name)); err != nil {
		m.t.Fatal(err)
	}
}
