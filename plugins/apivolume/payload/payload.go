// Package payload turns the API volume sources of a pod (configMap, secret,
// downwardAPI, projected) into the files their volume must hold, with the
// API's semantics: items, defaultMode and per-item modes, optional objects
// and keys, binaryData, the downward API's file formats, and the merging of
// projected sources. It does no I/O: objects and tokens come from a Getter
// the caller provides, so every rule here is a plain function of its inputs.
package payload

import (
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/atomicdir"
)

// DefaultMode is the API's default for defaultMode of all four sources.
const DefaultMode = 0o644

// Getter fetches what payloads are built from. Objects are in the pod's
// namespace; a missing object is an error for which apierrors.IsNotFound
// is true.
type Getter interface {
	ConfigMap(name string) (*v1.ConfigMap, error)
	Secret(name string) (*v1.Secret, error)
	// Token returns a service-account token for the projection.
	Token(p *v1.ServiceAccountTokenProjection) ([]byte, error)
	// TrustBundle returns the PEM bundle the projection selects; a
	// selection that matches nothing is NotFound.
	TrustBundle(p *v1.ClusterTrustBundleProjection) ([]byte, error)
	// PodCertificate returns the private key (PEM) and certificate chain
	// of the podCertificate projection that is source number source.
	PodCertificate(source int, p *v1.PodCertificateProjection) (key, chain []byte, err error)
}

// Pod is what payloads need to know about the pod: downwardAPI items read
// its metadata and its containers' resources, and token files may belong
// to its single user.
type Pod struct {
	Name, Namespace string
	UID             types.UID
	Labels          map[string]string
	Annotations     map[string]string
	// Containers are the regular containers, then the init containers.
	Containers []Container
	// FSUser is the user every container runs as, when they all run as
	// the same one (the kubelet's FsUser); it owns token files.
	FSUser  *int64
	FSGroup *int64
	// NestedMounts lists, by volume name, where containers mount other
	// volumes beneath it (relative to it): these directories must exist
	// in the volume, which containers see read-only.
	NestedMounts map[string][]string
}

// Container is a container's name and resources.
type Container struct {
	Name      string
	Resources v1.ResourceRequirements
}

// FromObject copies what payloads need out of a pod. Labels and
// annotations are kept only when want says a downwardAPI item reads them
// (annotations can be large, and most pods have no such item).
func FromObject(pod *v1.Pod, labels, annotations bool) *Pod {
	p := &Pod{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, FSUser: fsUser(pod), NestedMounts: nestedMounts(pod)}
	if labels {
		p.Labels = pod.Labels
	}
	if annotations {
		p.Annotations = pod.Annotations
	}
	if sc := pod.Spec.SecurityContext; sc != nil {
		p.FSGroup = sc.FSGroup
	}
	for _, cs := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			p.Containers = append(p.Containers, Container{Name: cs[i].Name, Resources: cs[i].Resources})
		}
	}
	return p
}

// nestedMounts finds, for each volume, the mount points of other volumes
// beneath it in the same container: only the outermost ones (a volume at
// /a/b beneath one at /a beneath this one at / needs only "a").
func nestedMounts(pod *v1.Pod) map[string][]string {
	var out map[string][]string
	add := func(mounts []v1.VolumeMount) {
		for _, m := range mounts {
			base := path.Clean(m.MountPath)
			prefix := strings.TrimSuffix(base, "/") + "/"
			var found []string
			for _, n := range mounts {
				p := path.Clean(n.MountPath)
				if strings.HasPrefix(p, prefix) {
					found = append(found, p[len(prefix):])
				}
			}
			sort.Strings(found)
			for i, rel := range found {
				if i > 0 && slices.ContainsFunc(found[:i], func(o string) bool { return o == rel || strings.HasPrefix(rel, o+"/") }) {
					continue
				}
				if out == nil {
					out = map[string][]string{}
				}
				if !slices.Contains(out[m.Name], rel) {
					out[m.Name] = append(out[m.Name], rel)
				}
			}
		}
	}
	for i := range pod.Spec.InitContainers {
		add(pod.Spec.InitContainers[i].VolumeMounts)
	}
	for i := range pod.Spec.Containers {
		add(pod.Spec.Containers[i].VolumeMounts)
	}
	for i := range pod.Spec.EphemeralContainers {
		add(pod.Spec.EphemeralContainers[i].VolumeMounts)
	}
	return out
}

