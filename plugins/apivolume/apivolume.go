// Package apivolume implements the volumes whose content comes from the
// API rather than from storage: configMap, secret, downwardAPI and
// projected (service-account tokens, cluster trust bundles, and the three
// others). SetUp builds the files (package payload), makes the volume
// directory (a directory on the node's disk for configMap, as the kubelet
// does; a tmpfs sized from the content, never swapped, for the others) and
// writes the files atomically (internal/atomicdir). Setting a volume up
// again only rewrites content, and only what changed. Content that does not
// fit the pod's or the node's byte budget (package budget) is refused
// before anything is written.
//
// What the files are built from comes through Sources: the API server in
// cluster mode, the manifest directory in standalone mode, fakes in tests.
package apivolume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/internal/atomicdir"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/safefs"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/apivolume/budget"
	"github.com/volume-agent/volume-agent/plugins/apivolume/payload"
	"github.com/volume-agent/volume-agent/podcerts"
	"github.com/volume-agent/volume-agent/tokens"
	"github.com/volume-agent/volume-agent/volume"
)

// The plugins' names (the kubelet's, so directories look familiar).
const (
	ConfigMapName   = "kubernetes.io/configmap"
	SecretName      = "kubernetes.io/secret"
	DownwardAPIName = "kubernetes.io/downward-api"
	ProjectedName   = "kubernetes.io/projected"
)

// PluginName returns the name of the plugin for an API volume source, ""
// for other sources.
func PluginName(vs *v1.VolumeSource) string {
	switch {
	case vs.ConfigMap != nil:
		return ConfigMapName
	case vs.Secret != nil:
		return SecretName
	case vs.DownwardAPI != nil:
		return DownwardAPIName
	case vs.Projected != nil:
		return ProjectedName
	}
	return ""
}

// Objects reads ConfigMaps and Secrets. Missing objects are errors for
// which apierrors.IsNotFound is true; returned objects are shared.
type Objects interface {
	ConfigMap(ctx context.Context, namespace, name string) (*v1.ConfigMap, error)
	Secret(ctx context.Context, namespace, name string) (*v1.Secret, error)
}

// Tokens issues service-account tokens (tokens.Manager).
type Tokens interface {
	Get(ctx context.Context, k tokens.Key) (token []byte, refreshAt time.Time, err error)
}

// TrustBundles returns the normalised PEM bundle a clusterTrustBundle
// projection selects (NotFound when nothing matches) in the pod's
// namespace's view.
type TrustBundles interface {
	TrustBundle(ctx context.Context, p *v1.ClusterTrustBundleProjection) ([]byte, error)
}

// PodCertificates serves podCertificate projections (podcerts.Manager).
type PodCertificates interface {
	Get(ctx context.Context, req podcerts.Request) (podcerts.Credentials, error)
}

// PodMetadata returns what downwardAPI items and token files need to know
// about a pod beyond volume.PodInfo.
type PodMetadata interface {
	Pod(uid types.UID) (*Pod, bool)
}

// Sources are where the content comes from.
type Sources struct {
	Objects Objects
	// Tokens is nil without an API server: token projections are then a
	// per-pod error.
	Tokens Tokens
	// TrustBundles is nil when the API server serves no ClusterTrustBundles
	// (or without one): such projections are a per-pod error.
	TrustBundles TrustBundles
	// PodCerts is nil where pod certificates cannot be requested (no API
	// server, or not with the node's identity): such projections are a
	// per-pod error.
	PodCerts PodCertificates
	Pods     PodMetadata
	// NodeAllocatable fills unset limits of resourceFieldRef items.
	NodeAllocatable func() v1.ResourceList
	// NoTokensReason explains why Tokens is nil, for the per-pod error.
	NoTokensReason string
	// NoTrustBundlesReason explains why TrustBundles is nil.
	NoTrustBundlesReason string
	// NoPodCertsReason explains why PodCerts is nil.
	NoPodCertsReason string
	// Budget bounds the bytes written; nil: no bound (tests).
	Budget *budget.Budget
}

