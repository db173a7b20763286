package localpv

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// AnnProvisionedBy is the annotation naming who provisioned a PV. The PV
// controller leaves Released PVs whose provisioner is not a kubernetes.io/
// one to that provisioner instead of failing them.
const AnnProvisionedBy = "pv.kubernetes.io/provisioned-by"

// ProvisionerName is the AnnProvisionedBy value of a node's PVs. It names
// the node so that each agent only ever touches its own node's PVs.
func ProvisionerName(node string) string { return "volume-agent.io/" + node }

// entry is one name found in a class's discovery directory.
type entry struct {
	Class *Class
	Name  string
	Path  string // the node's path
	Probe probe
}

// seenEntry is how long an entry has looked the same (see Options.SettlePeriod).
type seenEntry struct {
	Identity string
	Since    time.Time
}

// recentCreate is a PV created a moment ago that the PV cache may not show
// yet; it is not created again meanwhile.
type recentCreate struct {
	Name string
	At   time.Time
}

// recentTTL is how long a created PV's absence from the cache is put down
// to the watch lagging. After it, creating again is harmless: the name is
// deterministic, so the API server answers AlreadyExists.
const recentTTL = 30 * time.Second

// planInput is everything one pass decides on.
type planInput struct {
	Now            time.Time
	Node, Hostname string
	Config         *Config
	// ClassErr says why a class can create no PV now.
	ClassErr map[string]string
	Classes  map[string]*storagev1.StorageClass
	PVs      []*v1.PersistentVolume
	Entries  []entry
	// Backing is the probe of each of our PVs' paths, by UID.
	Backing    map[types.UID]probe
	Cleanups   []Cleanup
	Recent     map[string]recentCreate
	Seen       map[string]seenEntry
	Settle     time.Duration
	CreateErrs map[string]string
}

type createRequest struct {
	PV    *v1.PersistentVolume
	Class string
	Path  string
}

type deleteRequest struct {
	Name  string
	UID   types.UID
	Class string
	Mode  string
}

// planOutput is what one pass does.
type planOutput struct {
	Create  []createRequest
	Clean   []target
	Delete  []deleteRequest
	Forget  []types.UID
	Volumes []Volume
	// Wake is when a pass is needed next (a retry or a settling entry is
	// due); zero if nothing is waiting.
	Wake time.Time
}

func (o *planOutput) wakeAt(t time.Time) {
	if o.Wake.IsZero() || t.Before(o.Wake) {
		o.Wake = t
	}
}