// fsUser is the user all containers (init, regular, ephemeral) run as, if
// it is the same for all and known.
func fsUser(pod *v1.Pod) *int64 {
	var podUser *int64
	if pod.Spec.SecurityContext != nil {
		podUser = pod.Spec.SecurityContext.RunAsUser
	}
	var found *int64
	check := func(sc *v1.SecurityContext) bool {
		u := podUser
		if sc != nil && sc.RunAsUser != nil {
			u = sc.RunAsUser
		}
		if u == nil || (found != nil && *found != *u) {
			return false
		}
		found = u
		return true
	}
	for i := range pod.Spec.InitContainers {
		if !check(pod.Spec.InitContainers[i].SecurityContext) {
			return nil
		}
	}
	for i := range pod.Spec.Containers {
		if !check(pod.Spec.Containers[i].SecurityContext) {
			return nil
		}
	}
	for i := range pod.Spec.EphemeralContainers {
		if !check(pod.Spec.EphemeralContainers[i].SecurityContext) {
			return nil
		}
	}
	return found
}

// Inputs are everything Build reads.
type Inputs struct {
	Pod *Pod
	// NodeAllocatable fills unset container limits of resourceFieldRef
	// items (cpu, memory, ephemeral-storage), as the kubelet does.
	NodeAllocatable v1.ResourceList
	Get             Getter
}

// Build returns the files of an API volume. Problems with several items or
// sources are reported together; any problem fails the whole volume, so an
// existing volume keeps its old content.
func Build(vs *v1.VolumeSource, in Inputs) (atomicdir.Payload, error) {
	switch {
	case vs.ConfigMap != nil:
		out := atomicdir.Payload{}
		return out, configMap(out, &vs.ConfigMap.LocalObjectReference, vs.ConfigMap.Items, vs.ConfigMap.Optional, mode(vs.ConfigMap.DefaultMode), in.Get)
	case vs.Secret != nil:
		out := atomicdir.Payload{}
		ref := v1.LocalObjectReference{Name: vs.Secret.SecretName}
		return out, secret(out, &ref, vs.Secret.Items, vs.Secret.Optional, mode(vs.Secret.DefaultMode), in.Get)
	case vs.DownwardAPI != nil:
		out := atomicdir.Payload{}
		return out, downwardAPI(out, vs.DownwardAPI.Items, mode(vs.DownwardAPI.DefaultMode), in)
	case vs.Projected != nil:
		return projected(vs.Projected, in)
	}
	return nil, errors.New("not a configMap, secret, downwardAPI or projected volume")
}

func mode(m *int32) os.FileMode {
	if m == nil {
		return DefaultMode
	}
	return os.FileMode(*m)
}

func itemMode(m *int32, def os.FileMode) os.FileMode {
	if m == nil {
		return def
	}
	return os.FileMode(*m)
}

func isTrue(b *bool) bool { return b != nil && *b }

// configMap adds a ConfigMap's keys (data and binaryData) to out.
func configMap(out atomicdir.Payload, ref *v1.LocalObjectReference, items []v1.KeyToPath, optional *bool, def os.FileMode, get Getter) error {
	cm, err := get.ConfigMap(ref.Name)
	switch {
	case apierrors.IsNotFound(err) && isTrue(optional):
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("configMap %q not found", ref.Name)
	case err != nil:
		return fmt.Errorf("configMap %q: %w", ref.Name, err)
	}
	values := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		values[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		values[k] = v
	}
	return keys(out, "configMap", ref.Name, values, items, optional, def)
}