type kind int

const (
	configMapKind kind = iota
	secretKind
	downwardKind
	projectedKind
)

// Plugin is one of the four API volume plugins.
type Plugin struct {
	name   string
	kind   kind
	memory bool // on its own tmpfs
	host   plugins.Host
	src    Sources
	status *Status
}

// The agent finds a plugin's capabilities by type assertion: these make a
// changed signature fail the build instead of a volume at run time.
var (
	_ plugins.Plugin        = (*Plugin)(nil)
	_ plugins.Reconstructor = (*Plugin)(nil)
)

// New returns the four plugins; they share status (what each volume was
// built from, for the debug endpoint).
func New(host plugins.Host, src Sources) ([]plugins.Plugin, *Status) {
	st := &Status{volumes: map[volume.UniqueName]*VolumeStatus{}}
	mk := func(name string, k kind, memory bool) plugins.Plugin {
		return &Plugin{name: name, kind: k, memory: memory, host: host, src: src, status: st}
	}
	return []plugins.Plugin{
		mk(ConfigMapName, configMapKind, false),
		mk(SecretName, secretKind, true),
		mk(DownwardAPIName, downwardKind, true),
		mk(ProjectedName, projectedKind, true),
	}, st
}

func (p *Plugin) Name() string { return p.name }

func (p *Plugin) CanSupport(spec *volume.Spec) bool {
	if spec.Volume == nil {
		return false
	}
	vs := &spec.Volume.VolumeSource
	switch p.kind {
	case configMapKind:
		return vs.ConfigMap != nil
	case secretKind:
		return vs.Secret != nil
	case downwardKind:
		return vs.DownwardAPI != nil
	}
	return vs.Projected != nil
}

// Attributes checks what the API server would have rejected (standalone
// manifests are not validated) and what this agent cannot serve.
func (p *Plugin) Attributes(spec *volume.Spec) (volume.Attributes, error) {
	if err := p.validate(&spec.Volume.VolumeSource); err != nil {
		return volume.Attributes{}, err
	}
	return volume.Attributes{RequiresRemount: true, ReadOnlyForContainers: true}, nil
}