// plan decides, without doing anything, what a pass does: which entries
// become PVs, which Released PVs are cleaned or deleted, and the state of
// everything for the debug document. It is a pure function of its input.
func plan(in *planInput) *planOutput {
	out := &planOutput{}
	prov := ProvisionerName(in.Node)

	pvs := slices.Clone(in.PVs)
	sort.Slice(pvs, func(i, j int) bool { return pvs[i].Name < pvs[j].Name })
	byPath := map[string][]*v1.PersistentVolume{}
	taken := map[string]bool{}
	present := map[types.UID]bool{}
	for _, pv := range pvs {
		taken[pv.Name] = true
		present[pv.UID] = true
		if p := pvPath(pv); p != "" && (isOurs(pv, prov) || mayBeOnNode(pv, in.Hostname)) {
			byPath[p] = append(byPath[p], pv)
		}
	}
	entryAt := map[string]*entry{}
	for i := range in.Entries {
		entryAt[in.Entries[i].Path] = &in.Entries[i]
	}

	cleanups := map[types.UID]Cleanup{}
	owed := map[string]Cleanup{} // paths whose PV went away uncleaned
	for _, c := range in.Cleanups {
		cleanups[c.UID] = c
		if present[c.UID] {
			continue
		}
		switch c.State {
		case CleanupSucceeded:
			out.Forget = append(out.Forget, c.UID)
		case CleanupRunning:
			owed[c.Path] = c
		case CleanupFailed:
			if c.DiskMismatch {
				// Deleting a PV whose path leads to another disk gives up
				// on the disk it was made from; the one there now owes
				// nothing to it.
				out.Forget = append(out.Forget, c.UID)
				continue
			}
			fallthrough
		case CleanupPending:
			// The PV is gone but its disk is dirty: keep cleaning it.
			owed[c.Path] = c
			if !in.Now.Before(c.NextRetry) {
				out.Clean = append(out.Clean, target{PV: c.PV, UID: c.UID, ClaimUID: c.ClaimUID, Class: c.Class, Path: c.Path, Block: c.Block, Mode: c.Mode, Identity: c.Identity})
			} else {
				out.wakeAt(c.NextRetry)
			}
		}
	}

	for _, pv := range pvs {
		if !isOurs(pv, prov) {
			continue
		}
		v := volumeOf(pv)
		if e := entryAt[v.Path]; e != nil {
			v.Entry = e.Name
		}
		planOurPV(in, out, pv, cleanups, &v)
		out.Volumes = append(out.Volumes, v)
	}

	for i := range in.Entries {
		e := &in.Entries[i]
		v := Volume{Class: e.Class.Name, Entry: e.Name, Path: e.Path, Capacity: capacityText(e.Probe)}
		if users := byPath[e.Path]; len(users) > 0 {
			if slices.ContainsFunc(users, func(pv *v1.PersistentVolume) bool { return isOurs(pv, prov) }) {
				continue // listed with our PV above
			}
			v.State = StateSkipped
			v.Reason = fmt.Sprintf("the path is used by PV %s, which this node's provisioner did not create", pvNames(users))
			out.Volumes = append(out.Volumes, v)
			continue
		}
		if c, ok := owed[e.Path]; ok {
			v.PV, v.UID, v.LastError = c.PV, c.UID, c.LastError
			v.State = StateCleaning
			if c.State == CleanupFailed {
				v.State = StateCleanupFailed
			}
			v.Reason = fmt.Sprintf("PV %s was deleted before its disk was cleaned: the disk is offered again once it is", c.PV)
			out.Volumes = append(out.Volumes, v)
			continue
		}
		if r, ok := in.Recent[e.Path]; ok && in.Now.Sub(r.At) < recentTTL {
			v.PV, v.State, v.Reason = r.Name, StatePending, "created; waiting for the PV cache to show it"
			out.wakeAt(r.At.Add(recentTTL))
			out.Volumes = append(out.Volumes, v)
			continue
		}
		mode, fsType, skip := decideEntry(e.Class, e.Probe)
		if skip == "" {
			skip = in.ClassErr[e.Class.Name]
		}
		if skip == "" && in.Settle > 0 {
			if s, ok := in.Seen[e.Path]; ok && in.Now.Sub(s.Since) < in.Settle {
				skip = fmt.Sprintf("new: waiting until it has looked the same for %v", in.Settle)
				out.wakeAt(s.Since.Add(in.Settle))
			}
		}
		if skip != "" {
			v.State, v.Reason = StateSkipped, skip
			out.Volumes = append(out.Volumes, v)
			continue
		}
		name := PVName(e.Class.NamePattern, in.Node, e.Class.Name, e.Name)
		if taken[name] {
			// Another path has this name (two entries that look alike once
			// made valid, or a PV made by someone else).
			alt := FallbackName(e.Class.NamePattern, in.Node, e.Class.Name, e.Name)
			if alt == name || taken[alt] {
				v.State = StateSkipped
				v.Reason = fmt.Sprintf("%v: the PV names %s and %s both belong to other paths", errNameTaken, name, alt)
				out.Volumes = append(out.Volumes, v)
				continue
			}
			name = alt
		}
		taken[name] = true
		pv := buildPV(name, e, mode, fsType, in.Classes[e.Class.Name], in.Node, in.Hostname)
		out.Create = append(out.Create, createRequest{PV: pv, Class: e.Class.Name, Path: e.Path})
		v.PV, v.State, v.VolumeMode, v.FSType = name, StatePending, mode, fsType
		v.ReclaimPolicy = pv.Spec.PersistentVolumeReclaimPolicy
		v.LastError = in.CreateErrs[e.Path]
		out.Volumes = append(out.Volumes, v)
	}
	sort.SliceStable(out.Volumes, func(i, j int) bool {
		a, b := out.Volumes[i], out.Volumes[j]
		if a.Class != b.Class {
			return a.Class < b.Class
		}
		return a.Path < b.Path
	})
	return out
}

// planOurPV decides about one of our PVs.
func planOurPV(in *planInput, out *planOutput, pv *v1.PersistentVolume, cleanups map[types.UID]Cleanup, v *Volume) {
	if why := missingReason(pv, in.Backing[pv.UID]); why != "" {
		v.State = StateMissing
		v.Reason = why + "; the PV is kept, not cleaned and not offered again until the disk is back or an administrator deletes the PV"
		return
	}
	switch pv.Status.Phase {
	case v1.VolumeAvailable:
		v.State = StateAvailable
		return
	case v1.VolumeBound:
		v.State = StateBound
		return
	case v1.VolumeFailed:
		v.State, v.Reason = StateFailed, pv.Status.Message
		return
	case v1.VolumeReleased:
	default:
		v.State = StatePending
		return
	}
	v.State = StateReleased
	switch pv.Spec.PersistentVolumeReclaimPolicy {
	case v1.PersistentVolumeReclaimDelete:
	case v1.PersistentVolumeReclaimRetain:
		v.Reason = "reclaim policy Retain: the data is kept; delete the PV (after cleaning the disk yourself) to offer the disk again"
		return
	case v1.PersistentVolumeReclaimRecycle:
		v.Reason = "reclaim policy Recycle is not supported by local volumes: use Delete (the disk is cleaned and offered again) or Retain"
		return
	default:
		v.Reason = fmt.Sprintf("unknown reclaim policy %q: not cleaned", pv.Spec.PersistentVolumeReclaimPolicy)
		return
	}
	if in.Config == nil || in.Config.Classes[pv.Spec.StorageClassName] == nil {
		v.Reason = fmt.Sprintf("storage class %q is not in the configuration: not cleaned (its cleanup method is unknown)", pv.Spec.StorageClassName)
		return
	}
	t := target{PV: pv.Name, UID: pv.UID, Class: pv.Spec.StorageClassName, Path: pvPath(pv), Block: wantsBlockDevice(pv), Mode: modeOf(pv), Identity: identityOf(pv)}
	if pv.Spec.ClaimRef != nil {
		t.ClaimUID = pv.Spec.ClaimRef.UID
	}
	v.State = StateCleaning
	c, ok := cleanups[pv.UID]
	switch {
	case !ok, c.State == CleanupSucceeded && c.ClaimUID != t.ClaimUID, c.State == CleanupPending:
		out.Clean = append(out.Clean, t)
	case c.State == CleanupRunning:
	case c.State == CleanupFailed:
		v.State, v.LastError = StateCleanupFailed, c.LastError
		if !in.Now.Before(c.NextRetry) {
			out.Clean = append(out.Clean, t)
		} else {
			out.wakeAt(c.NextRetry)
		}
	case c.State == CleanupSucceeded:
		v.Reason = "cleaned: deleting the PV so that the disk is offered again"
		if pv.DeletionTimestamp == nil {
			out.Delete = append(out.Delete, deleteRequest{Name: pv.Name, UID: pv.UID, Class: t.Class, Mode: modeOf(pv)})
		}
	}
}