// secret adds a Secret's keys to out.
func secret(out atomicdir.Payload, ref *v1.LocalObjectReference, items []v1.KeyToPath, optional *bool, def os.FileMode, get Getter) error {
	s, err := get.Secret(ref.Name)
	switch {
	case apierrors.IsNotFound(err) && isTrue(optional):
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("secret %q not found", ref.Name)
	case err != nil:
		return fmt.Errorf("secret %q: %w", ref.Name, err)
	}
	return keys(out, "secret", s.Name, s.Data, items, optional, def)
}

// keys adds values to out: every key at its own name, or the listed items.
func keys(out atomicdir.Payload, kind, name string, values map[string][]byte, items []v1.KeyToPath, optional *bool, def os.FileMode) error {
	if len(items) == 0 {
		names := make([]string, 0, len(values))
		for k := range values {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			if err := atomicdir.ValidatePath(k); err != nil {
				return fmt.Errorf("%s %q: key %q cannot be a file name: %w", kind, name, k, err)
			}
			out[k] = atomicdir.File{Data: values[k], Mode: def}
		}
		return nil
	}
	var errs []error
	for _, it := range items {
		v, ok := values[it.Key]
		if !ok {
			if !isTrue(optional) {
				errs = append(errs, fmt.Errorf("%s %q has no key %q", kind, name, it.Key))
			}
			continue
		}
		if err := atomicdir.ValidatePath(it.Path); err != nil {
			errs = append(errs, fmt.Errorf("%s %q, key %q: %w", kind, name, it.Key, err))
			continue
		}
		out[it.Path] = atomicdir.File{Data: v, Mode: itemMode(it.Mode, def)}
	}
	return errors.Join(errs...)
}