func (p *Plugin) validate(vs *v1.VolumeSource) error {
	var errs []error
	paths := map[string]bool{}
	explicit := func(kind, pth string) {
		if err := atomicdir.ValidatePath(pth); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", kind, err))
			return
		}
		c := path.Clean(pth)
		if paths[c] {
			errs = append(errs, fmt.Errorf("%s: conflicting duplicate paths: %q", kind, pth))
		}
		paths[c] = true
	}
	items := func(kind string, its []v1.KeyToPath) {
		for _, it := range its {
			explicit(kind+" item "+it.Key, it.Path)
		}
	}
	downward := func(its []v1.DownwardAPIVolumeFile) {
		for _, it := range its {
			explicit("downwardAPI", it.Path)
		}
	}
	switch {
	case vs.ConfigMap != nil:
		items("configMap", vs.ConfigMap.Items)
	case vs.Secret != nil:
		items("secret", vs.Secret.Items)
	case vs.DownwardAPI != nil:
		downward(vs.DownwardAPI.Items)
	case vs.Projected != nil:
		for i := range vs.Projected.Sources {
			s := &vs.Projected.Sources[i]
			switch {
			case s.ConfigMap != nil:
				items("configMap", s.ConfigMap.Items)
			case s.Secret != nil:
				items("secret", s.Secret.Items)
			case s.DownwardAPI != nil:
				downward(s.DownwardAPI.Items)
			case s.ServiceAccountToken != nil:
				if p.src.Tokens == nil {
					errs = append(errs, fmt.Errorf("serviceAccountToken projection %q cannot be served: %s", s.ServiceAccountToken.Path, p.src.NoTokensReason))
				}
				if e := s.ServiceAccountToken.ExpirationSeconds; e != nil && *e < payload.MinTokenExpirationSeconds {
					errs = append(errs, fmt.Errorf("serviceAccountToken: expirationSeconds %d is below the minimum of %d", *e, payload.MinTokenExpirationSeconds))
				}
				if err := atomicdir.ValidatePath(s.ServiceAccountToken.Path); err != nil {
					errs = append(errs, fmt.Errorf("serviceAccountToken: %w", err))
				}
			case s.ClusterTrustBundle != nil:
				if p.src.TrustBundles == nil {
					errs = append(errs, fmt.Errorf("clusterTrustBundle projection %q cannot be served: %s", s.ClusterTrustBundle.Path, p.src.NoTrustBundlesReason))
				}
				explicit("clusterTrustBundle", s.ClusterTrustBundle.Path)
			case s.PodCertificate != nil:
				if p.src.PodCerts == nil {
					errs = append(errs, fmt.Errorf("podCertificate projection (signer %q) cannot be served: %s", s.PodCertificate.SignerName, p.src.NoPodCertsReason))
				}
				if err := payload.ValidatePodCertificate(s.PodCertificate); err != nil {
					errs = append(errs, err)
				}
				for _, pth := range []string{s.PodCertificate.CredentialBundlePath, s.PodCertificate.KeyPath, s.PodCertificate.CertificateChainPath} {
					if pth != "" {
						explicit("podCertificate", pth)
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// SetUp builds the volume's files and writes what changed. A failure to
// build them (an object missing, the API server unreachable for a token)
// leaves an existing volume as it was.
func (p *Plugin) SetUp(ctx context.Context, req *plugins.SetUpRequest) error {
	vs := &req.Spec.Volume.VolumeSource
	g := &getter{ctx: ctx, ns: req.Pod.Namespace, pod: req.Pod, src: &p.src, used: []Input{}, volName: req.Spec.Name, dir: req.Dir}
	in := payload.Inputs{Pod: p.podMeta(req.Pod), Get: g}
	if p.src.NodeAllocatable != nil && payload.RefsOf(vs).Resources {
		in.NodeAllocatable = p.src.NodeAllocatable()
	}
	if refs := payload.RefsOf(vs); refs.ReadsPod() {
		g.used = append(g.used, Input{Kind: "Pod", Name: req.Pod.Name})
	}
	files, err := payload.Build(vs, in)
	if err != nil {
		if onlyPending(err) {
			// A certificate the signer has not issued yet is a wait, as
			// for the kubelet, not a failure.
			return volume.Waiting(err)
		}
		return err
	}
	// The budget is checked before the first byte is written: the pages
	// would be charged to the agent's memory.
	undo := func() {}
	if b := p.src.Budget; b != nil {
		prev, had := b.Holding(req.VolumeName)
		if err := b.Reserve(req.Pod.PodRef, req.Spec.Name, req.VolumeName, ContentBytes(files)); err != nil {
			return err
		}
		undo = func() {
			if had {
				b.Found(req.Pod.UID, req.VolumeName, prev)
			} else {
				b.Release(req.VolumeName)
			}
		}
	}
	fresh, err := p.prepareDir(req.Dir, files)
	if err != nil {
		// Nothing was written.
		undo()
		return err
	}
	if err := atomicdir.MakeDirs(req.Dir, in.Pod.NestedMounts[req.Spec.Name]); err != nil {
		err = fmt.Errorf("making the mount points of volumes mounted beneath this one: %w", err)
		if fresh {
			if terr := p.remove(ctx, req.Dir); terr != nil {
				return volume.Uncertain(errors.Join(err, terr))
			}
			undo()
		}
		return err
	}
	changed, err := atomicdir.Write(req.Dir, files, atomicdir.Options{FSGroup: req.Pod.FSGroup})
	if err != nil {
		err = fmt.Errorf("writing the volume's files: %w", err)
		if fresh {
			// Nothing of a new volume may stay half made.
			if terr := p.remove(ctx, req.Dir); terr != nil {
				return volume.Uncertain(errors.Join(err, terr))
			}
			undo()
		}
		// An existing volume holds the old content or the new: it keeps
		// the larger reservation.
		return err
	}
	req.RefreshAt = g.refreshAt
	p.status.written(req, g.used, changed, req.RefreshAt)
	if changed && req.Log != nil {
		req.Log.Debug("volume content written", zap.Int("files", len(files)), zap.Bool("fresh", fresh))
	}
	return nil
}

// podMeta is the pod's metadata, or what PodInfo holds of it.
func (p *Plugin) podMeta(pod volume.PodInfo) *payload.Pod {
	if p.src.Pods != nil {
		if m, ok := p.src.Pods.Pod(pod.UID); ok {
			return m
		}
	}
	return &payload.Pod{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, FSGroup: pod.FSGroup}
}

// prepareDir makes the volume directory (and tmpfs) and reports whether
// this call made it.
func (p *Plugin) prepareDir(dir string, files atomicdir.Payload) (bool, error) {
	created, err := mountutil.EnsureDir(dir, 0o755)
	if err != nil {
		return false, err
	}
	if !p.memory {
		return created, nil
	}
	mounted := false
	if !created {
		if mounted, err = p.host.Mounter.IsMountPoint(dir); err != nil {
			return false, err
		}
	}
	need := TmpfsSize(files)
	if !mounted {
		if err := p.host.Mounter.MountTmpfs(dir, mountutil.TmpfsOptions{SizeBytes: need, Mode: 0o755, NoSwap: true}); err != nil {
			if created {
				_ = unix.Rmdir(dir)
			}
			return false, err
		}
		return true, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if have := int64(st.Blocks) * st.Bsize; have < need {
		if err := p.host.Mounter.MountTmpfs(dir, mountutil.TmpfsOptions{SizeBytes: need, Resize: true}); err != nil {
			return false, err
		}
	}
	return false, nil
}

// ContentBytes is what files cost in the budget: each file in whole pages,
// and at least one (its inode, dentry and link are kernel memory too).
func ContentBytes(files atomicdir.Payload) int64 {
	const page = 4096
	var n int64
	for _, f := range files {
		n += max(1, (int64(len(f.Data))+page-1)/page) * page
	}
	return n
}

// TmpfsSize is the size of a tmpfs for files: room for two copies (an
// update writes the new set before it removes the old one), each file in
// whole pages, plus 64 KiB for directories and small changes.
func TmpfsSize(files atomicdir.Payload) int64 {
	const page = 4096
	var n int64
	for _, f := range files {
		n += (int64(len(f.Data)) + page - 1) / page * page
	}
	return 2*n + 64<<10
}

func (p *Plugin) remove(ctx context.Context, dir string) error {
	if err := p.host.Mounter.UnmountAll(dir); err != nil {
		return err
	}
	return safefs.RemoveAll(ctx, dir)
}

// TearDown unmounts the tmpfs (whatever the spec says: after a restart it
// may be unknown) and removes the directory, never following a link or
// crossing into another mount.
func (p *Plugin) TearDown(ctx context.Context, req *plugins.TearDownRequest) error {
	if err := p.remove(ctx, req.Dir); err != nil {
		return err
	}
	p.status.forget(req.VolumeName)
	if p.src.Budget != nil {
		p.src.Budget.Release(req.VolumeName)
	}
	return nil
}

// ReconstructPodVolume implements plugins.Reconstructor. The content found
// is counted in the budget at once: its pages are charged whatever the
// budget says, and new volumes must not be admitted on the assumption that
// they are not (the volume's next set up replaces the figure).
func (p *Plugin) ReconstructPodVolume(pod types.UID, specName, dir string) (volume.UniqueName, volume.Attributes, error) {
	name := volume.PodScopedName(p.name, pod, specName)
	if p.src.Budget != nil && dir != "" {
		p.src.Budget.Found(pod, name, measure(dir))
	}
	return name, volume.Attributes{RequiresRemount: true, ReadOnlyForContainers: true}, nil
}

// measure is what the regular files under dir cost, as ContentBytes counts
// them. It follows no link and stays on dir's filesystem; what it cannot
// read counts nothing (the next set up measures again).
func measure(dir string) int64 {
	const page = 4096
	var root unix.Stat_t
	if err := unix.Lstat(dir, &root); err != nil {
		return 0
	}
	var n int64
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(path, &st) != nil || st.Dev != root.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			n += max(1, (st.Size+page-1)/page) * page
		}
		return nil
	})
	return n
}

// getter serves payload.Getter for one SetUp and records what it used.
type getter struct {
	ctx       context.Context
	ns        string
	pod       volume.PodInfo
	src       *Sources
	refreshAt time.Time
	used      []Input
	// volName and dir are the pod's volume name and directory (pod
	// certificates).
	volName, dir string
}

func (g *getter) record(kind, name string, obj any, err error) {
	in := Input{Kind: kind, Name: name}
	if err != nil {
		in.Missing = true
	} else if acc, aerr := meta.Accessor(obj); aerr == nil {
		in.ResourceVersion = acc.GetResourceVersion()
	}
	g.used = append(g.used, in)
}

func (g *getter) ConfigMap(name string) (*v1.ConfigMap, error) {
	if g.src.Objects == nil {
		return nil, errors.New("no source of ConfigMaps")
	}
	cm, err := g.src.Objects.ConfigMap(g.ctx, g.ns, name)
	g.record("ConfigMap", name, cm, err)
	return cm, err
}

func (g *getter) Secret(name string) (*v1.Secret, error) {
	if g.src.Objects == nil {
		return nil, errors.New("no source of Secrets")
	}
	s, err := g.src.Objects.Secret(g.ctx, g.ns, name)
	g.record("Secret", name, s, err)
	return s, err
}

func (g *getter) Token(p *v1.ServiceAccountTokenProjection) ([]byte, error) {
	if g.src.Tokens == nil {
		return nil, errors.New(g.src.NoTokensReason)
	}
	sa := g.pod.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	exp := int64(payload.DefaultTokenExpirationSeconds)
	if p.ExpirationSeconds != nil {
		exp = *p.ExpirationSeconds
	}
	k := tokens.Key{Namespace: g.ns, ServiceAccount: sa, Audience: p.Audience, ExpirationSeconds: exp, PodName: g.pod.Name, PodUID: g.pod.UID}
	tok, at, err := g.src.Tokens.Get(g.ctx, k)
	if err != nil {
		return nil, err
	}
	if g.refreshAt.IsZero() || at.Before(g.refreshAt) {
		g.refreshAt = at
	}
	g.used = append(g.used, Input{Kind: "ServiceAccountToken", Name: sa, Audience: p.Audience, RefreshAt: at})
	return tok, nil
}

func (g *getter) TrustBundle(p *v1.ClusterTrustBundleProjection) ([]byte, error) {
	if g.src.TrustBundles == nil {
		return nil, errors.New(g.src.NoTrustBundlesReason)
	}
	pem, err := g.src.TrustBundles.TrustBundle(g.ctx, p)
	name := ""
	switch {
	case p.Name != nil:
		name = *p.Name
	case p.SignerName != nil:
		name = "signer " + *p.SignerName
	}
	g.used = append(g.used, Input{Kind: "ClusterTrustBundle", Name: name, Missing: err != nil})
	return pem, err
}

func (g *getter) PodCertificate(source int, p *v1.PodCertificateProjection) ([]byte, []byte, error) {
	if g.src.PodCerts == nil {
		return nil, nil, errors.New(g.src.NoPodCertsReason)
	}
	req := podcerts.Request{
		Key:            podcerts.Key{Namespace: g.ns, PodName: g.pod.Name, PodUID: g.pod.UID, Volume: g.volName, Source: source},
		ServiceAccount: g.pod.ServiceAccount,
		Projection:     *p,
		Existing:       func() ([]byte, []byte) { return existingCredentials(g.dir, p) },
	}
	c, err := g.src.PodCerts.Get(g.ctx, req)
	in := Input{Kind: "PodCertificate", Name: p.SignerName, Missing: err != nil}
	if err == nil {
		in.RefreshAt = c.RefreshAt
		if !c.RefreshAt.IsZero() && (g.refreshAt.IsZero() || c.RefreshAt.Before(g.refreshAt)) {
			g.refreshAt = c.RefreshAt
		}
	}
	g.used = append(g.used, in)
	return c.Key, c.Chain, err
}

// onlyPending reports whether every error joined in err is a pod
// certificate not issued yet.
func onlyPending(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !onlyPending(e) {
				return false
			}
		}
		return len(j.Unwrap()) > 0
	}
	return errors.Is(err, podcerts.ErrPending)
}

// maxCredentialBytes bounds what is read back of a credential file.
const maxCredentialBytes = 1 << 20

// existingCredentials reads back the key and chain a podCertificate
// projection wrote into the volume (after a restart), nil if it cannot.
// podcerts trusts neither: the chain must be an issued request's and
// match the key.
func existingCredentials(dir string, p *v1.PodCertificateProjection) ([]byte, []byte) {
	read := func(rel string) []byte {
		if rel == "" {
			return nil
		}
		b, err := atomicdir.ReadFile(dir, rel, maxCredentialBytes)
		if err != nil {
			return nil
		}
		return b
	}
	if p.KeyPath != "" && p.CertificateChainPath != "" {
		return read(p.KeyPath), read(p.CertificateChainPath)
	}
	if b := read(p.CredentialBundlePath); b != nil {
		return podcerts.SplitBundle(b)
	}
	return nil, nil
}

// Input is one thing a volume was built from, for the debug endpoint:
// names and versions, never data.
type Input struct {
	Kind            string    `json:"kind"`
	Name            string    `json:"name"`
	ResourceVersion string    `json:"resourceVersion,omitempty"`
	Missing         bool      `json:"missing,omitempty"`
	Audience        string    `json:"audience,omitempty"`
	RefreshAt       time.Time `json:"refreshAt,omitzero"`
}

// VolumeStatus is what one volume was last built from and when.
type VolumeStatus struct {
	Volume  volume.UniqueName `json:"volume"`
	Plugin  string            `json:"plugin"`
	Pod     volume.PodRef     `json:"pod"`
	Inputs  []Input           `json:"inputs"`
	Checked time.Time         `json:"lastChecked"`
	// Written is when the content last changed on disk.
	Written   time.Time `json:"lastWritten"`
	Writes    int       `json:"writes"`
	RefreshAt time.Time `json:"refreshAt,omitzero"`
}

// Status keeps the VolumeStatus of every API volume set up.
type Status struct {
	mu      sync.Mutex
	volumes map[volume.UniqueName]*VolumeStatus
}

func (s *Status) written(req *plugins.SetUpRequest, used []Input, changed bool, refreshAt time.Time) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.volumes[req.VolumeName]
	if !ok {
		v = &VolumeStatus{Volume: req.VolumeName, Plugin: PluginName(&req.Spec.Volume.VolumeSource), Pod: req.Pod.PodRef}
		s.volumes[req.VolumeName] = v
	}
	v.Inputs, v.Checked, v.RefreshAt = used, now, refreshAt
	if changed || v.Written.IsZero() {
		v.Written = now
		v.Writes++
	}
}

func (s *Status) forget(name volume.UniqueName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.volumes, name)
}

// List returns the status of every API volume, by volume name.
func (s *Status) List() []VolumeStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]VolumeStatus, 0, len(s.volumes))
	for _, v := range s.volumes {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Volume < out[j].Volume })
	return out
}