func volumeOf(pv *v1.PersistentVolume) Volume {
	v := Volume{
		Class: pv.Spec.StorageClassName, Path: pvPath(pv), PV: pv.Name, UID: pv.UID, Phase: pv.Status.Phase,
		VolumeMode: v1.PersistentVolumeMode(modeOf(pv)), ReclaimPolicy: pv.Spec.PersistentVolumeReclaimPolicy,
	}
	if q, ok := pv.Spec.Capacity[v1.ResourceStorage]; ok {
		v.Capacity = q.String()
		v.capacityBytes = q.Value()
	}
	if ref := pv.Spec.ClaimRef; ref != nil && pv.Status.Phase != v1.VolumeAvailable {
		v.Claim = ref.Namespace + "/" + ref.Name
	}
	if pv.Spec.Local != nil && pv.Spec.Local.FSType != nil {
		v.FSType = *pv.Spec.Local.FSType
	}
	return v
}

func modeOf(pv *v1.PersistentVolume) string {
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == v1.PersistentVolumeBlock {
		return string(v1.PersistentVolumeBlock)
	}
	return string(v1.PersistentVolumeFilesystem)
}

func capacityText(p probe) string {
	if p.Capacity <= 0 {
		return ""
	}
	q := quantity(roundCapacity(p.Capacity))
	return q.String()
}

func pvNames(pvs []*v1.PersistentVolume) string {
	names := make([]string, len(pvs))
	for i, pv := range pvs {
		names[i] = pv.Name
	}
	return strings.Join(names, ", ")
}

// isOurs reports whether this node's provisioner made the PV.
func isOurs(pv *v1.PersistentVolume, provisioner string) bool {
	return pv.Annotations[AnnProvisionedBy] == provisioner
}

// mayBeOnNode reports whether a PV may be on the node with this hostname
// label: unless its node affinity pins it to other hostnames, its path may
// be this node's and must not be handed out twice.
func mayBeOnNode(pv *v1.PersistentVolume, hostname string) bool {
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) == 0 {
		return true
	}
	for _, term := range na.Required.NodeSelectorTerms {
		ok := true
		for _, e := range term.MatchExpressions {
			if e.Key == v1.LabelHostname && e.Operator == v1.NodeSelectorOpIn && !slices.Contains(e.Values, hostname) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// buildPV makes the PV of an entry.
func buildPV(name string, e *entry, mode v1.PersistentVolumeMode, fsType string, sc *storagev1.StorageClass, node, hostname string) *v1.PersistentVolume {
	policy := v1.PersistentVolumeReclaimDelete
	if sc != nil && sc.ReclaimPolicy != nil {
		policy = *sc.ReclaimPolicy
	}
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      maps.Clone(e.Class.Labels),
			Annotations: map[string]string{AnnProvisionedBy: ProvisionerName(node)},
		},
		Spec: v1.PersistentVolumeSpec{
			Capacity:                      v1.ResourceList{v1.ResourceStorage: quantity(roundCapacity(e.Probe.Capacity))},
			AccessModes:                   slices.Clone(e.Class.AccessModes),
			PersistentVolumeReclaimPolicy: policy,
			StorageClassName:              e.Class.Name,
			VolumeMode:                    &mode,
			PersistentVolumeSource:        v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: e.Path}},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{hostname}}},
			}}}},
		},
	}
	if fsType != "" {
		pv.Spec.Local.FSType = &fsType
	}
	// Mount options mean nothing to a raw device.
	if mode == v1.PersistentVolumeFilesystem && sc != nil {
		pv.Spec.MountOptions = slices.Clone(sc.MountOptions)
	}
	return pv
}