// projected merges the sources in order; a later source overwrites a path
// of an earlier one, as in the kubelet.
func projected(src *v1.ProjectedVolumeSource, in Inputs) (atomicdir.Payload, error) {
	def := mode(src.DefaultMode)
	out := atomicdir.Payload{}
	var errs []error
	for i := range src.Sources {
		s := &src.Sources[i]
		var err error
		switch {
		case s.ConfigMap != nil:
			err = configMap(out, &s.ConfigMap.LocalObjectReference, s.ConfigMap.Items, s.ConfigMap.Optional, def, in.Get)
		case s.Secret != nil:
			err = secret(out, &s.Secret.LocalObjectReference, s.Secret.Items, s.Secret.Optional, def, in.Get)
		case s.DownwardAPI != nil:
			err = downwardAPI(out, s.DownwardAPI.Items, def, in)
		case s.ServiceAccountToken != nil:
			err = token(out, s.ServiceAccountToken, def, in)
		case s.ClusterTrustBundle != nil:
			err = trustBundle(out, s.ClusterTrustBundle, def, in)
		case s.PodCertificate != nil:
			err = podCertificate(out, i, s.PodCertificate, def, in)
		default:
			err = fmt.Errorf("projected source %d has no known type", i)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// credentialFile is how token and trust bundle files are written: 0600 and
// owned by the pod's single user when there is one or an fsGroup (the
// fsGroup pass then makes it 0640), defaultMode otherwise.
func credentialFile(data []byte, def os.FileMode, pod *Pod) atomicdir.File {
	f := atomicdir.File{Data: data, Mode: def}
	if pod != nil && (pod.FSUser != nil || pod.FSGroup != nil) {
		f.Mode, f.UID = 0o600, pod.FSUser
	}
	return f
}

func token(out atomicdir.Payload, p *v1.ServiceAccountTokenProjection, def os.FileMode, in Inputs) error {
	if err := atomicdir.ValidatePath(p.Path); err != nil {
		return fmt.Errorf("serviceAccountToken: %w", err)
	}
	if p.ExpirationSeconds != nil && *p.ExpirationSeconds < MinTokenExpirationSeconds {
		return fmt.Errorf("serviceAccountToken: expirationSeconds %d is below the minimum of %d", *p.ExpirationSeconds, MinTokenExpirationSeconds)
	}
	tok, err := in.Get.Token(p)
	if err != nil {
		return fmt.Errorf("serviceAccountToken %q: %w", p.Path, err)
	}
	out[p.Path] = credentialFile(tok, def, in.Pod)
	return nil
}

// podCertificate writes the files the projection names, as the kubelet
// does: the credential bundle (the key, then the chain), the key, the
// chain; each with the mode of token files.
func podCertificate(out atomicdir.Payload, source int, p *v1.PodCertificateProjection, def os.FileMode, in Inputs) error {
	if err := ValidatePodCertificate(p); err != nil {
		return err
	}
	key, chain, err := in.Get.PodCertificate(source, p)
	if err != nil {
		return fmt.Errorf("podCertificate (signer %q): %w", p.SignerName, err)
	}
	for path, data := range PodCertificateFiles(p, key, chain) {
		out[path] = credentialFile(data, def, in.Pod)
	}
	return nil
}

// PodCertificateFiles maps each path a podCertificate projection names to
// its content.
func PodCertificateFiles(p *v1.PodCertificateProjection, key, chain []byte) map[string][]byte {
	out := map[string][]byte{}
	if p.CredentialBundlePath != "" {
		out[p.CredentialBundlePath] = append(append([]byte{}, key...), chain...)
	}
	if p.KeyPath != "" {
		out[p.KeyPath] = key
	}
	if p.CertificateChainPath != "" {
		out[p.CertificateChainPath] = chain
	}
	return out
}

// podCertificateKeyTypes are the key types the API allows.
var podCertificateKeyTypes = []string{"RSA3072", "RSA4096", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"}

// ValidatePodCertificate checks what the API server checks of a
// podCertificate projection besides the signer's name.
func ValidatePodCertificate(p *v1.PodCertificateProjection) error {
	var errs []error
	if p.SignerName == "" {
		errs = append(errs, errors.New("podCertificate: signerName is required"))
	}
	if !slices.Contains(podCertificateKeyTypes, p.KeyType) {
		errs = append(errs, fmt.Errorf("podCertificate: keyType %q is not one of %v", p.KeyType, podCertificateKeyTypes))
	}
	if e := p.MaxExpirationSeconds; e != nil && *e < 3600 {
		errs = append(errs, fmt.Errorf("podCertificate: maxExpirationSeconds %d is below the minimum of 3600", *e))
	}
	if p.CredentialBundlePath == "" && p.KeyPath == "" && p.CertificateChainPath == "" {
		errs = append(errs, errors.New("podCertificate: specify at least one of credentialBundlePath, keyPath and certificateChainPath"))
	}
	for _, pth := range []string{p.CredentialBundlePath, p.KeyPath, p.CertificateChainPath} {
		if pth == "" {
			continue
		}
		if err := atomicdir.ValidatePath(pth); err != nil {
			errs = append(errs, fmt.Errorf("podCertificate: %w", err))
		}
	}
	return errors.Join(errs...)
}

// MinTokenExpirationSeconds is the API's minimum for expirationSeconds.
const MinTokenExpirationSeconds = 600

// DefaultTokenExpirationSeconds is the API's default expirationSeconds.
const DefaultTokenExpirationSeconds = 3600

func trustBundle(out atomicdir.Payload, p *v1.ClusterTrustBundleProjection, def os.FileMode, in Inputs) error {
	if err := atomicdir.ValidatePath(p.Path); err != nil {
		return fmt.Errorf("clusterTrustBundle: %w", err)
	}
	pem, err := in.Get.TrustBundle(p)
	switch {
	case apierrors.IsNotFound(err) && isTrue(p.Optional):
		pem = nil
	case err != nil:
		return fmt.Errorf("clusterTrustBundle %q: %w", p.Path, err)
	}
	out[p.Path] = credentialFile(pem, def, in.Pod)
	return nil
}
