package emptydir

// HugePages emptyDirs (medium HugePages or HugePages-<size>): a hugetlbfs
// mounted with the page size the kubelet picks (pkg/volume/emptydir,
// getPageSizeMountOption): the size in the medium's name, which one of the
// pod's hugepages-<size> requests must match; or, for HugePages, the one
// size the pod requests, refused when it requests none or several.

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
)

// hugetlbfsMounter mounts hugetlbfs (*mountutil.Mounter does).
type hugetlbfsMounter interface {
	MountHugetlbfs(target, pageSize string) error
}

func isHugePages(m v1.StorageMedium) bool {
	return m == v1.StorageMediumHugePages || strings.HasPrefix(string(m), string(v1.StorageMediumHugePagesPrefix))
}

// mediumPageSize is the size in a HugePages-<size> medium's name.
func mediumPageSize(m v1.StorageMedium) (resource.Quantity, error) {
	size := strings.TrimPrefix(string(m), string(v1.StorageMediumHugePagesPrefix))
	q, err := resource.ParseQuantity(size)
	if err != nil {
		return q, fmt.Errorf("emptyDir medium %q: page size %q: %w", m, size, err)
	}
	return q, nil
}

// pageSize is the page size of a HugePages emptyDir of a pod whose
// hugepages-<size> requests (pod-level, containers, init containers) have
// the sizes podSizes (volume.PodInfo.HugePageSizes), with the kubelet's
// errors.
func pageSize(medium v1.StorageMedium, podSizes string) (resource.Quantity, error) {
	var want resource.Quantity
	if medium != v1.StorageMediumHugePages {
		var err error
		if want, err = mediumPageSize(medium); err != nil {
			return want, err
		}
	}
	var found *resource.Quantity
	for _, s := range strings.Split(podSizes, ",") {
		if s == "" {
			continue
		}
		size, err := resource.ParseQuantity(s)
		if err != nil {
			return size, fmt.Errorf("resource name %s%s is an invalid hugepage name: %w", v1.ResourceHugePagesPrefix, s, err)
		}
		switch {
		case medium == v1.StorageMediumHugePages:
			if found != nil && found.Cmp(size) != 0 {
				return size, fmt.Errorf("medium: %s can't be used if container requests multiple huge page sizes", medium)
			}
			found = &size
		case size.Cmp(want) == 0:
			found = &size
		}
	}
	if found == nil {
		return want, fmt.Errorf("medium %s: hugePages storage requested, but there is no resource request for huge pages", medium)
	}
	return *found, nil
}

// setUpHugePages mounts the hugetlbfs, or checks the one mounted already
// has the page size (set up before a restart).
func (p *Plugin) setUpHugePages(req *plugins.SetUpRequest) error {
	medium := req.Spec.Volume.EmptyDir.Medium
	size, err := pageSize(medium, req.Pod.HugePageSizes)
	if err != nil {
		return err
	}
	created, err := mountutil.EnsureDir(req.Dir, 0o777)
	if err != nil {
		return err
	}
	if !created {
		mounted, err := p.host.Mounter.IsMountPoint(req.Dir)
		if err != nil {
			return err
		}
		if mounted {
			return checkHugetlbfs(req.Dir, size)
		}
	}
	m, ok := p.host.Mounter.(hugetlbfsMounter)
	if !ok {
		return fmt.Errorf("emptyDir medium %s: this node's mounter cannot mount hugetlbfs", medium)
	}
	// The kubelet's option as it writes it (e.g. pagesize=2Mi): the
	// kernel reads the number and its K/M/G.
	return m.MountHugetlbfs(req.Dir, size.String())
}

// checkHugetlbfs verifies that the mount at dir is a hugetlbfs with the
// page size.
func checkHugetlbfs(dir string, size resource.Quantity) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(abs))
	if err != nil {
		return err
	}
	if len(mounts) == 0 {
		return fmt.Errorf("%s: not found in the mount table", dir)
	}
	top := mounts[len(mounts)-1]
	if top.FSType != "hugetlbfs" {
		return fmt.Errorf("%s is a %s mount, not hugetlbfs", dir, top.FSType)
	}
	got, ok := mountedPageSize(top.VFSOptions)
	if !ok || got != size.Value() {
		return fmt.Errorf("%s: mounted page size (%s) and the requested %s differ", dir, top.VFSOptions, size.String())
	}
	return nil
}

// mountedPageSize reads pagesize=<n><K|M|G> from a hugetlbfs mount's
// options, in bytes.
func mountedPageSize(opts string) (int64, bool) {
	for _, o := range strings.Split(opts, ",") {
		v, ok := strings.CutPrefix(o, "pagesize=")
		if !ok || v == "" {
			continue
		}
		shift := map[byte]uint{'K': 10, 'k': 10, 'M': 20, 'm': 20, 'G': 30, 'g': 30}[v[len(v)-1]]
		if shift != 0 {
			v = v[:len(v)-1]
		}
		n, err := strconv.ParseInt(v, 10, 64)
		return n << shift, err == nil
	}
	return 0, false
}
