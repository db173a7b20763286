package manifest

import (
	"cmp"
	"fmt"
	"maps"
	"path/filepath"
	"slices"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/source"
)

type objKey struct{ ns, name string }

// snapshot is what readers see. It is never modified once published: an
// update builds a new one and swaps the pointer, so reads take no lock and
// readers may keep objects from an old snapshot.
type snapshot struct {
	pods    []*corev1.Pod // sorted by namespace/name
	pvcs    map[objKey]*corev1.PersistentVolumeClaim
	pvs     map[string]*corev1.PersistentVolume
	classes map[string]*storagev1.StorageClass
	drivers map[string]*storagev1.CSIDriver
	// configMaps and secrets are read by API volumes.
	configMaps map[objKey]*corev1.ConfigMap
	secrets    map[objKey]*corev1.Secret
	errors     []source.InputError
	// unread are inputs that never parsed: their objects are unknown.
	unread []string
}

func emptySnapshot() *snapshot {
	return &snapshot{
		pvcs:    map[objKey]*corev1.PersistentVolumeClaim{},
		pvs:     map[string]*corev1.PersistentVolume{},
		classes: map[string]*storagev1.StorageClass{},
		drivers: map[string]*storagev1.CSIDriver{},

		configMaps: map[objKey]*corev1.ConfigMap{},
		secrets:    map[objKey]*corev1.Secret{},
	}
}

func (a *snapshot) equal(b *snapshot) bool {
	return slices.Equal(a.pods, b.pods) &&
		maps.Equal(a.pvcs, b.pvcs) &&
		maps.Equal(a.pvs, b.pvs) &&
		maps.Equal(a.classes, b.classes) &&
		maps.Equal(a.drivers, b.drivers) &&
		maps.Equal(a.configMaps, b.configMaps) &&
		maps.Equal(a.secrets, b.secrets) &&
		slices.Equal(a.errors, b.errors)
}

// Pods returns the pods of this node sorted by namespace and name. The slice
// is the caller's; the pods are shared and must not be modified.
func (s *Source) Pods() []*corev1.Pod {
	return slices.Clone(s.snap.Load().pods)
}

// PVC returns a claim, with status.phase Bound when it and its volume name
// each other.
func (s *Source) PVC(namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	if namespace == "" {
		namespace = corev1.NamespaceDefault
	}
	if c, ok := s.snap.Load().pvcs[objKey{namespace, name}]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumeclaims"), name)
}

// PV returns a persistent volume.
func (s *Source) PV(name string) (*corev1.PersistentVolume, error) {
	if v, ok := s.snap.Load().pvs[name]; ok {
		return v, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumes"), name)
}

// StorageClass returns a storage class.
func (s *Source) StorageClass(name string) (*storagev1.StorageClass, error) {
	if c, ok := s.snap.Load().classes[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(storagev1.Resource("storageclasses"), name)
}

// CSIDriver returns a CSIDriver object.
func (s *Source) CSIDriver(name string) (*storagev1.CSIDriver, error) {
	if d, ok := s.snap.Load().drivers[name]; ok {
		return d, nil
	}
	return nil, apierrors.NewNotFound(storagev1.Resource("csidrivers"), name)
}

// ConfigMap returns a ConfigMap.
func (s *Source) ConfigMap(namespace, name string) (*corev1.ConfigMap, error) {
	if c, ok := s.snap.Load().configMaps[objKey{namespace, name}]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("configmaps"), name)
}

// Secret returns a Secret (stringData merged into data).
func (s *Source) Secret(namespace, name string) (*corev1.Secret, error) {
	if c, ok := s.snap.Load().secrets[objKey{namespace, name}]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
}

// UnreadInputs implements source.Completeness: files that never parsed, so
// their pods are unknown.
func (s *Source) UnreadInputs() []string {
	return slices.Clone(s.snap.Load().unread)
}

// InputErrors returns the current problems with the manifest files, ordered
// by file name.
func (s *Source) InputErrors() []source.InputError {
	return slices.Clone(s.snap.Load().errors)
}

type kindKey struct {
	kind kind
	objKey
}

type origin struct {
	file string
	loc  location
}

// rebuild publishes a new snapshot made from the file states and reports
// whether it differs from the previous one.
func (s *Source) rebuild() bool {
	old := s.snap.Load()
	n, ok := s.patched(old)
	if !ok {
		n = s.built(old)
		s.countClaims()
	}
	touched := s.touched
	s.touched, s.builtDirErr = nil, s.dirErr
	if len(s.files) == 0 {
		// A map keeps its table when emptied: an empty directory holds
		// none of a burst's counts (the next rebuild counts afresh).
		s.claims, s.uidClaims = nil, nil
	}
	if ok {
		s.patches++
	}
	if n.equal(old) {
		return false
	}
	s.snap.Store(n)
	// Recorded once the snapshot is out: a consumer that takes the record
	// and then looks the pods up must find them changed.
	if !ok {
		s.podChanges.MarkAll()
		s.notifyObjectChanges(old, n) // a patched snapshot changed pods only
		return true
	}
	for name, before := range touched {
		for _, objs := range [][]object{before.objects, s.contributionOf(name).objects} {
			for i := range objs {
				s.podChanges.Mark(source.PodKey{Namespace: objs[i].ns, Name: objs[i].name})
			}
		}
	}
	return true
}

// TakePodChanges implements source.PodChanges.
func (s *Source) TakePodChanges() (all bool, keys map[source.PodKey]struct{}) {
	return s.podChanges.Take()
}

// Pod returns the pod under a namespace and name.
func (s *Source) Pod(namespace, name string) (*corev1.Pod, bool) {
	pods := s.snap.Load().pods
	i, found := slices.BinarySearchFunc(pods, objKey{namespace, name}, podByKey)
	if !found {
		return nil, false
	}
	return pods[i], true
}

// podByKey orders the pods of a snapshot.
func podByKey(p *corev1.Pod, key objKey) int {
	return cmp.Or(cmp.Compare(p.Namespace, key.ns), cmp.Compare(p.Name, key.name))
}

// contribution is what a file gave the store at a rebuild.
type contribution struct {
	objects  []object
	warnings []string
	fatal    string
}

// contributionOf is what a file gives the store now (nothing if absent).
func (s *Source) contributionOf(name string) contribution {
	if st := s.files[name]; st != nil {
		return contribution{objects: st.objects, warnings: st.warnings, fatal: st.fatal}
	}
	return contribution{}
}

// touch records what a file contributed at the last rebuild, before its
// state changes for the first time since.
func (s *Source) touch(name string) {
	if _, ok := s.touched[name]; ok {
		return
	}
	if s.touched == nil {
		s.touched = map[string]contribution{}
	}
	s.touched[name] = s.contributionOf(name)
}

// countClaims counts every file's objects by kind and key, and pods by
// UID, after a full rebuild.
func (s *Source) countClaims() {
	s.claims, s.uidClaims = map[kindKey]int{}, map[types.UID]int{}
	for _, st := range s.files {
		s.claim(st.objects, 1)
	}
}

func (s *Source) claim(objs []object, delta int) {
	for i := range objs {
		o := &objs[i]
		kk := kindKey{o.kind, o.key()}
		if s.claims[kk] += delta; s.claims[kk] == 0 {
			delete(s.claims, kk)
		}
		if o.kind == kindPod {
			uid := o.obj.(*corev1.Pod).UID
			if s.uidClaims[uid] += delta; s.uidClaims[uid] == 0 {
				delete(s.uidClaims, uid)
			}
		}
	}
}

// patched makes the next snapshot from the previous one, changing only the
// pods of the files changed since, when that is all that changed: those
// files held and hold only pods and have no problems, and none of their
// pods shared its key or UID with another object before or shares it
// now. Then the other objects, the errors and the claims' binding are as
// they were. Otherwise ok is false and the full rebuild is needed (the
// claim counts are kept up to date either way).
//
// With pods arriving one file at a time, rebuilding the whole store after
// each was a sixth of the agent's CPU, quadratic in the pods.
func (s *Source) patched(old *snapshot) (n *snapshot, ok bool) {
	if s.claims == nil || s.dirErr != s.builtDirErr {
		return nil, false
	}
	onlyPods := func(c contribution) bool {
		if c.fatal != "" || len(c.warnings) > 0 {
			return false
		}
		for i := range c.objects {
			if c.objects[i].kind != kindPod {
				return false
			}
		}
		return true
	}
	alone := func(objs []object) bool {
		for i := range objs {
			o := &objs[i]
			if s.claims[kindKey{o.kind, o.key()}] != 1 || s.uidClaims[o.obj.(*corev1.Pod).UID] != 1 {
				return false
			}
		}
		return true
	}
	ok = true
	for name, before := range s.touched {
		ok = ok && onlyPods(before) && onlyPods(s.contributionOf(name)) && alone(before.objects)
	}
	for name, before := range s.touched {
		s.claim(before.objects, -1)
		s.claim(s.contributionOf(name).objects, 1)
	}
	for name := range s.touched {
		ok = ok && alone(s.contributionOf(name).objects)
	}
	if !ok {
		return nil, false
	}
	n = new(snapshot)
	*n = *old
	n.pods = slices.Clone(old.pods)
	for _, before := range s.touched {
		for i := range before.objects {
			if j, found := slices.BinarySearchFunc(n.pods, before.objects[i].key(), podByKey); found {
				n.pods = slices.Delete(n.pods, j, j+1)
			}
		}
	}
	for name := range s.touched {
		objs := s.contributionOf(name).objects
		for i := range objs {
			j, _ := slices.BinarySearchFunc(n.pods, objs[i].key(), podByKey)
			n.pods = slices.Insert(n.pods, j, objs[i].obj.(*corev1.Pod))
		}
	}
	return n, true
}

// built makes the next snapshot from every file's state.
func (s *Source) built(old *snapshot) *snapshot {
	total := 0
	for _, st := range s.files {
		total += len(st.objects)
	}
	n := &snapshot{
		pods:    make([]*corev1.Pod, 0, len(old.pods)),
		pvcs:    make(map[objKey]*corev1.PersistentVolumeClaim, len(old.pvcs)),
		pvs:     make(map[string]*corev1.PersistentVolume, len(old.pvs)),
		classes: make(map[string]*storagev1.StorageClass, len(old.classes)),
		drivers: make(map[string]*storagev1.CSIDriver, len(old.drivers)),

		configMaps: make(map[objKey]*corev1.ConfigMap, len(old.configMaps)),
		secrets:    make(map[objKey]*corev1.Secret, len(old.secrets)),
	}
	if s.dirErr != "" {
		n.errors = append(n.errors, source.InputError{Input: s.dir, Error: s.dirErr})
		n.unread = append(n.unread, s.dir)
	}
	seen := make(map[kindKey]origin, total)
	podUIDs := make(map[types.UID]kindKey, total)
	dups := make(map[source.InputError]struct{})
	for _, name := range s.names {
		st := s.files[name]
		// Joined only for what reports the file: most rebuilds report
		// nothing, and joining every name was a tenth of their cost.
		path := func() string { return filepath.Join(s.dir, name) }
		if st.fatal != "" && !st.good {
			n.unread = append(n.unread, path())
		}
		if st.fatal != "" {
			msg := st.fatal
			if len(st.objects) > 0 {
				msg += fmt.Sprintf(" (keeping the %d objects of its last good version)", len(st.objects))
			}
			n.errors = append(n.errors, source.InputError{Input: path(), Error: msg})
		} else {
			for _, w := range st.warnings {
				n.errors = append(n.errors, source.InputError{Input: path(), Error: w})
			}
		}
		for i := range st.objects {
			o := &st.objects[i]
			kk := kindKey{o.kind, o.key()}
			if first, dup := seen[kk]; dup {
				e := source.InputError{Input: path(), Error: fmt.Sprintf("%s: duplicate %s %s, already defined in %s %s; ignored",
					o.loc, o.kind, displayName(o.ns, o.name), first.file, first.loc)}
				s.logDuplicate(e, o, dups)
				n.errors = append(n.errors, e)
				continue
			}
			if o.kind == kindPod {
				// Two pods sharing a UID would share a pod directory.
				uid := o.obj.(*corev1.Pod).UID
				if other, dup := podUIDs[uid]; dup {
					first := seen[other]
					e := source.InputError{Input: path(), Error: fmt.Sprintf("%s: Pod %s has the same metadata.uid %q as Pod %s in %s %s; ignored",
						o.loc, displayName(o.ns, o.name), uid, displayName(other.ns, other.name), first.file, first.loc)}
					s.logDuplicate(e, o, dups)
					n.errors = append(n.errors, e)
					continue
				}
				podUIDs[uid] = kk
			}
			seen[kk] = origin{file: name, loc: o.loc}
			switch obj := o.obj.(type) {
			case *corev1.Pod:
				n.pods = append(n.pods, obj)
			case *corev1.PersistentVolumeClaim:
				n.pvcs[o.key()] = obj
			case *corev1.PersistentVolume:
				n.pvs[o.name] = obj
			case *storagev1.StorageClass:
				n.classes[o.name] = obj
			case *storagev1.CSIDriver:
				n.drivers[o.name] = obj
			case *corev1.ConfigMap:
				n.configMaps[o.key()] = reuse(obj, old.configMaps[o.key()])
			case *corev1.Secret:
				n.secrets[o.key()] = reuse(obj, old.secrets[o.key()])
			}
		}
	}
	s.dups = dups
	slices.SortFunc(n.pods, func(a, b *corev1.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	bindClaims(n, old)
	return n
}

// ObjectChanged is told about ConfigMaps and Secrets that were added,
// changed or removed: kind is "ConfigMap" or "Secret".
type ObjectChanged func(kind, namespace, name string)

// OnObjectChange registers f; call it before Run.
func (s *Source) OnObjectChange(f ObjectChanged) { s.objectChanged = f }

// notifyObjectChanges reports the ConfigMaps and Secrets that differ
// between two snapshots. Unchanged objects keep their pointer (reuse), so
// comparing pointers suffices.
func (s *Source) notifyObjectChanges(old, n *snapshot) {
	if s.objectChanged == nil {
		return
	}
	diff(old.configMaps, n.configMaps, func(k objKey) { s.objectChanged("ConfigMap", k.ns, k.name) })
	diff(old.secrets, n.secrets, func(k objKey) { s.objectChanged("Secret", k.ns, k.name) })
}

func diff[V comparable](a, b map[objKey]V, changed func(objKey)) {
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			changed(k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			changed(k)
		}
	}
}

// logDuplicate logs a duplicate the first time it is seen, not on every
// rebuild that finds it again.
func (s *Source) logDuplicate(e source.InputError, o *object, dups map[source.InputError]struct{}) {
	dups[e] = struct{}{}
	if _, known := s.dups[e]; known {
		return
	}
	fields := []zap.Field{zap.String("file", e.Input), zap.String("error", e.Error)}
	if o.kind == kindPod {
		fields = append(fields, zap.String("pod", o.ns+"/"+o.name))
	}
	s.log.Warn("Ignoring duplicate object in manifest file", fields...)
}

func displayName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// bindClaims presents claims and volumes as the PV controller would have
// left them, so the populator's checks are the same in both modes. Objects
// that need a change are copied: the ones in n may be shared with readers.
func bindClaims(n, old *snapshot) {
	boundTo := make(map[string]*corev1.PersistentVolumeClaim)
	for key, pvc := range n.pvcs {
		var pv *corev1.PersistentVolume
		if pvc.Spec.VolumeName != "" {
			pv = n.pvs[pvc.Spec.VolumeName]
		}
		bound := pv != nil && claimRefMatches(pv.Spec.ClaimRef, pvc)
		if bound {
			boundTo[pv.Name] = pvc
		}
		if c := normalizedClaim(pvc, pv, bound); c != pvc {
			n.pvcs[key] = reuse(c, old.pvcs[key])
		}
	}
	for name, pv := range n.pvs {
		if v := normalizedVolume(pv, boundTo[name]); v != pv {
			n.pvs[name] = reuse(v, old.pvs[name])
		}
	}
}

func claimRefMatches(ref *corev1.ObjectReference, pvc *corev1.PersistentVolumeClaim) bool {
	return ref != nil && ref.Namespace == pvc.Namespace && ref.Name == pvc.Name &&
		(ref.UID == "" || ref.UID == pvc.UID)
}

func normalizedClaim(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, bound bool) *corev1.PersistentVolumeClaim {
	phase := pvc.Status.Phase == ""
	if !bound {
		if !phase {
			return pvc
		}
		c := pvc.DeepCopy()
		c.Status.Phase = corev1.ClaimPending
		return c
	}
	capacity := len(pvc.Status.Capacity) == 0 && len(pv.Spec.Capacity) > 0
	modes := len(pvc.Status.AccessModes) == 0 && len(pv.Spec.AccessModes) > 0
	if !phase && !capacity && !modes {
		return pvc
	}
	c := pvc.DeepCopy()
	if phase {
		c.Status.Phase = corev1.ClaimBound
	}
	// The kubelet compares status.capacity with the volume's size to decide
	// whether a volume needs expanding; the PV controller copies both.
	if capacity {
		c.Status.Capacity = pv.Spec.Capacity.DeepCopy()
	}
	if modes {
		c.Status.AccessModes = slices.Clone(pv.Spec.AccessModes)
	}
	return c
}

func normalizedVolume(pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	phase := pv.Status.Phase == ""
	if pvc == nil {
		if !phase {
			return pv
		}
		v := pv.DeepCopy()
		v.Status.Phase = corev1.VolumeAvailable
		return v
	}
	uid := pv.Spec.ClaimRef.UID == ""
	if !phase && !uid {
		return pv
	}
	v := pv.DeepCopy()
	if phase {
		v.Status.Phase = corev1.VolumeBound
	}
	if uid {
		v.Spec.ClaimRef.UID = pvc.UID
	}
	return v
}

// reuse keeps the previous pointer for an unchanged object, so an update of
// one file does not make every normalised object look changed.
func reuse[T any](fresh, prev *T) *T {
	if prev != nil && equality.Semantic.DeepEqual(fresh, prev) {
		return prev
	}
	return fresh
}
